package blackholeexporter

import (
	"context"
	"testing"

	"github.com/ferryhq/ferry/exporter"
	"github.com/ferryhq/ferry/telemetry"
)

// The blackhole takes any topic as one partition (what the Kafka front
// shows its clients in benchmarks) and never asks for a restart.
func TestFactory(t *testing.T) {
	f := NewFactory()
	e, err := f.Create(f.NewConfig(), exporter.Env{Set: telemetry.TestSettings()})
	if err != nil {
		t.Fatal(err)
	}
	got, err := e.Partitions(context.Background(), []string{"a", "b.c"})
	if err != nil || len(got) != 2 || got[0].Topic != "a" || got[1].Partitions != 1 || got[1].Err != nil {
		t.Fatalf("partitions %+v, %v", got, err)
	}
	if restart, err := e.Reload(f.NewConfig()); restart || err != nil {
		t.Fatalf("reload: restart %v err %v", restart, err)
	}
	if f.DefaultYAML() != nil || f.NewConfig().Check(exporter.Bounds{}) != nil {
		t.Fatal("the blackhole has settings?")
	}
}
