package kafkaexporter

import (
	"context"
	"fmt"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/ferryhq/ferry/record"
)

// acksNoneExporter is an exporter with acks none to a one-broker kfake
// cluster holding topic "t"; both are closed when the test ends.
func acksNoneExporter(t *testing.T) *Exporter {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	cfg := testCfg(c.ListenAddrs())
	cfg.Acks, cfg.Idempotent = "none", false
	e := newExporter(t, cfg, 64<<20)
	t.Cleanup(func() { e.Shutdown(context.Background()) })
	return e
}

// TestReceiptsWithAcksNoneAreNotFabricated: with exporter.kafka.acks: none
// Kafka answers nothing, and franz-go reports each record's offset as its
// index in its produce batch (baseOffset 0). A receipt must not name those
// as places in Kafka: after some records are already in the partition, the
// "offsets" it reports hold other records.
func TestReceiptsWithAcksNoneAreNotFabricated(t *testing.T) {
	e := acksNoneExporter(t)

	for round := 0; round < 2; round++ {
		var recs []record.Record
		for i := 0; i < 5; i++ {
			recs = append(recs, record.Record{Topic: "t", Value: []byte(fmt.Sprintf("r%d-%d", round, i))})
		}
		b := &record.Batch{Records: recs}
		rc := record.NewReceipt(len(recs))
		b.Receipt = rc
		done := make(chan error, 1)
		b.OnDone(func(err error) { done <- err })
		if err := e.Consume(context.Background(), b); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if round == 1 {
			for i := range recs {
				// The partition holds records 0..4 of round 0 at offsets
				// 0..4: round 1's records are at 5..9 (or unknown).
				if rc.Offset[i] >= 0 && rc.Offset[i] < 5 {
					t.Fatalf("acks none: record %d of the second request reported at offset %d, which holds %q",
						i, rc.Offset[i], fmt.Sprintf("r0-%d", rc.Offset[i]))
				}
			}
		}
	}
}

// TestKafkaFrontOffsetsWithAcksNone: the Kafka front answers its producers
// with OnAcked's offset; with acks none Kafka gave none, so it must be -1
// (unknown), never franz-go's index within its own batch.
func TestKafkaFrontOffsetsWithAcksNone(t *testing.T) {
	e := acksNoneExporter(t)
	for round := 0; round < 2; round++ {
		recs := []record.Record{{Topic: "t", Value: []byte("a")}, {Topic: "t", Value: []byte("b")}}
		b := &record.Batch{Records: recs}
		offs := make([]int64, len(recs))
		b.OnAcked = func(i int, off int64) { offs[i] = off }
		done := make(chan error, 1)
		b.OnDone(func(err error) { done <- err })
		if err := e.Consume(context.Background(), b); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		for i, off := range offs {
			if off != -1 {
				t.Fatalf("acks none, round %d: record %d answered offset %d, want -1", round, i, off)
			}
		}
	}
}
