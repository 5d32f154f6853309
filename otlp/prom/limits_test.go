package prom

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	writev2 "github.com/prometheus/client_golang/exp/api/remote/genproto/v2"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/ferryhq/ferry/otlp/door"
)

// points counts the data points of a converted request.
func points(t testing.TB, pb []byte) int {
	md := decode(t, pb)
	return md.DataPointCount()
}

func rwLim(v2 bool, body []byte, lim door.Limits, st *door.Stats) ([]byte, error) {
	q := httptest.NewRequest(http.MethodPost, "/api/v1/write", nil)
	q.Header.Set("Content-Type", "application/x-protobuf")
	if v2 {
		q.Header.Set("Content-Type", "application/x-protobuf;proto=io.prometheus.write.v2.Request")
	}
	return RemoteWrite(q, body, nil, lim, st)
}

const delimited = "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited"

func pushLim(ct string, body []byte, lim door.Limits, st *door.Stats) ([]byte, error) {
	q := httptest.NewRequest(http.MethodPut, "/metrics/job/j", nil)
	q.Header.Set("Content-Type", ct)
	return Push(q, body, nil, lim, st)
}

// gauges is a v1 request of n series of one sample each.
func gauges(n int) []byte {
	var ss []v1series
	for i := range n {
		ss = append(ss, v1series{[]string{"__name__", "g", "i", fmt.Sprint(i)}, [][2]float64{{1, 1000}}})
	}
	return encV1(ss)
}

// TestRemoteWriteMaxItems: lim.MaxItems bounds the data points of the
// converted request, exactly: a classic histogram's bucket, _sum and
// _count samples are one point, gauge histograms none; past it the request
// is refused with door.ErrTooManyItems, as soon as the samples that must
// each be a point pass it: 1,000,000 samples against a limit of 10 are
// refused allocating next to nothing, 100,000 series the series table's
// first size (seriesPrealloc), not one entry a series.
func TestRemoteWriteMaxItems(t *testing.T) {
	lim := door.Limits{MaxBytes: 1 << 30, MaxItems: 10}
	if pb, err := rwLim(false, gauges(10), lim, nil); err != nil || points(t, pb) != 10 {
		t.Fatalf("10 points of 10: %v", err)
	}
	if _, err := rwLim(false, gauges(11), lim, nil); !errors.Is(err, door.ErrTooManyItems) {
		t.Fatalf("11 points of 10: %v", err)
	}
	// 12 samples, 3 histogram points (one without _count, dropped) and 20
	// gauge histogram samples: 2 points.
	var ss []v1series
	for ts := 1.0; ts <= 3; ts++ {
		ss = append(ss, v1series{[]string{"__name__", "h_bucket", "le", "1"}, [][2]float64{{1, ts}}},
			v1series{[]string{"__name__", "h_bucket", "le", "+Inf"}, [][2]float64{{2, ts}}},
			v1series{[]string{"__name__", "h_sum"}, [][2]float64{{3, ts}}})
		if ts < 3 {
			ss = append(ss, v1series{[]string{"__name__", "h_count"}, [][2]float64{{2, ts}}})
		}
	}
	for i := range 20 {
		ss = append(ss, v1series{[]string{"__name__", "gh_bucket", "le", fmt.Sprint(i)}, [][2]float64{{1, 1}}})
	}
	body := encV1(ss, [3]any{kHistogram, "h", "H."}, [3]any{kGaugeHistogram, "gh", "GH."})
	if pb, err := rwLim(false, body, door.Limits{MaxBytes: 1 << 30, MaxItems: 2}, nil); err != nil || points(t, pb) != 2 {
		t.Fatalf("2 histogram points of 2: %v", err)
	}
	if _, err := rwLim(false, body, door.Limits{MaxBytes: 1 << 30, MaxItems: 1}, nil); !errors.Is(err, door.ErrTooManyItems) {
		t.Fatalf("2 histogram points of 1: %v", err)
	}
	// v2
	st := writev2.NewSymbolTable()
	var ts []*writev2.TimeSeries
	for i := range 11 {
		ts = append(ts, &writev2.TimeSeries{LabelsRefs: st.SymbolizeLabels([]string{"__name__", "g", "i", fmt.Sprint(i)}, nil), Samples: []*writev2.Sample{{Value: 1, Timestamp: 1}}})
	}
	v2, _ := (&writev2.Request{Symbols: st.Symbols(), Timeseries: ts}).MarshalVT()
	if _, err := rwLim(true, v2, lim, nil); !errors.Is(err, door.ErrTooManyItems) {
		t.Fatalf("v2: 11 points of 10: %v", err)
	}
	if _, err := rwLim(true, v2, door.Limits{MaxBytes: 1 << 30, MaxItems: 11}, nil); err != nil {
		t.Fatalf("v2: 11 points of 11: %v", err)
	}
	// 1,000,000 samples of one series, then 100,000 series of one sample.
	samples := make([][2]float64, 1000000)
	for i := range samples {
		samples[i] = [2]float64{1, float64(i)}
	}
	for name, body := range map[string][]byte{"1,000,000 samples": encV1([]v1series{{[]string{"__name__", "g"}, samples}}), "100,000 series": gauges(100000)} {
		var err error
		if a := allocated(func() { _, err = rwLim(false, body, lim, nil) }); !errors.Is(err, door.ErrTooManyItems) || a > 256<<10 {
			t.Fatalf("%s against 10: %v, %d bytes allocated", name, err, a)
		}
	}
}

