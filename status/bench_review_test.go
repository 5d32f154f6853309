package status

import (
	"fmt"
	"io"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// benchAgent fills a registry as a busy agent's: topics topics on four
// receivers and the exporter, apps token applications, the Go and process
// collectors.
func benchAgent(b *testing.B, topics, apps int) *agent {
	a := newAgent(&testing.T{})

	admB := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_ratelimit_admitted_bytes_total", Help: "x"}, []string{"app"})
	a.set.Registry.MustRegister(admB)
	for _, r := range []string{"otlp", "http", "local", "kafka_front"} {
		for i := 0; i < topics; i++ {
			t := fmt.Sprintf("topic-%04d", i)
			a.recv.WithLabelValues(r, t).Add(float64(i))
			a.recvB.WithLabelValues(r, t).Add(float64(i))
		}
		a.reqs.WithLabelValues(r, "200").Add(1)
		a.errs.WithLabelValues(r, "bad_request").Add(1)
	}
	for i := 0; i < topics; i++ {
		t := fmt.Sprintf("topic-%04d", i)
		a.sent.WithLabelValues("kafka", t).Add(float64(i))
		a.sentB.WithLabelValues("kafka", t).Add(float64(i))
	}
	for i := 0; i < apps; i++ {
		app := fmt.Sprintf("app-%04d", i)
		a.admitted.WithLabelValues(app).Add(float64(i))
		admB.WithLabelValues(app).Add(float64(i))
		a.limited.WithLabelValues(app).Add(1)
		a.processed.WithLabelValues("sampler", "traces", app).Add(1)
	}
	for i := 0; i < 1000; i++ {
		a.latency.Observe(float64(i) / 1e4)
	}
	return a
}

func benchSample(b *testing.B, topics, apps int) {
	a := benchAgent(b, topics, apps)
	s, err := New(oneSecond, a.set, "bench")
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	s.Sample(now)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		now = now.Add(time.Second)
		s.Sample(now)
	}
}

func BenchmarkSampleSmall(b *testing.B) { benchSample(b, 20, 10) }
func BenchmarkSampleBusy(b *testing.B)  { benchSample(b, 1000, 1000) }
func BenchmarkGatherBusy(b *testing.B) {
	a := benchAgent(b, 1000, 1000)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := a.set.Registry.Gather(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkServeJSONDefault is one poll of the status page: it asks for
// /status with no history parameter, so it gets the whole ring.
func BenchmarkServeJSONDefault(b *testing.B) {
	a := benchAgent(b, 20, 10)
	s, _ := New(oneSecond, a.set, "bench")
	now := time.Now()
	for i := 0; i < 600; i++ {
		now = now.Add(time.Second)
		s.Sample(now)
	}
	req := httptest.NewRequest("GET", "/status", nil)
	w := httptest.NewRecorder()
	s.ServeJSON(w, req)
	b.Logf("body %d bytes", w.Body.Len())
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		rw := httptest.NewRecorder()
		rw.Body = nil
		s.ServeJSON(discard{rw}, req)
	}
}

type discard struct{ *httptest.ResponseRecorder }

func (d discard) Write(p []byte) (int, error) { return io.Discard.Write(p) }

// An application's name is whatever the token issuer chose: ferry top must
// not write its control characters to the operator's terminal.
func TestFrameHasNoEscapes(t *testing.T) {
	r := &Report{Version: "x", Ready: true,
		Apps:     []AppRow{{App: "evil\x1b[2J\x1b]0;pwned\x07"}},
		NotReady: nil}
	for _, l := range Frame(r, "127.0.0.1:8089", 120, 40) {
		for _, c := range l {
			if c < 0x20 || c == 0x7f || (c >= 0x80 && c < 0xa0) {
				t.Fatalf("frame line holds control character %q: %q", c, l)
			}
		}
	}
}

// BenchmarkGatherRuntimeOnly is what the Go and process collectors alone
// cost a gather (status reads none of their series).
func BenchmarkGatherRuntimeOnly(b *testing.B) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := reg.Gather(); err != nil {
			b.Fatal(err)
		}
	}
}
