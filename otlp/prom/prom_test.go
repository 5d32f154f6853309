package prom

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/s2"
	"github.com/prometheus/client_golang/exp/api/remote"
	writev2 "github.com/prometheus/client_golang/exp/api/remote/genproto/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/push"
	"github.com/prometheus/common/expfmt"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/ferryhq/ferry/otlp/door"
)

// decode reads a converted request with the Collector's own pdata: the
// bytes are valid OTLP.
func decode(t testing.TB, pb []byte) pmetric.Metrics {
	t.Helper()
	req := pmetricotlp.NewExportRequest()
	if err := req.UnmarshalProto(pb); err != nil {
		t.Fatalf("the converted request is not OTLP: %v", err)
	}
	return req.Metrics()
}

// byName indexes metrics by resource service.name and metric name.
func byName(md pmetric.Metrics) map[string]pmetric.Metric {
	out := map[string]pmetric.Metric{}
	for i := 0; i < md.ResourceMetrics().Len(); i++ {
		rm := md.ResourceMetrics().At(i)
		svc, _ := rm.Resource().Attributes().Get("service.name")
		for j := 0; j < rm.ScopeMetrics().Len(); j++ {
			ms := rm.ScopeMetrics().At(j).Metrics()
			for k := 0; k < ms.Len(); k++ {
				out[svc.Str()+"/"+ms.At(k).Name()] = ms.At(k)
			}
		}
	}
	return out
}

func attrs(m pcommon.Map) string {
	var kv []string
	m.Range(func(k string, v pcommon.Value) bool { kv = append(kv, k+"="+v.AsString()); return true })
	sort.Strings(kv)
	return strings.Join(kv, ",")
}

// pushServer is the door behind an httptest server: what a pushgateway
// client sends, converted.
func pushServer(t *testing.T) (*httptest.Server, func() []pmetric.Metrics) {
	var mu sync.Mutex
	var got []pmetric.Metrics
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, q *http.Request) {
		body, _ := io.ReadAll(q.Body)
		if q.Method != http.MethodPut && q.Method != http.MethodPost {
			w.WriteHeader(405)
			return
		}
		pb, err := Push(q, body, nil, door.Limits{MaxBytes: 1 << 20}, nil)
		if err != nil {
			t.Errorf("push: %v", err)
			http.Error(w, err.Error(), 400)
			return
		}
		mu.Lock()
		got = append(got, decode(t, pb))
		mu.Unlock()
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(srv.Close)
	return srv, func() []pmetric.Metrics { mu.Lock(); defer mu.Unlock(); return got }
}

