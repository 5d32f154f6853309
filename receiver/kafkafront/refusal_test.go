package kafkafront

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferryhq/ferry/buffer/budget"
	"github.com/ferryhq/ferry/receiver"
)

// TestRefusalsDoNotWaitForEachOther: with the memory budget full, clients
// holding back the last byte of their produce requests do not delay
// another client's "retry": it is answered (v3, v9, v12) while they still
// hold their requests, and they are closed on their own body_timeout. (A
// refusal used to read under one lease shared by all connections: the
// well-behaved client waited body_timeout, up to 5 s, per trickling client.)
func TestRefusalsDoNotWaitForEachOther(t *testing.T) {
	cfg := testConfig()
	cfg.BodyTimeout = 5 * time.Second
	bud := budget.New(256 << 10)
	f := startFront(t, cfg, receiver.Env{Bodies: bud})
	if !bud.TryReserve(bud.Limit()) {
		t.Fatal("could not fill the budget")
	}
	start := time.Now()
	var slow []*kclient
	for range 3 {
		k := dial(t, f)
		req := add(newProduce(9, -1), "logs", 0, blob(64<<10).bytes(t))
		b := frameOf(k, req)
		k.write(b[:len(b)-1])
		slow = append(slow, k)
	}
	f.waitRequests(t, "Produce", 3)
	k := dial(t, f)
	notEnough := kerr.NotEnoughReplicas.Code
	for _, ver := range []int16{3, 9, 12} {
		req := add(newProduce(ver, -1), "logs", 0, plain("a").bytes(t))
		add(req, "metrics", 2, plain("b").bytes(t))
		add(req, "logs", 1, plain("c").bytes(t))
		checkAnswer(t, k.produce(req), 1000, map[string]want{"logs/0": {notEnough, -1}, "logs/1": {notEnough, -1}, "metrics/2": {notEnough, -1}})
	}
	// Answered while the trickling clients still hold their requests (the
	// old lease answered only after one was closed for its body_timeout).
	if n := f.refused("body_timeout"); n != 0 {
		t.Fatalf("answered after %v, once %v trickling clients were closed for their body_timeout", time.Since(start).Round(time.Millisecond), n)
	}
	for _, s := range slow {
		s.closed()
	}
	if n := f.refused("body_timeout"); n != 3 {
		t.Errorf("%v body_timeout closes counted, want 3", n)
	}
	if n := f.refused("queue_full"); n != 3 {
		t.Errorf("%v queue_full refusals counted, want 3", n)
	}
	if used := f.r.refusals.Used(); used != 0 {
		t.Errorf("%d bytes of the refusals' room still held", used)
	}
}

// TestRefusalBounds: a refused request whose names and partitions the
// refusals' room cannot hold, or with more topics than
// max_partitions_per_request, closes its connection with the reason
// counted; a topic name longer than Kafka allows is answered "retry" as the
// accepted path would answer it (per partition); the room is given back.
func TestRefusalBounds(t *testing.T) {
	cfg := testConfig()
	cfg.MaxPartitions = 50
	bud := budget.New(256 << 10)
	f := startFront(t, cfg, receiver.Env{Bodies: bud})
	if !bud.TryReserve(bud.Limit()) {
		t.Fatal("could not fill the budget")
	}
	room := f.r.refusals
	for _, c := range []struct {
		name   string
		req    func() *kmsg.ProduceRequest
		reason string
	}{
		{"no room", func() *kmsg.ProduceRequest {
			// 40 topics of 1,000-byte names fit max_partitions; the
			// room has 10,000 bytes left.
			room.TryReserve(room.Limit() - 10000)
			req := newProduce(9, -1)
			for i := range 40 {
				add(req, fmt.Sprintf("%03d%s", i, strings.Repeat("n", 997)), 0, nil)
			}
			return req
		}, "queue_full"},
		{"empty topics", func() *kmsg.ProduceRequest {
			req := newProduce(3, -1)
			for i := range 51 {
				tp := kmsg.NewProduceRequestTopic()
				tp.Topic = fmt.Sprint(i)
				req.Topics = append(req.Topics, tp)
			}
			return req
		}, "too_many_partitions"},
	} {
		before := f.refused(c.reason)
		k := dial(t, f)
		k.send(c.req())
		k.closed()
		if n := f.refused(c.reason) - before; n != 1 {
			t.Errorf("%s: %v %s counted, want 1", c.name, n, c.reason)
		}
		if c.name == "no room" {
			room.Release(room.Limit() - 10000)
		}
		if used := room.Used(); used != 0 {
			t.Errorf("%s: %d bytes of the refusals' room still held", c.name, used)
		}
	}
	long := strings.Repeat("n", 300)
	k := dial(t, f)
	checkAnswer(t, k.produce(add(newProduce(9, -1), long, 0, plain("a").bytes(t))), 1000,
		map[string]want{long + "/0": {kerr.NotEnoughReplicas.Code, -1}})
	if used := room.Used(); used != 0 {
		t.Errorf("%d bytes of the refusals' room still held", used)
	}
}

