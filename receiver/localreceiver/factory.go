package localreceiver

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

// NewFactory is the local protocol receiver's factory (receivers.local).
func NewFactory() receiver.Factory { return factory{} }

func (factory) Type() string               { return "local" }
func (factory) DefaultYAML() []byte        { return defaultYAML }
func (factory) NewConfig() receiver.Config { return &Config{} }
func (factory) Create(cfg receiver.Config, env receiver.Env) (receiver.Receiver, error) {
	return New(*cfg.(*Config), env)
}

// On reports whether the receiver runs.
func (c *Config) On() bool { return c.Enabled }

// resolved is the configuration with its derived defaults filled in: the
// one place they are computed.
func (c Config) resolved(b receiver.Bounds) Config {
	if c.MaxFrameBytes == 0 {
		// A compressed frame may grow its output up to the limit.
		c.MaxFrameBytes = 8 << 20
		if b.MemoryLimit > 0 {
			c.MaxFrameBytes = min(c.MaxFrameBytes, bytesize.Size(b.MemoryLimit/4))
		}
	}
	return c
}

// Check validates the section against the agent's bounds.
func (c *Config) Check(b receiver.Bounds) []error {
	if !c.Enabled {
		return nil
	}
	var errs []error
	r := c.resolved(b)
	if err := r.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.MaxFrameBytes != 0 && int64(c.MaxFrameBytes) > b.MemoryLimit/2 {
		errs = append(errs, fmt.Errorf("max_frame_bytes (%s) exceeds half of queue.memory_limit (%s): a compressed frame may reserve it for its decompressed body",
			c.MaxFrameBytes, bytesize.Size(b.MemoryLimit)))
	}
	// A request is appended to the spool whole.
	if c.MaxFrameBytes != 0 && b.SpoolBytes != 0 && b.SpoolBytes < 2*int64(c.MaxFrameBytes) {
		errs = append(errs, fmt.Errorf("max_frame_bytes (%s) needs delivery.spool.max_bytes (%s) of at least twice it: a frame is appended whole",
			c.MaxFrameBytes, bytesize.Size(b.SpoolBytes)))
	}
	if err := receiver.CheckAuth(c.Auth, b); err != nil {
		errs = append(errs, err)
	}
	return errs
}

// CheckFiles reads the TCP listener's TLS files.
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
	old := r.given
	old.Auth, next.Auth = auth.ReceiverConfig{}, auth.ReceiverConfig{}
	return !reflect.DeepEqual(old, next)
}

// Listening is where it serves.
func (r *Receiver) Listening() []any {
	return []any{"local_socket", r.SocketPath(), "local_tcp", r.TCPAddr()}
}
