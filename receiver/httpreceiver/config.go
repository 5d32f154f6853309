package httpreceiver

import (
	"fmt"
	"time"

	"github.com/ferryhq/ferry/auth"
	"github.com/ferryhq/ferry/bytesize"
	"github.com/ferryhq/ferry/routing"
	"github.com/ferryhq/ferry/server"
)

// Config is the user configuration (YAML receivers.http).
type Config struct {
	Enabled bool `yaml:"enabled"`
	// The listener: listen, read_timeout, idle_timeout, max_header_bytes,
	// max_connections.
	server.HTTPConfig `yaml:",inline"`
	// MaxRequestBytes bounds a request body, both as sent and after
	// decompression (a gzip bomb is cut off at this size, not after).
	MaxRequestBytes bytesize.Size `yaml:"max_request_bytes"`
	// MaxRecords bounds the NDJSON lines of one request: each record costs
	// memory beyond its bytes, so millions of one-byte lines (a few KB of
	// gzip) would cost GBs. Counted before any record is built; 413 beyond.
	MaxRecords int `yaml:"max_records_per_request"`
	// WaitForAck: answer only after Kafka acknowledged every record (200).
	// false answers 202 once the records are queued; ?wait= overrides per request.
	WaitForAck bool `yaml:"wait_for_ack"`
	// AckTimeout: how long a waiting request waits for Kafka before it is
	// answered 504; its records stay queued and may still be delivered.
	AckTimeout time.Duration `yaml:"ack_timeout"`
	// ValidateJSON: refuse NDJSON lines that are not valid JSON (400 naming
	// the line). Off by default: lines are forwarded as bytes.
	ValidateJSON bool `yaml:"validate_json"`
	// Topics: the topic names requests may write to, as globs ("*": any
	// topic that exists); a token's own topic pattern applies on top.
	Topics []string `yaml:"topics"`
	// AllowedOrigins: web pages (by Origin) allowed to post from a browser;
	// empty refuses every request that carries an Origin header.
	AllowedOrigins []string `yaml:"allowed_origins"`
	// Auth: application tokens on this receiver (see docs/tokens.md).
	Auth auth.ReceiverConfig `yaml:"auth"`
}

// Validate names the first invalid field.
func (c *Config) Validate() error {
	if c.Enabled {
		if err := c.HTTPConfig.Validate(); err != nil {
			return err
		}
	}
	if c.MaxRequestBytes < 1024 {
		return fmt.Errorf("max_request_bytes: %s is below 1KiB", c.MaxRequestBytes)
	}
	if c.MaxRecords < 1 {
		return fmt.Errorf("max_records_per_request: %d is below 1", c.MaxRecords)
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
