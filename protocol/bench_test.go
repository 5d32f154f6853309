package protocol

import (
	"bytes"
	"testing"
)

// BenchmarkDecode1000x100B: the agent's decode of one produce frame of
// 1,000 records of 100 B (views, no copy).
func BenchmarkDecode1000x100B(b *testing.B) {
	body := AppendProduceCount(nil, 1000)
	r := Record{Topic: []byte("app-logs"), Key: []byte("k"), Value: bytes.Repeat([]byte("v"), 100)}
	prev := ""
	for i := 0; i < 1000; i++ {
		body = AppendRecord(body, prev, &r)
		prev = "app-logs"
	}
	var rs Records
	var rec Record
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if err := rs.Reset(body, DefaultLimits); err != nil {
			b.Fatal(err)
		}
		n := 0
		for rs.Next(&rec) {
			n++
		}
		if n != 1000 || rs.Err() != nil {
			b.Fatal(n, rs.Err())
		}
	}
}
