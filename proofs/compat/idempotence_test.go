package compat

import (
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
)

// roundTrip sends one request on c and decodes its answer into resp.
func roundTrip(t *testing.T, c net.Conn, corr int32, req kmsg.Request, resp kmsg.Response) {
	t.Helper()
	b := make([]byte, 4, 256)
	b = binary.BigEndian.AppendUint16(b, uint16(req.Key()))
	b = binary.BigEndian.AppendUint16(b, uint16(req.GetVersion()))
	b = binary.BigEndian.AppendUint32(b, uint32(corr))
	b = append(b, 0, 4, 't', 'e', 's', 't')
	if req.IsFlexible() {
		b = append(b, 0)
	}
	b = req.AppendTo(b)
	binary.BigEndian.PutUint32(b, uint32(len(b)-4))
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	var hdr [8]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, binary.BigEndian.Uint32(hdr[:])-4)
	if _, err := io.ReadFull(c, body); err != nil {
		t.Fatal(err)
	}
	if resp.IsFlexible() {
		body = body[1:]
	}
	resp.SetVersion(req.GetVersion())
	if err := resp.ReadFrom(body); err != nil {
		t.Fatal(err)
	}
}

// idempotentBatch is a batch of values from producer pid at sequence seq.
func idempotentBatch(pid int64, seq int32, values ...string) []byte {
	return kafkatest.Batch{ProducerID: pid, Seq: seq, Values: values}.Bytes()
}

// TestIdempotentRetryIsNotDuplicated: an idempotent producer that sends a
// batch again (its answer was lost, or it timed out) gets the original
// offset back, and Kafka holds the batch once; the next sequence is
// delivered as usual.
func TestIdempotentRetryIsNotDuplicated(t *testing.T) {
	broker := kafkatest.Shared(t)
	a := front(t, broker)
	topic := kafkatest.NewTopic(t, broker, "compat", 1)
	c, err := net.Dial("tcp", a.KafkaFront)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	md := kmsg.NewPtrMetadataRequest()
	md.Version = 7
	md.Topics = []kmsg.MetadataRequestTopic{{Topic: kmsg.StringPtr(topic)}}
	roundTrip(t, c, 1, md, kmsg.NewPtrMetadataResponse())
	ip := kmsg.NewPtrInitProducerIDRequest()
	ip.Version = 1
	ipr := kmsg.NewPtrInitProducerIDResponse()
	roundTrip(t, c, 2, ip, ipr)
	if ipr.ErrorCode != 0 || ipr.ProducerID < 0 {
		t.Fatalf("InitProducerId: code %d id %d", ipr.ErrorCode, ipr.ProducerID)
	}
	produce := func(corr int32, batch []byte) (int16, int64) {
		resp := kmsg.NewPtrProduceResponse()
		roundTrip(t, c, corr, kafkatest.ProduceRequest(topic, batch), resp)
		rp := resp.Topics[0].Partitions[0]
		return rp.ErrorCode, rp.BaseOffset
	}
	// A retry sends the same bytes again (same sequences, same CRC).
	abc := idempotentBatch(ipr.ProducerID, 0, "a", "b", "c")
	code, first := produce(3, abc)
	if code != 0 || first < 0 {
		t.Fatalf("first send: code %d offset %d", code, first)
	}
	code, again := produce(4, abc)
	if code != 0 || again != first {
		t.Fatalf("the retry: code %d offset %d, want 0 and the first send's %d", code, again, first)
	}
	code, next := produce(5, idempotentBatch(ipr.ProducerID, 3, "d"))
	if code != 0 || next != first+3 {
		t.Fatalf("the next sequence: code %d offset %d, want %d", code, next, first+3)
	}
	// Consume reads on briefly past 4, so a duplicate would be seen.
	if recs := kafkatest.Consume(t, broker, topic, 4, time.Minute); len(recs) != 4 {
		t.Fatalf("%d records in Kafka, want a, b, c, d once each", len(recs))
	}
}
