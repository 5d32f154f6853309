package localreceiver

import (
	"errors"
	"fmt"
	"time"

	"github.com/ferryhq/ferry/auth"
	"github.com/ferryhq/ferry/bytesize"
	"github.com/ferryhq/ferry/routing"
	"github.com/ferryhq/ferry/server"
)

// Config is the user configuration (YAML receivers.local).
type Config struct {
	Enabled bool `yaml:"enabled"`
	// Socket is the Unix socket's path ("" for none); SocketMode its
	// permission bits, octal.
	Socket     string `yaml:"socket"`
	SocketMode string `yaml:"socket_mode"`
	// Listen is the TCP address ("" for none).
	Listen string `yaml:"listen"`
	// TLS for the TCP listener when tls.cert_file is set (the Unix socket
	// is guarded by its file mode instead).
	TLS server.TLSConfig `yaml:"tls"`
	// MaxFrameBytes bounds a frame as sent and a produce body after
	// decompression (0: a quarter of queue.memory_limit, at most 8 MiB, set
	// by the pipeline); MaxRecords the records of one frame.
	MaxFrameBytes bytesize.Size `yaml:"max_frame_bytes"`
	MaxRecords    int           `yaml:"max_records_per_frame"`
	// MaxInflightBytes bounds the frames one connection has sent and not
	// yet had answered; past it ferry stops reading that connection until
	// answers go out (flow control, not refusal).
	MaxInflightBytes bytesize.Size `yaml:"max_inflight_bytes"`
	// MaxConnections bounds the connections open at once on each listener.
	MaxConnections int `yaml:"max_connections"`
	// IdleTimeout closes a connection that sends nothing for this long
	// while nothing of it is in flight.
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// BodyTimeout bounds reading a frame's body once its header arrived
	// (its memory is reserved by then), and a text-mode line.
	BodyTimeout time.Duration `yaml:"body_timeout"`
	// AckTimeout: a frame Kafka has not answered for within this is
	// answered retryable (ack_timeout); its records stay queued and may
	// still be delivered.
	AckTimeout time.Duration `yaml:"ack_timeout"`
	// Topics: the topic names records may go to, as globs; a token's own
	// topic pattern applies on top.
	Topics []string `yaml:"topics"`
	// Auth: the application token a client sends in its hello (or a
	// "#token" line in text mode).
	Auth auth.ReceiverConfig `yaml:"auth"`
}

// Validate names the first invalid field.
func (c *Config) Validate() error {
	if !c.Enabled {
		return nil
	}
	if c.Socket == "" && c.Listen == "" {
		return errors.New("socket and listen are both empty: nothing to listen on")
	}
	if c.Socket != "" {
		if _, err := server.ParseMode(c.SocketMode); err != nil {
			return fmt.Errorf("socket_mode: %w", err)
		}
	}
	if c.MaxFrameBytes != 0 && (c.MaxFrameBytes < 1024 || c.MaxFrameBytes > 1<<30) {
		return fmt.Errorf("max_frame_bytes: %s is outside 1KiB..1GiB", c.MaxFrameBytes)
	}
	if c.MaxRecords < 1 {
		return fmt.Errorf("max_records_per_frame: %d is below 1", c.MaxRecords)
	}
	if c.MaxInflightBytes < max(c.MaxFrameBytes, 1024) {
		return fmt.Errorf("max_inflight_bytes: %s is below max_frame_bytes (%s): one frame must fit", c.MaxInflightBytes, c.MaxFrameBytes)
	}
	if err := c.TLS.Validate(); err != nil {
		return err
	}
	if c.MaxConnections < 0 {
		return fmt.Errorf("max_connections: %d is negative", c.MaxConnections)
	}
	if c.IdleTimeout <= 0 {
		return errors.New("idle_timeout: must be positive")
	}
	if c.BodyTimeout < 100*time.Millisecond {
		return fmt.Errorf("body_timeout: %s is below 100ms", c.BodyTimeout)
	}
	if c.AckTimeout < 100*time.Millisecond {
		return fmt.Errorf("ack_timeout: %s is below 100ms", c.AckTimeout)
	}
	if _, err := routing.NewAllow(c.Topics); err != nil {
		return err
	}
	if err := c.Auth.Validate(); err != nil {
		return fmt.Errorf("auth.%w", err)
	}
	return nil
}
