package status

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/telemetry"
)

// agent registers the series the components register, under their real
// names and labels (docs/metrics.md), in a real registry.
type agent struct {
	set                          telemetry.Settings
	recv, recvB, errs, reqs      *prometheus.CounterVec
	sent, sentB, dropped, dead   *prometheus.CounterVec
	admitted, limited, processed *prometheus.CounterVec
	queue, limit, up, conns      prometheus.Gauge
	latency                      prometheus.Histogram
}

func newAgent(t *testing.T) *agent {
	t.Helper()
	set := telemetry.TestSettings()
	a := &agent{set: set}
	cv := func(name string, labels ...string) *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: name}, labels)
		set.Registry.MustRegister(c)
		return c
	}
	g := func(name string) prometheus.Gauge {
		x := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: name})
		set.Registry.MustRegister(x)
		return x
	}
	a.recv = cv("ferry_receiver_received_records_total", "receiver", "topic")
	a.recvB = cv("ferry_receiver_received_bytes_total", "receiver", "topic")
	a.errs = cv("ferry_receiver_errors_total", "receiver", "reason")
	a.reqs = cv("ferry_receiver_requests_total", "receiver", "code")
	a.sent = cv("ferry_exporter_sent_records_total", "exporter", "topic")
	a.sentB = cv("ferry_exporter_sent_bytes_total", "exporter", "topic")
	a.dropped = cv("ferry_exporter_dropped_records_total", "exporter", "topic", "reason")
	a.dead = cv("ferry_dead_letter_records_total", "sink", "reason")
	a.admitted = cv("ferry_ratelimit_admitted_records_total", "app")
	a.limited = cv("ferry_ratelimit_refused_records_total", "app")
	a.processed = telemetry.DroppedItems(set.Registry)
	a.queue, a.limit = g("ferry_queue_bytes"), g("ferry_queue_limit_bytes")
	a.up, a.conns = g("ferry_exporter_kafka_up"), g("ferry_exporter_kafka_connections")
	a.latency = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ferry_exporter_kafka_produce_latency_seconds",
		Help: "x", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)})
	set.Registry.MustRegister(a.latency)
	return a
}

