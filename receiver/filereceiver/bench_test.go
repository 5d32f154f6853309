package filereceiver

import (
	"fmt"
	"strings"
	"testing"
)

// BenchmarkJSONFields: the cost per line of reading a key and a timestamp
// from a typical 200-byte JSON log line (no allocation).
func BenchmarkJSONFields(b *testing.B) {
	line := []byte(`{"ts":"2026-11-25T10:00:00.123Z","level":"info","req":"r-123456","msg":"GET /api/v1/items 200","dur_ms":12.5,"tags":["a","b"],"user":{"id":42,"name":"ann"}}`)
	b.SetBytes(int64(len(line)))
	b.ReportAllocs()
	for b.Loop() {
		if _, _, ok := jsonFields(line, "req", "ts"); !ok {
			b.Fatal("not read")
		}
	}
}

// BenchmarkFrame and BenchmarkMultiline: framing a 256 KiB read of 100-byte
// lines, alone and grouped (one event in four has three stack lines).
func BenchmarkFrame(b *testing.B) { benchFrame(b, nil) }

func BenchmarkMultiline(b *testing.B) {
	benchFrame(b, newMultiline(Multiline{StartPattern: `^\d{4}-`, MaxLines: 500}))
}

func benchFrame(b *testing.B, m *multiline) {
	var sb strings.Builder
	for i := 0; sb.Len() < 256<<10; i++ {
		fmt.Fprintf(&sb, "2026-11-25 10:00:00 INFO %074d\n", i)
		if i%4 == 0 {
			sb.WriteString("\tat a.b.C.d(C.java:10)\n\tat a.b.C.e(C.java:20)\n\tat a.b.C.f(C.java:30)\n")
		}
	}
	buf := []byte(sb.String())
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	out := make([]lineRef, 0, maxBatchRecords)
	for b.Loop() {
		lines, consumed, _, _ := frame(buf, 256<<10, maxBatchRecords, false, false, out[:0])
		if m != nil {
			lines, _, _, _ = m.group(buf, lines, consumed, 256<<10, false, false, false)
		}
		if len(lines) == 0 {
			b.Fatal("no lines")
		}
	}
}
