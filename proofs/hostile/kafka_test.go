package hostile

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/pierrec/lz4/v4"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl/plain"

	"github.com/ferryhq/ferry/auth/token"
	"github.com/ferryhq/ferry/proofs/harness/agenttest"
	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
)

// kafkaRequest frames a request: size, key, version, correlation id,
// client id, the header's tags for flexible versions, then body.
func kafkaRequest(key, ver int16, corr int32, flexible bool, body []byte) []byte {
	b := make([]byte, 4, 64+len(body))
	b = binary.BigEndian.AppendUint16(b, uint16(key))
	b = binary.BigEndian.AppendUint16(b, uint16(ver))
	b = binary.BigEndian.AppendUint32(b, uint32(corr))
	b = binary.BigEndian.AppendUint16(b, 7)
	b = append(b, "hostile"...)
	if flexible {
		b = append(b, 0)
	}
	b = append(b, body...)
	binary.BigEndian.PutUint32(b, uint32(len(b)-4))
	return b
}

// produceV7 encodes a Produce v7 body (classic encoding) for one topic.
func produceV7(topic string, parts map[int32][]byte) []byte {
	req := kmsg.NewPtrProduceRequest()
	req.Version, req.Acks, req.TimeoutMillis = 7, -1, 30000
	t := kmsg.NewProduceRequestTopic()
	t.Topic = topic
	for p, recs := range parts {
		pt := kmsg.NewProduceRequestTopicPartition()
		pt.Partition, pt.Records = p, recs
		t.Partitions = append(t.Partitions, pt)
	}
	req.Topics = append(req.Topics, t)
	return req.AppendTo(nil)
}

// recordBatch builds a v2 batch around records (already compressed with
// codec), count records claimed.
func recordBatch(codec int16, count int32, records []byte) []byte {
	b := make([]byte, 61, 61+len(records))
	binary.BigEndian.PutUint32(b[8:], uint32(49+len(records)))
	b[16] = 2
	binary.BigEndian.PutUint16(b[21:], uint16(codec))
	binary.BigEndian.PutUint64(b[43:], ^uint64(0)) // producer id -1
	binary.BigEndian.PutUint16(b[51:], 0xffff)
	binary.BigEndian.PutUint32(b[53:], 0xffffffff)
	binary.BigEndian.PutUint32(b[57:], uint32(count))
	b = append(b, records...)
	binary.BigEndian.PutUint32(b[17:], crc32.Checksum(b[21:], crc32.MakeTable(crc32.Castagnoli)))
	return b
}

// kafkaAnswer reads one response's body (after its correlation id).
func kafkaAnswer(c net.Conn) ([]byte, error) {
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	var hdr [8]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return nil, err
	}
	body := make([]byte, binary.BigEndian.Uint32(hdr[:])-4)
	_, err := io.ReadFull(c, body)
	return body, err
}

// produceCodes sends a Produce v7 and returns the partition error codes.
func produceCodes(c net.Conn, body []byte) (map[int32]int16, error) {
	if _, err := c.Write(kafkaRequest(0, 7, 1, false, body)); err != nil {
		return nil, err
	}
	raw, err := kafkaAnswer(c)
	if err != nil {
		return nil, err
	}
	resp := kmsg.NewPtrProduceResponse()
	resp.Version = 7
	if err := resp.ReadFrom(raw); err != nil {
		return nil, err
	}
	out := map[int32]int16{}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			out[p.Partition] = p.ErrorCode
		}
	}
	return out, nil
}

