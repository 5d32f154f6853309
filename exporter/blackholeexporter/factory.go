package blackholeexporter

import (
	"context"

	"github.com/ferryhq/ferry/exporter"
)

type factory struct{}

// NewFactory is the blackhole exporter's factory (exporter.type:
// blackhole). It has no settings.
func NewFactory() exporter.Factory { return factory{} }

func (factory) Type() string               { return "blackhole" }
func (factory) DefaultYAML() []byte        { return nil }
func (factory) NewConfig() exporter.Config { return &Config{} }
func (factory) Create(_ exporter.Config, env exporter.Env) (exporter.Exporter, error) {
	return New(env.Set), nil
}

// Config is the blackhole's (empty) configuration.
type Config struct{}

// Check: nothing to check.
func (*Config) Check(exporter.Bounds) []error { return nil }

// CheckFiles: no files.
func (*Config) CheckFiles() error { return nil }

// Limits: any record, and topics are not created (there are none).
func (*Config) Limits() exporter.Limits {
	return exporter.Limits{NoExactlyOnce: "exporter.type blackhole discards every record: there is nothing to deliver exactly once"}
}

// Partitions: the blackhole takes any topic, as one partition (the
// receivers check the names).
func (e *Exporter) Partitions(_ context.Context, topics []string) ([]exporter.TopicInfo, error) {
	out := make([]exporter.TopicInfo, len(topics))
	for i, t := range topics {
		out[i] = exporter.TopicInfo{Topic: t, Partitions: 1}
	}
	return out, nil
}

// Describe is what the start-up line says of the exporter.
func (e *Exporter) Describe() []any { return []any{"exporter", "blackhole"} }

// Reload: nothing to apply, nothing to restart for.
func (e *Exporter) Reload(exporter.Config) (bool, error) { return false, nil }
