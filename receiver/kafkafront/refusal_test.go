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
// well-behaved client waited five seconds per trickling client.)
func TestRefusalsDoNotWaitForEachOther(t *testing.T) {
	cfg := testConfig()
	cfg.BodyTimeout = 3 * time.Second
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
	if held := time.Since(start); held >= cfg.BodyTimeout {
		t.Fatalf("the answers took %v: they waited for the trickling clients' body_timeout", held)
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

// TestRefusalBounds: a refused request whose names the refusals' room
// cannot hold, or whose topic name is longer than Kafka allows, or with
// more topics than max_partitions_per_request, closes its connection with
// the reason counted; the room is given back.
func TestRefusalBounds(t *testing.T) {
	cfg := testConfig()
	cfg.MaxPartitions = 50
	bud := budget.New(256 << 10)
	f := startFront(t, cfg, receiver.Env{Bodies: bud})
	if !bud.TryReserve(bud.Limit()) {
		t.Fatal("could not fill the budget")
	}
	for _, c := range []struct {
		name   string
		req    func() *kmsg.ProduceRequest
		reason string
	}{
		{"no room", func() *kmsg.ProduceRequest {
			// 40 topics of 249 bytes with one partition each fit
			// max_partitions; the room is taken first.
			f.r.refusals.TryReserve(f.r.refusals.Limit() - 1000)
			req := newProduce(9, -1)
			for i := range 40 {
				add(req, fmt.Sprintf("%03d%s", i, strings.Repeat("n", 246)), 0, nil)
			}
			return req
		}, "queue_full"},
		{"long name", func() *kmsg.ProduceRequest {
			return add(newProduce(9, -1), strings.Repeat("n", 250), 0, plain("a").bytes(t))
		}, "malformed_request"},
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
			f.r.refusals.Release(f.r.refusals.Limit() - 1000)
		}
		if used := f.r.refusals.Used(); used != 0 {
			t.Errorf("%s: %d bytes of the refusals' room still held", c.name, used)
		}
	}
}

// frameOf is req as the client sends it (kclient.send's framing).
func frameOf(k *kclient, req kmsg.Request) []byte {
	k.corr++
	b := make([]byte, 4, 512)
	b = binary.BigEndian.AppendUint16(b, uint16(req.Key()))
	b = binary.BigEndian.AppendUint16(b, uint16(req.GetVersion()))
	b = binary.BigEndian.AppendUint32(b, uint32(k.corr))
	b = append(b, 0, 4, 't', 'e', 's', 't')
	if req.IsFlexible() {
		b = append(b, 0)
	}
	b = req.AppendTo(b)
	binary.BigEndian.PutUint32(b, uint32(len(b)-4))
	return b
}

// FuzzRefusal: whatever a client sends as the rest of a Produce request
// (client id on), the streaming read of a refused request agrees with the
// path that reads it whole (header walk, partition count, kmsg): one
// accepts exactly what the other does (names up to Kafka's 249 bytes),
// with the same acks, topics and partitions in order, and never reads
// past the request.
func FuzzRefusal(f *testing.F) {
	for _, v := range []int16{3, 7, 9, 12} {
		req := add(newProduce(v, 1), "logs", 0, []byte("not a batch"))
		add(req, "metrics", 3, nil)
		add(req, "logs", 1, []byte{1, 2, 3})
		var c kclient
		b := frameOf(&c, req)[12:]
		f.Add(v, b)
		f.Add(v, b[:len(b)/2])
	}
	f.Fuzz(func(t *testing.T, ver int16, b []byte) {
		ver = 3 + (ver&0x7fff)%10
		const maxParts = 1000
		src := bytes.NewReader(append(append([]byte(nil), b...), "next request"...))
		got, acks, err := readRefused(bufio.NewReaderSize(nil, 16), src, len(b), ver, maxParts, func(int64) bool { return true })
		if rest := src.Len(); rest != len("next request") && err == nil {
			t.Fatalf("read past the request: %d bytes left after it", rest)
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
		if want == nil {
			for _, tp := range req.Topics {
				if len(tp.Topic) > maxTopicName {
					want = errMalformed
				}
			}
			if len(req.Topics) > maxParts {
				want = errMalformed
			}
		}
		if (err == nil) != (want == nil) {
			t.Fatalf("v%d: streaming read: %v; whole read: %v", ver, err, want)
		}
		if err != nil {
			var le *limitError
			if !errors.Is(err, errMalformed) && !errors.As(err, &le) {
				t.Fatalf("an error of no known kind: %v", err)
			}
			return
		}
		if acks != req.Acks || len(got.Topics) != len(req.Topics) {
			t.Fatalf("acks %d topics %d; whole read: %d, %d", acks, len(got.Topics), req.Acks, len(req.Topics))
		}
		wantResp := newProduceResponse(req)
		if !bytes.Equal(got.AppendTo(nil), wantResp.AppendTo(nil)) {
			t.Fatalf("answers differ:\n%+v\n%+v", got, wantResp)
		}
	})
}