func newStatus(t *testing.T, set telemetry.Settings, cfg Config) *Status {
	t.Helper()
	s, err := New(cfg, set, "test")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

var oneSecond = Config{Interval: time.Second, History: 10 * time.Minute}

func TestTotalsAndRates(t *testing.T) {
	a := newAgent(t)
	s := newStatus(t, a.set, oneSecond)
	t0 := time.Now()
	a.recv.WithLabelValues("http", "logs").Add(10)
	a.limit.Set(1000)
	s.Sample(t0)
	r := s.Report(0)
	if r.Totals.ReceivedRecords.Total != 10 || r.Totals.ReceivedRecords.PerSec != 0 {
		t.Fatalf("first sample: %+v (totals, and no rate yet)", r.Totals.ReceivedRecords)
	}
	// Two seconds later: 40 more in, 30 out, a refusal, a dead letter.
	a.recv.WithLabelValues("http", "logs").Add(30)
	a.recv.WithLabelValues("otlp_http", "traces").Add(10)
	a.recvB.WithLabelValues("http", "logs").Add(4000)
	a.sent.WithLabelValues("kafka", "logs").Add(30)
	a.errs.WithLabelValues("http", "request_too_large").Add(3)
	a.errs.WithLabelValues("http", "unauthenticated").Add(1)
	a.dead.WithLabelValues("file", "record_too_large").Add(2)
	a.queue.Set(250)
	a.up.Set(1)
	a.conns.Set(2)
	s.Sample(t0.Add(2 * time.Second))
	r = s.Report(0)
	tt := r.Totals
	if tt.ReceivedRecords.Total != 50 || tt.ReceivedRecords.PerSec != 20 {
		t.Errorf("received %+v, want 50 total at 20/s", tt.ReceivedRecords)
	}
	if tt.SentRecords.Total != 30 || tt.SentRecords.PerSec != 15 {
		t.Errorf("sent %+v, want 30 at 15/s", tt.SentRecords)
	}
	if tt.RefusedRequests.Total != 4 || tt.DeadLetters.Total != 2 {
		t.Errorf("refused %+v dead letters %+v", tt.RefusedRequests, tt.DeadLetters)
	}
	if len(r.Receivers) != 2 || r.Receivers[0].Receiver != "http" || r.Receivers[0].Records.PerSec != 15 ||
		r.Receivers[0].Bytes.Total != 4000 || r.Receivers[0].Refused.Total != 4 {
		t.Errorf("receivers %+v", r.Receivers)
	}
	// otlp_http appeared during the interval: all of its 10 are new.
	if r.Receivers[1].Receiver != "otlp_http" || r.Receivers[1].Records.PerSec != 5 {
		t.Errorf("a new receiver's rate: %+v", r.Receivers[1])
	}
	if len(r.Topics) != 2 || r.Topics[0].Topic != "logs" || r.Topics[0].In.Total != 40 || r.Topics[0].Out.Total != 30 {
		t.Errorf("topics %+v", r.Topics)
	}
	// Refusals: the most frequent first, each with its receiver.
	if len(r.Refusals) != 2 || r.Refusals[0].Reason != "request_too_large" || r.Refusals[0].Count.Total != 3 ||
		r.Refusals[0].Receiver != "http" || r.Refusals[0].Count.PerSec != 1.5 {
		t.Errorf("refusals %+v", r.Refusals)
	}
	if len(r.DeadLetters) != 1 || r.DeadLetters[0].Sink != "file" || r.DeadLetters[0].Reason != "record_too_large" {
		t.Errorf("dead letters %+v", r.DeadLetters)
	}
	if r.Queue.Bytes != 250 || r.Queue.Fill != 0.25 {
		t.Errorf("queue %+v", r.Queue)
	}
	if r.Kafka.Up == nil || !*r.Kafka.Up || r.Kafka.Connections != 2 {
		t.Errorf("kafka %+v", r.Kafka)
	}
	if r.Spool != nil || r.Files != nil {
		t.Errorf("spool %v files %v: no such component registered", r.Spool, r.Files)
	}
	if !r.Ready || r.Version != "test" {
		t.Errorf("ready %v version %q", r.Ready, r.Version)
	}
	// A quiet interval: rates fall to zero, totals stay.
	s.Sample(t0.Add(3 * time.Second))
	r = s.Report(0)
	if r.Totals.ReceivedRecords.PerSec != 0 || r.Totals.ReceivedRecords.Total != 50 {
		t.Errorf("quiet interval: %+v", r.Totals.ReceivedRecords)
	}
}

func TestApplications(t *testing.T) {
	a := newAgent(t)
	s := newStatus(t, a.set, oneSecond)
	t0 := time.Now()
	s.Sample(t0)
	a.admitted.WithLabelValues("shop").Add(100)
	a.admitted.WithLabelValues("").Add(5)
	a.limited.WithLabelValues("shop").Add(20)
	a.limited.WithLabelValues("noisy").Add(500)
	a.processed.WithLabelValues("sampler", "traces", "shop").Add(7)
	a.processed.WithLabelValues("filter", "logs", "shop").Add(3)
	debt := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "ferry_ratelimit_debt_seconds", Help: "x"}, []string{"app"})
	a.set.Registry.MustRegister(debt)
	debt.WithLabelValues("noisy").Set(1.25)
	s.Sample(t0.Add(time.Second))
	r := s.Report(0)
	byApp := map[string]AppRow{}
	for _, x := range r.Apps {
		byApp[x.App] = x
	}
	if len(r.Apps) != 3 || r.Apps[0].App != "noisy" {
		t.Fatalf("apps %+v: want three, the one refused most first", r.Apps)
	}
	if x := byApp["shop"]; x.Records.Total != 100 || x.Records.PerSec != 100 || x.RateLimited.Total != 20 ||
		x.SampledOut.Total != 7 || x.Filtered.Total != 3 || x.DebtSeconds != 0 {
		t.Errorf("shop %+v", x)
	}
	if x := byApp["noisy"]; x.RateLimited.Total != 500 || x.DebtSeconds != 1.25 {
		t.Errorf("noisy %+v", x)
	}
	if x := byApp[""]; x.Records.Total != 5 {
		t.Errorf("no token %+v", x)
	}
	if r.Totals.SampledOut.Total != 7 || r.Totals.Filtered.Total != 3 || r.Totals.RateLimited.Total != 520 {
		t.Errorf("totals %+v", r.Totals)
	}
}