// TestPushClient: client_golang's push package (PUT and POST, its default
// delimited protobuf and the text format) → OTLP: counter → monotonic
// cumulative sum, gauge → gauge, histogram → histogram, summary → summary;
// the grouping (job, instance, a base64-encoded value) → the resource.
func TestPushClient(t *testing.T) {
	now = func() time.Time { return time.UnixMilli(1700000000123) }
	defer func() { now = time.Now }()
	srv, got := pushServer(t)

	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "jobs_done_total", Help: "Jobs done."}, []string{"queue"})
	c.WithLabelValues("fast").Add(3)
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "last_run_seconds", Help: "Last run."})
	g.Set(12.5)
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "run_seconds", Help: "Run time.", Buckets: []float64{1, 5}})
	for _, v := range []float64{0.5, 2, 3, 9} {
		h.Observe(v)
	}
	s := prometheus.NewSummary(prometheus.SummaryOpts{Name: "size_bytes", Help: "Sizes.", Objectives: map[float64]float64{0.5: 0.05}})
	for _, v := range []float64{10, 20, 30} {
		s.Observe(v)
	}
	reg.MustRegister(c, g, h, s)

	for _, tc := range []struct {
		name   string
		pusher *push.Pusher
		put    bool
	}{
		{"protobuf PUT", push.New(srv.URL, "batch").Grouping("instance", "host-1").Grouping("path", "/var/x").Gatherer(reg), true},
		{"text POST", push.New(srv.URL, "batch").Grouping("instance", "host-1").Grouping("path", "/var/x").Gatherer(reg).Format(expfmt.NewFormat(expfmt.TypeTextPlain)), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.put {
				err = tc.pusher.Push()
			} else {
				err = tc.pusher.Add()
			}
			if err != nil {
				t.Fatal(err)
			}
			all := got()
			md := all[len(all)-1]
			rm := md.ResourceMetrics().At(0)
			if a := attrs(rm.Resource().Attributes()); a != "path=/var/x,service.instance.id=host-1,service.name=batch" {
				t.Fatalf("resource %s", a)
			}
			m := byName(md)
			ctr := m["batch/jobs_done_total"]
			if ctr.Type() != pmetric.MetricTypeSum || !ctr.Sum().IsMonotonic() || ctr.Sum().AggregationTemporality() != pmetric.AggregationTemporalityCumulative ||
				ctr.Sum().DataPoints().At(0).DoubleValue() != 3 || attrs(ctr.Sum().DataPoints().At(0).Attributes()) != "queue=fast" || ctr.Description() != "Jobs done." {
				t.Fatalf("counter: %v", ctr.Type())
			}
			if ts := ctr.Sum().DataPoints().At(0).Timestamp().AsTime().UnixMilli(); ts != 1700000000123 {
				t.Fatalf("a pushed sample without a timestamp is stamped on arrival: %d", ts)
			}
			if gg := m["batch/last_run_seconds"]; gg.Type() != pmetric.MetricTypeGauge || gg.Gauge().DataPoints().At(0).DoubleValue() != 12.5 {
				t.Fatalf("gauge %v", gg.Type())
			}
			hh := m["batch/run_seconds"]
			if hh.Type() != pmetric.MetricTypeHistogram {
				t.Fatalf("histogram %v", hh.Type())
			}
			hp := hh.Histogram().DataPoints().At(0)
			if hp.Count() != 4 || hp.Sum() != 14.5 || !eqF(hp.ExplicitBounds().AsRaw(), []float64{1, 5}) || !eqU(hp.BucketCounts().AsRaw(), []uint64{1, 2, 1}) {
				t.Fatalf("histogram point: count %d sum %v bounds %v counts %v", hp.Count(), hp.Sum(), hp.ExplicitBounds().AsRaw(), hp.BucketCounts().AsRaw())
			}
			ss := m["batch/size_bytes"]
			if ss.Type() != pmetric.MetricTypeSummary {
				t.Fatalf("summary %v", ss.Type())
			}
			sp := ss.Summary().DataPoints().At(0)
			if sp.Count() != 3 || sp.Sum() != 60 || sp.QuantileValues().Len() != 1 || sp.QuantileValues().At(0).Quantile() != 0.5 || sp.QuantileValues().At(0).Value() != 20 {
				t.Fatalf("summary point: %d %v", sp.Count(), sp.Sum())
			}
			if v, _ := ctr.Metadata().Get("prometheus.type"); v.Str() != "counter" {
				t.Fatalf("prometheus.type %q", v.Str())
			}
		})
	}
}

