package httpreceiver

import (
	_ "embed"
	"fmt"
	"reflect"

	"github.com/ferryhq/ferry/auth"
	"github.com/ferryhq/ferry/bytesize"
	"github.com/ferryhq/ferry/receiver"
	"github.com/ferryhq/ferry/routing"
)

//go:embed default.yaml
var defaultYAML []byte

type factory struct{}

// NewFactory is the HTTP message receiver's factory (receivers.http).
func NewFactory() receiver.Factory { return factory{} }

func (factory) Type() string               { return "http" }
func (factory) DefaultYAML() []byte        { return defaultYAML }
func (factory) NewConfig() receiver.Config { return &Config{} }
func (factory) Create(cfg receiver.Config, env receiver.Env) (receiver.Receiver, error) {
	return New(*cfg.(*Config), env)
}

// On reports whether the receiver runs.
func (c *Config) On() bool { return c.Enabled }

// Check validates the section against the agent's bounds.
func (c *Config) Check(b receiver.Bounds) []error {
	var errs []error
	if err := c.Validate(); err != nil {
		errs = append(errs, err)
	}
	if int64(c.MaxRequestBytes) > b.MemoryLimit {
		errs = append(errs, fmt.Errorf("max_request_bytes (%s) exceeds queue.memory_limit (%s): such a request could never be accepted",
			c.MaxRequestBytes, bytesize.Size(b.MemoryLimit)))
	}
	if !c.Enabled {
		return errs
	}
	if b.SpoolBytes != 0 && b.SpoolBytes < 2*int64(c.MaxRequestBytes) {
		errs = append(errs, fmt.Errorf("max_request_bytes (%s) needs delivery.spool.max_bytes (%s) of at least twice it: a request is appended whole",
			c.MaxRequestBytes, bytesize.Size(b.SpoolBytes)))
	}
	if a, err := routing.NewAllow(c.Topics); b.AutoCreateTopics && err == nil && a.Any() {
		errs = append(errs, fmt.Errorf("topics allows any name while exporter.kafka.auto_create_topics is on: list the patterns that may be created"))
	}
	if err := receiver.CheckAuth(c.Auth, b); err != nil {
		errs = append(errs, err)
	}
	return errs
}

// CheckFiles: the HTTP listener names no files.
func (c *Config) CheckFiles() error { return nil }

// Reload applies new token settings (requests in progress finish under
// the ones they started with); anything else that changed needs a restart.
func (r *Receiver) Reload(cfg receiver.Config) bool {
	next := *cfg.(*Config)
	r.gate.SetConfig(next.Auth)
	old := r.cfg
	old.Auth, next.Auth = auth.ReceiverConfig{}, auth.ReceiverConfig{}
	return !reflect.DeepEqual(old, next)
}

// Listening is where it serves.
func (r *Receiver) Listening() []any { return []any{"http", r.Addr()} }
