package compat

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/proofs/harness/agenttest"
	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
)

// front starts ferry with the Kafka front on, delivering to broker.
func front(t *testing.T, broker string, sets ...string) *agenttest.Agent {
	t.Helper()
	return agenttest.Start(t, ferryBin, "", append([]string{"exporter.kafka.brokers=[" + broker + "]",
		"receivers.kafka.enabled=true", "exporter.kafka.linger=1ms"}, sets...)...)
}

// TestFranzGo: an unmodified franz-go producer (idempotent, acks=all, each
// codec) bootstraps from ferry alone; every record reaches the real
// cluster with its key, value, headers and timestamp, in the partition
// the same client picks when producing to the cluster directly.
func TestFranzGo(t *testing.T) {
	broker := kafkatest.Shared(t)
	a := front(t, broker)
	for _, codec := range []struct {
		name string
		c    kgo.CompressionCodec
	}{{"none", kgo.NoCompression()}, {"gzip", kgo.GzipCompression()}, {"snappy", kgo.SnappyCompression()},
		{"lz4", kgo.Lz4Compression()}, {"zstd", kgo.ZstdCompression()}} {
		t.Run(codec.name, func(t *testing.T) {
			topic := kafkatest.NewTopic(t, broker, "compat", 6)
			via, err := kgo.NewClient(kgo.SeedBrokers(a.KafkaFront), kgo.DefaultProduceTopic(topic),
				kgo.ProducerBatchCompression(codec.c), kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)))
			if err != nil {
				t.Fatal(err)
			}
			defer via.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			const n = 600
			// Recent: Kafka's time retention (7 days by default, checked
			// every 5 minutes) deletes records whose timestamps are older,
			// even from the active segment, and a fixed date in 2023 made
			// the read-back fail whenever the check ran mid-test.
			ts := time.Now().Add(-time.Minute).Truncate(time.Millisecond)
			var recs []*kgo.Record
			for i := range n {
				r := &kgo.Record{Key: []byte(fmt.Sprintf("key-%d", i%37)), Value: []byte(fmt.Sprintf("value-%d", i)),
					Timestamp: ts.Add(time.Duration(i) * time.Millisecond),
					Headers:   []kgo.RecordHeader{{Key: "h", Value: []byte(fmt.Sprint(i))}, {Key: "empty"}}}
				recs = append(recs, r)
			}
			t0 := time.Now()
			produced := make(chan error, 1)
			go func() { produced <- via.ProduceSync(ctx, recs...).FirstErr() }()
			select {
			case err := <-produced:
				if err != nil {
					t.Fatalf("produce through ferry: %v", err)
				}
			case <-ctx.Done():
				t.Fatal("produce through ferry: not answered within 60 s")
			}
			t.Logf("produced through ferry in %v", time.Since(t0))
			// The offsets ferry answered with are the cluster's.
			offsets := map[[2]int64]bool{}
			for _, r := range recs {
				if r.Offset < 0 {
					t.Fatalf("record %q answered without an offset", r.Value)
				}
				offsets[[2]int64{int64(r.Partition), r.Offset}] = true
			}
			// Where the same client puts each key when producing directly.
			kafkatest.CreateTopic(t, broker, topic+"-direct", 6)
			direct, err := kgo.NewClient(kgo.SeedBrokers(broker), kgo.DefaultProduceTopic(topic+"-direct"),
				kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)))
			if err != nil {
				t.Fatal(err)
			}
			defer direct.Close()
			want := map[string]int32{}
			for i := range 37 {
				r := &kgo.Record{Key: []byte(fmt.Sprintf("key-%d", i))}
				if err := direct.ProduceSync(ctx, r).FirstErr(); err != nil {
					t.Fatal(err)
				}
				want[string(r.Key)] = r.Partition
			}
			t.Logf("produced directly by %v", time.Since(t0))
			got := kafkatest.Consume(t, broker, topic, n, time.Minute)
			t.Logf("read back by %v", time.Since(t0))
			if len(got) != n {
				t.Fatalf("%d records in Kafka, want %d", len(got), n)
			}
			seen := map[string]bool{}
			for _, r := range got {
				var i int
				fmt.Sscanf(string(r.Value), "value-%d", &i)
				if seen[string(r.Value)] {
					t.Fatalf("record %q twice", r.Value)
				}
				seen[string(r.Value)] = true
				if string(r.Key) != fmt.Sprintf("key-%d", i%37) {
					t.Fatalf("record %q has key %q", r.Value, r.Key)
				}
				if r.Partition != want[string(r.Key)] {
					t.Fatalf("key %q in partition %d through ferry, %d directly", r.Key, r.Partition, want[string(r.Key)])
				}
				if !r.Timestamp.Equal(ts.Add(time.Duration(i) * time.Millisecond)) {
					t.Fatalf("record %q timestamp %v", r.Value, r.Timestamp)
				}
				if len(r.Headers) != 2 || r.Headers[0].Key != "h" || string(r.Headers[0].Value) != fmt.Sprint(i) || r.Headers[1].Key != "empty" {
					t.Fatalf("record %q headers %v", r.Value, r.Headers)
				}
				if !offsets[[2]int64{int64(r.Partition), r.Offset}] {
					t.Fatalf("record %q at %d/%d, not an offset ferry answered", r.Value, r.Partition, r.Offset)
				}
			}
		})
	}
	if v := a.Metric(`ferry_receiver_received_records_total{receiver="kafka"}`); v != 3000 {
		t.Fatalf("ferry counted %v records received on the Kafka front, want 3000", v)
	}
}

