package otlpreceiver

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"

	"github.com/ferryhq/ferry/consumer/consumertest"
	"github.com/ferryhq/ferry/otlp/encoding"
	"github.com/ferryhq/ferry/receiver"
	"github.com/ferryhq/ferry/receiver/receivertest"
	"github.com/ferryhq/ferry/telemetry"
	"github.com/ferryhq/ferry/tools/otlpgen"
)

// cluster is a receiver.Topics answering n partitions for every topic (or
// err), counting the asks.
type cluster struct {
	mu    sync.Mutex
	n     int32
	err   error
	asks  atomic.Int64
	names atomic.Int64
}

func (c *cluster) topics(_ context.Context, names []string) ([]receiver.TopicInfo, error) {
	c.asks.Add(1)
	c.names.Add(int64(len(names)))
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return nil, c.err
	}
	out := make([]receiver.TopicInfo, len(names))
	for i, n := range names {
		out[i] = receiver.TopicInfo{Topic: n, Partitions: c.n}
	}
	return out, nil
}

func (c *cluster) set(n int32, err error) {
	c.mu.Lock()
	c.n, c.err = n, err
	c.mu.Unlock()
}

// waitKnown polls topic's entry until done says so, and returns it.
func waitKnown(t *testing.T, p *partitionCounts, topic, what string, done func(knownCount, bool) bool) knownCount {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		p.mu.Lock()
		k, ok := p.known[topic]
		p.mu.Unlock()
		if done(k, ok) {
			return k
		}
		if time.Now().After(deadline) {
			t.Fatal(what)
		}
	}
}

