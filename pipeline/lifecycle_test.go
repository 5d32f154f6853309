package pipeline

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ferryhq/ferry/buffer/spool"
	"github.com/ferryhq/ferry/config"
	"github.com/ferryhq/ferry/exporter/blackholeexporter"
	"github.com/ferryhq/ferry/processor/attributes"
	"github.com/ferryhq/ferry/telemetry"
)

// lifeConfig is a Kafka-exporter pipeline on free ports whose broker does
// not answer (nothing here needs one: the exporter starts without Kafka).
func lifeConfig(t *testing.T, sets ...string) *config.Config {
	t.Helper()
	cfg, err := config.Parse(nil, append([]string{
		"exporter.kafka.brokers=[127.0.0.1:1]", "exporter.kafka.dial_timeout=200ms",
		"receivers.http.listen=127.0.0.1:0", "telemetry.admin.listen=127.0.0.1:0",
		"receivers.otlp.http.listen=127.0.0.1:0", "receivers.otlp.grpc.listen=127.0.0.1:0",
		"receivers.local.listen=127.0.0.1:0", "receivers.local.socket=" + shortDir(t) + "/f.sock",
		"telemetry.report_interval=1s",
	}, sets...))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// taken is a port that is in use for the test's life.
func taken(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l.Addr().String()
}

// TestFailedStartLeavesNothing: whichever component fails to start, those
// started before it are stopped in reverse, the error names it, Shutdown
// afterwards returns at once, and no goroutine is left behind (the Kafka
// client's, the auth ticker's, the spool's, the listeners').
func TestFailedStartLeavesNothing(t *testing.T) {
	for _, c := range []struct {
		name, fails string
		sets        []string
	}{
		{"admin port taken", "admin", []string{"telemetry.admin.listen=" + taken(t)}},
		{"HTTP port taken", "receivers.http", []string{"receivers.http.listen=" + taken(t)}},
		{"OTLP gRPC port taken, after HTTP started", "receivers.otlp", []string{"receivers.otlp.grpc.listen=" + taken(t)}},
		{"OTLP port taken in spool mode", "receivers.otlp", []string{"receivers.otlp.http.listen=" + taken(t), "delivery.mode=spool",
			"delivery.spool.dir=" + t.TempDir(), "delivery.dead_letter.file=" + t.TempDir() + "/dl.ndjson"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
			p, err := New(lifeConfig(t, c.sets...), telemetry.TestSettings())
			if err != nil {
				t.Fatal(err)
			}
			err = p.Start(context.Background())
			if err == nil || !strings.HasPrefix(err.Error(), c.fails+":") {
				t.Fatalf("Start: %v, want an error naming %s", err, c.fails)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			done := make(chan struct{})
			go func() { _ = p.Shutdown(ctx); close(done) }()
			select {
			case <-done:
			case <-time.After(3 * time.Second):
				t.Fatal("Shutdown after a failed Start hangs")
			}
		})
	}
}

// TestFailedNewReleasesWhatItBuilt: a pipeline whose construction fails
// after the Kafka client and the spool were built (here a processor's
// config) closes the client and releases the spool's lock.
func TestFailedNewReleasesWhatItBuilt(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	dir := t.TempDir()
	cfg := lifeConfig(t, "delivery.mode=spool", "delivery.spool.dir="+dir, "delivery.dead_letter.file="+t.TempDir()+"/dl.ndjson")
	cfg.Processors.Attributes = attributes.Config{Actions: []attributes.Action{{Action: "no-such-action", Key: "k"}}}
	if _, err := New(cfg, telemetry.TestSettings()); err == nil {
		t.Fatal("New accepted an invalid processor")
	}
	s, err := spool.Open(cfg.Delivery.Spool, telemetry.TestSettings(), spool.Links{Next: blackholeexporter.New(telemetry.TestSettings())})
	if err != nil {
		t.Fatalf("the spool's lock was not released: %v", err)
	}
	_ = s.Close()
}

// TestSpoolLockedFailsNew: a second pipeline on a spool directory in use
// fails in New, naming it, and leaves nothing running.
func TestSpoolLockedFailsNew(t *testing.T) {
	dir := t.TempDir()
	cfg := lifeConfig(t, "delivery.mode=spool", "delivery.spool.dir="+dir, "delivery.dead_letter.file="+t.TempDir()+"/dl.ndjson")
	first, err := spool.Open(cfg.Delivery.Spool, telemetry.TestSettings(), spool.Links{Next: blackholeexporter.New(telemetry.TestSettings())})
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	if _, err := New(cfg, telemetry.TestSettings()); err == nil || !strings.Contains(err.Error(), "delivery.spool") {
		t.Fatalf("New on a locked spool: %v", err)
	}
}

// shortDir is a temporary directory with a short path: a Unix socket's
// path must stay under 108 bytes, which t.TempDir's may not.
func shortDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "fy")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// TestExporterFailingInNew: a Kafka exporter that cannot be built (here a
// CA file that holds no certificate) fails New with an error naming it,
// and New's clean-up must not touch the exporter that was never built.
func TestExporterFailingInNew(t *testing.T) {
	ca := t.TempDir() + "/ca.pem"
	if err := os.WriteFile(ca, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	p, err := New(lifeConfig(t, "exporter.kafka.tls.enabled=true", "exporter.kafka.tls.ca_file="+ca), telemetry.TestSettings())
	if err == nil || !strings.HasPrefix(err.Error(), "exporter.kafka:") {
		t.Fatalf("New: %v, %v; want an error naming exporter.kafka", p, err)
	}
}

// TestReadyOnlyWhileRunning: /readyz says "starting" until every
// component, the receivers last, has started (the admin listener answers
// from the first step), and "stopping" from the first step of a stop, so
// nothing is sent to a door that is not listening or is draining.
func TestReadyOnlyWhileRunning(t *testing.T) {
	set := telemetry.TestSettings()
	p, err := New(lifeConfig(t), set)
	if err != nil {
		t.Fatal(err)
	}
	state := func() string { _, why := set.Health.Ready(); return why["pipeline"] }
	if s := state(); !strings.HasPrefix(s, "starting") {
		t.Fatalf("before Start: pipeline %q, want starting", s)
	}
	// A last component, after the receivers: what /readyz says while the
	// last one starts, and while the first one stops.
	var atLastStart, atFirstStop string
	p.life.add("probe", step{
		start: func(context.Context) error { atLastStart = state(); return nil },
		stop:  func(context.Context) error { atFirstStop = state(); return nil }})
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(atLastStart, "starting") {
		t.Fatalf("while the last component started: pipeline %q, want starting", atLastStart)
	}
	if s := state(); s != "" {
		t.Fatalf("after Start: pipeline %q, want ready", s)
	}
	// Over the network, as a probe sees it.
	res, err := http.Get("http://" + p.Admin.Addr() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if strings.Contains(string(body), "pipeline") {
		t.Fatalf("/readyz after Start names the pipeline: %s", body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := p.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if atFirstStop != "stopping" {
		t.Fatalf("while the first component stopped: pipeline %q, want stopping", atFirstStop)
	}
}