// TestKafkaFrontAttacks: the Kafka front's bounds, each attacked over TCP
// against the real binary while franz-go produces through the same front
// and loses nothing it was told was acknowledged.
func TestKafkaFrontAttacks(t *testing.T) {
	brokers := kafkatest.Shared(t)
	goodTopic := kafkatest.NewTopic(t, brokers, "front-good", 2)
	target := kafkatest.NewTopic(t, brokers, "front-target", 2)
	a := agenttest.Start(t, ferryBin, agentConfig(brokers), "receivers.kafka.enabled=true", "receivers.kafka.max_connections=100")
	metric := func(reason string) float64 {
		return a.Metric(fmt.Sprintf(`ferry_receiver_errors_total{reason="%s",receiver="kafka"}`, reason))
	}

	good, err := kgo.NewClient(kgo.SeedBrokers(a.KafkaFront), kgo.DefaultProduceTopic(goodTopic))
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	var acked []string
	stop, goodDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(goodDone)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			v := fmt.Sprintf("good-%d", i)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if good.ProduceSync(ctx, &kgo.Record{Value: []byte(v)}).FirstErr() == nil {
				acked = append(acked, v)
			}
			cancel()
			time.Sleep(2 * time.Millisecond)
		}
	}()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", a.KafkaFront)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}

	attack(t, a, "Kafka front: a request size prefix of 1 GiB", func() (string, bool, string) {
		c := dial()
		defer c.Close()
		before := metric("request_too_large")
		_, _ = c.Write([]byte{0x40, 0, 0, 0, 0, 0, 0, 7})
		ok := closed(c) && metric("request_too_large") == before+1
		return "connection closed (request_too_large)", ok, "checked from the size prefix before anything is read (max_request_bytes)"
	}, nil)

	attack(t, a, "Kafka front: a Metadata request of 100 KiB", func() (string, bool, string) {
		c := dial()
		defer c.Close()
		_, _ = c.Write(kafkaRequest(3, 1, 1, false, make([]byte, 100<<10)))
		return "connection closed", closed(c), "every request but Produce is capped at 64 KiB"
	}, nil)

	attack(t, a, "Kafka front: a Metadata request naming 20,000 topics", func() (string, bool, string) {
		c := dial()
		defer c.Close()
		body := binary.BigEndian.AppendUint32(nil, 20000)
		for range 20000 {
			body = append(body, 0, 1, 'x')
		}
		before := metric("too_many_topics")
		_, _ = c.Write(kafkaRequest(3, 1, 1, false, body))
		ok := closed(c) && metric("too_many_topics") == before+1
		return "connection closed (too_many_topics)", ok, "the count is read before kmsg decodes a topic; at most 1,000"
	}, nil)

	attack(t, a, "Kafka front: 20,000 topic-partitions in one Produce", func() (string, bool, string) {
		c := dial()
		defer c.Close()
		parts := map[int32][]byte{}
		for i := int32(0); i < 20000; i++ {
			parts[i] = nil
		}
		before := metric("too_many_partitions")
		_, _ = c.Write(kafkaRequest(0, 7, 1, false, produceV7(target, parts)))
		ok := closed(c) && metric("too_many_partitions") == before+1
		return "connection closed (too_many_partitions)", ok, "counted by walking the bytes before kmsg decodes one partition"
	}, nil)

	attack(t, a, "Kafka front: a Produce that does not parse", func() (string, bool, string) {
		c := dial()
		defer c.Close()
		body := produceV7(target, map[int32][]byte{0: nil})
		body[len(body)-3] = 0x7f // a partition array length past the end
		before := metric("malformed_request")
		_, _ = c.Write(kafkaRequest(0, 7, 1, false, body))
		ok := closed(c) && metric("malformed_request") == before+1
		return "connection closed (malformed_request)", ok, ""
	}, nil)

	attack(t, a, "Kafka front: 2^31 records claimed in a 20-byte batch", func() (string, bool, string) {
		c := dial()
		defer c.Close()
		codes, err := produceCodes(c, produceV7(target, map[int32][]byte{0: recordBatch(0, 1<<31-1, make([]byte, 20))}))
		return fmt.Sprintf("partition error %d", codes[0]), err == nil && codes[0] == 10, "MESSAGE_TOO_LARGE from the batch header, before a record is decoded"
	}, nil)

	attack(t, a, "Kafka front: a batch whose CRC does not match", func() (string, bool, string) {
		c := dial()
		defer c.Close()
		b := recordBatch(0, 1, []byte{14, 0, 0, 0, 1, 2, 'k', 2, 'v', 0})
		b[len(b)-1] ^= 1
		codes, err := produceCodes(c, produceV7(target, map[int32][]byte{0: b}))
		return fmt.Sprintf("partition error %d", codes[0]), err == nil && codes[0] == 2, "CORRUPT_MESSAGE; the connection stays usable"
	}, nil)

	attack(t, a, "Kafka front: a 10-byte Metadata request claiming 2^28 tagged fields (CPU)", func() (string, bool, string) {
		c := dial()
		defer c.Close()
		body := append([]byte{1, 0, 0}, binary.AppendUvarint(nil, 1<<28)...) // no topics, two bools, the tag count
		start := time.Now()
		if _, err := c.Write(kafkaRequest(3, 12, 1, true, body)); err != nil {
			return err.Error(), false, ""
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := c.Read(make([]byte, 1))
		took := time.Since(start)
		if errors.Is(err, os.ErrDeadlineExceeded) || err == nil {
			return fmt.Sprintf("no close within %s", took.Round(time.Millisecond)), false, ""
		}
		return fmt.Sprintf("closed after %s", took.Round(time.Millisecond)), took < time.Second,
			"the tagged fields are walked before kmsg decodes the body (kmsg looped over the count: ~9 s of CPU per request)"
	}, nil)

	attack(t, a, "Kafka front: LZ4 bomb, 1 MiB inflating to 256 MiB", func() (string, bool, string) {
		c := dial()
		defer c.Close()
		var z bytes.Buffer
		w := lz4.NewWriter(&z)
		zero := make([]byte, 1<<20)
		for range 256 {
			_, _ = w.Write(zero)
		}
		_ = w.Close()
		codes, err := produceCodes(c, produceV7(target, map[int32][]byte{1: recordBatch(3, 1, z.Bytes())}))
		return fmt.Sprintf("partition error %d", codes[1]), err == nil && codes[1] == 10,
			fmt.Sprintf("%d KiB sent; decompression stops at max_decompressed_bytes, reserved first", z.Len()>>10)
	}, nil)

	attack(t, a, "Kafka front: 16 connections pipelining 1 MiB produces and 500,000 ApiVersions, answers never read", func() (string, bool, string) {
		big := produceV7(target, map[int32][]byte{0: recordBatch(0, 1, append([]byte{0x80, 0x80, 0x01}, make([]byte, 1<<20)...))})
		tiny := kafkaRequest(18, 3, 1, true, []byte{2, 'x', 2, '1', 0})
		var conns []net.Conn
		type result struct {
			sent    int64
			stopped bool // a write timed out: ferry stopped reading
		}
		done := make(chan result, 16)
		for i := range 16 {
			c := dial()
			conns = append(conns, c)
			go func() {
				_ = c.SetWriteDeadline(time.Now().Add(4 * time.Second))
				var r result
				req, times := kafkaRequest(0, 7, 1, false, big), 32
				if i%2 == 1 {
					req, times = bytes.Repeat(tiny, 1000), 500
				}
				for range times {
					n, err := c.Write(req)
					r.sent += int64(n)
					if err != nil {
						r.stopped = true // ferry stopped reading: flow control
						break
					}
				}
				done <- r
			}()
		}
		var sent int64
		stopped := 0
		for range 16 {
			r := <-done
			sent += r.sent
			if r.stopped {
				stopped++
			}
		}
		for _, c := range conns {
			c.Close()
		}
		// The ApiVersions senders at least must have been stopped: their
		// answers are bigger than their requests.
		return fmt.Sprintf("%d MiB written; %d of 16 connections stopped", sent>>20, stopped), stopped >= 8,
			"the reader stops at max_inflight_bytes, 1,000 owed answers or 1 MiB of unread answers per connection"
	}, nil)

	attack(t, a, "Kafka front: Fetch and FindCoordinator (a consumer)", func() (string, bool, string) {
		c := dial()
		defer c.Close()
		fc := kmsg.NewPtrFindCoordinatorRequest()
		fc.Version, fc.CoordinatorKey = 3, "group"
		_, _ = c.Write(kafkaRequest(10, 3, 1, true, fc.AppendTo(nil)))
		raw, err := kafkaAnswer(c)
		resp := kmsg.NewPtrFindCoordinatorResponse()
		resp.Version = 3
		perr := resp.ReadFrom(raw[min(1, len(raw)):])
		ok := err == nil && perr == nil && resp.ErrorCode == 35
		if !ok {
			t.Logf("FindCoordinator answer: %v %v % x", err, perr, raw)
		}
		f := kmsg.NewPtrFetchRequest()
		f.Version = 4
		_, _ = c.Write(kafkaRequest(1, 4, 2, false, f.AppendTo(nil)))
		return "UNSUPPORTED_VERSION, then closed on Fetch", ok && closed(c), "a consumer pointed at ferry is told, not served"
	}, nil)

	close(stop)
	<-goodDone
	if len(acked) == 0 {
		t.Fatal("the well-behaved franz-go producer got nothing acknowledged")
	}
	got := map[string]bool{}
	for _, r := range kafkatest.Consume(t, brokers, goodTopic, len(acked), 30*time.Second) {
		got[string(r.Value)] = true
	}
	lost := 0
	for _, v := range acked {
		if !got[v] {
			lost++
		}
	}
	if lost > 0 {
		t.Fatalf("%d of %d acknowledged records of the well-behaved producer are not in Kafka", lost, len(acked))
	}
	if n := len(kafkatest.ConsumeAll(t, brokers, target, 2*time.Second)); n != 0 {
		t.Fatalf("%d records of the attacks reached Kafka", n)
	}
}

