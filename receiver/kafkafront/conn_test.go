package kafkafront

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferryhq/ferry/buffer/budget"
	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/receiver"
	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/telemetry"
)

// TestTopLevelErrorFieldsExist: every API answered UNSUPPORTED_VERSION by
// setting a top-level ErrorCode has that field in kmsg's response (a
// kmsg upgrade that renamed it would otherwise panic at run time).
func TestTopLevelErrorFieldsExist(t *testing.T) {
	for key := range topLevelError {
		req := kmsg.RequestForKey(key)
		if req == nil {
			t.Fatalf("API key %d unknown to kmsg", key)
		}
		f := reflect.ValueOf(req.ResponseKind()).Elem().FieldByName("ErrorCode")
		if !f.IsValid() || f.Kind() != reflect.Int16 {
			t.Fatalf("%s response has no int16 ErrorCode", kmsg.NameForKey(key))
		}
	}
}

func testConfig() Config {
	return Config{Enabled: true, Listen: "127.0.0.1:0", MaxRequestBytes: 1 << 20, MaxDecompressedBytes: 4 << 20,
		MaxRecords: 1000, MaxPartitions: 100, MaxInflightBytes: 4 << 20, IdleTimeout: time.Minute, BodyTimeout: 10 * time.Second,
		AckTimeout: 5 * time.Second, MetadataMaxAge: time.Minute, Topics: []string{"*"}}
}

// TestUnreadAnswersStopTheReader: a client that pipelines a million small
// requests and never reads an answer (each answer larger than its request)
// gets its connection stopped once 1 MiB of answers wait, so ferry holds a
// bounded amount for it instead of three times what it sent.
func TestUnreadAnswersStopTheReader(t *testing.T) {
	set := telemetry.TestSettings()
	sink := consumer.Func(func(context.Context, *record.Batch) error { return nil })
	r, err := New(testConfig(), receiver.Env{Set: set, Next: sink, Pre: nil, Topics: func(context.Context, []string) ([]TopicInfo, error) { return nil, nil }})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer r.Shutdown(context.Background())
	c, err := net.Dial("tcp", r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// ApiVersions v3: client software name and version, no tags.
	req := []byte{0, 0, 0, 0, 0, 18, 0, 3, 0, 0, 0, 1, 0, 1, 'x', 0, 2, 'x', 2, '1', 0}
	binary.BigEndian.PutUint32(req, uint32(len(req)-4))
	const total = 1_000_000
	go func() {
		_ = c.SetWriteDeadline(time.Now().Add(20 * time.Second))
		batch := bytes.Repeat(req, 1000)
		for range total / 1000 {
			if _, err := c.Write(batch); err != nil {
				return
			}
		}
	}()
	handled := func() float64 {
		mfs, _ := set.Registry.Gather()
		for _, mf := range mfs {
			if mf.GetName() != "ferry_receiver_requests_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "code" && l.GetValue() == "ApiVersions" {
						return m.GetCounter().GetValue()
					}
				}
			}
		}
		return 0
	}
	last, still := -1.0, 0
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline) && still < 10; time.Sleep(100 * time.Millisecond) {
		if h := handled(); h == last {
			still++
		} else {
			last, still = h, 0
		}
	}
	// Kernel socket buffers on both sides hold some answers too; what
	// matters is that the reader stopped far short of the million.
	if last >= total/2 {
		t.Fatalf("ferry handled %.0f of %d pipelined requests whose answers nobody read", last, total)
	}
	t.Logf("reader stopped after %.0f requests", last)
}

