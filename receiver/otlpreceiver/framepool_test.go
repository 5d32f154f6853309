package otlpreceiver

import (
	"bytes"
	"context"
	"testing"

	"go.opentelemetry.io/collector/pdata/plog/plogotlp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"

	"github.com/ferryhq/ferry/consumer/consumertest"
	"github.com/ferryhq/ferry/otlp/encoding"
	"github.com/ferryhq/ferry/tools/otlpgen"
)

func TestFramePool(t *testing.T) {
	var p framePool
	for _, c := range []struct{ n, cap int }{{0, 256}, {1, 256}, {256, 256}, {257, 512}, {16384, 16384}, {16385, 32768}, {1 << 20, 1 << 20}, {1<<20 + 1, 1<<20 + 1}} {
		b := p.Get(c.n)
		if len(*b) != c.n || cap(*b) != c.cap {
			t.Errorf("Get(%d): len %d cap %d, want len %d cap %d", c.n, len(*b), cap(*b), c.n, c.cap)
		}
		p.Put(b)
	}
	// A returned buffer is handed out again for any size of its tier, at
	// the size asked for.
	b := p.Get(16384)
	(*b)[0] = 1
	p.Put(b)
	again := p.Get(9000)
	if len(*again) != 9000 || cap(*again) != 16384 {
		t.Fatalf("len %d cap %d after reuse", len(*again), cap(*again))
	}
	// A buffer of a size this pool does not make is not kept, so no tier
	// can hand out a buffer too small for it.
	odd := make([]byte, 10000)
	p.Put(&odd)
	for range 100 {
		if g := p.Get(16384); cap(*g) < 16384 {
			t.Fatalf("tier of 16 KiB gave a buffer of %d", cap(*g))
		}
	}
}

// BenchmarkFramePool: a 16 KiB frame's buffer from ferry's pool against
// gRPC's default one (which clears each buffer it hands out), filled as a
// frame read fills it.
func BenchmarkFramePool(b *testing.B) {
	frame := make([]byte, 16384)
	for _, c := range []struct {
		name string
		pool mem.BufferPool
	}{{"grpc default", mem.DefaultBufferPool()}, {"ferry", &framePool{}}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(frame)))
			for range b.N {
				buf := c.pool.Get(len(frame))
				copy(*buf, frame)
				c.pool.Put(buf)
			}
		})
	}
}

// TestGRPCFramesRoundTrip: requests of many frames, plain and gzip, one
// after another on one connection, arrive byte for byte (partition none
// forwards the request untouched). Frame buffers are reused without being
// cleared (framePool), so a byte of an earlier request showing through
// would fail this; the requests differ in size and content for that.
func TestGRPCFramesRoundTrip(t *testing.T) {
	cfg := testConfig()
	cfg.MaxRequestBytes = 1 << 20
	cfg.Logs = encoding.Config{Topic: "logs", Encoding: "otlp_proto", Partition: "none"}
	sink := &consumertest.Sink{}
	r := start(t, cfg, sink)
	cc, err := grpc.NewClient(r.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	g := otlpgen.New(3)
	var want [][]byte
	for i := range 12 {
		req := plogotlp.NewExportRequestFromLogs(g.LogsOf(40+i*37, 1024+i*100, otlpgen.BodyText))
		b, err := req.MarshalProto()
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, b)
		var opts []grpc.CallOption
		if i%2 == 1 {
			opts = append(opts, grpc.UseCompressor("gzip"))
		}
		if _, err := plogotlp.NewGRPCClient(cc).Export(context.Background(), req, opts...); err != nil {
			t.Fatalf("request %d (%d bytes): %v", i, len(b), err)
		}
	}
	got := sink.Records()
	if len(got) != len(want) {
		t.Fatalf("%d records, want %d", len(got), len(want))
	}
	for i, rec := range got {
		if !bytes.Equal(rec.Value, want[i]) {
			t.Fatalf("request %d: %d bytes in Kafka's record, %d sent, not the same", i, len(rec.Value), len(want[i]))
		}
	}
}