// frameOf is req as the client sends it (kclient.send's framing).
func frameOf(k *kclient, req kmsg.Request) []byte {
	k.corr++
	return encodeRequest(req, k.corr)
}

// FuzzRefusal: whatever a client sends as the rest of a Produce request
// (client id on), the streaming read of a refused request agrees with the
// path that reads it whole (header walk, partition count, kmsg): one
// accepts exactly what the other does, with the same acks and the same
// answer; it never reads past the request, and never keeps more than the
// room it was given (odd room: that many bytes; even: unbounded).
func FuzzRefusal(f *testing.F) {
	for _, v := range []int16{3, 7, 9, 12} {
		req := add(newProduce(v, 1), "logs", 0, []byte("not a batch"))
		add(req, "metrics", 3, nil)
		add(req, "logs", 1, []byte{1, 2, 3})
		var c kclient
		b := frameOf(&c, req)[12:]
		f.Add(v, uint16(0), b)
		f.Add(v, uint16(41), b)
		f.Add(v, uint16(0), b[:len(b)/2])
	}
	f.Fuzz(func(t *testing.T, ver int16, room uint16, b []byte) {
		ver = 3 + (ver&0x7fff)%10
		const maxParts = 1000
		src := bytes.NewReader(append(append([]byte(nil), b...), "next request"...))
		var held int64
		k, err := readRefused(bufio.NewReaderSize(nil, 16), src, len(b), ver, maxParts, func(n int64) bool {
			if room%2 == 1 && held+n > int64(room) {
				return false
			}
			held += n
			return true
		})
		if src.Len() < len("next request") {
			t.Fatalf("read past the request: %d bytes left after it", src.Len())
		}
		if err == nil && src.Len() != len("next request") {
			t.Fatalf("the request was not read whole: %d bytes left", src.Len())
		}
		if errors.Is(err, errNoRoom) {
			return
		}
		if k != nil {
			kept := int64(cap(k.names)) + 8*int64(cap(k.topics)) + 4*int64(cap(k.parts))
			if kept > held {
				t.Fatalf("%d bytes kept, %d reserved", kept, held)
			}
		}
		// The whole-request path.
		req := kmsg.NewPtrProduceRequest()
		req.SetVersion(ver)
		body, ok := skipHeader(b, req.IsFlexible())
		var want error
		switch {
		case !ok:
			want = errMalformed
		default:
			if _, err := countPartitions(body, ver, maxParts); err != nil {
				want = err
			} else if err := req.ReadFrom(body); err != nil {
				want = err
			}
		}
		if (err == nil) != (want == nil) {
			t.Fatalf("v%d: streaming read: %v; whole read: %v", ver, err, want)
		}
		if err != nil {
			var le, wle *limitError
			if !errors.Is(err, errMalformed) && !errors.As(err, &le) {
				t.Fatalf("an error of no known kind: %v", err)
			}
			if errors.As(err, &le) != errors.As(want, &wle) {
				t.Fatalf("v%d: streaming read: %v; whole read: %v", ver, err, want)
			}
			return
		}
		if k.acks != req.Acks {
			t.Fatalf("acks %d; whole read: %d", k.acks, req.Acks)
		}
		if k.acks == 0 {
			if len(k.topics)+len(k.parts)+len(k.names) != 0 {
				t.Fatal("an acks=0 refusal kept names or partitions")
			}
			return
		}
		got, wantResp := k.response(ver), newProduceResponse(req)
		if !bytes.Equal(got.AppendTo(nil), wantResp.AppendTo(nil)) {
			t.Fatalf("answers differ:\n%+v\n%+v", got, wantResp)
		}
	})
}