// TestPushMaxItems: a push of more data points than lim.MaxItems is
// refused with door.ErrTooManyItems: delimited protobuf from its count of
// metrics, before a family is decoded; text from its sample lines when no
// line declares a histogram or summary (whose lines merge into points),
// else once parsed, before anything is written.
func TestPushMaxItems(t *testing.T) {
	lim := door.Limits{MaxBytes: 1 << 30, MaxItems: 10}
	lines := func(n int) []byte {
		var b []byte
		for i := range n {
			b = fmt.Appendf(b, "m{i=\"%d\"} 1\n", i)
		}
		return b
	}
	if pb, err := pushLim("text/plain", lines(10), lim, nil); err != nil || points(t, pb) != 10 {
		t.Fatalf("text: 10 points of 10: %v", err)
	}
	if _, err := pushLim("text/plain", lines(11), lim, nil); !errors.Is(err, door.ErrTooManyItems) {
		t.Fatalf("text: 11 points of 10: %v", err)
	}
	hist := []byte("# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 3\nh_count 2\n" +
		"h_bucket{le=\"1\",a=\"b\"} 1\nh_bucket{le=\"+Inf\",a=\"b\"} 2\nh_sum{a=\"b\"} 3\nh_count{a=\"b\"} 2\n")
	if pb, err := pushLim("text/plain", hist, door.Limits{MaxBytes: 1 << 30, MaxItems: 2}, nil); err != nil || points(t, pb) != 2 {
		t.Fatalf("text: 2 histogram points (8 lines) of 2: %v", err)
	}
	if _, err := pushLim("text/plain", hist, door.Limits{MaxBytes: 1 << 30, MaxItems: 1}, nil); !errors.Is(err, door.ErrTooManyItems) {
		t.Fatalf("text: 2 histogram points of 1: %v", err)
	}
	// delimited: one family of n metrics.
	fam := func(n int, typ uint64) []byte {
		var m []byte
		m = protowire.AppendTag(m, 1, protowire.BytesType)
		m = protowire.AppendString(m, "m")
		m = protowire.AppendTag(m, 3, protowire.VarintType)
		m = protowire.AppendVarint(m, typ)
		for range n {
			m = protowire.AppendTag(m, 4, protowire.BytesType)
			m = protowire.AppendBytes(m, []byte{0x22, 0x09, 0x09, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f}) // untyped {value 1}
		}
		return protowire.AppendBytes(nil, m)
	}
	if pb, err := pushLim(delimited, fam(10, 3), lim, nil); err != nil || points(t, pb) != 10 {
		t.Fatalf("delimited: 10 points of 10: %v", err)
	}
	if _, err := pushLim(delimited, fam(11, 3), lim, nil); !errors.Is(err, door.ErrTooManyItems) {
		t.Fatalf("delimited: 11 points of 10: %v", err)
	}
	if _, err := pushLim(delimited, fam(11, 5), lim, nil); err != nil { // gauge histograms: dropped, not points
		t.Fatalf("delimited: 11 gauge histograms of 10: %v", err)
	}
	for name, c := range map[string]struct {
		ct   string
		body []byte
	}{"text": {"text/plain", bytes.Repeat([]byte("a 1\n"), 1000000)}, "delimited": {delimited, fam(1000000, 3)}} {
		var err error
		if a := allocated(func() { _, err = pushLim(c.ct, c.body, lim, nil) }); !errors.Is(err, door.ErrTooManyItems) || a > 64<<10 {
			t.Fatalf("%s: 1,000,000 points against 10: %v, %d bytes allocated", name, err, a)
		}
	}
}

