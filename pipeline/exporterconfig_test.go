package pipeline

import (
	"testing"
	"time"

	"github.com/ferryhq/ferry/config"
	"github.com/ferryhq/ferry/telemetry"
)

// In mode spool nobody waits for Kafka's ack, so the exporter's batches
// linger for delivery.spool.linger; in modes kafka and spill clients wait
// on the memory path, so exporter.kafka.linger stays (the Kafka exporter's
// factory test checks what it does with Env.Spooled, 0 included).
func TestSpoolModeLingers(t *testing.T) {
	for _, c := range []struct {
		mode    string
		want    time.Duration
		spooled bool
	}{{"kafka", 0, false}, {"spill", 0, false}, {"spool", 40 * time.Millisecond, true}} {
		cfg, err := config.Parse(nil, []string{"delivery.mode=" + c.mode, "exporter.kafka.linger=7ms", "delivery.spool.linger=40ms"})
		if err != nil {
			t.Fatal(err)
		}
		if env := exporterEnv(cfg, telemetry.TestSettings()); env.Spooled != c.spooled || env.SpoolLinger != c.want {
			t.Errorf("mode %s: Env spooled %v linger %v, want %v %v", c.mode, env.Spooled, env.SpoolLinger, c.spooled, c.want)
		}
	}
	if d := config.Default().Delivery.Spool.Linger; d != 50*time.Millisecond {
		t.Errorf("delivery.spool.linger defaults to %v; the docs say 50ms", d)
	}
}
