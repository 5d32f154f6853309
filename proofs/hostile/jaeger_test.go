package hostile

import (
	"encoding/binary"
	"fmt"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/proofs/harness/agenttest"
	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
	"github.com/ferryhq/ferry/proofs/harness/payloads"
)

// jaegerBatch starts a thrift binary jaeger.thrift Batch (a process named
// "x") up to its spans list's header, declaring n spans.
func jaegerBatch(n uint32) []byte {
	b := []byte{12, 0, 1, 11, 0, 1, 0, 0, 0, 1, 'x', 0, 15, 0, 2, 12}
	return binary.BigEndian.AppendUint32(b, n)
}

// jaegerSpanHead is a span's required fields, before its tags.
func jaegerSpanHead() []byte {
	var b []byte
	for _, id := range []byte{1, 2, 3, 4} {
		b = append(b, 10, 0, id, 0, 0, 0, 0, 0, 0, 0, 1)
	}
	b = append(b, 11, 0, 5, 0, 0, 0, 1, 'o', 8, 0, 7, 0, 0, 0, 1)
	b = append(b, 10, 0, 8, 0, 0, 0, 0, 0, 0, 0, 1, 10, 0, 9, 0, 0, 0, 0, 0, 0, 0, 1)
	return b
}

// TestJaegerDoorAttacks: the Jaeger door (receivers.otlp.doors: [jaeger])
// against bodies whose declared lengths lie or whose structures are huge
// or deep, on the real binary: each refused, the agent within its memory
// bound. Without the door's walk the thrift reader would allocate 8 bytes a
// declared span before reading one (240 MB for the zeros), and the tag
// flood would be decoded whole (over 200 MB of structs).
func TestJaegerDoorAttacks(t *testing.T) {
	brokers := kafkatest.Shared(t)
	kafkatest.CreateTopicIfMissing(t, brokers, "otlp_spans", 1)
	a := agenttest.Start(t, ferryBin, agentConfig(brokers), "receivers.otlp.doors=[jaeger]")
	url := "http://" + a.OTLP + "/api/traces"
	refused := func(r reply, code int, msg string) (string, bool) {
		return r.String(), r.err == nil && r.code == code && strings.Contains(r.body, msg)
	}

	attack(t, a, "Jaeger: a 20-byte thrift Batch declaring 2³¹−1 spans", func() (string, bool, string) {
		ans, ok := refused(send(url, "application/x-thrift", "", jaegerBatch(1<<31-1)), 400, "declares 2147483647 elements")
		return ans, ok, "refused from the list's header"
	}, nil)

	attack(t, a, "Jaeger: 30 MiB of zeros declaring 30 M spans (gzip)", func() (string, bool, string) {
		body := append(jaegerBatch(30_000_000), make([]byte, 30<<20)...)
		gz := payloads.Gzip(body)
		// Peak RSS does not see an untouched 240 MB slice (fresh pages
		// stay unmapped): count the bytes the agent allocated.
		before := a.Metric("go_memstats_alloc_bytes_total")
		ans, ok := refused(send(url, "application/x-thrift", "gzip", gz), 400, "Span: required field")
		alloc := a.Metric("go_memstats_alloc_bytes_total") - before
		if alloc > 150<<20 {
			ok = false
			ans += fmt.Sprintf(", %d MB allocated", int(alloc)>>20)
		}
		return ans, ok, fmt.Sprintf("%d KB on the wire, %d MB allocated in all (the 30 MiB body read); the walk checks each span's required fields before the thrift reader allocates the list (240 MB more)", len(gz)>>10, int(alloc)>>20)
	}, nil)

	attack(t, a, "Jaeger: a span with 1.2 M tags (gzip)", func() (string, bool, string) {
		body := append(jaegerBatch(1), jaegerSpanHead()...)
		body = append(body, 15, 0, 10, 12)
		body = binary.BigEndian.AppendUint32(body, 1_200_000)
		for i := range 1_200_000 {
			body = append(body, 11, 0, 1, 0, 0, 0, 4)
			body = binary.BigEndian.AppendUint32(body, uint32(i))
			body = append(body, 8, 0, 2, 0, 0, 0, 1, 2, 0, 5, 1, 0)
		}
		body = append(body, 0, 0)
		gz := payloads.Gzip(body)
		ans, ok := refused(send(url, "application/x-thrift", "gzip", gz), 413, "Span.tags: 1200000 elements, more than 10000")
		return ans, ok, fmt.Sprintf("%d MB of thrift, %d KB on the wire; at most 10,000 tags, logs or references a span", len(body)>>20, len(gz)>>10)
	}, nil)

	attack(t, a, "Jaeger: a list nested 1 M levels in a span (gzip)", func() (string, bool, string) {
		body := append(jaegerBatch(1), jaegerSpanHead()...)
		body = append(body, 15, 0, 99)
		for range 1_000_000 {
			body = append(body, 15, 0, 0, 0, 1)
		}
		gz := payloads.Gzip(body)
		ans, ok := refused(send(url, "application/x-thrift", "gzip", gz), 400, "nested deeper than 16")
		return ans, ok, fmt.Sprintf("%d KB on the wire", len(gz)>>10)
	}, nil)
}