// TestKafkaFrontSASL: with auth required, the application token is the
// SASL PLAIN password: a valid one produces, a bad one is refused with
// SASL_AUTHENTICATION_FAILED, and a client without SASL is disconnected
// before it can produce.
func TestKafkaFrontSASL(t *testing.T) {
	brokers := kafkatest.Shared(t)
	topic := kafkatest.NewTopic(t, brokers, "front-sasl", 1)
	a := agenttest.Start(t, ferryBin, agentConfig(brokers), "receivers.kafka.enabled=true",
		"receivers.kafka.auth.mode=required", "receivers.kafka.auth.sources=[sasl]")
	produce := func(opts ...kgo.Opt) error {
		cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(a.KafkaFront), kgo.DefaultProduceTopic(topic),
			kgo.RequestRetries(1), kgo.RecordRetries(2)}, opts...)...)
		if err != nil {
			return err
		}
		defer cl.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return cl.ProduceSync(ctx, &kgo.Record{Value: []byte("v")}).FirstErr()
	}
	tok := issue(t, token.Claims{App: "orders"})
	if err := produce(kgo.SASL(plain.Auth{User: "orders", Pass: tok}.AsMechanism())); err != nil {
		t.Fatalf("valid token: %v", err)
	}
	// franz-go keeps retrying a failed authentication until its deadline;
	// what ferry answered is in its counter and its log.
	refused := func() float64 {
		return a.Metric(`ferry_receiver_errors_total{reason="unauthenticated",receiver="kafka"}`)
	}
	before := refused()
	if err := produce(kgo.SASL(plain.Auth{User: "orders", Pass: "not-a-token"}.AsMechanism())); err == nil {
		t.Fatal("a bad token produced")
	}
	if refused() <= before || !strings.Contains(a.Logs.String(), `user \"orders\": invalid token`) {
		t.Fatalf("a bad token was not refused as unauthenticated (counter %v → %v)", before, refused())
	}
	before = refused()
	if err := produce(); err == nil {
		t.Fatal("a client without SASL produced")
	}
	if refused() <= before {
		t.Fatal("a client without SASL was not counted unauthenticated")
	}
	recs := kafkatest.Consume(t, brokers, topic, 1, 30*time.Second)
	if len(recs) != 1 {
		t.Fatalf("%d records in Kafka, want the one with a valid token", len(recs))
	}
	var tenant string
	for _, h := range recs[0].Headers {
		if h.Key == "ferry.tenant" {
			tenant = string(h.Value)
		}
	}
	if tenant != "orders" {
		t.Fatalf("record headers %v: want ferry.tenant=orders from the token", recs[0].Headers)
	}
}