func TestProduceLatencyQuantiles(t *testing.T) {
	a := newAgent(t)
	s := newStatus(t, a.set, oneSecond)
	t0 := time.Now()
	s.Sample(t0)
	if r := s.Report(0); r.Kafka.ProduceP50Ms != nil || r.Kafka.ProduceP99Ms != nil {
		t.Fatalf("quantiles with no produce request: %v %v", r.Kafka.ProduceP50Ms, r.Kafka.ProduceP99Ms)
	}
	// 98 fast requests (about 3 ms) and 2 slow ones (about 300 ms).
	for i := 0; i < 98; i++ {
		a.latency.Observe(0.003)
	}
	a.latency.Observe(0.3)
	a.latency.Observe(0.3)
	s.Sample(t0.Add(time.Second))
	r := s.Report(60)
	p50, p99 := *r.Kafka.ProduceP50Ms, *r.Kafka.ProduceP99Ms
	// Buckets are powers of two from 0.5 ms: 3 ms is in (2, 4], 300 ms in (256, 512].
	if p50 <= 2 || p50 > 4 || p99 <= 256 || p99 > 512 {
		t.Fatalf("p50 %v ms p99 %v ms", p50, p99)
	}
	if r.Kafka.ProduceRequests != 100 {
		t.Fatalf("quantiles over %v requests, want 100", r.Kafka.ProduceRequests)
	}
	if got := r.History.Series["produce_p99_ms"]; got[len(got)-1] <= 256 {
		t.Fatalf("chart's p99 of the interval: %v", got)
	}
	// The window moves on: ten seconds later only new requests count.
	for i := 2; i <= 12; i++ {
		a.latency.Observe(0.001)
		s.Sample(t0.Add(time.Duration(i) * time.Second))
	}
	r = s.Report(0)
	if p99 := *r.Kafka.ProduceP99Ms; p99 > 1 || r.Kafka.ProduceRequests != 10 || r.Kafka.LatencyWindowSeconds != 10 {
		t.Fatalf("after the window moved: p99 %v ms over %v requests in %v s", p99, r.Kafka.ProduceRequests, r.Kafka.LatencyWindowSeconds)
	}
}

// TestRingAndRowsBounded: the ring keeps history/interval samples and no
// more; a table lists MaxRows rows and says how many it left out.
func TestRingAndRowsBounded(t *testing.T) {
	a := newAgent(t)
	s := newStatus(t, a.set, Config{Interval: time.Second, History: 5 * time.Second})
	t0 := time.Now()
	for i := 0; i < 60; i++ {
		a.recv.WithLabelValues("http", fmt.Sprintf("topic-%02d", i)).Add(float64(i + 1))
	}
	for i := 0; i < 9; i++ {
		a.recv.WithLabelValues("http", "topic-00").Add(float64(i))
		s.Sample(t0.Add(time.Duration(i) * time.Second))
	}
	r := s.Report(1e9)
	in := r.History.Series["in_records_per_sec"]
	if len(in) != 5 || in[0] != 4 || in[4] != 8 {
		t.Fatalf("history %v: want the last five rates 4..8", in)
	}
	if len(r.History.Series) != numSeries {
		t.Fatalf("%d series", len(r.History.Series))
	}
	if r := s.Report(2); len(r.History.Series["in_records_per_sec"]) != 2 {
		t.Fatal("?history=2 did not give two samples")
	}
	if len(r.Topics) != MaxRows || r.Omitted["topics"] != 10 {
		t.Fatalf("%d topic rows, omitted %v", len(r.Topics), r.Omitted)
	}
	if r.Topics[0].Topic != "topic-00" { // the only one with a rate
		t.Fatalf("first topic %q", r.Topics[0].Topic)
	}
	if err := (&Config{Interval: 100 * time.Millisecond, History: time.Hour}).Validate(); err == nil {
		t.Fatal("36000 samples accepted")
	}
	if err := (&Config{Interval: time.Second, History: time.Hour}).Validate(); err != nil {
		t.Fatal(err)
	}
	if err := (&Config{Interval: 0, History: time.Hour}).Validate(); err == nil {
		t.Fatal("interval 0 accepted")
	}
}

