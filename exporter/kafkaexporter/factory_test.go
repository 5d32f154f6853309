package kafkaexporter

import (
	"context"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/ferryhq/ferry/exporter"
	"github.com/ferryhq/ferry/telemetry"
)

// defaults is the section `ferry config default` prints, decoded.
func defaults(t *testing.T) *Config {
	t.Helper()
	var doc struct {
		Kafka Config `yaml:"kafka"`
	}
	if err := yaml.Unmarshal(defaultYAML, &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Kafka.Brokers) == 0 {
		t.Fatal("default.yaml's section did not decode")
	}
	return &doc.Kafka
}

func create(t *testing.T, cfg *Config, env exporter.Env) *Exporter {
	t.Helper()
	env.Set = telemetry.TestSettings()
	e, err := NewFactory().Create(cfg, env)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Shutdown(context.Background()) })
	return e.(*Exporter)
}

// The pipeline's Env.Linger (delivery mode spool) replaces the section's
// linger for the client, while Reload compares with the section as written:
// the same file reloaded asks for no restart.
func TestFactoryLingerAndReload(t *testing.T) {
	cfg := defaults(t)
	cfg.Linger = 7 * time.Millisecond
	if e := create(t, cfg, exporter.Env{BufferedBytes: 64 << 20}); e.cfg.Linger != 7*time.Millisecond {
		t.Fatalf("not spooled: client linger %v, want the section's 7ms", e.cfg.Linger)
	}
	if e := create(t, cfg, exporter.Env{BufferedBytes: 64 << 20, Spooled: true}); e.cfg.Linger != 0 {
		t.Fatalf("spooled with delivery.spool.linger 0: client linger %v, want 0", e.cfg.Linger)
	}
	e := create(t, cfg, exporter.Env{BufferedBytes: 64 << 20, Spooled: true, SpoolLinger: 40 * time.Millisecond})
	if e.cfg.Linger != 40*time.Millisecond {
		t.Fatalf("client linger %v, want the spool's 40ms", e.cfg.Linger)
	}
	same := *cfg
	if restart, err := e.Reload(&same); err != nil || restart {
		t.Fatalf("the same section reloaded: restart %v, err %v; want neither", restart, err)
	}
	tls := *cfg
	tls.TLS.MinVersion = "1.3"
	if restart, err := e.Reload(&tls); err != nil || restart {
		t.Fatalf("a TLS change: restart %v, err %v; it applies from the next connection", restart, err)
	}
	brokers := *cfg
	brokers.Brokers = []string{"127.0.0.1:1"}
	if restart, err := e.Reload(&brokers); err != nil || !restart {
		t.Fatalf("other brokers: restart %v, err %v; want a restart", restart, err)
	}
	sasl := *cfg
	sasl.SASL = SASLConfig{Mechanism: "PLAIN", Username: "u", Password: "p"}
	if _, err := e.Reload(&sasl); err == nil || !strings.Contains(err.Error(), "restart") {
		t.Fatalf("turning SASL on while running: %v; want an error saying it needs a restart", err)
	}
	if got := e.Describe(); len(got) != 2 || got[0] != "kafka" {
		t.Fatalf("Describe %v", got)
	}
}

// Check reports every error of the section, against the agent's bounds.
func TestConfigCheck(t *testing.T) {
	cfg := defaults(t)
	if errs := cfg.Check(exporter.Bounds{MemoryLimit: 256 << 20}); len(errs) != 0 {
		t.Fatalf("the defaults fail: %v", errs)
	}
	cfg.MaxBufferedBytes = 1 << 20
	errs := cfg.Check(exporter.Bounds{MemoryLimit: 256 << 20})
	if len(errs) != 1 || !strings.HasPrefix(errs[0].Error(), "max_buffered_bytes") {
		t.Fatalf("errors %v; want max_buffered_bytes below queue.memory_limit", errs)
	}
	cfg.Acks = "most"
	if errs := cfg.Check(exporter.Bounds{MemoryLimit: 256 << 20}); len(errs) != 2 {
		t.Fatalf("errors %v; want both the acks and the buffer error", errs)
	}
	if l := defaults(t).Limits(); l.MaxRecordBytes != 1000000 || l.AutoCreateTopics || l.NoReceipts != "" {
		t.Fatalf("limits %+v", l)
	}
	// acks none: Kafka answers nothing, so receivers refuse receipts.
	none := defaults(t)
	none.Acks = "none"
	if l := none.Limits(); !strings.Contains(l.NoReceipts, "exporter.kafka.acks") {
		t.Fatalf("limits %+v", l)
	}
}
