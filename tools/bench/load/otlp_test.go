package load

import (
	"context"
	"encoding/json"
	"github.com/ferryhq/ferry/receiver"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/config"
	"github.com/ferryhq/ferry/consumer/consumertest"
	"github.com/ferryhq/ferry/receiver/otlpreceiver"
	"github.com/ferryhq/ferry/telemetry"
)

// startReceiver is ferry's OTLP receiver (default config, ephemeral
// loopback ports) delivering to a sink that acknowledges at once.
func startReceiver(t *testing.T) (*otlpreceiver.Receiver, *consumertest.Sink) {
	t.Helper()
	cfg := *config.Default().Receivers.ReceiverConfig("otlp").(*otlpreceiver.Config)
	cfg.HTTP.Listen, cfg.GRPC.Listen = "127.0.0.1:0", "127.0.0.1:0"
	sink := &consumertest.Sink{}
	r, err := otlpreceiver.New(cfg, receiver.Env{Set: telemetry.TestSettings(), Next: sink})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Shutdown(context.Background()) })
	return r, sink
}

func runOTLP(t *testing.T, args ...string) map[string]any {
	t.Helper()
	rep := filepath.Join(t.TempDir(), "report.json")
	if err := OTLPCmd(append(args, "--header=false", "--report-json", rep)); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(rep)
	if err != nil {
		t.Fatal(err)
	}
	var res map[string]any
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	return res
}

// The items the load reports as acknowledged are the items the agent
// received, over both transports and for logs and spans.
func TestOTLPLoadDeliversWhatItReports(t *testing.T) {
	r, sink := startReceiver(t)
	for _, c := range []struct{ protocol, target, signal string }{
		{"grpc", r.GRPCAddr(), "logs"},
		{"grpc", r.GRPCAddr(), "traces"},
		{"http", "http://" + r.HTTPAddr(), "logs"},
		{"http", "http://" + r.HTTPAddr(), "traces"},
	} {
		sink.Reset()
		res := runOTLP(t, "--protocol", c.protocol, "--target", c.target, "--signal", c.signal, "--count", "10", "--length", "100",
			"--requests", "40", "--concurrency", "4")
		var got int64
		for _, rec := range sink.Records() {
			n, ok := OTLPItems(rec.Value)
			if !ok {
				t.Fatalf("%s %s: a record is not OTLP", c.protocol, c.signal)
			}
			got += n
		}
		if res["items"].(float64) != 400 || got != 400 || res["failed"].(float64) != 0 {
			t.Errorf("%s %s: reported %v items (%v failed), the agent received %d; want 400", c.protocol, c.signal, res["items"], res["failed"], got)
		}
	}
}

// --rate never sends a request before it is due, so a run of d at rate R
// sends at most R·d + 1 requests however fast the agent answers.
func TestOTLPLoadRateIsAnUpperBound(t *testing.T) {
	r, _ := startReceiver(t)
	res := runOTLP(t, "--protocol", "http", "--target", "http://"+r.HTTPAddr(), "--count", "1", "--length", "10",
		"--requests", "1000000", "--concurrency", "8", "--rate", "100", "--duration", "500ms")
	n := int(res["requests"].(float64))
	if n > 51 || n < 5 {
		t.Fatalf("%d requests in 500 ms at --rate 100; want at most 51 (and more than a few)", n)
	}
	t.Log("requests sent: " + strconv.Itoa(n))
}

// An agent that is down answers UNAVAILABLE (or 503) to every attempt,
// which the load retries as OTLP exporters do, but never past --duration:
// the run ends on time and reports what it could not send as abandoned
// (not failed: the agent failed nothing), naming the cause.
func TestOTLPLoadEndsOnTimeWhenTheAgentIsDown(t *testing.T) {
	for _, c := range []struct{ protocol, scheme string }{{"grpc", ""}, {"http", "http://"}} {
		t.Run(c.protocol, func(t *testing.T) {
			done := make(chan map[string]any, 1)
			go func() {
				rep := filepath.Join(t.TempDir(), "report.json")
				err := OTLPCmd([]string{"--protocol", c.protocol, "--target", c.scheme + closedAddr(t), "--count", "1", "--length", "10",
					"--requests", "1000000", "--concurrency", "4", "--duration", "500ms", "--header=false", "--fail-on-error=false",
					"--report-json", rep})
				var res map[string]any
				if b, rerr := os.ReadFile(rep); err == nil && rerr == nil {
					_ = json.Unmarshal(b, &res)
				}
				done <- res
			}()
			select {
			case res := <-done:
				if res == nil {
					t.Fatal("no report")
				}
				if res["requests"].(float64) != 0 || res["abandoned"].(float64) < 4 || res["failed"].(float64) != 0 {
					t.Fatalf("requests %v, not sent %v, failed %v; want 0, at least one per worker, 0", res["requests"], res["abandoned"], res["failed"])
				}
				if f := res["abandoned_causes"].(string); !strings.Contains(f, "refused") {
					t.Fatalf("causes %q do not name the refused connection", f)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("a run of --duration 500ms against a closed port still runs after 10 s")
			}
		})
	}
}

// A whole run in which no request was accepted is an error.
func TestOTLPLoadFailsWhenNothingWasAccepted(t *testing.T) {
	err := OTLPCmd([]string{"--protocol", "http", "--target", "http://" + closedAddr(t), "--count", "1", "--requests", "1000000",
		"--concurrency", "2", "--duration", "300ms", "--header=false"})
	if err == nil || !strings.Contains(err.Error(), "no request was accepted") {
		t.Fatalf("err %v; want no request was accepted", err)
	}
}

// closedAddr is a loopback address nothing listens on (agenttest's
// FreeAddr does the same, but agenttest imports this package).
func closedAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}
