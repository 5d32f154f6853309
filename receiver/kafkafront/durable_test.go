package kafkafront

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferryhq/ferry/auth"
	"github.com/ferryhq/ferry/auth/authtest"
	"github.com/ferryhq/ferry/auth/token"
	"github.com/ferryhq/ferry/buffer/spool"
	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/idempotency"
	"github.com/ferryhq/ferry/receiver"
	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/telemetry"
)

// newIdemStore is a store as delivery mode spool builds it (64 KiB: the
// smallest max_bytes allowed).
func newIdemStore(t *testing.T) *idempotency.Store {
	t.Helper()
	st, err := idempotency.NewStore(idempotency.Config{Window: time.Minute, MaxBytes: 64 << 10}, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// keysOf lists the keys a batch carries to the spool: each one's record
// count.
func keysOf(b *record.Batch) []int {
	var out []int
	for id := b.Idem; id != nil; id = id.Next {
		out = append(out, id.Records)
	}
	return out
}

// stored does what the spool does once a batch's records are stored:
// commit its keys, then complete it (no offsets: Kafka has not seen it).
func (h *heldBatch) stored(st *idempotency.Store) {
	if !h.s.take(h) {
		return
	}
	for id := h.b.Idem; id != nil; id = id.Next {
		st.Commit(id)
	}
	b := h.b
	for i := range len(h.recs) {
		b.AckAt(i, nil)
	}
}

// TestProduceIdempotentDurable: in delivery mode spool an idempotent
// producer's batches are recognised through the idempotency store, which
// outlives the front (the spool gives it back after a restart; here a
// second front on the same store is the restarted agent, knowing no
// producer id): every partition's batch carries its own key to the spool;
// a retry after a restart is answered OK with nothing delivered (was:
// delivered again), one whose first copy is still being stored is
// retriable, the same sequences with other bytes are refused
// OUT_OF_ORDER_SEQUENCE_NUMBER; and every path where a batch is not stored
// gives its key back, so the client's retry is delivered.
func TestProduceIdempotentDurable(t *testing.T) {
	st := newIdemStore(t)
	f := startFront(t, testConfig(), receiver.Env{Idem: st})
	a := dial(t, f)
	pid, epoch := a.initProducerID()
	batch := func(seq int32, values ...string) []byte {
		tb := plain(values...)
		tb.pid, tb.epoch, tb.seq = pid, epoch, seq
		return tb.bytes(t)
	}
	notEnough, outOfOrder := kerr.NotEnoughReplicas.Code, kerr.OutOfOrderSequenceNumber.Code
	first := add(newProduce(9, -1), "logs", 0, batch(0, "a", "b"))
	add(first, "logs", 1, batch(0, "c"))
	add(first, "logs", 2, plain("plain").bytes(t)) // not idempotent: no key, always delivered
	corr := a.send(first)
	h := f.sink.next(t)
	recordsAre(t, h.recs, "logs/0 ka=a", "logs/0 kb=b", "logs/1 kc=c", "logs/2 kplain=plain")
	if got := fmt.Sprint(keysOf(h.b)); got != "[2 1]" {
		t.Fatalf("keys to the spool (records each): %s, want [2 1]: one per idempotent partition", got)
	}

	// The agent restarted while the first copy is being stored: a second
	// front on the same store does not know the producer id; the store
	// says the batches are in flight.
	f2 := startFront(t, testConfig(), receiver.Env{Idem: st})
	b := dial(t, f2)
	dupCorr := b.send(first)
	h2 := f2.sink.next(t)
	recordsAre(t, h2.recs, "logs/2 kplain=plain")
	h2.stored(st)
	resp := kmsg.NewPtrProduceResponse()
	b.recv(dupCorr, 9, resp)
	checkAnswer(t, resp, anyThrottle, map[string]want{"logs/0": {notEnough, -1}, "logs/1": {notEnough, -1}, "logs/2": {0, -1}})
	if n := f2.refused("duplicate_in_flight"); n != 2 {
		t.Errorf("%v duplicate_in_flight counted, want 2", n)
	}

	h.stored(st)
	resp = kmsg.NewPtrProduceResponse()
	a.recv(corr, 9, resp)
	checkAnswer(t, resp, 0, map[string]want{"logs/0": {0, -1}, "logs/1": {0, -1}, "logs/2": {0, -1}})

	// Stored: the retry after the restart is answered OK, nothing
	// delivered but the plain batch.
	dupCorr = b.send(first)
	h2 = f2.sink.next(t)
	recordsAre(t, h2.recs, "logs/2 kplain=plain")
	h2.stored(st)
	resp = kmsg.NewPtrProduceResponse()
	b.recv(dupCorr, 9, resp)
	checkAnswer(t, resp, 0, map[string]want{"logs/0": {0, -1}, "logs/1": {0, -1}, "logs/2": {0, -1}})
	if n := f2.refused("duplicate_batch"); n != 2 {
		t.Errorf("%v duplicate_batch counted, want 2", n)
	}
	// A partition on its own, regrouped as a client does: the same.
	checkAnswer(t, b.produce(add(newProduce(9, -1), "logs", 1, batch(0, "c"))), 0, map[string]want{"logs/1": {0, -1}})
	f2.sink.none(t)

	// The same producer id, epoch, partition and sequences with other
	// bytes: refused, nothing delivered, on either front.
	for _, k := range []*kclient{a, b} {
		checkAnswer(t, k.produce(add(newProduce(9, -1), "logs", 0, batch(0, "x", "y"))), 0, map[string]want{"logs/0": {outOfOrder, -1}})
	}
	f.sink.none(t)
	f2.sink.none(t)
	if n := f.refused("producer_sequence_reused") + f2.refused("producer_sequence_reused"); n != 2 {
		t.Errorf("%v producer_sequence_reused counted, want 2", n)
	}

	// Every path where the batch is not stored gives its key back: the
	// retry is delivered (not "in flight" for ever, not a replay).
	next := func(seq int32, v string) *kmsg.ProduceRequest {
		return add(newProduce(9, -1), "logs", 0, batch(seq, v))
	}
	t.Run("refused_by_the_pipeline", func(t *testing.T) {
		f2.sink.setRefuse(consumer.ErrFull)
		checkAnswer(t, b.produce(next(2, "d")), anyThrottle, map[string]want{"logs/0": {notEnough, -1}})
		f2.sink.setRefuse(nil)
		corr := b.send(next(2, "d"))
		h := f2.sink.next(t)
		recordsAre(t, h.recs, "logs/0 kd=d")
		h.stored(st)
		resp := kmsg.NewPtrProduceResponse()
		b.recv(corr, 9, resp)
		checkAnswer(t, resp, 0, map[string]want{"logs/0": {0, -1}})
	})
	t.Run("failed_in_the_pipeline", func(t *testing.T) {
		corr := b.send(next(3, "e"))
		f2.sink.next(t).fail(consumer.ErrUnavailable)
		resp := kmsg.NewPtrProduceResponse()
		b.recv(corr, 9, resp)
		checkAnswer(t, resp, anyThrottle, map[string]want{"logs/0": {notEnough, -1}})
		corr = b.send(next(3, "e"))
		f2.sink.next(t).stored(st)
		resp = kmsg.NewPtrProduceResponse()
		b.recv(corr, 9, resp)
		checkAnswer(t, resp, 0, map[string]want{"logs/0": {0, -1}})
	})
	t.Run("refused_while_decoding", func(t *testing.T) {
		bad := plain("f", "g")
		bad.pid, bad.epoch, bad.seq = pid, epoch, 4
		raw := bad.bytes(t)
		binary.BigEndian.PutUint32(raw[57:], 3) // three records claimed, two there
		binary.BigEndian.PutUint32(raw[17:], crc32.Checksum(raw[batchCRCStart:], crc32c))
		for range 2 {
			checkAnswer(t, b.produce(add(newProduce(9, -1), "logs", 0, raw)), 0, map[string]want{"logs/0": {kerr.CorruptMessage.Code, -1}})
		}
		f2.sink.none(t)
	})
	t.Run("acks_zero_refused", func(t *testing.T) {
		f2.sink.setRefuse(consumer.ErrFull)
		req := next(7, "h")
		req.Acks = 0
		b.send(req)
		b.answersNext(b.apiVersions())
		f2.sink.setRefuse(nil)
		corr := b.send(next(7, "h"))
		f2.sink.next(t).stored(st)
		resp := kmsg.NewPtrProduceResponse()
		b.recv(corr, 9, resp)
		checkAnswer(t, resp, 0, map[string]want{"logs/0": {0, -1}})
	})
	t.Run("decoded_twice", func(t *testing.T) {
		// Inflating past the first reservation: decoded again, its key
		// given back between the passes, so it is delivered once, then
		// recognised by the other front.
		big := blob(1 << 20)
		big.pid, big.epoch, big.seq, big.codec = pid, epoch, 8, kgo.ZstdCompression()
		req := add(newProduce(9, -1), "logs", 0, big.bytes(t))
		corr := b.send(req)
		h := f2.sink.next(t)
		if got := fmt.Sprint(keysOf(h.b)); got != "[1]" {
			t.Fatalf("keys: %s", got)
		}
		h.stored(st)
		resp := kmsg.NewPtrProduceResponse()
		b.recv(corr, 9, resp)
		checkAnswer(t, resp, 0, map[string]want{"logs/0": {0, -1}})
		checkAnswer(t, a.produce(req), 0, map[string]want{"logs/0": {0, -1}})
		f.sink.none(t)
	})
	if n := st.Len(); n != 6 {
		t.Errorf("the store remembers %d keys, want 6 (the batches stored)", n)
	}
}

// TestProduceIdempotentScoped: keys are scoped to the application the
// connection authenticated as: another application's batch with the same
// producer id and bytes is its own (delivered), never a replay of the
// first's.
func TestProduceIdempotentScoped(t *testing.T) {
	st := newIdemStore(t)
	cfg := testConfig()
	cfg.Auth = auth.ReceiverConfig{Mode: "optional", Sources: []string{"sasl"}}
	checker, _ := authtest.New(t)
	f := startFront(t, cfg, receiver.Env{Idem: st, Pre: &receiver.Prechecks{Checker: checker}})
	login := func(app string) *kclient {
		k := dial(t, f)
		if app == "" {
			return k
		}
		hs := kmsg.NewPtrSASLHandshakeRequest()
		hs.Version, hs.Mechanism = 1, "PLAIN"
		k.recv(k.send(hs), 1, kmsg.NewPtrSASLHandshakeResponse())
		au := kmsg.NewPtrSASLAuthenticateRequest()
		au.Version, au.SASLAuthBytes = 1, []byte("\x00u\x00"+authtest.IssueClaims(t, token.Claims{App: app}))
		resp := kmsg.NewPtrSASLAuthenticateResponse()
		k.recv(k.send(au), 1, resp)
		if resp.ErrorCode != 0 {
			t.Fatalf("SASL %s: %d", app, resp.ErrorCode)
		}
		return k
	}
	tb := plain("v")
	tb.pid, tb.epoch, tb.seq = 1234567, 0, 0 // an id no front issued (a previous run's)
	req := add(newProduce(9, -1), "logs", 0, tb.bytes(t))
	for i, app := range []string{"shop", "", "billing", "shop"} {
		k := login(app)
		corr := k.send(req)
		if i < 3 {
			// shop's second send is its replay: not delivered.
			f.sink.next(t).stored(st)
		}
		resp := kmsg.NewPtrProduceResponse()
		k.recv(corr, 9, resp)
		checkAnswer(t, resp, 0, map[string]want{"logs/0": {0, -1}})
	}
	f.sink.none(t)
	if n := f.refused("duplicate_batch"); n != 1 {
		t.Errorf("%v duplicate_batch counted, want 1 (shop's second send)", n)
	}
}

// TestProduceIdempotentStoreFull: the keys of batches still being stored
// are bounded by the store's max_bytes: past it a partition is answered
// retriable (idempotency_full) and nothing of it is delivered; once the
// others are stored there is room again (answered keys are evicted, the
// oldest first).
func TestProduceIdempotentStoreFull(t *testing.T) {
	st := newIdemStore(t)
	f := startFront(t, testConfig(), receiver.Env{Idem: st})
	k := dial(t, f)
	// 100 partitions a request (testConfig's bound), each under its own
	// producer id: 500 keys of 141 bytes, against 64 KiB (464 keys). The
	// 464 delivered are held (being stored) until every request was read.
	pidN := int64(1 << 40)
	request := func() *kmsg.ProduceRequest {
		req := newProduce(9, -1)
		for i := range 100 {
			tb := plain(fmt.Sprint("v", pidN))
			tb.pid, tb.epoch, tb.seq = pidN, 0, 0
			pidN++
			add(req, "logs", int32(i%3), tb.bytes(t))
		}
		return req
	}
	var corrs []int32
	for range 5 {
		corrs = append(corrs, k.send(request()))
	}
	var held []*heldBatch
	records := 0
	for records < 464 {
		h := f.sink.next(t)
		held = append(held, h)
		records += len(h.recs)
	}
	if records != 464 {
		t.Fatalf("%d records delivered with their keys, want 464 (64 KiB / 141 bytes)", records)
	}
	for _, h := range held {
		h.stored(st)
	}
	full := 0
	for _, corr := range corrs {
		resp := kmsg.NewPtrProduceResponse()
		k.recv(corr, 9, resp)
		for _, tp := range resp.Topics {
			for _, p := range tp.Partitions {
				switch p.ErrorCode {
				case 0:
				case kerr.NotEnoughReplicas.Code:
					full++
				default:
					t.Fatalf("request %d: partition error %v", corr, kerr.ErrorForCode(p.ErrorCode))
				}
			}
		}
	}
	if full != 500-464 || f.refused("idempotency_full") != float64(full) {
		t.Errorf("%d partitions refused retriable, idempotency_full %v; want %d", full, f.refused("idempotency_full"), 500-464)
	}
	f.sink.none(t)
	// Room again: the next request's keys evict the oldest answered ones.
	corr := k.send(request())
	f.sink.next(t).stored(st)
	resp := kmsg.NewPtrProduceResponse()
	k.recv(corr, 9, resp)
	for _, tp := range resp.Topics {
		for _, p := range tp.Partitions {
			if p.ErrorCode != 0 {
				t.Fatalf("after the first were stored: partition error %v", kerr.ErrorForCode(p.ErrorCode))
			}
		}
	}
}

// spoolSink is the exporter behind a real spool: it keeps the values the
// spool's reader hands it and acknowledges them.
type spoolSink struct {
	mu   sync.Mutex
	seen map[string]int
	n    int
}

func (s *spoolSink) Consume(_ context.Context, b *record.Batch) error {
	s.mu.Lock()
	for _, r := range b.Records {
		s.seen[string(r.Value)]++
		s.n++
	}
	s.mu.Unlock()
	b.Arm()
	for i := range b.Records {
		b.AckAt(i, nil)
	}
	return nil
}

func (s *spoolSink) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

// TestProduceIdempotentSpoolRestart: the front over a real spool (fsync
// always), closed and opened again with a new store and a new front, as a
// restarted agent: the batches stored by the first run are recognised from
// the spool's key log, answered OK and not appended again; the spool holds
// every record once.
func TestProduceIdempotentSpoolRestart(t *testing.T) {
	dir := t.TempDir()
	cfg := spool.Config{Dir: dir, SegmentBytes: 1 << 20, MaxBytes: 64 << 20, Fsync: "always",
		FsyncInterval: 10 * time.Millisecond, WriteBuffer: 8 << 20, ReadAhead: 4 << 20}
	run := func(next consumer.Consumer) (*spool.Spool, *front) {
		st := newIdemStore(t)
		s, err := spool.Open(cfg, telemetry.TestSettings(), spool.Links{Next: next, MaxRecordBytes: 1 << 20, Idem: st})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		fr := &front{set: telemetry.TestSettings()}
		r, err := New(testConfig(), receiver.Env{Set: fr.set, Next: s, Topics: frontTopics, Idem: st})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		fr.r = r
		return s, fr
	}
	stop := func(s *spool.Spool, fr *front) {
		_ = fr.r.Shutdown(context.Background())
		_ = s.Shutdown(context.Background())
		_ = s.Close()
	}
	// The first run's exporter is down: nothing leaves the spool.
	s1, f1 := run(consumer.Func(func(context.Context, *record.Batch) error { return consumer.ErrUnavailable }))
	k := dial(t, f1)
	pid, _ := k.initProducerID()
	var reqs []*kmsg.ProduceRequest
	for i := range 20 {
		req := newProduce(9, -1)
		for p := range 3 {
			tb := plain(fmt.Sprintf("r%d-p%d-a", i, p), fmt.Sprintf("r%d-p%d-b", i, p))
			tb.pid, tb.epoch, tb.seq = pid, 0, int32(2*i)
			add(req, "logs", int32(p), tb.bytes(t))
		}
		checkAnswer(t, k.produce(req), 0, map[string]want{"logs/0": {0, -1}, "logs/1": {0, -1}, "logs/2": {0, -1}})
		reqs = append(reqs, req)
	}
	k.c.Close()
	stop(s1, f1)

	sink := &spoolSink{seen: map[string]int{}}
	s2, f2 := run(sink)
	defer stop(s2, f2)
	k = dial(t, f2)
	for _, req := range reqs {
		checkAnswer(t, k.produce(req), 0, map[string]want{"logs/0": {0, -1}, "logs/1": {0, -1}, "logs/2": {0, -1}})
	}
	if n := f2.refused("duplicate_batch"); n != 60 {
		t.Errorf("%v duplicate_batch counted, want 60", n)
	}
	// A batch never sent before is stored.
	tb := plain("new")
	tb.pid, tb.epoch, tb.seq = pid, 0, 40
	checkAnswer(t, k.produce(add(newProduce(9, -1), "logs", 0, tb.bytes(t))), 0, map[string]want{"logs/0": {0, -1}})
	for deadline := time.Now().Add(wait); sink.count() < 121; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			break
		}
	}
	time.Sleep(quietFor)
	sink.mu.Lock()
	defer sink.mu.Unlock()
	if sink.n != 121 || len(sink.seen) != 121 {
		t.Fatalf("the spool delivered %d records, %d distinct; want 121 once each (120 from the first run, 1 new)", sink.n, len(sink.seen))
	}
}