// TestServe: the JSON and the page as the admin listener serves them.
func TestServe(t *testing.T) {
	a := newAgent(t)
	s := newStatus(t, a.set, Config{Interval: 100 * time.Millisecond, History: 10 * time.Second})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /status", s.ServeJSON)
	mux.HandleFunc("GET /{$}", s.ServePage)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	get := func(path string) (*http.Response, string) {
		res, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res, string(b)
	}
	if res, _ := get("/status"); res.StatusCode != 503 {
		t.Fatalf("before the first sample: %d", res.StatusCode)
	}
	// An application name is the token issuer's choice: it must reach the
	// page as text, never as markup.
	a.admitted.WithLabelValues(`</script><script>alert(1)</script>`).Add(1)
	a.recv.WithLabelValues("http", "logs").Add(42)
	if err := s.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(t.Context())
	time.Sleep(350 * time.Millisecond)
	res, body := get("/status?history=0.2")
	if res.StatusCode != 200 || res.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("%d %s", res.StatusCode, body)
	}
	var r Report
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		t.Fatal(err)
	}
	if r.Totals.ReceivedRecords.Total != 42 || r.History == nil || len(r.History.Series["queue_bytes"]) != 2 {
		t.Fatalf("report %+v history %+v", r.Totals, r.History)
	}
	if res, _ := get("/status?history=-1"); res.StatusCode != 400 {
		t.Fatalf("history=-1: %d", res.StatusCode)
	}
	if _, body := get("/status?history=0"); strings.Contains(body, `"history"`) {
		t.Fatal("history=0 still has history")
	}
	res, body = get("/")
	csp := res.Header.Get("Content-Security-Policy")
	if res.StatusCode != 200 || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/html") ||
		!strings.Contains(csp, "script-src 'sha256-") || !strings.Contains(csp, "default-src 'none'") {
		t.Fatalf("page: %d %v", res.StatusCode, res.Header)
	}
	if strings.Contains(body, "<script>alert(1)") || !strings.Contains(body, `\u003c/script\u003e\u003cscript\u003ealert(1)`) {
		t.Fatal("a label value was written into the page as markup")
	}
	if !strings.Contains(body, `"received_records":{"total":42`) {
		t.Fatal("the page does not carry the current report")
	}
	self := strings.ReplaceAll(string(page), `"http://www.w3.org/2000/svg"`, "") // a namespace name, not an address
	for _, ext := range []string{"http://", "https://", "src=", "href=", "@import", "url("} {
		if strings.Contains(self, ext) {
			t.Errorf("the page refers to an external asset (%q)", ext)
		}
	}
	if res, _ := get("/other"); res.StatusCode != 404 {
		t.Fatalf("/other: %d", res.StatusCode)
	}
}

func TestFrame(t *testing.T) {
	a := newAgent(t)
	s := newStatus(t, a.set, oneSecond)
	t0 := time.Now()
	s.Sample(t0)
	for i := 1; i <= 30; i++ {
		a.recv.WithLabelValues("http", "app-logs").Add(float64(10 * i))
		a.sent.WithLabelValues("kafka", "app-logs").Add(float64(10 * i))
		s.Sample(t0.Add(time.Duration(i) * time.Second))
	}
	a.errs.WithLabelValues("http", "request_too_large").Add(3)
	a.admitted.WithLabelValues("shop").Add(40)
	a.limited.WithLabelValues("shop").Add(6)
	for i := 0; i < 20; i++ {
		a.recv.WithLabelValues("http", fmt.Sprintf("t-%02d", i)).Add(1)
	}
	a.recv.WithLabelValues("http", "app-logs").Add(50)
	a.up.Set(1)
	s.Sample(t0.Add(31 * time.Second))
	r := s.Report(120)
	for _, size := range [][2]int{{80, 24}, {60, 20}, {160, 50}} {
		lines := Frame(r, "127.0.0.1:8089", size[0], size[1])
		if len(lines) > size[1] {
			t.Errorf("%dx%d: %d lines", size[0], size[1], len(lines))
		}
		text := strings.Join(lines, "\n")
		for _, l := range lines {
			if n := utf8.RuneCountInString(l); n > size[0] {
				t.Errorf("%dx%d: a line of %d: %q", size[0], size[1], n, l)
			}
		}
		for _, want := range []string{"Kafka up", "request_too_large", "shop", "app-logs", "4700", "4650", "READY"} {
			if !strings.Contains(text, want) {
				t.Errorf("%dx%d: no %q in\n%s", size[0], size[1], want, text)
			}
		}
		// A narrow terminal leaves the least needed columns out; a wide
		// one shows them all, and more rows.
		if size[0] == 160 && (!strings.Contains(text, "refused  conns") || strings.Contains(text, "more)")) {
			t.Errorf("wide frame lacks the connections column or rows:\n%s", text)
		}
		if size[0] == 60 && strings.Contains(text, "refused  conns") {
			t.Errorf("narrow frame kept the connections column:\n%s", text)
		}
		if size[0] == 80 && !strings.Contains(text, "more)") {
			t.Errorf("80x24 shows all 21 topics?\n%s", text)
		}
		t.Logf("%dx%d:\n%s", size[0], size[1], text)
	}
}