func eqF(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func eqU(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestParseGrouping(t *testing.T) {
	g, err := ParseGrouping("/metrics/job@base64/YmF0Y2gvb25l/instance/h1/empty@base64/=/a%20b/c")
	if err != nil || len(g) != 4 || g[0] != [2]string{"job", "batch/one"} || g[2] != [2]string{"empty", ""} || g[3] != [2]string{"a b", "c"} {
		// "a b" is no valid legacy name but is a UTF-8 one
		if err == nil || !strings.Contains(err.Error(), "a b") {
			t.Fatalf("%v %v", g, err)
		}
	}
	for _, bad := range []string{"/metrics/job/", "/metrics/job/x/odd", "/metrics/instance/x", "/metrics/job/x/job/y", "/metrics/job/x/__name__/y"} {
		if _, err := ParseGrouping(bad); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

// rwServer serves remote write into the door (snappy decoded as
// httpbody does) and answers 204 with Written's headers.
func rwServer(t *testing.T) (*httptest.Server, func() []pmetric.Metrics) {
	var mu sync.Mutex
	var got []pmetric.Metrics
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, q *http.Request) {
		raw, _ := io.ReadAll(q.Body)
		body, err := s2.Decode(nil, raw)
		if err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		pb, err := RemoteWrite(q, body, nil, door.Limits{MaxBytes: 8 << 20}, nil)
		if err != nil {
			t.Errorf("remote write: %v", err)
			http.Error(w, err.Error(), 400)
			return
		}
		mu.Lock()
		got = append(got, decode(t, pb))
		mu.Unlock()
		Written(q, pb, w.Header())
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	return srv, func() []pmetric.Metrics { mu.Lock(); defer mu.Unlock(); return got }
}

// TestRemoteWriteV2Client: client_golang's remote write client sends a
// v2 request (types, help, unit, a created timestamp, a classic histogram,
// a native histogram); the door answers with v2's written headers (the
// client fails without them).
func TestRemoteWriteV2Client(t *testing.T) {
	srv, got := rwServer(t)
	api, err := remote.NewAPI(srv.URL, remote.WithAPIPath("/api/v1/write"))
	if err != nil {
		t.Fatal(err)
	}
	st := writev2.NewSymbolTable()
	ts := int64(1700000000000)
	series := func(typ writev2.Metadata_MetricType, help, unit string, lbls ...string) *writev2.TimeSeries {
		return &writev2.TimeSeries{LabelsRefs: st.SymbolizeLabels(lbls, nil),
			Metadata: &writev2.Metadata{Type: typ, HelpRef: st.Symbolize(help), UnitRef: st.Symbolize(unit)}}
	}
	ctr := series(writev2.Metadata_METRIC_TYPE_COUNTER, "Requests.", "", "__name__", "http_requests_total", "code", "200", "instance", "web:80", "job", "shop/web")
	ctr.Samples = []*writev2.Sample{{Value: 42, Timestamp: ts}}
	ctr.CreatedTimestamp = ts - 60000
	gauge := series(writev2.Metadata_METRIC_TYPE_GAUGE, "", "bytes", "__name__", "mem_bytes", "instance", "web:80", "job", "shop/web")
	gauge.Samples = []*writev2.Sample{{Value: 1024, Timestamp: ts}, {Value: math.Float64frombits(staleNaN), Timestamp: ts + 15000}}
	var hist []*writev2.TimeSeries
	for _, b := range []struct{ le, v string }{{"0.1", "1"}, {"1", "3"}, {"+Inf", "4"}} {
		s := series(writev2.Metadata_METRIC_TYPE_HISTOGRAM, "", "", "__name__", "lat_seconds_bucket", "instance", "web:80", "job", "shop/web", "le", b.le)
		v := map[string]float64{"1": 1, "3": 3, "4": 4}[b.v]
		s.Samples = []*writev2.Sample{{Value: v, Timestamp: ts}}
		hist = append(hist, s)
	}
	hs := series(writev2.Metadata_METRIC_TYPE_HISTOGRAM, "", "", "__name__", "lat_seconds_sum", "instance", "web:80", "job", "shop/web")
	hs.Samples = []*writev2.Sample{{Value: 2.5, Timestamp: ts}}
	hc := series(writev2.Metadata_METRIC_TYPE_HISTOGRAM, "", "", "__name__", "lat_seconds_count", "instance", "web:80", "job", "shop/web")
	hc.Samples = []*writev2.Sample{{Value: 4, Timestamp: ts}}
	nat := series(writev2.Metadata_METRIC_TYPE_HISTOGRAM, "", "", "__name__", "rpc_seconds", "instance", "web:80", "job", "shop/web")
	nat.Histograms = []*writev2.Histogram{{Count: &writev2.Histogram_CountInt{CountInt: 5}, Sum: 7, Schema: 0, ZeroThreshold: 1e-128,
		ZeroCount:     &writev2.Histogram_ZeroCountInt{ZeroCountInt: 1},
		PositiveSpans: []*writev2.BucketSpan{{Offset: 1, Length: 2}, {Offset: 1, Length: 1}}, PositiveDeltas: []int64{1, 1, -1}, Timestamp: ts}}
	req := &writev2.Request{Timeseries: append([]*writev2.TimeSeries{ctr, gauge, hs, hc, nat}, hist...)}
	req.Symbols = st.Symbols()
	stats, err := api.Write(context.Background(), remote.WriteV2MessageType, req)
	if err != nil {
		t.Fatal(err)
	}
	if stats.Samples != 8 || stats.Histograms != 1 {
		t.Fatalf("written: %+v", stats)
	}
	md := got()[0]
	if md.ResourceMetrics().Len() != 1 {
		t.Fatalf("%d resources", md.ResourceMetrics().Len())
	}
	if a := attrs(md.ResourceMetrics().At(0).Resource().Attributes()); a != "service.instance.id=web:80,service.name=web,service.namespace=shop" {
		t.Fatalf("resource %s", a)
	}
	m := byName(md)
	c := m["web/http_requests_total"]
	if c.Type() != pmetric.MetricTypeSum || !c.Sum().IsMonotonic() || c.Description() != "Requests." {
		t.Fatalf("counter %v", c.Type())
	}
	cp := c.Sum().DataPoints().At(0)
	if cp.DoubleValue() != 42 || cp.Timestamp().AsTime().UnixMilli() != ts || cp.StartTimestamp().AsTime().UnixMilli() != ts-60000 || attrs(cp.Attributes()) != "code=200" {
		t.Fatalf("counter point %v %v %v %s", cp.DoubleValue(), cp.Timestamp(), cp.StartTimestamp(), attrs(cp.Attributes()))
	}
	g := m["web/mem_bytes"]
	if g.Type() != pmetric.MetricTypeGauge || g.Unit() != "bytes" || g.Gauge().DataPoints().Len() != 2 ||
		!g.Gauge().DataPoints().At(1).Flags().NoRecordedValue() || g.Gauge().DataPoints().At(0).Flags().NoRecordedValue() {
		t.Fatalf("gauge %v (staleness marker → no recorded value)", g.Type())
	}
	h := m["web/lat_seconds"]
	if h.Type() != pmetric.MetricTypeHistogram {
		t.Fatalf("classic histogram %v", h.Type())
	}
	hp := h.Histogram().DataPoints().At(0)
	if hp.Count() != 4 || hp.Sum() != 2.5 || !eqF(hp.ExplicitBounds().AsRaw(), []float64{0.1, 1}) || !eqU(hp.BucketCounts().AsRaw(), []uint64{1, 2, 1}) || attrs(hp.Attributes()) != "" {
		t.Fatalf("histogram point %d %v %v %v %s", hp.Count(), hp.Sum(), hp.ExplicitBounds().AsRaw(), hp.BucketCounts().AsRaw(), attrs(hp.Attributes()))
	}
	n := m["web/rpc_seconds"]
	if n.Type() != pmetric.MetricTypeExponentialHistogram {
		t.Fatalf("native histogram %v", n.Type())
	}
	np := n.ExponentialHistogram().DataPoints().At(0)
	// Prometheus buckets 1,2 then (gap 1) 4 with counts 1,2,1 → OTLP offset 0: [1,2,0,1]
	if np.Count() != 5 || np.Sum() != 7 || np.Scale() != 0 || np.ZeroCount() != 1 || np.Positive().Offset() != 0 || !eqU(np.Positive().BucketCounts().AsRaw(), []uint64{1, 2, 0, 1}) || np.ZeroThreshold() != 1e-128 {
		t.Fatalf("exponential point %d %v %d %d %d %v", np.Count(), np.Sum(), np.Scale(), np.ZeroCount(), np.Positive().Offset(), np.Positive().BucketCounts().AsRaw())
	}
}

// v1 encoding for the tests: prompb's field numbers.
type v1series struct {
	labels  []string
	samples [][2]float64 // value, timestamp
}

func encV1(ss []v1series, meta ...[3]any) []byte {
	var b []byte
	for _, s := range ss {
		var m []byte
		for i := 0; i < len(s.labels); i += 2 {
			var l []byte
			l = protowire.AppendTag(l, 1, protowire.BytesType)
			l = protowire.AppendString(l, s.labels[i])
			l = protowire.AppendTag(l, 2, protowire.BytesType)
			l = protowire.AppendString(l, s.labels[i+1])
			m = protowire.AppendTag(m, 1, protowire.BytesType)
			m = protowire.AppendBytes(m, l)
		}
		for _, sm := range s.samples {
			var x []byte
			x = protowire.AppendTag(x, 1, protowire.Fixed64Type)
			x = protowire.AppendFixed64(x, math.Float64bits(sm[0]))
			x = protowire.AppendTag(x, 2, protowire.VarintType)
			x = protowire.AppendVarint(x, uint64(int64(sm[1])))
			m = protowire.AppendTag(m, 2, protowire.BytesType)
			m = protowire.AppendBytes(m, x)
		}
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendBytes(b, m)
	}
	for _, md := range meta {
		var x []byte
		x = protowire.AppendTag(x, 1, protowire.VarintType)
		x = protowire.AppendVarint(x, uint64(md[0].(kind)))
		x = protowire.AppendTag(x, 2, protowire.BytesType)
		x = protowire.AppendString(x, md[1].(string))
		x = protowire.AppendTag(x, 4, protowire.BytesType)
		x = protowire.AppendString(x, md[2].(string))
		b = protowire.AppendTag(b, 3, protowire.BytesType)
		b = protowire.AppendBytes(b, x)
	}
	return b
}

func rw1(t testing.TB, body []byte, max int) ([]byte, error) {
	q := httptest.NewRequest(http.MethodPost, "/api/v1/write", nil)
	q.Header.Set("Content-Type", "application/x-protobuf")
	return RemoteWrite(q, body, nil, door.Limits{MaxBytes: max}, nil)
}

// TestRemoteWriteV1: untyped series are gauges (v1 has no types), typed
// by metadata in the same request when it comes; empty labels dropped.
func TestRemoteWriteV1(t *testing.T) {
	body := encV1([]v1series{
		{[]string{"__name__", "up", "instance", "a:9100", "job", "node", "empty", ""}, [][2]float64{{1, 1000}}},
		{[]string{"__name__", "req_total", "instance", "a:9100", "job", "node", "code", "500"}, [][2]float64{{7, 1000}, {8, 2000}}},
		{[]string{"__name__", "temp", "room", "a"}, [][2]float64{{21.5, 1000}}},
		{[]string{"__name__", "q", "quantile", "0.9", "job", "node", "instance", "a:9100"}, [][2]float64{{3, 1000}}},
		{[]string{"__name__", "q_count", "job", "node", "instance", "a:9100"}, [][2]float64{{10, 1000}}},
		{[]string{"__name__", "q_sum", "job", "node", "instance", "a:9100"}, [][2]float64{{20, 1000}}},
	}, [3]any{kCounter, "req_total", "Requests."}, [3]any{kSummary, "q", "Q."})
	pb, err := rw1(t, body, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	md := decode(t, pb)
	m := byName(md)
	if up := m["node/up"]; up.Type() != pmetric.MetricTypeGauge || attrs(up.Gauge().DataPoints().At(0).Attributes()) != "" {
		t.Fatalf("up %v %s", up.Type(), attrs(up.Gauge().DataPoints().At(0).Attributes()))
	}
	if v, _ := m["node/up"].Metadata().Get("prometheus.type"); v.Str() != "unknown" {
		t.Fatalf("untyped: %q", v.Str())
	}
	r := m["node/req_total"]
	if r.Type() != pmetric.MetricTypeSum || r.Sum().DataPoints().Len() != 2 || r.Sum().DataPoints().At(1).DoubleValue() != 8 || r.Description() != "Requests." {
		t.Fatalf("counter %v", r.Type())
	}
	if tp := m["/temp"]; tp.Type() != pmetric.MetricTypeGauge || attrs(tp.Gauge().DataPoints().At(0).Attributes()) != "room=a" {
		t.Fatalf("no job: %v", tp.Type())
	}
	q := m["node/q"]
	if q.Type() != pmetric.MetricTypeSummary || q.Summary().DataPoints().At(0).Count() != 10 || q.Summary().DataPoints().At(0).Sum() != 20 ||
		q.Summary().DataPoints().At(0).QuantileValues().At(0).Value() != 3 {
		t.Fatalf("summary %v", q.Type())
	}
	if md.ResourceMetrics().Len() != 2 {
		t.Fatalf("%d resources", md.ResourceMetrics().Len())
	}
}

// TestBounds: each bound refuses its request before allocation, naming it.
func TestBounds(t *testing.T) {
	many := []string{"__name__", "x"}
	for i := range MaxLabelsPerSeries + 1 {
		many = append(many, "l"+string(rune('a'+i%26))+strings.Repeat("x", i/26), "v")
	}
	if _, err := rw1(t, encV1([]v1series{{many, [][2]float64{{1, 1}}}}), 1<<20); err == nil || !strings.Contains(err.Error(), "labels") {
		t.Fatalf("label flood: %v", err)
	}
	if _, err := rw1(t, encV1([]v1series{{[]string{"__name__", "x", "a", strings.Repeat("v", MaxLabelValueBytes+1)}, [][2]float64{{1, 1}}}}), 1<<20); err == nil || !strings.Contains(err.Error(), "value of") {
		t.Fatalf("long value: %v", err)
	}
	var tiny []v1series
	for range 1000 {
		tiny = append(tiny, v1series{[]string{"__name__", "x"}, [][2]float64{{1, 1}}})
	}
	if _, err := rw1(t, encV1(tiny), 1000*minPointBytes-1); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "points") {
		t.Fatalf("series count: %v", err)
	}
	if _, err := rw1(t, encV1([]v1series{{[]string{"a", "b"}, nil}}), 1<<20); err == nil {
		t.Fatal("a series without a name accepted")
	}
}

func TestSeriesBound(t *testing.T) {
	defer func(n int) { MaxSeriesPerRequest = n }(MaxSeriesPerRequest)
	MaxSeriesPerRequest = 10
	var ss []v1series
	for range 11 {
		ss = append(ss, v1series{[]string{"__name__", "x"}, [][2]float64{{1, 1}}})
	}
	if _, err := rw1(t, encV1(ss), 1<<20); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "series") {
		t.Fatalf("series bound: %v", err)
	}
	if _, err := rw1(t, encV1(ss[:10]), 1<<20); err != nil {
		t.Fatal(err)
	}
}

// allocated is the bytes f allocates.
func allocated(f func()) uint64 {
	var a, b runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&a)
	f()
	runtime.ReadMemStats(&b)
	return b.TotalAlloc - a.TotalAlloc
}

// TestEmptyMessagesCostNothing: bodies of empty entries — a push of zero
// bytes (each an empty delimited MetricFamily), a text push of comment
// lines, a remote write of empty metadata entries — are refused (or read)
// without building a structure per entry: they allocated 1 GB, 91 MB and
// 384 MB from 8 MiB bodies that gzip to a few KB.
func TestEmptyMessagesCostNothing(t *testing.T) {
	const size = 8 << 20
	zeros := make([]byte, size)
	h := http.Header{"Content-Type": {"application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited"}}
	var err error
	if n := allocated(func() { _, err = decodeExposition(h, zeros, door.Limits{MaxBytes: size}) }); !errors.Is(err, ErrTooLarge) || n > 4<<20 {
		t.Fatalf("delimited empty families: %v, %d bytes allocated", err, n)
	}
	types := bytes.Repeat([]byte("# TYPE m counter\n"), size/17)
	if n := allocated(func() { _, err = decodeExposition(http.Header{}, types, door.Limits{MaxBytes: size}) }); !errors.Is(err, ErrTooLarge) || n > 4<<20 {
		t.Fatalf("text comment lines: %v, %d bytes allocated", err, n)
	}
	meta := bytes.Repeat([]byte{0x1a, 0x00}, size/2)
	if n := allocated(func() {
		_, err = convertRW(meta, nil, door.Limits{MaxBytes: size}, nil, false, "prometheus_remote_write")
	}); !errors.Is(err, ErrTooLarge) || n > 4<<20 {
		t.Fatalf("empty metadata entries: %v, %d bytes allocated", err, n)
	}
}
