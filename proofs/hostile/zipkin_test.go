package hostile

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/otlp/zipkin"
	"github.com/ferryhq/ferry/proofs/harness/agenttest"
	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
	"github.com/ferryhq/ferry/proofs/harness/payloads"
)

// TestZipkinAttacks: the zipkin door (receivers.otlp.doors) refuses what
// would make the translator's heap grow past the agent's bound, counted
// before any span is decoded: a tag flood in one span (without
// MaxEntriesPerSpan, encoding/json's map, the translator's copy of it and
// the attributes take several hundred MiB), a request of a million tiny
// spans (max_items_per_request, 100,000 by default, counted by the scan;
// MaxSpans behind it) and JSON nested a million levels deep.
func TestZipkinAttacks(t *testing.T) {
	brokers := kafkatest.Shared(t)
	kafkatest.CreateTopicIfMissing(t, brokers, "otlp_spans", 1)
	a := agenttest.Start(t, ferryBin, agentConfig(brokers), "receivers.otlp.doors=[zipkin]")
	url := "http://" + a.OTLP + "/api/v2/spans"
	spansBefore := a.Metric(`ferry_receiver_received_records_total{receiver="zipkin",topic="otlp_spans"}`)
	forged := func() int64 {
		return int64(a.Metric(`ferry_receiver_received_records_total{receiver="zipkin",topic="otlp_spans"}`) - spansBefore)
	}
	is := func(r reply, code int, text string) (string, bool) {
		return fmt.Sprintf("%d %s", r.code, strings.TrimSpace(r.body)), r.err == nil && r.code == code && strings.Contains(r.body, text)
	}

	attack(t, a, "Zipkin tag flood: one span of 1.5 M tags (gzip)", func() (string, bool, string) {
		var b bytes.Buffer
		b.WriteString(`[{"traceId":"1","id":"1","tags":{`)
		for i := range 1_500_000 {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `"t%d":""`, i)
		}
		b.WriteString(`}}]`)
		body := payloads.Gzip(b.Bytes())
		ans, ok := is(send(url, "application/json", "gzip", body), 413, fmt.Sprintf("more than %d tags", zipkin.MaxEntriesPerSpan))
		return ans, ok, fmt.Sprintf("%d MB of JSON, %d KB on the wire; MaxEntriesPerSpan counts them before decoding", b.Len()>>20, len(body)>>10)
	}, forged)

	attack(t, a, "Zipkin span bomb: 1 M spans of 25 bytes (gzip)", func() (string, bool, string) {
		raw := []byte("[" + strings.TrimSuffix(strings.Repeat(`{"traceId":"1","id":"1"},`, 1_000_000), ",") + "]")
		body := payloads.Gzip(raw)
		ans, ok := is(send(url, "application/json", "gzip", body), 413, "receivers.otlp.max_items_per_request")
		return ans, ok, fmt.Sprintf("%d MB of JSON, %d KB on the wire; counted before any span is decoded (max_items_per_request, then MaxSpans)", len(raw)>>20, len(body)>>10)
	}, forged)

	attack(t, a, "Zipkin JSON nested 1 M levels (gzip)", func() (string, bool, string) {
		raw := []byte(`[{"traceId":"1","id":"1","x":` + strings.Repeat("[", 1_000_000) + strings.Repeat("]", 1_000_000) + `}]`)
		ans, ok := is(send(url, "application/json", "gzip", payloads.Gzip(raw)), 400, "nested deeper")
		return ans, ok, "refused at the 6th level"
	}, forged)
}
