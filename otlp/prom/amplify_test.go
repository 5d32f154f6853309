package prom

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	writev2 "github.com/prometheus/client_golang/exp/api/remote/genproto/v2"

	"github.com/ferryhq/ferry/otlp/door"
)

func rw2(t testing.TB, body []byte, max int) ([]byte, error) {
	q := httptest.NewRequest(http.MethodPost, "/api/v1/write", nil)
	q.Header.Set("Content-Type", "application/x-protobuf;proto=io.prometheus.write.v2.Request")
	return RemoteWrite(q, body, nil, door.Limits{MaxBytes: max}, nil)
}

func name(i int) string { // short distinct metric names: a, b, ..., ba, bb, ...
	const l = "abcdefghijklmnopqrstuvwxyz"
	s := ""
	for {
		s = string(l[i%26]) + s
		i /= 26
		if i == 0 {
			return s
		}
	}
}

// worst cases of each door, measured: the ratio of OTLP to body bytes.
func amplificationCases() []struct {
	name   string
	door   string
	body   []byte
	within bool // whether the door's Amplify must hold it (false: refused by design)
} {
	type c = struct {
		name   string
		door   string
		body   []byte
		within bool
	}
	var out []c
	// v1: many tiny series, each its own metric, one sample.
	var tiny []v1series
	for i := range 5000 {
		tiny = append(tiny, v1series{[]string{"__name__", name(i)}, [][2]float64{{1, 1}}})
	}
	out = append(out, c{"v1 tiny series, distinct names", "rw", encV1(tiny), true})
	// v1: many labels of one letter, empty-ish values.
	var flood []v1series
	for range 200 {
		l := []string{"__name__", "a"}
		for j := range 100 {
			l = append(l, name(j), "v")
		}
		flood = append(flood, v1series{l, [][2]float64{{1, 1}}})
	}
	out = append(out, c{"v1 100 one-letter labels a series", "rw", encV1(flood), true})
	// v1: one series, many samples (labels repeated in every point).
	l := []string{"__name__", "a"}
	for j := range 20 {
		l = append(l, name(j)+"xxxx", "vvvvvvvv")
	}
	var samples [][2]float64
	for i := range 2000 {
		samples = append(samples, [2]float64{1, float64(i)})
	}
	out = append(out, c{"v1 one series of 20 labels, 2000 samples", "rw", encV1([]v1series{{l, samples}}), true})
	// v2, realistic: node-exporter-like series of 8 labels from a shared
	// symbol table, one sample each.
	st := writev2.NewSymbolTable()
	var ts []*writev2.TimeSeries
	for i := range 2000 {
		lb := []string{"__name__", "node_cpu_seconds_total", "cpu", fmt.Sprint(i % 16), "instance", "host-17.example:9100", "job", "node",
			"mode", []string{"idle", "user", "system", "iowait"}[i%4], "region", "ap-guangzhou", "zone", "ap-guangzhou-3", "series", fmt.Sprint(i)}
		ts = append(ts, &writev2.TimeSeries{LabelsRefs: st.SymbolizeLabels(lb, nil), Samples: []*writev2.Sample{{Value: float64(i), Timestamp: 1700000000000}},
			Metadata: &writev2.Metadata{Type: writev2.Metadata_METRIC_TYPE_COUNTER}})
	}
	b, _ := (&writev2.Request{Symbols: st.Symbols(), Timeseries: ts}).MarshalVT()
	out = append(out, c{"v2 realistic (8 labels from shared symbols)", "rw2", b, true})
	// v2, hostile: a 1 KiB symbol referenced by every series.
	st = writev2.NewSymbolTable()
	ts = nil
	long := strings.Repeat("x", 1024)
	for range 2000 {
		ts = append(ts, &writev2.TimeSeries{LabelsRefs: st.SymbolizeLabels([]string{"__name__", "a", "l", long}, nil), Samples: []*writev2.Sample{{Value: 1}}})
	}
	b, _ = (&writev2.Request{Symbols: st.Symbols(), Timeseries: ts}).MarshalVT()
	out = append(out, c{"v2 hostile (1 KiB symbol in every series)", "rw2", b, false})
	// push: one-letter untyped samples.
	var sb strings.Builder
	for i := range 5000 {
		fmt.Fprintf(&sb, "%s 1\n", name(i))
	}
	out = append(out, c{"push tiny untyped samples", "push", []byte(sb.String()), true})
	sb.Reset()
	for i := range 2000 {
		fmt.Fprintf(&sb, "a{%s=\"v\"} 1\n", name(i))
	}
	out = append(out, c{"push one-label samples", "push", []byte(sb.String()), true})
	return out
}

func convertCase(t testing.TB, which string, body []byte, max int) ([]byte, error) {
	switch which {
	case "rw":
		return rw1(t, body, max)
	case "rw2":
		return rw2(t, body, max)
	}
	q := httptest.NewRequest(http.MethodPut, "/metrics/job/j", nil)
	q.Header.Set("Content-Type", "text/plain; version=0.0.4")
	return Push(q, body, nil, door.Limits{MaxBytes: max}, nil)
}

// TestAmplification: each worst case converts within its door's Amplify,
// or (the hostile v2 case) is refused by the reservation, ErrTooLarge.
func TestAmplification(t *testing.T) {
	for _, tc := range amplificationCases() {
		amp := RemoteWriteAmplify
		if tc.door == "push" {
			amp = PushAmplify
		}
		out, err := convertCase(t, tc.door, tc.body, 1<<30)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		ratio := float64(len(out)) / float64(len(tc.body))
		t.Logf("%-48s body %7d B → OTLP %8d B: %5.2f×", tc.name, len(tc.body), len(out), ratio)
		_, err = convertCase(t, tc.door, tc.body, amp*len(tc.body)+4096)
		if tc.within && (ratio > float64(amp) || err != nil) {
			t.Errorf("%s: %.2f× passes Amplify %d (%v)", tc.name, ratio, amp, err)
		}
		if !tc.within && err != ErrTooLarge {
			t.Errorf("%s: not refused within its reservation: %v", tc.name, err)
		}
	}
}
