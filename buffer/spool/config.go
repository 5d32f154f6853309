package spool

import (
	"fmt"
	"time"

	"github.com/ferryhq/ferry/bytesize"
)

// Config is the user configuration (YAML delivery.spool).
type Config struct {
	// Dir holds the segments, the checkpoint and a lock file; one agent per
	// directory (a second one fails to start).
	Dir string `yaml:"dir"`
	// SegmentBytes: a segment is sealed and a new one started past this.
	SegmentBytes bytesize.Size `yaml:"segment_bytes"`
	// MaxBytes caps every segment byte on disk; appends beyond it are refused.
	MaxBytes bytesize.Size `yaml:"max_bytes"`
	// Fsync: always (answer after an fsync; concurrent appends share one),
	// interval (fsync every FsyncInterval) or never.
	Fsync         string        `yaml:"fsync"`
	FsyncInterval time.Duration `yaml:"fsync_interval"`
	// WriteBuffer bounds the bytes of batches being appended or waiting for
	// their fsync.
	WriteBuffer bytesize.Size `yaml:"write_buffer"`
	// ReadAhead: the reader takes memory for what it has read and Kafka has
	// not yet acknowledged only while the budget it draws from (the queue's
	// memory_limit, shared with receivers) is below this; 0 means half of
	// memory_limit.
	ReadAhead bytesize.Size `yaml:"read_ahead"`
	// ReplayRate throttles reading the backlog found on disk at start, in
	// bytes per second, so recovery leaves disk and CPU to live traffic;
	// 0 = unthrottled.
	ReplayRate bytesize.Size `yaml:"replay_rate"`
	// Linger replaces the exporter's linger in delivery mode spool, where
	// every record reaches Kafka from the spool and no client waits for
	// Kafka's ack: larger, fewer produce requests cost the agent and the
	// brokers less CPU. The pipeline applies it; the spool does not batch
	// by time itself.
	Linger time.Duration `yaml:"linger"`
}

// Validate names the first invalid field by its YAML key.
func (c *Config) Validate() error {
	if c.Dir == "" {
		return fmt.Errorf("dir: a directory is required")
	}
	if c.SegmentBytes < 64<<10 || c.SegmentBytes > 1<<30 {
		return fmt.Errorf("segment_bytes: %s is outside 64KiB..1GiB", c.SegmentBytes)
	}
	if c.MaxBytes < 2*c.SegmentBytes {
		return fmt.Errorf("max_bytes: %s is below two segments (%s)", c.MaxBytes, 2*c.SegmentBytes)
	}
	if c.Linger < 0 || c.Linger > time.Minute {
		return fmt.Errorf("linger: %s is outside 0..1m", c.Linger)
	}
	switch c.Fsync {
	case "always", "never":
	case "interval":
		if c.FsyncInterval < time.Millisecond || c.FsyncInterval > time.Minute {
			return fmt.Errorf("fsync_interval: %s is outside 1ms..1m", c.FsyncInterval)
		}
	default:
		return fmt.Errorf("fsync: %q is not one of always, interval, never", c.Fsync)
	}
	if c.WriteBuffer < 1<<20 {
		return fmt.Errorf("write_buffer: %s is below 1MiB", c.WriteBuffer)
	}
	if c.ReadAhead < 0 || c.ReplayRate < 0 {
		return fmt.Errorf("read_ahead and replay_rate must not be negative")
	}
	return nil
}
