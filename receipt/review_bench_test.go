package receipt

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/record"
)

// BenchmarkLookupLargeReceipt: one request of 100,000 records (the HTTP
// receiver's max_records_per_request) whose records alternate partitions;
// every lookup builds its pages of ranges outside the store's lock, which
// the spool's appends (Add, under the append lock) and the Kafka client's
// promise goroutine (Settle) take.
func BenchmarkLookupLargeReceipt(b *testing.B) {
	const n = 100000
	s, id := largeSettledReceipt(n)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		// Every page of the answer (at most MaxRangesPerAnswer each).
		got := 0
		for from := 0; ; {
			st, ok := s.LookupFrom(id, 7, from)
			if !ok {
				b.Fatal(ok)
			}
			got += len(st.Ranges)
			if testing.Verbose() {
				_ = AppendJSON(nil, st.Ranges)
			}
			if from = st.Next; from == 0 {
				break
			}
		}
		if got != n {
			b.Fatal(got)
		}
	}
}

// BenchmarkSettleOtherTraffic: one client asked for receipts (many small
// requests pending); a chunk of 10,000 records of clients that did not ask
// is settled: each record is searched for in the store under its lock.
func BenchmarkSettleOtherTraffic(b *testing.B) {
	s, _ := NewStore(Config{MaxBytes: 16 << 20, MaxAge: time.Hour}, prometheus.NewRegistry())
	off := int64(64)
	for i := 0; i < 50000; i++ {
		s.Add(Pos{1, off}, off+40, []uint32{0}, 7)
		off += 40
	}
	const n = 10000
	at := make([]Pos, n)
	for i := range at {
		at[i] = Pos{1, off + int64(i*40)}
	}
	rc := record.NewReceipt(n)
	for i := 0; i < n; i++ {
		rc.Acked(i, "topic", 0, int64(i))
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s.Settle(at, rc)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/record")
}