// eventually polls get until it returns want.
func eventually(t *testing.T, p *partitionCounts, topic string, want int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for p.get(topic) != want {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d partitions, want %d", topic, p.get(topic), want)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestPartitionCountsNeverWait: a count is answered from what is known (0
// at first) while one goroutine asks the cluster; a failed ask keeps the
// last count, and an answer is reused until it is out of date.
func TestPartitionCountsNeverWait(t *testing.T) {
	c := &cluster{n: 6}
	p := newPartitionCounts(c.topics)
	if n := p.get("spans"); n != 0 {
		t.Fatalf("before start: %d", n)
	}
	p.start()
	defer p.close()
	eventually(t, p, "spans", 6)
	asks := c.asks.Load()
	for range 1000 {
		p.get("spans")
	}
	if c.asks.Load() != asks {
		t.Fatalf("%d asks for a count still fresh", c.asks.Load()-asks)
	}
	// Out of date, and the cluster unreachable: the last count stays.
	c.set(0, errors.New("unreachable"))
	p.mu.Lock()
	k := p.known["spans"]
	k.at = k.at.Add(-partitionsMaxAge)
	p.known["spans"] = k
	p.mu.Unlock()
	p.get("spans")
	waitKnown(t, p, "spans", "the failed ask was not recorded", func(k knownCount, _ bool) bool { return k.failed })
	if n := p.get("spans"); n != 6 {
		t.Fatalf("after a failed ask: %d, want the last count 6", n)
	}
	// A topic the cluster does not have (no partitions): 0, and marked
	// to be asked again after partitionsRetry, not partitionsMaxAge.
	c.set(-1, nil)
	p.get("missing")
	for deadline := time.Now().Add(5 * time.Second); ; {
		p.mu.Lock()
		k, ok := p.known["missing"]
		p.mu.Unlock()
		if ok {
			if !k.failed || k.n != 0 || p.get("missing") != 0 {
				t.Fatalf("a topic without partitions recorded as %+v", k)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the missing topic was never asked for")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestPartitionCountsBounded: topic names may come from templates; the
// cache and the names waiting to be asked stay bounded.
func TestPartitionCountsBounded(t *testing.T) {
	c := &cluster{n: 3}
	p := newPartitionCounts(c.topics) // not started: nothing is asked
	for i := range 3 * partitionsMaxTopics {
		p.get("t" + string(rune('a'+i%26)) + time.Duration(i).String())
	}
	if len(p.pending) > partitionsMaxTopics {
		t.Fatalf("%d names pending", len(p.pending))
	}
	names := make([]string, 0, len(p.pending))
	for n := range p.pending {
		names = append(names, n)
	}
	infos, _ := c.topics(context.Background(), names)
	p.store(names, infos, nil, time.Now())
	p.store(names[:10], infos[:10], nil, time.Now())
	if len(p.known) > partitionsMaxTopics || len(p.pending) != 0 {
		t.Fatalf("%d known, %d pending", len(p.known), len(p.pending))
	}
}

// tracePartitionReceiver starts a receiver writing traces to topic spans
// with trace_partition, counts from c and shrink notices from watch (nil:
// none), into sink; it returns the HTTP
// traces URL and a request of 50 single-span traces.
func tracePartitionReceiver(t *testing.T, c *cluster, sink *consumertest.Sink, watch func(func(string, int32)) func()) (*Receiver, string, []byte) {
	t.Helper()
	cfg := testConfig()
	cfg.Traces = encoding.Config{Topic: "spans", Encoding: "otlp_proto", Partition: "trace_partition"}
	r, err := New(cfg, receiver.Env{Set: telemetry.TestSettings(), Next: sink, Topics: c.topics, WatchShrink: watch})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Shutdown(context.Background()) })
	raw, _ := ptraceotlp.NewExportRequestFromTraces(otlpgen.New(3).Traces(50)).MarshalProto()
	return r, "http://" + r.HTTPAddr() + "/v1/traces", raw
}

// TestTracesGroupedByPartition: with trace_partition and the cluster's
// counts (the exporter's, in the agent), a request's spans reach the
// exporter as a record per partition, each on the partition a record keyed
// by its trace id would go to, without a key; the first request, before the
// count is known, as a record per trace keyed by its id.
func TestTracesGroupedByPartition(t *testing.T) {
	c := &cluster{n: 4}
	sink := &consumertest.Sink{}
	r, base, raw := tracePartitionReceiver(t, c, sink, nil)
	if code, _, body := postOTLP(t, base, "application/x-protobuf", "", raw); code != 200 {
		t.Fatalf("%d %s", code, body)
	}
	recs := sink.Records()
	if len(recs) != 50 || len(recs[0].Key) != 32 {
		t.Fatalf("before the count is known: %d records, key %q", len(recs), recs[0].Key)
	}
	eventually(t, r.parts, "spans", 4)
	sink.Reset()
	if code, _, body := postOTLP(t, base, "application/x-protobuf", "", raw); code != 200 {
		t.Fatalf("%d %s", code, body)
	}
	recs = sink.Records()
	if len(recs) < 2 || len(recs) > 4 {
		t.Fatalf("%d records for 50 traces over 4 partitions", len(recs))
	}
	spans := 0
	for _, rec := range recs {
		p, chosen := rec.Partition()
		if !chosen || rec.Key != nil {
			t.Fatalf("record on partition %d (chosen %v), key %q", p, chosen, rec.Key)
		}
		td, err := (&ptrace.ProtoUnmarshaler{}).UnmarshalTraces(rec.Value)
		if err != nil {
			t.Fatal(err)
		}
		for _, rs := range td.ResourceSpans().All() {
			for _, ss := range rs.ScopeSpans().All() {
				for _, sp := range ss.Spans().All() {
					tid := sp.TraceID()
					want := kgo.StickyKeyPartitioner(nil).ForTopic("spans").Partition(&kgo.Record{Key: []byte(tid.String())}, 4)
					if int32(want) != p {
						t.Fatalf("span of trace %s on partition %d, its key goes to %d", tid, p, want)
					}
					spans++
				}
			}
		}
	}
	if spans != 50 {
		t.Fatalf("%d spans", spans)
	}
}

// When the exporter hears that a topic has fewer partitions than a
// record was placed for (deleted and created again: Kafka refused a chosen
// partition), the receiver drops the topic's count: the next request is
// written per trace, keyed, which the producer places by its own count,
// instead of being grouped by the old count again until the count is out
// of date (30 s of refused requests on the old code, or dead letters in
// delivery mode spool). Shutdown stops the notices.
func TestShrunkTopicForgetsTheCount(t *testing.T) {
	c := &cluster{n: 4}
	sink := &consumertest.Sink{}
	var shrinks receivertest.Shrinks
	r, base, raw := tracePartitionReceiver(t, c, sink, shrinks.Watch)
	r.parts.get("spans")
	eventually(t, r.parts, "spans", 4)

	c.set(2, nil) // recreated with 2 partitions: the cluster knows, the cache does not yet
	if !shrinks.Notify("spans", 3) {
		t.Fatal("the receiver did not register for shrink notices")
	}
	if code, _, body := postOTLP(t, base, "application/x-protobuf", "", raw); code != 200 {
		t.Fatalf("%d %s", code, body)
	}
	recs := sink.Records()
	if len(recs) != 50 {
		t.Fatalf("after the shrink: %d records for 50 traces, want one per trace (the count forgotten)", len(recs))
	}
	for _, rec := range recs {
		if _, chosen := rec.Partition(); chosen || len(rec.Key) != 32 {
			t.Fatalf("after the shrink, a record chosen %v, key %q; want keyed by trace id, unplaced", chosen, rec.Key)
		}
	}
	eventually(t, r.parts, "spans", 2)
	_ = r.Shutdown(context.Background())
	if shrinks.Watching() {
		t.Fatal("Shutdown left the receiver watching the exporter")
	}
}

// A count asked for before a refusal and answered after it may be the old
// one: an answer that still offers the refused partition is not kept (the
// topic is written per trace until asked again, after partitionsRetry). A
// late refusal of a partition the count no longer offers changes nothing.
func TestRefusalDuringAnAskKeepsNoStaleCount(t *testing.T) {
	var n atomic.Int32
	n.Store(4)
	asked := make(chan struct{}, 8)
	release := make(chan struct{})
	ask := func(ctx context.Context, names []string) ([]receiver.TopicInfo, error) {
		count := n.Load() // read when the ask starts, as a Metadata request would be
		asked <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		out := make([]receiver.TopicInfo, len(names))
		for i, name := range names {
			out[i] = receiver.TopicInfo{Topic: name, Partitions: count}
		}
		return out, nil
	}
	p := newPartitionCounts(ask)
	p.start()
	defer p.close()
	p.get("spans")
	select {
	case <-asked: // the ask is under way and will answer 4
	case <-time.After(5 * time.Second):
		t.Fatal("never asked")
	}
	n.Store(2)
	p.forget("spans", 3)
	release <- struct{}{}
	if k := waitKnown(t, p, "spans", "the ask never answered", func(_ knownCount, ok bool) bool { return ok }); k.n != 0 || !k.failed {
		t.Fatalf("the answer of an ask from before the refusal was kept: %+v", k)
	}
	countAndRefusals(t, p, "spans", 0, "after a stale answer (per trace)")

	// A count of 2 known: a late refusal of partition 3 (records placed
	// before) leaves it; a refusal of partition 1 drops it.
	p.store([]string{"logs"}, []receiver.TopicInfo{{Topic: "logs", Partitions: 2}}, nil, time.Now())
	p.forget("logs", 3)
	if got := p.get("logs"); got != 2 {
		t.Fatalf("a late refusal beyond the count dropped it: %d", got)
	}
	p.forget("logs", 1)
	countAndRefusals(t, p, "logs", 0, "after a refusal within the count")
	close(release)
}

// countAndRefusals checks topic's count and that no refusal is remembered
// (the answer took it, or the topic was not being asked).
func countAndRefusals(t *testing.T, p *partitionCounts, topic string, want int, when string) {
	t.Helper()
	if got := p.get(topic); got != want {
		t.Fatalf("%s: count %d, want %d", when, got, want)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.refused) != 0 {
		t.Fatalf("%s: refusals kept %v", when, p.refused)
	}
}
