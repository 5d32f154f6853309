package kafkafront

import (
	"context"
	"encoding/binary"
	"fmt"
	"github.com/ferryhq/ferry/receiver"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/telemetry"
)

// ledgerSink is the pipeline of the sequence fuzz target: it delivers or
// fails each batch as told, and counts each record value delivered.
type ledgerSink struct {
	mu        sync.Mutex
	fail      bool
	offset    int64
	delivered map[string]int
}

func (s *ledgerSink) Consume(_ context.Context, b *record.Batch) error {
	s.mu.Lock()
	fail := s.fail
	var err error
	if fail {
		err = &consumer.RetryableError{Reason: "kafka_unavailable", Kind: consumer.KindUnavailable, Msg: "told to fail"}
	}
	offsets := make([]int64, len(b.Records))
	for i, r := range b.Records {
		if !fail {
			s.delivered[string(r.Value)]++
			offsets[i] = s.offset
			s.offset++
		}
	}
	s.mu.Unlock()
	b.Arm()
	for i := range b.Records {
		if err == nil && b.OnAcked != nil {
			b.OnAcked(i, offsets[i])
		}
		b.AckAt(i, err)
	}
	return nil
}

// fuzzSession is one raw client connection of the fuzz target.
type fuzzSession struct {
	c    net.Conn
	corr int32
}

func (s *fuzzSession) roundTrip(req kmsg.Request, resp kmsg.Response) error {
	s.corr++
	b := make([]byte, 4, 256)
	b = binary.BigEndian.AppendUint16(b, uint16(req.Key()))
	b = binary.BigEndian.AppendUint16(b, uint16(req.GetVersion()))
	b = binary.BigEndian.AppendUint32(b, uint32(s.corr))
	b = append(b, 0, 1, 'f')
	b = req.AppendTo(b)
	binary.BigEndian.PutUint32(b, uint32(len(b)-4))
	if _, err := s.c.Write(b); err != nil {
		return err
	}
	_ = s.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var hdr [8]byte
	if _, err := io.ReadFull(s.c, hdr[:]); err != nil {
		return err
	}
	body := make([]byte, binary.BigEndian.Uint32(hdr[:])-4)
	if _, err := io.ReadFull(s.c, body); err != nil {
		return err
	}
	resp.SetVersion(req.GetVersion())
	return resp.ReadFrom(body)
}

// seqBatchBytes is a one-record batch whose value names its identity; a
// fixed timestamp keeps a rebuilt batch's bytes (its CRC) the same.
func seqBatchBytes(pid int64, epoch int16, seq int32, value string) []byte {
	return kafkatest.Batch{ProducerID: pid, Epoch: epoch, Seq: seq, Timestamp: time.UnixMilli(1_700_000_000_000), Values: []string{value}}.Bytes()
}

// FuzzProduceSequences drives the Kafka front's produce path, with the
// sequence table in the loop, through a script of produce requests: two
// connections, two issued producer ids and one never issued, epochs 0-2,
// two partitions, sequences 0-1 in two contents each (so no partition's
// batches ever leave the table's window of five), and a pipeline that
// delivers or fails each batch as the script says. Whatever the order,
// every batch answered OK was delivered, and a batch of an issued id
// answered OK was delivered exactly once.
func FuzzProduceSequences(f *testing.F) {
	sink := &ledgerSink{delivered: map[string]int{}}
	cfg := testConfig()
	cluster := func(_ context.Context, topics []string) ([]TopicInfo, error) {
		out := make([]TopicInfo, len(topics))
		for i, t := range topics {
			out[i] = TopicInfo{Topic: t, Partitions: 2}
		}
		return out, nil
	}
	r, err := New(cfg, receiver.Env{Set: telemetry.TestSettings(), Next: sink, Pre: nil, Topics: cluster})
	if err != nil {
		f.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = r.Shutdown(context.Background()) })

	// Two bytes an operation: connection, producer id, epoch; partition,
	// sequence, content, and whether the pipeline fails it.
	f.Add([]byte{0, 0, 1, 0})              // a batch, then its retry on the other connection
	f.Add([]byte{0, 8, 0, 0, 0, 0})        // a failed batch, then its retry
	f.Add([]byte{0, 0, 8, 0})              // epoch 0, then epoch 1 from sequence 0
	f.Add([]byte{0, 0, 0, 4})              // the same sequence, other bytes
	f.Add([]byte{8, 0, 0, 0, 8, 2})        // epoch 1, then a late batch of epoch 0
	f.Add([]byte{4, 0, 4, 0, 12, 0, 4, 0}) // an id never issued, epochs back and forth
	f.Fuzz(func(t *testing.T, script []byte) {
		if len(script) > 2*40 {
			return
		}
		var conns [2]*fuzzSession
		for i := range conns {
			c, err := net.Dial("tcp", r.Addr())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			conns[i] = &fuzzSession{c: c}
		}
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
		answeredOK := map[string]int{} // identity → pid index
		for ; len(script) >= 2; script = script[2:] {
			op, op2 := script[0], script[1]
			conn := conns[op&1]
			pi, value, req, fail := scriptProduce(op, op2, run, pids[:])
			sink.mu.Lock()
			sink.fail = fail
			sink.mu.Unlock()
			resp := kmsg.NewPtrProduceResponse()
			if err := conn.roundTrip(req, resp); err != nil {
				t.Fatal(err)
			}
			if resp.Topics[0].Partitions[0].ErrorCode == 0 {
				answeredOK[value] = pi
			}
		}
		sink.mu.Lock()
		defer sink.mu.Unlock()
		for v, pi := range answeredOK {
			n := sink.delivered[v]
			switch {
			case n == 0:
				t.Fatalf("%s answered OK and never delivered", v)
			case pi < 2 && n != 1:
				t.Fatalf("%s (an issued producer id) answered OK and delivered %d times", v, n)
			}
		}
	})
}

// scriptProduce is one step of a sequence fuzzing script: op and op2
// choose the producer (of pids), epoch, partition, sequence, a variant of
// the bytes and whether the sink fails the batch; value names the record.
func scriptProduce(op, op2 byte, run string, pids []int64) (pi int, value string, req *kmsg.ProduceRequest, fail bool) {
	pi = int(op>>1&3) % 3
	epoch := int16(op>>3&3) % 3
	part := int32(op2 & 1)
	seq := int32(op2 >> 1 & 1)
	variant := op2 >> 2 & 1
	fail = op2>>3&1 == 1
	value = fmt.Sprintf("%s/%d/%d/%d/%d/%d", run, pi, epoch, part, seq, variant)
	req = kmsg.NewPtrProduceRequest()
	req.Version, req.Acks, req.TimeoutMillis = 7, -1, 30000
	tp := kmsg.NewProduceRequestTopic()
	tp.Topic = "t"
	p := kmsg.NewProduceRequestTopicPartition()
	p.Partition, p.Records = part, seqBatchBytes(pids[pi], epoch, seq, value)
	tp.Partitions = append(tp.Partitions, p)
	req.Topics = append(req.Topics, tp)
	return pi, value, req, fail
}
