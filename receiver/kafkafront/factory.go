package kafkafront

import (
	_ "embed"
	"fmt"
	"reflect"

	"github.com/ferryhq/ferry/auth"
	"github.com/ferryhq/ferry/bytesize"
	"github.com/ferryhq/ferry/receiver"
)

//go:embed default.yaml
var defaultYAML []byte

type factory struct{}

// NewFactory is the Kafka front's factory (receivers.kafka).
func NewFactory() receiver.Factory { return factory{} }

func (factory) Type() string               { return "kafka" }
func (factory) DefaultYAML() []byte        { return defaultYAML }
func (factory) NewConfig() receiver.Config { return &Config{} }
func (factory) Create(cfg receiver.Config, env receiver.Env) (receiver.Receiver, error) {
	return New(*cfg.(*Config), env)
}

// On reports whether the front runs.
func (c *Config) On() bool { return c.Enabled }

// Check validates the section against the agent's bounds.
func (c *Config) Check(b receiver.Bounds) []error {
	if !c.Enabled {
		return nil
	}
	var errs []error
	if err := c.Validate(); err != nil {
		errs = append(errs, err)
	}
	if int64(c.MaxDecompressedBytes) > b.MemoryLimit/2 {
		errs = append(errs, fmt.Errorf("max_decompressed_bytes (%s) exceeds half of queue.memory_limit (%s): a compressed request may reserve it for its decompressed batches",
			c.MaxDecompressedBytes, bytesize.Size(b.MemoryLimit)))
	}
	if b.SpoolBytes != 0 && b.SpoolBytes < 2*int64(c.MaxRequestBytes) {
		errs = append(errs, fmt.Errorf("max_request_bytes (%s) needs delivery.spool.max_bytes (%s) of at least twice it: a request is appended whole",
			c.MaxRequestBytes, bytesize.Size(b.SpoolBytes)))
	}
	if err := receiver.CheckAuth(c.Auth, b); err != nil {
		errs = append(errs, err)
	}
	return errs
}

// CheckFiles reads the listener's TLS files.
func (c *Config) CheckFiles() error {
	if !c.Enabled {
		return nil
	}
	return c.TLS.CheckFiles()
}

// Reload applies new token settings; anything else that changed needs a
// restart.
func (r *Receiver) Reload(cfg receiver.Config) bool {
	next := *cfg.(*Config)
	r.gate.SetConfig(next.Auth)
	old := r.cfg
	old.Auth, next.Auth = auth.ReceiverConfig{}, auth.ReceiverConfig{}
	return !reflect.DeepEqual(old, next)
}

// Listening is where it serves.
func (r *Receiver) Listening() []any { return []any{"kafka_front", r.Addr()} }