// TestParkedAnswersStopTheReader: answers ready behind an earlier one
// still owed (Kafka has not acknowledged it) are held by ferry until that
// one is answered. They count toward what the reader lets a connection
// hold: a client with one produce request unanswered could otherwise
// pipeline requests naming 10,000 partitions of a topic it may not write
// (each answered at once, with 16 times its size of per-partition errors)
// and hold up to 1,000 such answers, about 700 MB, on one connection.
func TestParkedAnswersStopTheReader(t *testing.T) {
	cfg := testConfig()
	cfg.MaxPartitions, cfg.Topics = 10000, []string{"logs"}
	f := startFront(t, cfg, receiver.Env{})
	k := dial(t, f)
	k.send(add(newProduce(9, -1), "logs", 0, blob(100).bytes(t)))
	h := f.sink.next(t) // held: its answer is owed until the test acks it
	big := newProduce(9, -1)
	for p := range int32(10000) {
		add(big, "denied", p, nil)
	}
	one := encodeRequest(big, 2)
	// 40 of them (about 30 MB of answers) in one write, never read.
	var all []byte
	for range 40 {
		all = append(all, one...)
	}
	go func() {
		_ = k.c.SetWriteDeadline(time.Now().Add(wait))
		_, _ = k.c.Write(all)
	}()
	f.waitRequests(t, "Produce", 2)
	time.Sleep(500 * time.Millisecond)
	held := f.r.answers.Held()
	read := f.requests(t, "Produce") - 1
	if read > 4 || held > 4<<20 {
		t.Fatalf("with an answer owed the reader read %v of 40 requests whose answers wait behind it, holding %d bytes of answers", read, held)
	}
	// Answering the first lets the rest through, in order; each refusal
	// is told on every partition, in words on the first receiver.MaxMessages.
	h.ack(0, nil)
	k.frame()
	for range 40 {
		resp := kmsg.NewPtrProduceResponse()
		k.recv(2, 9, resp)
		codes, words := 0, 0
		for _, tp := range resp.Topics {
			for _, p := range tp.Partitions {
				if p.ErrorCode != 0 {
					codes++
				}
				if p.ErrorMessage != nil {
					words++
				}
			}
		}
		if codes != 10000 || words != receiver.MaxMessages {
			t.Fatalf("a request naming 10,000 partitions it may not write: %d answered with an error, %d with words", codes, words)
		}
	}
	waitHeld(t, f, 0)
}

// waitHeld waits until the front's connections hold want bytes of answers
// (the writer counts an answer until its write returns).
func waitHeld(t *testing.T, f *front, want int64) {
	t.Helper()
	for deadline := time.Now().Add(wait); f.r.answers.Held() != want; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d bytes of answers counted, want %d", f.r.answers.Held(), want)
		}
	}
}

// TestOwedAnswersStopTheReader: produce requests whose answers are still
// owed (Kafka has not acknowledged their records) count as the answers
// they will be, so a client cannot have the front read many requests that
// each name a partition it may write and 5,000 it may not, and then hold
// all their answers (165 KB each) once Kafka answers.
func TestOwedAnswersStopTheReader(t *testing.T) {
	cfg := testConfig()
	cfg.MaxPartitions, cfg.Topics = 10000, []string{"logs"}
	f := startFront(t, cfg, receiver.Env{})
	k := dial(t, f)
	var all []byte
	for i := range 40 {
		req := add(newProduce(9, -1), "logs", 0, plain(fmt.Sprint(i)).bytes(t))
		for p := range int32(5000) {
			add(req, "denied", p, nil)
		}
		all = append(all, encodeRequest(req, int32(i+1))...)
	}
	go func() {
		_ = k.c.SetWriteDeadline(time.Now().Add(wait))
		_, _ = k.c.Write(all)
	}()
	first := f.sink.next(t)
	time.Sleep(500 * time.Millisecond)
	if read := f.requests(t, "Produce"); read > 3 {
		t.Fatalf("the front read %v of 40 requests while their answers (165 KB each) were owed", read)
	}
	// A client that reads its answers gets every one.
	first.ack(0, nil)
	for i := range 40 {
		if i > 0 {
			f.sink.next(t).ack(int64(i), nil)
		}
		resp := kmsg.NewPtrProduceResponse()
		k.recv(int32(i+1), 9, resp)
		if len(resp.Topics) != 2 || resp.Topics[0].Partitions[0].ErrorCode != 0 || resp.Topics[0].Partitions[0].BaseOffset != int64(i) {
			t.Fatalf("answer %d: %+v", i, resp.Topics[0])
		}
	}
	waitHeld(t, f, 0)
}

