package spool

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/receipt"
	"github.com/ferryhq/ferry/record"
)

// placer acknowledges as Kafka would, from another goroutine, giving each
// record the next offset of partition 1 and filling a receipt when the
// batch asks; the first record it ever sees fails once (retryable), so a
// record's place must follow it into the spool's next try.
type placer struct {
	mu     sync.Mutex
	next   int64
	at     map[int64]string
	failed bool
	asked  int
}

func (p *placer) Consume(_ context.Context, b *record.Batch) error {
	b.Arm()
	if b.Receipt != nil {
		p.mu.Lock()
		p.asked++
		p.mu.Unlock()
	}
	go func() {
		for i := range b.Records {
			p.mu.Lock()
			if !p.failed {
				p.failed = true
				p.mu.Unlock()
				b.AckAt(i, consumer.ErrFull)
				continue
			}
			off := p.next
			p.next++
			p.at[off] = string(b.Records[i].Value)
			p.mu.Unlock()
			if b.Receipt != nil {
				b.Receipt.Acked(i, b.Records[i].Topic, 1, off)
			}
			b.AckAt(i, nil)
		}
	}()
	return nil
}

// TestReceiptsAfterKafka: a batch that asks for a receipt gets a spool id
// at the append; once the reader's records are acknowledged the store
// answers, for the same owner only, where each record went — for records
// read back from disk and from the appender's tail, and across a retry.
func TestReceiptsAfterKafka(t *testing.T) {
	store, err := receipt.NewStore(receipt.Config{MaxBytes: 1 << 20, MaxAge: time.Minute}, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	s := open(t, testConfig(t.TempDir()))
	defer s.Close()
	s.links.Receipts = store
	// Before the reader starts: read back from disk.
	a := recs(0, 50)
	a.Receipt = record.NewReceipt(50)
	a.Receipt.Owner = 7
	appendOK(t, s, a)
	plain := recs(50, 20) // no receipt asked: not tracked
	appendOK(t, s, plain)
	p := &placer{at: map[int64]string{}}
	if err := start(t, s, Links{Next: p, Receipts: store}); err != nil {
		t.Fatal(err)
	}
	// After: from the tail, most likely.
	time.Sleep(50 * time.Millisecond)
	b := recs(70, 30)
	b.Receipt = record.NewReceipt(30)
	b.Receipt.Owner = 7
	appendOK(t, s, b)
	for _, c := range []struct {
		rc   *record.Receipt
		from int
		n    int
	}{{a.Receipt, 0, 50}, {b.Receipt, 70, 30}} {
		if c.rc.SpoolID == "" {
			t.Fatal("no spool id")
		}
		if _, ok := store.Lookup(c.rc.SpoolID, 8); ok {
			t.Fatal("another owner read the receipt")
		}
		var st receipt.Status
		deadline := time.Now().Add(10 * time.Second)
		for {
			var ok bool
			st, ok = store.Lookup(c.rc.SpoolID, 7)
			if !ok {
				t.Fatalf("receipt %s unknown", c.rc.SpoolID)
			}
			if st.Pending == 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if st.Pending != 0 || st.Records != c.n {
			t.Fatalf("%+v", st)
		}
		k := c.from
		p.mu.Lock()
		for _, r := range st.Ranges {
			for j := 0; j < r.Count; j++ {
				if want := string(recs(k, 1).Records[0].Value); p.at[r.Offset+int64(j)] != want || r.Partition != 1 || r.Topic != "t" {
					t.Fatalf("record %d: receipt %s/%d/%d holds %q", k, r.Topic, r.Partition, r.Offset+int64(j), p.at[r.Offset+int64(j)])
				}
				k++
			}
		}
		p.mu.Unlock()
		if k != c.from+c.n {
			t.Fatalf("ranges cover %d records", k-c.from)
		}
	}
	if store.Watching() {
		t.Fatal("the store still waits for Kafka")
	}
	if _, ok := store.Lookup("0-0-0000000000000000", 7); ok {
		t.Fatal("a made-up id was found")
	}
}

func TestReceiptStoreBounds(t *testing.T) {
	store, err := receipt.NewStore(receipt.Config{MaxBytes: 64 << 10, MaxAge: time.Minute}, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	rel := make([]uint32, 500) // ~16 KB each: four fit
	for i := range rel {
		rel[i] = uint32(i * 10)
	}
	var ids []string
	for i := 0; i < 6; i++ {
		ids = append(ids, store.Add(receipt.Pos{Seg: 1, Off: int64(i) * 10000}, int64(i)*10000+5000, rel, 0))
	}
	if _, ok := store.Lookup(ids[0], 0); ok {
		t.Fatal("the oldest receipt was kept past max_bytes")
	}
	if st, ok := store.Lookup(ids[5], 0); !ok || st.Pending != 500 {
		t.Fatalf("%+v %v", st, ok)
	}
	// One request larger than the whole store is not kept.
	id := store.Add(receipt.Pos{Seg: 2}, 1<<20, make([]uint32, 10000), 0)
	if _, ok := store.Lookup(id, 0); ok {
		t.Fatal("an oversized receipt was kept")
	}
}
