package syslogreceiver

import (
	_ "embed"
	"reflect"

	"github.com/ferryhq/ferry/receiver"
)

//go:embed default.yaml
var defaultYAML []byte

type factory struct{}

// NewFactory is the syslog receiver's factory (receivers.syslog).
func NewFactory() receiver.Factory { return factory{} }

func (factory) Type() string               { return "syslog" }
func (factory) DefaultYAML() []byte        { return defaultYAML }
func (factory) NewConfig() receiver.Config { return &Config{} }
func (factory) Create(cfg receiver.Config, env receiver.Env) (receiver.Receiver, error) {
	return New(*cfg.(*Config), env)
}

// Reload: nothing of the syslog receiver changes while it runs (it has no
// tokens); any change needs a restart.
func (r *Receiver) Reload(cfg receiver.Config) bool {
	return !reflect.DeepEqual(r.cfg, *cfg.(*Config))
}

// Listening is where it serves ("" for a listener that is off).
func (r *Receiver) Listening() []any {
	return []any{"syslog_udp", r.UDPAddr(), "syslog_tcp", r.TCPAddr(), "syslog_tls", r.TLSAddr(), "syslog_socket", r.SocketPath()}
}