// TestInvalidNameNotEchoedPerPartition: a topic name the front refuses
// is quoted in the answer's words by its first bytes only, and words ride
// on 100 partitions at most: a 100 KB name of bytes quoted in four
// characters each, on 100 partitions, was answered with 40 MB.
func TestInvalidNameNotEchoedPerPartition(t *testing.T) {
	f := startFront(t, testConfig(), receiver.Env{})
	k := dial(t, f)
	req := add(newProduce(9, -1), "logs", 0, plain("ok").bytes(t))
	name := strings.Repeat("\xff", 100_000)
	for p := range int32(99) {
		add(req, name, p, nil)
	}
	raw := encodeRequest(req, 1)
	k.write(raw)
	f.sink.next(t).ack(0, nil)
	_, body := k.frame()
	if len(body) > 2*len(raw) {
		t.Fatalf("a request of %d bytes answered with %d", len(raw), len(body))
	}
	resp := kmsg.NewPtrProduceResponse()
	resp.Version = 9
	if err := resp.ReadFrom(body[1:]); err != nil {
		t.Fatal(err)
	}
	p := resp.Topics[1].Partitions[0]
	if p.ErrorCode == 0 || p.ErrorMessage == nil || !strings.Contains(*p.ErrorMessage, "(100000 bytes)") || len(*p.ErrorMessage) > 512 {
		t.Fatalf("the refused name's partition: code %d, words %v", p.ErrorCode, p.ErrorMessage)
	}
}

// TestHeadersReservedBeforeMade: a record header costs two bytes on the
// wire and record.HeaderOverhead in memory. A request whose records carry
// 1,000 empty headers each is refused retryable on its partition when the
// budget has room for the request but not for its headers, and otherwise
// charged for them (a request decompressed to 32 MiB of empty headers
// made 670 MB of structs, charged 32 MiB).
func TestHeadersReservedBeforeMade(t *testing.T) {
	hs := make([][2]string, 1000)
	for i := 1; i < len(hs); i += 2 {
		hs[i][0] = "ferry.x" // dropped (reserved), its slot made all the same
	}
	tb := tbatch{pid: -1, epoch: -1, seq: -1}
	for range 50 {
		tb.recs = append(tb.recs, trec{value: []byte("v"), headers: hs})
	}
	structs := int64(50 * 1000 * record.HeaderOverhead)
	for _, room := range []bool{false, true} {
		var charged atomic.Int64
		sink := consumer.Func(func(_ context.Context, b *record.Batch) error {
			charged.Store(b.MemBytes)
			b.Arm()
			for i := range b.Records {
				b.AckAt(i, nil)
			}
			return nil
		})
		limit := int64(1 << 20) // the request (~110 KB) fits, its headers' structs (4 MB) do not
		if room {
			limit = 64 << 20
		}
		bud := budget.New(limit)
		r, err := New(testConfig(), receiver.Env{Set: telemetry.TestSettings(), Next: sink, Bodies: bud, Topics: frontTopics})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		f := &front{r: r}
		k := dial(t, f)
		resp := k.produce(add(newProduce(9, -1), "logs", 0, tb.bytes(t)))
		code := resp.Topics[0].Partitions[0].ErrorCode
		switch {
		case !room && code != codeFor(consumer.ErrFull).Code:
			t.Fatalf("no room for the headers: code %d", code)
		case room && (code != 0 || charged.Load() < structs):
			t.Fatalf("with room: code %d, charged %d bytes for %d bytes of header structs", code, charged.Load(), structs)
		}
		_ = r.Shutdown(context.Background())
		if used := bud.Used(); used != 0 {
			t.Fatalf("the budget holds %d bytes after the request", used)
		}
	}
}
