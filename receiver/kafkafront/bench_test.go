package kafkafront

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferryhq/ferry/idempotency"
	"github.com/ferryhq/ferry/receiver"
	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/telemetry"
)

// BenchmarkProduce is the produce path end to end on loopback: a request
// of one batch of ten 100-byte records per partition (one or eight
// partitions), read, decoded, handed to a pipeline that acknowledges at
// once, answered. "plain" is a producer without idempotence (its cost must
// not move when idempotent producers get more work); "idempotent" one with
// a producer id, every batch a new sequence range (no duplicates).
func BenchmarkProduce(b *testing.B) {
	for _, parts := range []int{1, 8} {
		for _, idem := range []bool{false, true} {
			name := fmt.Sprintf("plain/partitions=%d", parts)
			if idem {
				name = fmt.Sprintf("idempotent/partitions=%d", parts)
			}
			b.Run(name, func(b *testing.B) { benchProduce(b, parts, idem, receiver.Env{}) })
		}
		// Delivery mode spool: every idempotent batch also gets a key in
		// the idempotency store, committed as the spool would.
		b.Run(fmt.Sprintf("idempotent_spool/partitions=%d", parts), func(b *testing.B) {
			st, err := idempotency.NewStore(idempotency.Config{Window: time.Minute, MaxBytes: 16 << 20}, nil)
			if err != nil {
				b.Fatal(err)
			}
			benchProduce(b, parts, true, receiver.Env{Idem: st, Next: commitAll{st}})
		})
	}
}

// commitAll is a spool-mode pipeline that stores every batch at once: its
// keys are committed, its records acknowledged.
type commitAll struct{ st *idempotency.Store }

func (c commitAll) Consume(_ context.Context, b *record.Batch) error {
	for id := b.Idem; id != nil; id = id.Next {
		c.st.Commit(id)
	}
	b.Arm()
	for i := range b.Records {
		b.AckAt(i, nil)
	}
	return nil
}

// benchProduce runs the produce benchmark against a front built with env
// (Set, Next and Topics are filled in).
func benchProduce(b *testing.B, parts int, idem bool, env receiver.Env) {
	cfg := testConfig()
	cfg.MaxPartitions = 1000
	env.Set, env.Topics = telemetry.TestSettings(), func(_ context.Context, names []string) ([]TopicInfo, error) {
		out := make([]TopicInfo, len(names))
		for i, n := range names {
			out[i] = TopicInfo{Topic: n, Partitions: int32(parts)}
		}
		return out, nil
	}
	if env.Next == nil {
		env.Next = ackAll{}
	}
	r, err := New(cfg, env)
	if err != nil {
		b.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = r.Shutdown(context.Background()) }()
	c, err := net.Dial("tcp", r.Addr())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	pid := int64(-1)
	if idem {
		req := kmsg.NewPtrInitProducerIDRequest()
		req.Version = 4
		resp := kmsg.NewPtrInitProducerIDResponse()
		benchRoundTrip(b, c, appendRequest(nil, req, 1), req.Version, resp)
		pid = resp.ProducerID
	}
	value := make([]byte, 100)
	seqs := make([]int32, parts)
	build := func(corr int32) []byte {
		req := newProduce(9, -1)
		for p := range parts {
			tb := tbatch{pid: -1, epoch: -1, seq: -1}
			if idem {
				tb.pid, tb.epoch, tb.seq = pid, 0, seqs[p]
				seqs[p] += 10
			}
			for range 10 {
				tb.recs = append(tb.recs, trec{value: value})
			}
			add(req, "bench", int32(p), tb.bytes(b))
		}
		return appendRequest(nil, req, corr)
	}
	// Requests are built beforehand (a client's cost, not ferry's).
	reqs := make([][]byte, b.N)
	for i := range reqs {
		reqs[i] = build(int32(i + 2))
	}
	resp := kmsg.NewPtrProduceResponse()
	b.ReportAllocs()
	b.SetBytes(int64(parts * 10 * len(value)))
	b.ResetTimer()
	for i := range b.N {
		benchRoundTrip(b, c, reqs[i], 9, resp)
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if p.ErrorCode != 0 {
					b.Fatalf("partition %d: error %d", p.Partition, p.ErrorCode)
				}
			}
		}
	}
}

// benchRoundTrip writes one request frame and reads its answer into resp.
func benchRoundTrip(b *testing.B, c net.Conn, frame []byte, ver int16, resp kmsg.Response) {
	_ = c.SetDeadline(time.Now().Add(wait))
	if _, err := c.Write(frame); err != nil {
		b.Fatal(err)
	}
	var size [4]byte
	if _, err := io.ReadFull(c, size[:]); err != nil {
		b.Fatal(err)
	}
	body := make([]byte, binary.BigEndian.Uint32(size[:]))
	if _, err := io.ReadFull(c, body); err != nil {
		b.Fatal(err)
	}
	resp.SetVersion(ver)
	body = body[4:]
	if resp.IsFlexible() {
		body = body[1:] // the response header's empty tag section
	}
	if err := resp.ReadFrom(body); err != nil {
		b.Fatal(err)
	}
}
