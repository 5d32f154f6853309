package syslogreceiver

import (
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/ferryhq/ferry/bytesize"
	"github.com/ferryhq/ferry/receiver"
	"github.com/ferryhq/ferry/routing"
	"github.com/ferryhq/ferry/server"
)

// Config is the user configuration (YAML receivers.syslog); default.yaml
// holds its defaults and says what each key does.
type Config struct {
	Enabled bool `yaml:"enabled"`
	// UDP, TCP and TLSListen are host:port ("" for none); the TLS
	// listener serves only when TLS.CertFile is set.
	UDP       string           `yaml:"udp"`
	TCP       string           `yaml:"tcp"`
	TLSListen string           `yaml:"tls_listen"`
	TLS       server.TLSConfig `yaml:"tls"`
	// Socket is a Unix datagram socket's path ("" for none); SocketMode
	// its permission bits, octal.
	Socket     string `yaml:"socket"`
	SocketMode string `yaml:"socket_mode"`
	// Format: json or raw.
	Format string `yaml:"format"`
	// Topic and Key are templates over {hostname}, {app_name},
	// {facility}, {severity} and {host}.
	Topic string `yaml:"topic"`
	Key   string `yaml:"key"`
	// App is the application the records count against in rate_limits.
	App string `yaml:"app"`
	// MaxMessageBytes bounds one message.
	MaxMessageBytes bytesize.Size `yaml:"max_message_bytes"`
	// MaxConnections bounds each stream listener's open connections.
	MaxConnections int `yaml:"max_connections"`
	// IdleTimeout closes a stream connection that sends nothing.
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// FrameTimeout bounds the time from a frame's first byte to its last.
	FrameTimeout time.Duration `yaml:"frame_timeout"`
}

// On reports whether the receiver runs.
func (c *Config) On() bool { return c.Enabled }

// FixedTopics is the topic when it has no placeholders (a template's
// names depend on what is read, so ferry does not create them).
func (c *Config) FixedTopics() []string {
	if !c.Enabled {
		return nil
	}
	return routing.FixedTopic(c.Topic)
}

// KeyedPlacement: a key template keeps the records it gives one key on
// one partition, through the partitioner.
func (c *Config) KeyedPlacement() []string {
	if !c.Enabled || c.Key == "" {
		return nil
	}
	return []string{fmt.Sprintf("key is %q (records with one key share a partition through it)", c.Key)}
}

// tlsOn: the TLS listener serves.
func (c *Config) tlsOn() bool { return c.TLSListen != "" && c.TLS.On() }

// recordBound is the largest record a message can become: its JSON (or
// raw bytes), its key and its headers.
func (c *Config) recordBound() int64 {
	n := int64(c.MaxMessageBytes)
	if c.Format == "json" {
		return 6*n + maxSDExtra + jsonFixed + 3*n + 1024
	}
	return 3*n + 1024
}

// Check validates the section against the agent's bounds and returns every
// error it finds, each naming its key.
func (c *Config) Check(b receiver.Bounds) []error {
	if !c.Enabled {
		return nil
	}
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.UDP == "" && c.TCP == "" && !c.tlsOn() && c.Socket == "" {
		add("udp, tcp, tls_listen and socket: all off (tls_listen needs tls.cert_file): nothing to listen on")
	}
	for _, a := range []struct{ key, addr string }{{"udp", c.UDP}, {"tcp", c.TCP}, {"tls_listen", c.TLSListen}} {
		if a.addr == "" {
			continue
		}
		_, port, err := net.SplitHostPort(a.addr)
		if err != nil {
			add("%s: %q is not host:port", a.key, a.addr)
		} else if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
			add("%s: %q: the port is not a number from 0 to 65535", a.key, a.addr)
		}
	}
	if c.TCP != "" && c.tlsOn() && c.TCP == c.TLSListen {
		add("tls_listen: %q is also tcp's address: one of them could not listen", c.TLSListen)
	}
	if err := c.TLS.Validate(); err != nil {
		add("%v", err)
	}
	if c.Socket != "" {
		if _, err := server.ParseMode(c.SocketMode); err != nil {
			add("socket_mode: %v", err)
		}
	}
	if c.Format != "json" && c.Format != "raw" {
		add("format: %q is not one of json, raw", c.Format)
	}
	if t, err := parseTemplate(c.Topic); err != nil {
		add("topic: %v", err)
	} else if t.static() && !routing.ValidTopic(c.Topic) {
		add("topic: %q is not a valid Kafka topic name (1 to 249 of a-z A-Z 0-9 . _ -)", c.Topic)
	}
	if c.Key != "" {
		if _, err := parseTemplate(c.Key); err != nil {
			add("key: %v", err)
		}
	}
	if c.App == "" {
		add("app: a name is required (the application rate_limits count these records against)")
	}
	if c.MaxMessageBytes < 480 || c.MaxMessageBytes > 16<<20 {
		// RFC 5424: receivers MUST take 480 octets.
		add("max_message_bytes: %s is outside 480B..16MiB", c.MaxMessageBytes)
	} else {
		if b.MaxRecordBytes > 0 && c.recordBound() > b.MaxRecordBytes {
			add("max_message_bytes: %s makes records of up to %s (format %s, with key and headers), over the exporter's largest record (%s)",
				c.MaxMessageBytes, bytesize.Size(c.recordBound()), c.Format, bytesize.Size(b.MaxRecordBytes))
		}
		if b.MemoryLimit > 0 && 4*c.recordBound() > b.MemoryLimit {
			add("max_message_bytes: %s needs queue.memory_limit (%s) of at least 4 × %s (a message's largest record)",
				c.MaxMessageBytes, bytesize.Size(b.MemoryLimit), bytesize.Size(c.recordBound()))
		}
	}
	if c.MaxConnections < 1 {
		add("max_connections: %d is below 1", c.MaxConnections)
	}
	if c.IdleTimeout <= 0 {
		add("idle_timeout: must be positive")
	}
	if c.FrameTimeout < 100*time.Millisecond {
		add("frame_timeout: %s is below 100ms", c.FrameTimeout)
	}
	return errs
}

// CheckFiles reads the TLS listener's files.
func (c *Config) CheckFiles() error {
	if !c.Enabled || !c.tlsOn() {
		return nil
	}
	return c.TLS.CheckFiles()
}
