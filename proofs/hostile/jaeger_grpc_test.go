package hostile

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding/gzip"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/ferryhq/ferry/proofs/harness/agenttest"
	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
)

// rawProto sends a message's bytes as they are.
type rawProto struct{}

func (rawProto) Name() string { return "proto" }
func (rawProto) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(v.([]byte))}, nil
}
func (rawProto) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

func pbField(num protowire.Number, msgs ...[]byte) []byte {
	var out []byte
	for _, m := range msgs {
		out = protowire.AppendTag(out, num, protowire.BytesType)
		out = protowire.AppendBytes(out, m)
	}
	return out
}

// jaegerProtoSpan is a span of ids and extra fields (a
// jaeger.api_v2.Span in protobuf).
func jaegerProtoSpan(id int, extra []byte) []byte {
	s := pbField(1, append(make([]byte, 8), 0, 0, 0, 0, 0, 0, 0, 1))
	sid := make([]byte, 8)
	sid[6], sid[7] = byte(id>>8), byte(id)
	s = append(s, pbField(2, sid)...)
	return append(s, extra...)
}

// jaegerPostSpans is a PostSpansRequest of these spans, in a batch of
// process "x".
func jaegerPostSpans(spans ...[]byte) []byte {
	return pbField(1, append(pbField(2, pbField(1, []byte("x"))), pbField(1, spans...)...))
}

// TestJaegerGRPCAttacks: Jaeger's gRPC collector service (the jaeger
// door's PostSpans, on its own listener) against messages of tiny
// elements, on the real binary: protobuf's lengths cannot lie past the
// message, but an empty tag is 2 bytes on the wire and a 120-byte struct
// once gogo-protobuf's generated decoder has appended it. Each is refused
// or converted a chunk at a time, the agent within its memory bound.
// Without the walk the first would be decoded whole (over 1 GB of structs);
// without the chunks the second would be (about 1 GB live at once).
func TestJaegerGRPCAttacks(t *testing.T) {
	brokers := kafkatest.Shared(t)
	kafkatest.CreateTopicIfMissing(t, brokers, "otlp_spans", 1)
	a := agenttest.Start(t, ferryBin, agentConfig(brokers), "receivers.otlp.doors=[jaeger]")
	cc, err := grpc.NewClient(a.JaegerGRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	post := func(req []byte) string {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		err := cc.Invoke(ctx, "/jaeger.api_v2.CollectorService/PostSpans", req, new([]byte),
			grpc.ForceCodecV2(rawProto{}), grpc.UseCompressor(gzip.Name))
		st := status.Convert(err)
		return st.Code().String() + ": " + st.Message()
	}
	refused := func(ans, want string) (string, bool) {
		return ans, strings.Contains(ans, want)
	}

	attack(t, a, "Jaeger gRPC: a span of 15 M empty tags, 30 MiB (gzip)", func() (string, bool, string) {
		req := jaegerPostSpans(jaegerProtoSpan(1, []byte(strings.Repeat("\x42\x00", 15_000_000))))
		before := a.Metric("go_memstats_alloc_bytes_total")
		ans, ok := refused(post(req), "ResourceExhausted: jaeger_grpc: span 0: more than 10000 tags")
		alloc := a.Metric("go_memstats_alloc_bytes_total") - before
		if alloc > 150<<20 {
			ok = false
			ans += fmt.Sprintf(", %d MB allocated", int(alloc)>>20)
		}
		return ans, ok, fmt.Sprintf("%d MB allocated in all (gRPC's read and ferry's copy); the walk counts the tags before gogo-protobuf's decoder makes a 120-byte struct of each (1.8 GB)", int(alloc)>>20)
	}, nil)

	attack(t, a, "Jaeger gRPC: 1,000 spans of 4,000 empty tags, 8 MB (gzip)", func() (string, bool, string) {
		span := []byte(strings.Repeat("\x42\x00", 4000))
		var spans [][]byte
		for i := range 1000 {
			spans = append(spans, jaegerProtoSpan(i, span))
		}
		t0 := time.Now()
		ans, ok := refused(post(jaegerPostSpans(spans...)), "OK")
		return ans, ok, fmt.Sprintf("answered in %v: converted a chunk at a time (at most 4,096 tags, logs, fields and references: 2.6 MB of Go heap, reserved), 4 M tags in all", time.Since(t0).Round(time.Millisecond))
	}, nil)

	attack(t, a, "Jaeger gRPC: 200,000 empty spans (gzip)", func() (string, bool, string) {
		var spans [][]byte
		for range 200_000 {
			spans = append(spans, nil)
		}
		ans, ok := refused(post(jaegerPostSpans(spans...)), "ResourceExhausted: request refused: the number of spans")
		return ans, ok, "max_items_per_request (100,000) on the spans the walk counted, before one is decoded"
	}, nil)
}