// TestFranzGoDeliveryModes: acks=0 is fire-and-forget (counted as such,
// every record still delivered here), and in spool mode a produce is
// answered from the fsync'd spool (no offset yet) while every record still
// reaches the partition the client chose, which the spool keeps.
func TestFranzGoDeliveryModes(t *testing.T) {
	broker := kafkatest.Shared(t)
	for _, mode := range []struct {
		name  string
		sets  []string
		opts  []kgo.Opt
		acks0 bool
	}{
		{"acks0", nil, []kgo.Opt{kgo.RequiredAcks(kgo.NoAck()), kgo.DisableIdempotentWrite()}, true},
		{"spool", []string{"delivery.mode=spool", "delivery.spool.dir=" + t.TempDir()}, nil, false},
	} {
		t.Run(mode.name, func(t *testing.T) {
			a := front(t, broker, mode.sets...)
			topic := kafkatest.NewTopic(t, broker, "compat", 4)
			via, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(a.KafkaFront), kgo.DefaultProduceTopic(topic),
				kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil))}, mode.opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			defer via.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			const n = 500
			var recs []*kgo.Record
			for i := range n {
				recs = append(recs, &kgo.Record{Key: []byte(fmt.Sprintf("key-%d", i%11)), Value: []byte(fmt.Sprintf("value-%d", i))})
			}
			if err := via.ProduceSync(ctx, recs...).FirstErr(); err != nil {
				t.Fatalf("produce: %v", err)
			}
			chosen := map[string]int32{}
			for _, r := range recs {
				chosen[string(r.Key)] = r.Partition
			}
			got := kafkatest.Consume(t, broker, topic, n, time.Minute)
			if len(got) != n {
				t.Fatalf("%d records in Kafka, want %d", len(got), n)
			}
			for _, r := range got {
				if r.Partition != chosen[string(r.Key)] {
					t.Fatalf("key %q chose partition %d, is in %d", r.Key, chosen[string(r.Key)], r.Partition)
				}
			}
			faf := a.Metric(`ferry_receiver_fire_and_forget_records_total`)
			if mode.acks0 && faf != n || !mode.acks0 && faf != 0 {
				t.Fatalf("fire-and-forget records counted %v (acks=0: %v)", faf, mode.acks0)
			}
		})
	}
}
