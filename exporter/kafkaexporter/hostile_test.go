package kafkaexporter

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/record"
)

// TestBatchNeverPartlyProduced: a batch that does not fit in the Kafka
// client's buffer is refused whole (retryable), with none of its records
// handed to the client: a partly produced batch answered 429 would be sent
// again in full by the client, duplicating the part that went through.
func TestBatchNeverPartlyProduced(t *testing.T) {
	cfg := testCfg([]string{"127.0.0.1:1"}) // nothing listens: records stay buffered
	cfg.MaxBufferedBytes = 64 << 10
	e := newExporter(t, cfg, 0)
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = e.Shutdown(ctx)
	}()
	hdr := []record.Header{{Key: "h", Value: bytes.Repeat([]byte("v"), 100)}}
	mk := func(n int) *record.Batch {
		b := &record.Batch{}
		for i := 0; i < n; i++ {
			b.Records = append(b.Records, record.Record{Topic: "t", Value: []byte("0123456789"), Headers: hdr})
		}
		b.OnDone(func(error) {})
		return b
	}
	// 200 records of ~111 bytes each fit; 1000 more do not.
	if err := e.Consume(context.Background(), mk(200)); err != nil {
		t.Fatal(err)
	}
	err := e.Consume(context.Background(), mk(1000))
	if !errors.Is(err, consumer.ErrFull) {
		t.Fatalf("over the client's buffer: %v, want ErrFull", err)
	}
	if n := e.inflight.Load(); n != 200 {
		t.Fatalf("%d records in the Kafka client, want the first batch's 200 only", n)
	}
}
