package otlpreceiver

import (
	_ "embed"
	"fmt"
	"reflect"
	"strings"

	"github.com/ferryhq/ferry/auth"
	"github.com/ferryhq/ferry/bytesize"
	"github.com/ferryhq/ferry/otlp/encoding"
	"github.com/ferryhq/ferry/receiver"
	"github.com/ferryhq/ferry/routing"
)

//go:embed default.yaml
var defaultYAML []byte

type factory struct{}

// NewFactory is the OTLP receiver's factory (receivers.otlp).
func NewFactory() receiver.Factory { return factory{} }

func (factory) Type() string               { return "otlp" }
func (factory) DefaultYAML() []byte        { return defaultYAML }
func (factory) NewConfig() receiver.Config { return &Config{} }
func (factory) Create(cfg receiver.Config, env receiver.Env) (receiver.Receiver, error) {
	return New(*cfg.(*Config), env)
}

// On reports whether the receiver runs.
func (c *Config) On() bool { return c.Enabled }

// FixedTopics is each signal's topic when the configuration names it in
// full (a fixed name, or a template whose only field is {signal}) and
// topics allows it; a template a request fills in names none. Span
// metrics go to the metrics topic, so it is covered here too.
func (c *Config) FixedTopics() []string {
	if !c.Enabled {
		return nil
	}
	allow, err := routing.NewAllow(c.Topics)
	if err != nil {
		return nil
	}
	var out []string
	for _, s := range []struct {
		sig   string
		topic string
	}{{"traces", c.Traces.Topic}, {"metrics", c.Metrics.Topic}, {"logs", c.Logs.Topic}} {
		t, err := routing.Parse(s.topic)
		if err != nil {
			continue
		}
		if name, ok := t.Fixed(s.sig); ok && routing.ValidTopic(name) && allow.Check(name, nil) == nil {
			out = append(out, name)
		}
	}
	return out
}

// KeyedPlacement: partition trace_id and resource place a signal's records
// by their key, as does a key template. trace_partition places its
// grouped records itself, except where it writes what trace_id writes:
// with flat_json (a record per span), and for a topic decided per
// resource; the per-trace records written until a topic's count is known
// follow the partitioner too, as docs/otlp.md says, but only briefly.
// none writes no key.
func (c *Config) KeyedPlacement() []string {
	if !c.Enabled {
		return nil
	}
	var out []string
	for _, s := range []struct {
		sig string
		c   *encoding.Config
	}{{"traces", &c.Traces}, {"metrics", &c.Metrics}, {"logs", &c.Logs}} {
		switch {
		case s.c.Key != "":
			out = append(out, fmt.Sprintf("%s.key is %q (records with one key share a partition through it)", s.sig, s.c.Key))
		case s.c.Partition == "trace_id":
			out = append(out, s.sig+".partition is trace_id (a trace's spans share a partition through their key, the trace id)")
		case s.c.Partition == "trace_partition" && s.c.Encoding == "flat_json":
			out = append(out, s.sig+".partition is trace_partition with encoding flat_json (a record per span, keyed by its trace id: a trace's spans share a partition through their key)")
		case s.c.Partition == "trace_partition" && strings.Contains(s.c.Topic, "{resource."):
			out = append(out, fmt.Sprintf("%s.partition is trace_partition with a topic decided per resource (%q: written as with trace_id, a trace's spans share a partition through their key)", s.sig, s.c.Topic))
		case s.c.Partition == "resource":
			out = append(out, s.sig+".partition is resource (one resource's records share a partition through their key, its hash)")
		}
	}
	return out
}

// resolved is the configuration with its derived defaults filled in: the
// one place they are computed.
func (c Config) resolved(b receiver.Bounds) Config {
	if c.MaxExpandedBytes == 0 {
		c.MaxExpandedBytes = 4 * c.MaxRequestBytes
		if b.MemoryLimit > 0 {
			c.MaxExpandedBytes = max(bytesize.Size(b.MemoryLimit/4), c.MaxRequestBytes)
		}
	}
	return c
}

// maxRecordBytes is the largest record the receiver builds: the
// exporter's limit less room for a record's framing, key and headers in a
// batch (0: no limit).
func maxRecordBytes(b receiver.Bounds) int {
	if b.MaxRecordBytes <= 0 {
		return 0
	}
	return int(b.MaxRecordBytes) - 4096
}

// Check validates the section against the agent's bounds.
func (c *Config) Check(b receiver.Bounds) []error {
	if !c.Enabled {
		return nil
	}
	var errs []error
	if err := c.Validate(); err != nil {
		errs = append(errs, err)
	}
	if int64(c.MaxRequestBytes) > b.MemoryLimit/2 {
		errs = append(errs, fmt.Errorf("max_request_bytes (%s) exceeds half of queue.memory_limit (%s): an OTLP request holds its bytes and their encoding",
			c.MaxRequestBytes, bytesize.Size(b.MemoryLimit)))
	}
	if c.MaxExpandedBytes != 0 && int64(c.MaxExpandedBytes) > b.MemoryLimit {
		errs = append(errs, fmt.Errorf("max_expanded_bytes (%s) exceeds queue.memory_limit (%s): such a request could never be accepted",
			c.MaxExpandedBytes, bytesize.Size(b.MemoryLimit)))
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

// CheckFiles reads the gRPC listeners' TLS files.
func (c *Config) CheckFiles() error {
	if !c.Enabled || !c.GRPC.Enabled && !c.jaegerGRPCOwn() {
		return nil
	}
	if err := c.GRPC.TLS.CheckFiles(); err != nil {
		return fmt.Errorf("grpc.%w", err)
	}
	return nil
}

// Reload applies new token settings (requests in progress finish under
// the ones they started with); anything else that changed needs a restart.
func (r *Receiver) Reload(cfg receiver.Config) bool {
	next := *cfg.(*Config)
	r.gate.SetConfig(next.Auth)
	old := r.given
	old.Auth, next.Auth = auth.ReceiverConfig{}, auth.ReceiverConfig{}
	return !reflect.DeepEqual(old, next)
}

// Listening is where it serves.
func (r *Receiver) Listening() []any {
	var out []any
	if r.http != nil {
		out = append(out, "otlp_http", r.HTTPAddr())
	}
	if r.grpc != nil {
		out = append(out, "otlp_grpc", r.GRPCAddr())
	}
	if a := r.JaegerGRPCAddr(); a != "" {
		out = append(out, jaegerGRPCName, a)
	}
	return out
}
