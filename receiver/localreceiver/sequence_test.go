package localreceiver

import (
	"bufio"
	"context"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/buffer/spool"
	"github.com/ferryhq/ferry/consumer/consumertest"
	"github.com/ferryhq/ferry/idempotency"
	"github.com/ferryhq/ferry/protocol"
	"github.com/ferryhq/ferry/receiver"
	"github.com/ferryhq/ferry/telemetry"
)

// seqAgent is a local receiver on a real spool (fsync always) with an
// idempotency store, as delivery mode spool builds it.
type seqAgent struct {
	r    *Receiver
	sp   *spool.Spool
	sink *consumertest.Sink
}

func startSeqAgent(t *testing.T, dir string, cfg Config, sink *consumertest.Sink) *seqAgent {
	t.Helper()
	st, err := idempotency.NewStore(idempotency.Config{Window: time.Minute, MaxBytes: 1 << 20}, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	sp, err := spool.Open(spool.Config{Dir: dir, SegmentBytes: 1 << 20, MaxBytes: 64 << 20, Fsync: "always", WriteBuffer: 8 << 20,
		ReadAhead: 4 << 20}, telemetry.TestSettings(), spool.Links{Next: sink, Idem: st})
	if err != nil {
		t.Fatal(err)
	}
	_ = sp.Start(context.Background())
	r := startEnv(t, cfg, receiver.Env{Next: sp, Idem: st})
	return &seqAgent{r: r, sp: sp, sink: sink}
}

func (a *seqAgent) stop() {
	_ = a.r.Shutdown(context.Background())
	_ = a.sp.Shutdown(context.Background())
	_ = a.sp.Close()
}

// dial3 connects at version 3 with producer id pid asking for features.
func dial3(t *testing.T, r *Receiver, pid []byte, feats uint64) (net.Conn, *bufio.Reader, protocol.HelloOK) {
	t.Helper()
	c, err := net.Dial("tcp", r.TCPAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	pre := protocol.PreambleFor(protocol.Version3)
	out := protocol.AppendHello(pre[:], protocol.Hello{Version: 3, ClientName: "t", Features: feats, ProducerID: pid})
	if _, err := c.Write(out); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	h, body := readFrame(t, c, br)
	ok, err := protocol.DecodeHelloOK(body, protocol.DefaultLimits)
	if h.Type != protocol.TypeHelloOK || err != nil || ok.Version != 3 {
		t.Fatalf("hello: type %d %+v %v", h.Type, ok, err)
	}
	return c, br, ok
}

// seqFrame is a version 3 produce frame with sequence seq (and request id
// reqID when not empty), its body compressed with c.
func seqFrame(t *testing.T, id uint32, seq uint64, reqID string, c byte, recs ...protocol.Record) []byte {
	t.Helper()
	flags := protocol.FlagSequence | c
	var body []byte
	if reqID != "" {
		flags |= protocol.FlagRequestID
		body = protocol.AppendRequestID(body, reqID)
	}
	body = protocol.AppendSequence(body, seq)
	body = protocol.AppendProduceCount(body, len(recs))
	prev := ""
	for i := range recs {
		body = protocol.AppendRecord(body, prev, &recs[i])
		prev = string(recs[i].Topic)
	}
	zb, err := protocol.Compress(nil, body, c)
	if err != nil {
		t.Fatal(err)
	}
	return protocol.AppendFrame(nil, protocol.TypeProduce, flags, id, zb)
}

// roundTrip sends frame and reads its result's ranges.
func roundTrip(t *testing.T, c net.Conn, br *bufio.Reader, frame []byte) (protocol.FrameHeader, []protocol.Range) {
	t.Helper()
	if _, err := c.Write(frame); err != nil {
		t.Fatal(err)
	}
	h, body := readFrame(t, c, br)
	if h.Type != protocol.TypeResult {
		reason, msg, _ := protocol.DecodeError(body, protocol.DefaultLimits)
		t.Fatalf("frame type %d: %s %s", h.Type, reason, msg)
	}
	var rc protocol.Receipt
	rs, err := protocol.DecodeResultReceipt(nil, &rc, h.Flags, body, protocol.DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	return h, rs
}

// settle waits until the spool delivered want records to the sink, and
// a little longer to see that no more come.
func settle(t *testing.T, sink *consumertest.Sink, want int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for len(sink.Records()) < want && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	if got := len(sink.Records()); got != want {
		t.Fatalf("the spool delivered %d records, want %d", got, want)
	}
}

// TestSequencedFrameStoredOnce: a version 3 producer's frame sent again
// under the same sequence — on the same connection, on a new one, and
// after the agent restarted on the same spool — is answered accepted and
// stored once; compressed differently or with another request id it is
// another body (the sequence names the exact records: refused as reused
// only when the records differ). A different producer id is another
// producer.
func TestSequencedFrameStoredOnce(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t)
	a := startSeqAgent(t, dir, cfg, &consumertest.Sink{})
	pid := []byte("0123456789abcdef")
	c, br, ok := dial3(t, a.r, pid, protocol.FeatureIdempotence|protocol.FeatureLZ4)
	if ok.Features&protocol.FeatureIdempotence == 0 {
		t.Fatalf("idempotence not granted in delivery mode spool: features %d", ok.Features)
	}
	recs := []protocol.Record{{Topic: []byte("t"), Value: []byte("a")}, {Topic: []byte("t"), Value: []byte("b")}, {Topic: []byte("t"), Value: []byte("c")}}
	accepted := func(rs []protocol.Range, n uint32) bool {
		return len(rs) == 1 && rs[0].Status == protocol.StatusOK && (rs[0].Count == n || rs[0].Count == 0)
	}
	if _, rs := roundTrip(t, c, br, seqFrame(t, 1, 7, "", 0, recs...)); !accepted(rs, 3) {
		t.Fatalf("first: %+v", rs)
	}
	// The same records under the same sequence, compressed this time.
	if _, rs := roundTrip(t, c, br, seqFrame(t, 2, 7, "", protocol.CompressLZ4, recs...)); !accepted(rs, 3) {
		t.Fatalf("retry: %+v", rs)
	}
	c2, br2, _ := dial3(t, a.r, pid, protocol.FeatureIdempotence)
	if _, rs := roundTrip(t, c2, br2, seqFrame(t, 1, 7, "", 0, recs...)); !accepted(rs, 3) {
		t.Fatalf("retry on a new connection: %+v", rs)
	}
	settle(t, a.sink, 3)

	// Another body under the same sequence is the client's bug.
	if _, rs := roundTrip(t, c2, br2, seqFrame(t, 2, 7, "", 0, recs[:2]...)); len(rs) != 1 || rs[0].Status != protocol.StatusPermanent || rs[0].Reason != "sequence_reused" {
		t.Fatalf("reused sequence: %+v", rs)
	}
	// Another producer's sequence 7 is its own.
	c3, br3, _ := dial3(t, a.r, []byte("fedcba9876543210"), protocol.FeatureIdempotence)
	if _, rs := roundTrip(t, c3, br3, seqFrame(t, 1, 7, "", 0, recs...)); !accepted(rs, 3) {
		t.Fatalf("another producer: %+v", rs)
	}
	settle(t, a.sink, 6)
	c.Close()
	c2.Close()
	c3.Close()
	a.stop()

	// The agent restarts on the same spool: the sequence is remembered.
	sink := &consumertest.Sink{}
	a = startSeqAgent(t, dir, cfg, sink)
	defer a.stop()
	c, br, _ = dial3(t, a.r, pid, protocol.FeatureIdempotence)
	if _, rs := roundTrip(t, c, br, seqFrame(t, 1, 7, "", 0, recs...)); !accepted(rs, 3) {
		t.Fatalf("retry after restart: %+v", rs)
	}
	if _, rs := roundTrip(t, c, br, seqFrame(t, 2, 8, "", 0, recs[:1]...)); !accepted(rs, 1) {
		t.Fatalf("a new sequence after restart: %+v", rs)
	}
	// A restarted spool replays what Kafka had not acknowledged (the sink
	// acknowledges: nothing), so only the new frame's record arrives.
	settle(t, sink, 1)
}

// TestSequenceReplayKeepsRefusals: a retry of a frame some of whose
// records the agent refused on their own (a topic this connection may not
// write to) is answered as the first was: those refused again, the rest
// accepted, nothing stored again.
func TestSequenceReplayKeepsRefusals(t *testing.T) {
	cfg := testConfig(t)
	cfg.Topics = []string{"ok-*"}
	a := startSeqAgent(t, t.TempDir(), cfg, &consumertest.Sink{})
	defer a.stop()
	c, br, _ := dial3(t, a.r, []byte("0123456789abcdef"), protocol.FeatureIdempotence)
	recs := []protocol.Record{{Topic: []byte("ok-1"), Value: []byte("a")}, {Topic: []byte("no"), Value: []byte("b")}, {Topic: []byte("ok-1"), Value: []byte("c")}}
	want := []byte{protocol.StatusOK, protocol.StatusPermanent, protocol.StatusOK}
	for try := range 2 {
		_, rs := roundTrip(t, c, br, seqFrame(t, uint32(try+1), 1, "", 0, recs...))
		if len(rs) != 3 {
			t.Fatalf("try %d: %+v", try, rs)
		}
		for i, rg := range rs {
			if rg.Status != want[i] || rg.Count != 1 {
				t.Fatalf("try %d: range %d: %+v", try, i, rs)
			}
		}
	}
	settle(t, a.sink, 2)
}

// TestSequenceWithoutIdempotence: an agent that does not keep sequences
// (delivery mode kafka: no store) grants no idempotence, and a sequenced
// frame there is refused for good, the connection going on; a hello
// without a producer id is not granted it either. A version 4 preamble is
// refused.
func TestSequenceWithoutIdempotence(t *testing.T) {
	sink := &consumertest.Sink{}
	r := start(t, testConfig(t), sink, nil)
	c, br, ok := dial3(t, r, []byte("0123456789abcdef"), protocol.FeatureIdempotence)
	if ok.Features&protocol.FeatureIdempotence != 0 {
		t.Fatal("idempotence granted without a store")
	}
	rec := protocol.Record{Topic: []byte("t"), Value: []byte("v")}
	if _, rs := roundTrip(t, c, br, seqFrame(t, 1, 1, "", 0, rec)); len(rs) != 1 || rs[0].Status != protocol.StatusPermanent || rs[0].Reason != "idempotence_unavailable" {
		t.Fatalf("%+v", rs)
	}
	if _, rs := roundTrip(t, c, br, produce(2, rec)); len(rs) != 1 || rs[0].Status != protocol.StatusOK {
		t.Fatalf("the connection goes on: %+v", rs)
	}

	a := startSeqAgent(t, t.TempDir(), testConfig(t), &consumertest.Sink{})
	defer a.stop()
	if _, _, ok := dial3(t, a.r, nil, protocol.FeatureIdempotence); ok.Features&protocol.FeatureIdempotence != 0 {
		t.Fatal("idempotence granted to a hello without a producer id")
	}
	_, _, h, body := dialVersion(t, r, 4, 4)
	if reason, _, _ := protocol.DecodeError(body, protocol.DefaultLimits); h.Type != protocol.TypeError || reason != "unsupported_version" {
		t.Fatalf("version 4: %d %q", h.Type, body)
	}
}

// TestSequenceTruncatedIsMalformed: flag 16 with a body that ends inside
// the sequence varint breaks the stream.
func TestSequenceTruncatedIsMalformed(t *testing.T) {
	a := startSeqAgent(t, t.TempDir(), testConfig(t), &consumertest.Sink{})
	defer a.stop()
	c, br, _ := dial3(t, a.r, []byte("0123456789abcdef"), protocol.FeatureIdempotence)
	_, _ = c.Write(protocol.AppendFrame(nil, protocol.TypeProduce, protocol.FlagSequence, 1, []byte{0x80}))
	h, body := readFrame(t, c, br)
	if reason, _, _ := protocol.DecodeError(body, protocol.DefaultLimits); h.Type != protocol.TypeError || reason != "malformed_frame" {
		t.Fatalf("%d %q", h.Type, body)
	}
}
