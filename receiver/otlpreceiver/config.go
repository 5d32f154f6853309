package otlpreceiver

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/ferryhq/ferry/auth"
	"github.com/ferryhq/ferry/bytesize"
	"github.com/ferryhq/ferry/otlp/encoding"
	"github.com/ferryhq/ferry/routing"
	"github.com/ferryhq/ferry/server"
)

// Config is the user configuration (YAML receivers.otlp).
type Config struct {
	Enabled bool `yaml:"enabled"`
	HTTP    struct {
		Enabled bool `yaml:"enabled"`
		// The listener: listen, read_timeout, idle_timeout,
		// max_header_bytes, max_connections.
		server.HTTPConfig `yaml:",inline"`
		// AllowedOrigins: web pages (by Origin) allowed to export from a
		// browser (CORS is answered for them); empty refuses every request
		// that carries an Origin header.
		AllowedOrigins []string `yaml:"allowed_origins"`
	} `yaml:"http"`
	GRPC struct {
		Enabled bool   `yaml:"enabled"`
		Listen  string `yaml:"listen"`
		// MaxConcurrentStreams bounds the requests one connection carries
		// at once (gRPC reads each message whole before ferry sees it).
		MaxConcurrentStreams uint32 `yaml:"max_concurrent_streams"`
		// MaxConnections bounds the connections open at once; beyond it
		// a new connection is closed and clients reconnect with backoff
		// (0: unbounded).
		MaxConnections int `yaml:"max_connections"`
		// MaxHeaderBytes bounds a call's metadata (gRPC's own default is
		// 16 MiB, held for each stream it admits).
		MaxHeaderBytes bytesize.Size `yaml:"max_header_bytes"`
		// TLS serves gRPC over TLS when tls.cert_file is set.
		TLS server.TLSConfig `yaml:"tls"`
	} `yaml:"grpc"`
	// Topics: the topic names requests may write to after routing, as
	// globs ("*": any topic that exists); a token's own topic pattern
	// applies on top.
	Topics []string `yaml:"topics"`
	// MaxRequestBytes bounds a request as sent and after decompression.
	MaxRequestBytes bytesize.Size `yaml:"max_request_bytes"`
	// MaxItems bounds the spans, log records and data points of one
	// request (an OTLP/JSON request may hold up to 4 JSON objects or
	// arrays per item); MaxExpandedBytes bounds the records one request
	// becomes (a resource copied into each trace's record, flat_json's
	// objects), counted as they are built. Beyond either: 413.
	// MaxExpandedBytes 0: the pipeline sets a quarter of the queue's
	// memory_limit (4 × max_request_bytes without a pipeline).
	MaxItems         int           `yaml:"max_items_per_request"`
	MaxExpandedBytes bytesize.Size `yaml:"max_expanded_bytes"`
	// WaitForAck: answer success only after Kafka acknowledged every record
	// of the request; false answers once queued (fire and forget).
	WaitForAck bool            `yaml:"wait_for_ack"`
	AckTimeout time.Duration   `yaml:"ack_timeout"`
	Traces     encoding.Config `yaml:"traces"`
	Metrics    encoding.Config `yaml:"metrics"`
	Logs       encoding.Config `yaml:"logs"`
	// Auth: application tokens on both transports (see docs/tokens.md).
	Auth auth.ReceiverConfig `yaml:"auth"`
	// Doors: other wire formats served on the HTTP listener (door.go).
	Doors []string `yaml:"doors"`
	// JaegerGRPCEndpoint: with the jaeger door open, Jaeger's gRPC
	// collector service is served on grpc.listen and on this address
	// too, with the grpc section's settings (door_grpc.go); "": only on
	// grpc.listen.
	JaegerGRPCEndpoint string `yaml:"jaeger_grpc_endpoint"`
}

// Validate names the first invalid field.
func (c *Config) Validate() error {
	if !c.Enabled {
		return nil
	}
	if c.HTTP.Enabled {
		if err := c.HTTP.HTTPConfig.Validate(); err != nil {
			return fmt.Errorf("http.%w", err)
		}
	}
	if err := checkDoors(c.Doors); err != nil {
		return err
	}
	if len(c.Doors) > 0 && !c.HTTP.Enabled {
		return fmt.Errorf("doors: served on the HTTP listener, which is not enabled")
	}
	if c.GRPC.Enabled && c.GRPC.Listen == "" {
		return fmt.Errorf("grpc.listen: required when enabled")
	}
	if c.jaegerGRPCOwn() && c.GRPC.Enabled && c.JaegerGRPCEndpoint == c.GRPC.Listen && !strings.HasSuffix(c.GRPC.Listen, ":0") {
		return fmt.Errorf("jaeger_grpc_endpoint: %s is grpc.listen, where Jaeger's gRPC service is served already (set it to \"\" for that listener alone)", c.JaegerGRPCEndpoint)
	}
	if err := c.GRPC.TLS.Validate(); err != nil {
		return fmt.Errorf("grpc.%w", err)
	}
	if c.GRPC.MaxConnections < 0 {
		return fmt.Errorf("grpc.max_connections: %d is negative", c.GRPC.MaxConnections)
	}
	if (c.GRPC.Enabled || c.jaegerGRPCOwn()) && (c.GRPC.MaxHeaderBytes < 1024 || c.GRPC.MaxHeaderBytes > 16<<20) {
		return fmt.Errorf("grpc.max_header_bytes: %s is outside 1KiB..16MiB", c.GRPC.MaxHeaderBytes)
	}
	if c.MaxRequestBytes < 1024 || c.MaxRequestBytes > 1<<30 {
		return fmt.Errorf("max_request_bytes: %s is outside 1KiB..1GiB", c.MaxRequestBytes)
	}
	if c.AckTimeout < 100*time.Millisecond {
		return fmt.Errorf("ack_timeout: %s is below 100ms", c.AckTimeout)
	}
	if c.MaxItems < 1 {
		return fmt.Errorf("max_items_per_request: %d is below 1", c.MaxItems)
	}
	if c.MaxExpandedBytes != 0 && c.MaxExpandedBytes < c.MaxRequestBytes {
		return fmt.Errorf("max_expanded_bytes: %s is below max_request_bytes (%s)", c.MaxExpandedBytes, c.MaxRequestBytes)
	}
	if _, err := routing.NewAllow(c.Topics); err != nil {
		return err
	}
	if err := c.Auth.Validate(); err != nil {
		return fmt.Errorf("auth.%w", err)
	}
	for _, s := range []struct {
		name string
		sig  encoding.Signal
		c    *encoding.Config
	}{{"traces", encoding.Traces, &c.Traces}, {"metrics", encoding.Metrics, &c.Metrics}, {"logs", encoding.Logs, &c.Logs}} {
		if err := s.c.Validate(s.sig); err != nil {
			return fmt.Errorf("%s.%w", s.name, err)
		}
		if _, err := routing.Parse(s.c.Topic); err != nil {
			return fmt.Errorf("%s.topic: %w", s.name, err)
		}
		if s.c.Key != "" {
			if _, err := routing.Parse(s.c.Key); err != nil {
				return fmt.Errorf("%s.key: %w", s.name, err)
			}
		}
	}
	return nil
}

// jaegerGRPCOwn reports whether Jaeger's gRPC service has a listener of its
// own (the jaeger door open and jaeger_grpc_endpoint set).
func (c *Config) jaegerGRPCOwn() bool {
	return c.JaegerGRPCEndpoint != "" && slices.Contains(c.Doors, "jaeger")
}