// FuzzProduceSequencesDurable is FuzzProduceSequences in delivery mode
// spool, with agent restarts in the script: the pipeline commits each
// stored batch's keys as the spool does, and a restart replaces the front
// (its sequence table empty, the producer ids it issued unknown) while the
// idempotency store — given back by the spool at start — stays. Whatever
// the order, every batch answered OK was delivered, and exactly once, for
// every producer id (the durable keys cover ids a front never issued, or
// issued before a restart).
func FuzzProduceSequencesDurable(f *testing.F) {
	sink := &ledgerSink{delivered: map[string]int{}}
	st, err := idempotency.NewStore(idempotency.Config{Window: time.Hour, MaxBytes: 64 << 20}, nil)
	if err != nil {
		f.Fatal(err)
	}
	next := consumer.Func(func(ctx context.Context, b *record.Batch) error {
		sink.mu.Lock()
		fail := sink.fail
		sink.mu.Unlock()
		if !fail {
			for id := b.Idem; id != nil; id = id.Next {
				st.Commit(id)
			}
		}
		return sink.Consume(ctx, b)
	})
	cluster := func(_ context.Context, topics []string) ([]TopicInfo, error) {
		out := make([]TopicInfo, len(topics))
		for i, t := range topics {
			out[i] = TopicInfo{Topic: t, Partitions: 2}
		}
		return out, nil
	}
	start := func(t testing.TB) *Receiver {
		r, err := New(testConfig(), receiver.Env{Set: telemetry.TestSettings(), Next: next, Topics: cluster, Idem: st})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		return r
	}

	// Two bytes an operation: connection, producer id, epoch; partition,
	// sequence, content, whether the pipeline fails it, and whether the
	// agent restarts before it.
	f.Add([]byte{0, 0, 1, 16})                // a batch, a restart, its retry
	f.Add([]byte{0, 8, 0, 16})                // a failed batch, a restart, its retry
	f.Add([]byte{0, 0, 0, 20})                // a batch, a restart, the same sequence with other bytes
	f.Add([]byte{8, 0, 0, 16, 8, 0})          // epoch 1, a restart, a late batch of epoch 0, epoch 1 again
	f.Add([]byte{4, 0, 4, 16, 5, 0})          // an id never issued, across a restart, on both connections
	f.Add([]byte{0, 0, 1, 0, 0, 16, 1, 16})   // retries on both sides of two restarts
	f.Add([]byte{0, 2, 1, 2, 0, 18, 0, 6, 1}) // another sequence and partition, other content
	f.Fuzz(func(t *testing.T, script []byte) {
		if len(script) > 2*40 {
			return
		}
		r := start(t)
		defer func() { _ = r.Shutdown(context.Background()) }()
		var conns [2]*fuzzSession
		dialAll := func() {
			for i := range conns {
				c, err := net.Dial("tcp", r.Addr())
				if err != nil {
					t.Fatal(err)
				}
				conns[i] = &fuzzSession{c: c}
			}
		}
		dialAll()
		defer func() {
			for _, c := range conns {
				c.c.Close()
			}
		}()
		var pids [3]int64
		for i := range 2 {
			req := kmsg.NewPtrInitProducerIDRequest()
			req.Version = 1
			resp := kmsg.NewPtrInitProducerIDResponse()
			if err := conns[0].roundTrip(req, resp); err != nil {
				t.Fatal(err)
			}
			pids[i] = resp.ProducerID
		}
		pids[2] = pids[0] ^ 1<<40 // never issued
		run := fmt.Sprint(time.Now().UnixNano())
		answeredOK := map[string]bool{}
		for ; len(script) >= 2; script = script[2:] {
			op, op2 := script[0], script[1]
			if op2>>4&1 == 1 {
				for _, c := range conns {
					c.c.Close()
				}
				_ = r.Shutdown(context.Background())
				r = start(t)
				dialAll()
			}
			conn := conns[op&1]
			_, value, req, fail := scriptProduce(op, op2, run, pids[:])
			sink.mu.Lock()
			sink.fail = fail
			sink.mu.Unlock()
			resp := kmsg.NewPtrProduceResponse()
			if err := conn.roundTrip(req, resp); err != nil {
				t.Fatal(err)
			}
			if resp.Topics[0].Partitions[0].ErrorCode == 0 {
				answeredOK[value] = true
			}
		}
		sink.mu.Lock()
		defer sink.mu.Unlock()
		for v := range answeredOK {
			if n := sink.delivered[v]; n != 1 {
				t.Fatalf("%s answered OK and delivered %d times", v, n)
			}
		}
	})
}
