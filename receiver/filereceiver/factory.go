package filereceiver

import (
	_ "embed"
	"reflect"
	"strings"

	"github.com/ferryhq/ferry/receiver"
)

//go:embed default.yaml
var defaultYAML []byte

type factory struct{}

// NewFactory is the file receiver's factory (receivers.files).
func NewFactory() receiver.Factory { return factory{} }

func (factory) Type() string               { return "files" }
func (factory) DefaultYAML() []byte        { return defaultYAML }
func (factory) NewConfig() receiver.Config { return &Config{} }
func (factory) Create(cfg receiver.Config, env receiver.Env) (receiver.Receiver, error) {
	return New(*cfg.(*Config), env)
}

// Reload: nothing of the file receiver applies while it runs; any change
// needs a restart (which resumes every file at its checkpoint).
func (r *Receiver) Reload(cfg receiver.Config) bool {
	return !reflect.DeepEqual(r.cfg, *cfg.(*Config))
}

// Listening names what it reads.
func (r *Receiver) Listening() []any {
	return []any{"files", strings.Join(r.cfg.Include, ",")}
}
