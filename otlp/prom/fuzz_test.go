package prom

import (
	"errors"
	"math"
	"net/http"
	"net/http/httptest"
	"testing"

	writev2 "github.com/prometheus/client_golang/exp/api/remote/genproto/v2"

	"github.com/ferryhq/ferry/otlp/door"
)

// checkOut: no panic (the fuzzer's), the output within the door's
// reservation and valid OTLP, or an error; and convert (the same request
// with a limit of 3 items) refuses it exactly when it has more than 3
// data points.
func checkOut(t *testing.T, body, out []byte, err error, max int, convert func(door.Limits) ([]byte, error)) {
	if err != nil {
		if errors.Is(err, ErrTooLarge) && len(out) != 0 {
			t.Fatalf("an error with output")
		}
		return
	}
	if len(out) > max {
		t.Fatalf("%d bytes out of %d in, past the reservation %d", len(out), len(body), max)
	}
	n := decode(t, out).DataPointCount()
	_, lerr := convert(door.Limits{MaxBytes: max, MaxItems: 3})
	if errors.Is(lerr, door.ErrTooManyItems) != (n > 3) || lerr != nil && !errors.Is(lerr, door.ErrTooManyItems) {
		t.Fatalf("%d points, limit 3: %v", n, lerr)
	}
}

// FuzzRemoteWrite: v1 and v2 bodies (the first byte picks) never panic,
// convert within RemoteWriteAmplify × their size, into valid OTLP.
func FuzzRemoteWrite(f *testing.F) {
	f.Add(byte(0), encV1([]v1series{
		{[]string{"__name__", "up", "instance", "a:1", "job", "j"}, [][2]float64{{1, 1000}, {math.Float64frombits(staleNaN), 2000}}},
		{[]string{"__name__", "h_bucket", "le", "1"}, [][2]float64{{1, 1}}},
		{[]string{"__name__", "h_count"}, [][2]float64{{1, 1}}},
	}, [3]any{kHistogram, "h", "H."}))
	st := writev2.NewSymbolTable()
	nat := &writev2.TimeSeries{LabelsRefs: st.SymbolizeLabels([]string{"__name__", "n", "job", "a/b"}, nil),
		Histograms: []*writev2.Histogram{{Count: &writev2.Histogram_CountInt{CountInt: 3}, Schema: 2,
			PositiveSpans: []*writev2.BucketSpan{{Offset: -2, Length: 2}, {Offset: 3, Length: 1}}, PositiveDeltas: []int64{1, 0, 1},
			NegativeSpans: []*writev2.BucketSpan{{Offset: 0, Length: 1}}, NegativeDeltas: []int64{1}}},
		Metadata: &writev2.Metadata{Type: writev2.Metadata_METRIC_TYPE_HISTOGRAM}}
	cb := &writev2.TimeSeries{LabelsRefs: st.SymbolizeLabels([]string{"__name__", "c"}, nil),
		Histograms: []*writev2.Histogram{{Count: &writev2.Histogram_CountFloat{CountFloat: 3}, Schema: -53, CustomValues: []float64{1, 2},
			PositiveSpans: []*writev2.BucketSpan{{Offset: 0, Length: 3}}, PositiveCounts: []float64{1, 1, 1}}}}
	sm := &writev2.TimeSeries{LabelsRefs: st.SymbolizeLabels([]string{"__name__", "s", "quantile", "0.5"}, nil), Samples: []*writev2.Sample{{Value: 1, Timestamp: 5}},
		Metadata: &writev2.Metadata{Type: writev2.Metadata_METRIC_TYPE_SUMMARY}}
	b, _ := (&writev2.Request{Symbols: st.Symbols(), Timeseries: []*writev2.TimeSeries{nat, cb, sm}}).MarshalVT()
	f.Add(byte(1), b)
	for _, c := range amplificationCases()[:2] {
		f.Add(byte(0), c.body[:min(len(c.body), 4096)])
	}
	f.Fuzz(func(t *testing.T, v byte, body []byte) {
		q := httptest.NewRequest(http.MethodPost, "/api/v1/write", nil)
		if v&1 == 1 {
			q.Header.Set("Content-Type", "application/x-protobuf;proto=io.prometheus.write.v2.Request")
		}
		max := RemoteWriteAmplify*len(body) + 4096
		out, err := RemoteWrite(q, body, nil, door.Limits{MaxBytes: max}, &door.Stats{})
		checkOut(t, body, out, err, max, func(lim door.Limits) ([]byte, error) { return RemoteWrite(q, body, nil, lim, nil) })
	})
}

// FuzzPush: text and delimited protobuf pushes (the first byte picks)
// never panic, convert within PushAmplify × their size, into valid OTLP.
func FuzzPush(f *testing.F) {
	f.Add(byte(0), []byte("# TYPE c counter\nc_total{a=\"b\"} 3\n# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 3\nh_count 2\n# TYPE s summary\ns{quantile=\"0.5\"} 1\ns_sum 1\ns_count 1\ng 1.5 1700000000000\n"))
	f.Add(byte(1), []byte{0x0a, 0x0a, 0x01, 'a', 0x18, 0x01, 0x22, 0x05, 0x1a, 0x03, 0x09, 0, 0})
	f.Fuzz(func(t *testing.T, v byte, body []byte) {
		q := httptest.NewRequest(http.MethodPut, "/metrics/job/j/instance/i", nil)
		if v&1 == 1 {
			q.Header.Set("Content-Type", "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited")
		} else {
			q.Header.Set("Content-Type", "text/plain; version=0.0.4")
		}
		max := PushAmplify*len(body) + 4096
		out, err := Push(q, body, nil, door.Limits{MaxBytes: max}, &door.Stats{})
		checkOut(t, body, out, err, max, func(lim door.Limits) ([]byte, error) { return Push(q, body, nil, lim, nil) })
	})
}
