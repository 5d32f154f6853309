package pipeline

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"

	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
	"github.com/ferryhq/ferry/receiver/otlpreceiver"
	"github.com/ferryhq/ferry/tools/otlpgen"
)

// TestTracesLandOnTheirTracePartition: on the default split
// (trace_partition), against a real broker, the agent learns the topic's
// partition count from the cluster and then writes a request's spans as a
// record per partition without a key; every span, before and after, is on
// the partition a record keyed by its hex trace id goes to (Kafka's
// murmur2, as the Java client would put it), so consumers of one
// partition see whole traces.
func TestTracesLandOnTheirTracePartition(t *testing.T) {
	brokers := kafkatest.Shared(t)
	const partitions = 5
	topic := kafkatest.NewTopic(t, brokers, "tp-spans", partitions)
	p := startAgent(t, brokers, "receivers.otlp.traces.topic="+topic)
	addr := p.Receiver("otlp").(*otlpreceiver.Receiver).HTTPAddr()
	sent := 0
	post := func(seed uint64) {
		raw, _ := ptraceotlp.NewExportRequestFromTraces(otlpgen.New(seed).TracesOf(120, 4)).MarshalProto()
		postTraces(t, addr, raw)
		sent += 120
	}
	// Answered after Kafka's ack: a request's records are in the topic
	// when its answer comes. Requests until one was grouped.
	var recs []*kgo.Record
	grouped := 0
	for seed := uint64(1); grouped == 0; seed++ {
		if seed > 50 {
			t.Fatalf("50 requests and none written a record per partition")
		}
		post(seed)
		time.Sleep(20 * time.Millisecond)
		recs = kafkatest.ConsumeUntil(t, brokers, topic, func(rs []*kgo.Record) bool { return spanCount(t, rs) >= sent }, 30*time.Second)
		grouped = 0
		for _, r := range recs {
			if r.Key == nil {
				grouped++
			}
		}
	}
	post(1000) // one more, surely grouped
	recs = kafkatest.ConsumeUntil(t, brokers, topic, func(rs []*kgo.Record) bool { return spanCount(t, rs) >= sent }, 30*time.Second)
	spans, perPartition := 0, map[int32]int{}
	for _, r := range recs {
		td, err := (&ptrace.ProtoUnmarshaler{}).UnmarshalTraces(r.Value)
		if err != nil {
			t.Fatal(err)
		}
		for _, rs := range td.ResourceSpans().All() {
			for _, ss := range rs.ScopeSpans().All() {
				for _, sp := range ss.Spans().All() {
					key := []byte(sp.TraceID().String())
					if r.Key != nil && string(r.Key) != string(key) {
						t.Fatalf("span of trace %s in a record keyed %s", key, r.Key)
					}
					if want := kgo.StickyKeyPartitioner(nil).ForTopic(topic).Partition(&kgo.Record{Key: key}, partitions); int32(want) != r.Partition {
						t.Fatalf("span of trace %s on partition %d, its key goes to %d", key, r.Partition, want)
					}
					spans++
				}
			}
		}
		if r.Key == nil {
			perPartition[r.Partition]++
		}
	}
	if spans != sent {
		t.Fatalf("%d spans in Kafka, %d sent", spans, sent)
	}
	if len(perPartition) != partitions {
		t.Fatalf("grouped records on partitions %v, want all %d", perPartition, partitions)
	}
}

// spanCount is the spans in rs (TracesData values).
func spanCount(t *testing.T, rs []*kgo.Record) int {
	t.Helper()
	n := 0
	for _, r := range rs {
		td, err := (&ptrace.ProtoUnmarshaler{}).UnmarshalTraces(r.Value)
		if err != nil {
			t.Fatal(err)
		}
		n += td.SpanCount()
	}
	return n
}
