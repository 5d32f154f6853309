package prom

import (
	"fmt"
	"testing"

	writev2 "github.com/prometheus/client_golang/exp/api/remote/genproto/v2"

	"github.com/ferryhq/ferry/otlp/door"
)

// Prometheus's own shape: 2000 series (max_samples_per_send), one sample
// each, ~10 labels, the job and instance of a few targets.
func benchV1() []byte {
	var ss []v1series
	for i := range 2000 {
		ss = append(ss, v1series{[]string{"__name__", fmt.Sprintf("metric_%d_total", i%50), "cpu", fmt.Sprint(i % 16), "instance", fmt.Sprintf("host-%d:9100", i%4),
			"job", "node", "mode", "idle", "region", "ap-guangzhou", "zone", "ap-guangzhou-3", "series", fmt.Sprint(i)}, [][2]float64{{float64(i), 1700000000000}}})
	}
	return encV1(ss)
}

func benchV2() []byte {
	st := writev2.NewSymbolTable()
	var ts []*writev2.TimeSeries
	for i := range 2000 {
		lb := []string{"__name__", fmt.Sprintf("metric_%d_total", i%50), "cpu", fmt.Sprint(i % 16), "instance", fmt.Sprintf("host-%d:9100", i%4),
			"job", "node", "mode", "idle", "region", "ap-guangzhou", "zone", "ap-guangzhou-3", "series", fmt.Sprint(i)}
		ts = append(ts, &writev2.TimeSeries{LabelsRefs: st.SymbolizeLabels(lb, nil), Samples: []*writev2.Sample{{Value: float64(i), Timestamp: 1700000000000}},
			Metadata: &writev2.Metadata{Type: writev2.Metadata_METRIC_TYPE_COUNTER}})
	}
	b, _ := (&writev2.Request{Symbols: st.Symbols(), Timeseries: ts}).MarshalVT()
	return b
}

func benchRW(b *testing.B, body []byte, v2 bool) {
	dst := make([]byte, 0, RemoteWriteAmplify*len(body))
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if v2 {
			_, err = rw2(b, body, cap(dst))
		} else {
			_, err = convertRW(body, dst[:0], door.Limits{MaxBytes: cap(dst)}, nil, false, "prometheus_remote_write")
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(2000*b.N)/b.Elapsed().Seconds(), "samples/s")
}

func BenchmarkRemoteWriteV1_2000Samples(b *testing.B) { benchRW(b, benchV1(), false) }
func BenchmarkRemoteWriteV2_2000Samples(b *testing.B) { benchRW(b, benchV2(), true) }

func BenchmarkPushText_2000Samples(b *testing.B) {
	var body []byte
	for i := range 2000 {
		body = fmt.Appendf(body, "metric_%d_total{cpu=\"%d\",mode=\"idle\",series=\"%d\"} %d\n", i%50, i%16, i, i)
	}
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := convertCase(b, "push", body, PushAmplify*len(body)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(2000*b.N)/b.Elapsed().Seconds(), "samples/s")
}