// TestEmptyTopicsCount: on the accepted path too, a topic with no
// partitions counts towards max_partitions_per_request (an 8 MiB request of
// empty topics, 3 bytes each, made kmsg build 2.8M structs and as many
// answer entries, outside the budget).
func TestEmptyTopicsCount(t *testing.T) {
	cfg := testConfig()
	cfg.MaxPartitions = 50
	f := startFront(t, cfg, receiver.Env{})
	k := dial(t, f)
	req := add(newProduce(9, -1), "logs", 0, plain("a").bytes(t))
	for i := range 50 {
		tp := kmsg.NewProduceRequestTopic()
		tp.Topic = fmt.Sprint(i)
		req.Topics = append(req.Topics, tp)
	}
	k.send(req)
	k.closed()
	if n := f.refused("too_many_partitions"); n != 1 {
		t.Errorf("%v too_many_partitions counted, want 1", n)
	}
	f.sink.none(t)
}

// TestRefusalReservesWhatArrived: a refused request whose one topic name
// declares nearly the whole request, of which the client sends 40 bytes
// and then waits, holds room for what arrived, not for what it declared
// (reserving the declared length let one connection that sent 40 bytes
// hold the whole room).
func TestRefusalReservesWhatArrived(t *testing.T) {
	bud := budget.New(256 << 10)
	f := startFront(t, testConfig(), receiver.Env{Bodies: bud})
	if !bud.TryReserve(bud.Limit()) {
		t.Fatal("could not fill the budget")
	}
	const n = 900 << 10 // the request's size after its size prefix
	b := binary.BigEndian.AppendUint32(nil, n)
	b = append(b, 0, 0, 0, 9, 0, 0, 0, 1, 0, 4, 't', 'e', 's', 't', 0) // Produce v9, corr 1, client id, no tags
	b = append(b, 0, 0xff, 0xff, 0, 0, 0x75, 0x30, 2)                  // no transactional id, acks -1, timeout, 1 topic
	b = binary.AppendUvarint(b, uint64(n-40)+1)                        // a name of nearly all of it
	b = append(b, strings.Repeat("n", 20)...)
	k := dial(t, f)
	k.write(b)
	f.waitRequests(t, "Produce", 1)
	time.Sleep(200 * time.Millisecond)
	if used := f.r.refusals.Used(); used > 64<<10 {
		t.Fatalf("%d bytes of the refusals' room held for a request that sent %d", used, len(b))
	}
}

// TestRefusalOfTheLargestValidShape: with the defaults' bounds, a refused
// request of max_partitions_per_request one-partition topics, each with the
// longest name Kafka accepts, is answered "retry" from an empty room, not
// closed for want of it.
func TestRefusalOfTheLargestValidShape(t *testing.T) {
	cfg := testConfig()
	cfg.MaxRequestBytes, cfg.MaxDecompressedBytes, cfg.MaxPartitions, cfg.MaxInflightBytes = 8<<20, 32<<20, 10000, 64<<20
	bud := budget.New(256 << 10)
	f := startFront(t, cfg, receiver.Env{Bodies: bud})
	if !bud.TryReserve(bud.Limit()) {
		t.Fatal("could not fill the budget")
	}
	req := newProduce(9, -1)
	for i := range 10000 {
		add(req, fmt.Sprintf("%05d%s", i, strings.Repeat("n", 244)), 0, nil)
	}
	resp := dial(t, f).produce(req)
	if len(resp.Topics) != 10000 || resp.Topics[9999].Partitions[0].ErrorCode != kerr.NotEnoughReplicas.Code {
		t.Fatalf("%d topics answered", len(resp.Topics))
	}
	if n := f.refused("queue_full"); n != 1 {
		t.Fatalf("%v queue_full counted, want the one refusal", n)
	}
	if used := f.r.refusals.Used(); used != 0 {
		t.Fatalf("%d bytes of the room still held", used)
	}
}
