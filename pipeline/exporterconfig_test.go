package pipeline

import (
	"testing"
	"time"

	"github.com/ferryhq/ferry/config"
	"github.com/ferryhq/ferry/telemetry"
)

// In mode spool nobody waits for Kafka's ack, so the exporter's batches
// linger for delivery.spool.linger; in modes kafka and spill clients wait
// on the memory path, so exporter.kafka.linger stays (Env.Linger 0; the
// Kafka exporter's factory test checks what it does with a non-zero one).
func TestSpoolModeLingers(t *testing.T) {
	for _, c := range []struct {
		mode string
		want time.Duration
	}{{"kafka", 0}, {"spill", 0}, {"spool", 40 * time.Millisecond}} {
		cfg, err := config.Parse(nil, []string{"delivery.mode=" + c.mode, "exporter.kafka.linger=7ms", "delivery.spool.linger=40ms"})
		if err != nil {
			t.Fatal(err)
		}
		if got := exporterEnv(cfg, telemetry.TestSettings()).Linger; got != c.want {
			t.Errorf("mode %s: exporter linger %v, want %v", c.mode, got, c.want)
		}
	}
	if d := config.Default().Delivery.Spool.Linger; d != 50*time.Millisecond {
		t.Errorf("delivery.spool.linger defaults to %v; the docs say 50ms", d)
	}
}