// exemplars appends n exemplars (field) to a series message.
func withExemplars(series []byte, field protowire.Number, n int) []byte {
	for range n {
		series = protowire.AppendTag(series, field, protowire.BytesType)
		series = protowire.AppendBytes(series, []byte{0x11, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f}) // value 1
	}
	return series
}

// TestRemoteWriteDropped: what the mapping leaves out is counted by reason:
// gauge histogram samples (classic and native), histogram points without
// _count, exemplars (v1 and v2), a series' float samples beside its native
// histograms, native histograms of a schema OTLP has not, a second
// target_info of a resource.
func TestRemoteWriteDropped(t *testing.T) {
	body := encV1([]v1series{
		{[]string{"__name__", "gh_bucket", "le", "1"}, [][2]float64{{1, 1}, {1, 2}}},
		{[]string{"__name__", "h_bucket", "le", "1"}, [][2]float64{{1, 1}}},
		{[]string{"__name__", "h_sum"}, [][2]float64{{1, 1}}},
		{[]string{"__name__", "target_info", "job", "j", "a", "1"}, [][2]float64{{1, 1}}},
		{[]string{"__name__", "target_info", "job", "j", "a", "2"}, [][2]float64{{1, 1}}},
		{[]string{"__name__", "up", "job", "j"}, [][2]float64{{1, 1}}},
	}, [3]any{kGaugeHistogram, "gh", ""}, [3]any{kHistogram, "h", ""})
	// the last series (up) gets 3 exemplars: its message is the body's last
	// field 1, rebuilt.
	var last []byte
	_ = fields(body, func(num protowire.Number, _ protowire.Type, _ uint64, b []byte) error {
		if num == 1 {
			last = b
		}
		return nil
	})
	i := bytes.Index(body, last)
	rest := body[i+len(last):]
	head := body[:i]
	head = head[:len(head)-protowire.SizeVarint(uint64(len(last)))-1]
	ex := withExemplars(append([]byte(nil), last...), 3, 3)
	body = append(protowire.AppendBytes(protowire.AppendTag(append([]byte(nil), head...), 1, protowire.BytesType), ex), rest...)
	var st door.Stats
	pb, err := rwLim(false, body, door.Limits{MaxBytes: 1 << 20}, &st)
	if err != nil {
		t.Fatal(err)
	}
	var want door.Stats
	want.Dropped[door.GaugeHistogram] = 2
	want.Dropped[door.NoCount] = 1
	want.Dropped[door.TargetInfo] = 1
	want.Dropped[door.Exemplar] = 3
	if st != want {
		t.Fatalf("v1: dropped %v, want %v", st.Dropped, want.Dropped)
	}
	if points(t, pb) != 1 {
		t.Fatalf("%d points", points(t, pb))
	}

	sym := writev2.NewSymbolTable()
	ts := []*writev2.TimeSeries{
		{LabelsRefs: sym.SymbolizeLabels([]string{"__name__", "n"}, nil), Samples: []*writev2.Sample{{Value: 1, Timestamp: 1}, {Value: 2, Timestamp: 2}},
			Histograms: []*writev2.Histogram{{Count: &writev2.Histogram_CountInt{CountInt: 1}, Schema: 1, Timestamp: 1},
				{Count: &writev2.Histogram_CountInt{CountInt: 1}, Schema: 1, Timestamp: 2, ResetHint: writev2.Histogram_RESET_HINT_GAUGE},
				{Count: &writev2.Histogram_CountInt{CountInt: 1}, Schema: 20, Timestamp: 3}}},
		{LabelsRefs: sym.SymbolizeLabels([]string{"__name__", "g"}, nil), Samples: []*writev2.Sample{{Value: 1, Timestamp: 1}},
			Exemplars: []*writev2.Exemplar{{Value: 1}, {Value: 2}}},
	}
	v2, _ := (&writev2.Request{Symbols: sym.Symbols(), Timeseries: ts}).MarshalVT()
	st = door.Stats{}
	if _, err := rwLim(true, v2, door.Limits{MaxBytes: 1 << 20}, &st); err != nil {
		t.Fatal(err)
	}
	want = door.Stats{}
	want.Dropped[door.MixedSeries] = 2
	want.Dropped[door.GaugeHistogram] = 1
	want.Dropped[door.BadNativeHistogram] = 1
	want.Dropped[door.Exemplar] = 2
	if st != want {
		t.Fatalf("v2: dropped %v, want %v", st.Dropped, want.Dropped)
	}
}

