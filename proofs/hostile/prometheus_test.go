package hostile

import (
	"bytes"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/s2"
	writev2 "github.com/prometheus/client_golang/exp/api/remote/genproto/v2"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/ferryhq/ferry/proofs/harness/agenttest"
	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
)

// promSeries is a remote write 1.0 TimeSeries: labels (name, value ...)
// and n samples.
func promSeries(b []byte, labels []string, n int) []byte {
	var m []byte
	for i := 0; i+1 < len(labels); i += 2 {
		var l []byte
		l = protowire.AppendTag(l, 1, protowire.BytesType)
		l = protowire.AppendString(l, labels[i])
		l = protowire.AppendTag(l, 2, protowire.BytesType)
		l = protowire.AppendString(l, labels[i+1])
		m = protowire.AppendTag(m, 1, protowire.BytesType)
		m = protowire.AppendBytes(m, l)
	}
	for i := range n {
		var s []byte
		s = protowire.AppendTag(s, 1, protowire.Fixed64Type)
		s = protowire.AppendFixed64(s, math.Float64bits(1))
		s = protowire.AppendTag(s, 2, protowire.VarintType)
		s = protowire.AppendVarint(s, uint64(i+1))
		m = protowire.AppendTag(m, 2, protowire.BytesType)
		m = protowire.AppendBytes(m, s)
	}
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	return protowire.AppendBytes(b, m)
}

// TestPrometheusDoorAttacks: the remote write and push doors of the real
// binary (memory_limit 64 MiB, max_request_bytes 31 MiB: a body and its
// conversion's reservation must fit the budget beside the good client's
// traffic, so the bodies stay under ~10 MB decoded) under a snappy
// bomb, a label flood, a flood of tiny series and a push of tiny samples,
// while a well-behaved client sends records; each is refused by its own
// bound (the answer names it: without the bound the request would pass, or
// hold ~100 bytes a series outside the budget), within the RSS bound.
func TestPrometheusDoorAttacks(t *testing.T) {
	brokers := kafkatest.Shared(t)
	goodTopic := kafkatest.NewTopic(t, brokers, "good-prom", 3)
	kafkatest.CreateTopicIfMissing(t, brokers, "otlp_metrics", 1)
	a := agenttest.Start(t, ferryBin, agentConfig(brokers), "receivers.otlp.doors=[prometheus_remote_write,prometheus_push]")
	otlp := "http://" + a.OTLP
	good := runGood("http://"+a.HTTP, goodTopic)
	is := func(r reply, code int, reason string) (string, bool) {
		return r.String(), r.err == nil && r.code == code && strings.Contains(r.body, reason)
	}
	const rw = "application/x-protobuf"

	attack(t, a, "Remote write snappy bomb: a 16-byte body declaring 1 GiB", func() (string, bool, string) {
		body := protowire.AppendVarint(nil, 1<<30) // the snappy block's decoded length
		body = append(body, bytes.Repeat([]byte{0}, 12)...)
		ans, ok := is(send(otlp+"/api/v1/write", rw, "snappy", body), 413, "")
		return ans, ok, "refused from the block header, before memory is reserved"
	}, nil)

	attack(t, a, "Remote write snappy bomb: 6 MB of one label value", func() (string, bool, string) {
		body := s2.EncodeSnappy(nil, promSeries(nil, []string{"__name__", "x", "v", strings.Repeat("a", 6<<20)}, 1))
		ans, ok := is(send(otlp+"/api/v1/write", rw, "snappy", body), 400, "value of")
		return ans, ok, fmt.Sprintf("%d KB on the wire; a label value is at most 16 KiB", len(body)>>10)
	}, nil)

	attack(t, a, "Remote write label flood: one series of 200,000 labels (snappy)", func() (string, bool, string) {
		labels := []string{"__name__", "x"}
		for i := range 200_000 {
			labels = append(labels, fmt.Sprintf("l%d", i), "v")
		}
		body := s2.EncodeSnappy(nil, promSeries(nil, labels, 1))
		ans, ok := is(send(otlp+"/api/v1/write", rw, "snappy", body), 400, "more than 256 labels")
		return ans, ok, fmt.Sprintf("%d KB on the wire; refused while counting, before anything is allocated", len(body)>>10)
	}, nil)

	attack(t, a, "Remote write: 300,000 tiny series of one sample (snappy)", func() (string, bool, string) {
		var b []byte
		one := promSeries(nil, []string{"__name__", "a"}, 1)
		for range 300_000 {
			b = append(b, one...)
		}
		body := s2.EncodeSnappy(nil, b)
		ans, ok := is(send(otlp+"/api/v1/write", rw, "snappy", body), 413, "series (at most 200000")
		return ans, ok, fmt.Sprintf("%d KB on the wire, %d MB decoded; ~30 MB of decoding state if kept", len(body)>>10, len(b)>>20)
	}, nil)

	attack(t, a, "Remote write 2.0: custom-bucket histograms, the second without buckets, sent 50 times", func() (string, bool, string) {
		// Before the fix each request panicked the conversion: net/http
		// recovered the handler, but the request's ~35 KB of reservations
		// stayed taken (resends drained the budget).
		st := writev2.NewSymbolTable()
		h := func(ts int64, spans ...*writev2.BucketSpan) *writev2.Histogram {
			return &writev2.Histogram{Count: &writev2.Histogram_CountFloat{CountFloat: 1}, Schema: -53, CustomValues: []float64{1, 2},
				PositiveSpans: spans, PositiveCounts: make([]float64, len(spans)), Timestamp: ts}
		}
		ser := &writev2.TimeSeries{LabelsRefs: st.SymbolizeLabels([]string{"__name__", "c"}, nil),
			Histograms: []*writev2.Histogram{h(1, &writev2.BucketSpan{Length: 1}), h(2)}}
		pb, err := (&writev2.Request{Symbols: st.Symbols(), Timeseries: []*writev2.TimeSeries{ser}}).MarshalVT()
		if err != nil {
			return err.Error(), false, ""
		}
		var ans string
		for range 50 {
			r := send(otlp+"/api/v1/write", rw+";proto=io.prometheus.write.v2.Request", "snappy", s2.EncodeSnappy(nil, pb))
			var ok bool
			if ans, ok = is(r, 204, ""); !ok {
				return ans, false, "each converted (the empty one's buckets all zero)"
			}
		}
		return ans, true, "each converted (the empty one's buckets all zero); found by the fuzz smoke"
	}, nil)

	attack(t, a, "Push: 1 M one-letter samples", func() (string, bool, string) {
		var b bytes.Buffer
		for i := range 1_000_000 {
			fmt.Fprintf(&b, "%c%d 1\n", 'a'+i%26, i)
		}
		ans, ok := is(send(otlp+"/metrics/job/flood", "text/plain; version=0.0.4", "", b.Bytes()), 413, "receivers.otlp.max_items_per_request")
		return ans, ok, fmt.Sprintf("%d MB; counted before the text is parsed (max_items_per_request, then the push's own bound; a parsed sample costs a few hundred bytes)", b.Len()>>20)
	}, nil)

	good.stop()
	time.Sleep(time.Second)
	if good.n.Load() == 0 {
		t.Fatalf("the well-behaved client had nothing accepted (%d refused)", good.refused.Load())
	}
}