// TestPushDropped: a pushed gauge histogram's points, exemplars (of a
// counter, of buckets, of a native histogram), a histogram's native
// buckets are counted.
func TestPushDropped(t *testing.T) {
	one, two := 1.0, 2.0
	var body []byte
	for _, f := range []*dto.MetricFamily{
		{Name: proto.String("gh"), Type: dto.MetricType_GAUGE_HISTOGRAM.Enum(), Metric: []*dto.Metric{{Histogram: &dto.Histogram{}}, {Histogram: &dto.Histogram{}}}},
		{Name: proto.String("c"), Type: dto.MetricType_COUNTER.Enum(), Metric: []*dto.Metric{{Counter: &dto.Counter{Value: &one, Exemplar: &dto.Exemplar{Value: &one}}}}},
		{Name: proto.String("h"), Type: dto.MetricType_HISTOGRAM.Enum(), Metric: []*dto.Metric{{Histogram: &dto.Histogram{
			SampleCount: proto.Uint64(2), SampleSum: &two, Schema: proto.Int32(3), PositiveSpan: []*dto.BucketSpan{{Offset: proto.Int32(0), Length: proto.Uint32(1)}}, PositiveDelta: []int64{2},
			Bucket:    []*dto.Bucket{{UpperBound: &one, CumulativeCount: proto.Uint64(1), Exemplar: &dto.Exemplar{Value: &one}}},
			Exemplars: []*dto.Exemplar{{Value: &two}}}}}},
	} {
		m, err := proto.Marshal(f)
		if err != nil {
			t.Fatal(err)
		}
		body = protowire.AppendBytes(body, m)
	}
	var st door.Stats
	pb, err := pushLim(delimited, body, door.Limits{MaxBytes: 1 << 20}, &st)
	if err != nil {
		t.Fatal(err)
	}
	var want door.Stats
	want.Dropped[door.GaugeHistogram] = 2
	want.Dropped[door.Exemplar] = 3
	want.Dropped[door.NativeBuckets] = 1
	if st != want {
		t.Fatalf("dropped %v, want %v", st.Dropped, want.Dropped)
	}
	if points(t, pb) != 2 {
		t.Fatalf("%d points", points(t, pb))
	}
}

// TestLongSeriesLinear: a series of many samples costs time linear in
// them. Each point's attributes were read by walking its series' whole
// message, samples included: 40,000 samples of one series (580 KB) took
// 28 s, quadratic.
func TestLongSeriesLinear(t *testing.T) {
	samples := make([][2]float64, 50000)
	for i := range samples {
		samples[i] = [2]float64{1, float64(i)}
	}
	body := encV1([]v1series{{[]string{"__name__", "g", "a", "b"}, samples}})
	t0 := time.Now()
	pb, err := rwLim(false, body, door.Limits{MaxBytes: 64 * len(body)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t0); d > 5*time.Second {
		t.Fatalf("50,000 samples of one series took %v", d)
	}
	if p := decode(t, pb).ResourceMetrics().At(0).ScopeMetrics().At(0).Metrics().At(0).Gauge().DataPoints(); p.Len() != 50000 || attrs(p.At(49999).Attributes()) != "a=b" {
		t.Fatalf("%d points", p.Len())
	}
	// labels after the samples, or among them, still label the points.
	late := encV1([]v1series{{nil, [][2]float64{{1, 1}, {2, 2}}}})
	late = late[:0:0]
	var m []byte
	for _, l := range [][2]string{{"__name__", "g"}, {"a", "b"}} {
		m = protowire.AppendTag(m, 2, protowire.BytesType)
		m = protowire.AppendBytes(m, []byte{0x09, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f, 0x10, 0x01})
		var lb []byte
		lb = protowire.AppendTag(lb, 1, protowire.BytesType)
		lb = protowire.AppendString(lb, l[0])
		lb = protowire.AppendTag(lb, 2, protowire.BytesType)
		lb = protowire.AppendString(lb, l[1])
		m = protowire.AppendTag(m, 1, protowire.BytesType)
		m = protowire.AppendBytes(m, lb)
	}
	late = protowire.AppendBytes(protowire.AppendTag(late, 1, protowire.BytesType), m)
	pb, err = rwLim(false, late, door.Limits{MaxBytes: 1 << 20}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if p := decode(t, pb).ResourceMetrics().At(0).ScopeMetrics().At(0).Metrics().At(0).Gauge().DataPoints(); p.Len() != 2 || attrs(p.At(1).Attributes()) != "a=b" {
		t.Fatalf("labels among samples: %d points", p.Len())
	}
}
