package kafkafront

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"
	"unsafe"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferryhq/ferry/consumer"
)

// Refusing a produce request the memory budget has no room for.
//
// The client must be told per partition to retry (a Kafka client answered
// otherwise fails the batch or drops the connection), and the answer names
// every topic and partition of the request, so the request is read whole.
// It is read as a stream: the record batches are skipped unread, and only
// the topic names and partition numbers are kept, in a compact form (kept):
// names as sent, 4 bytes a partition, 8 a topic. Each
// refusing connection reads on its own body_timeout with a few KiB of
// buffer, so a client trickling its request delays nobody else's refusal.
// (The refusal used to read the request into one buffer of
// max_request_bytes under a lease shared by all connections: clients
// holding back their last byte kept every other client's "retry" waiting
// body_timeout, up to 5 s, each.)
//
// What a refusal keeps is reserved as its bytes arrive (never for what a
// length only declares), from a room shared by all refusals:
// refusalRoom, so one refusal of any request Kafka could accept fits an
// empty room. So is the answer
// built at the end, for the moment it takes to encode. A client holding
// room while it trickles holds at most about twice what it sent, plus 8
// bytes a topic (slices grow by doubling). When the room is spent the
// refused request's connection is closed (counted queue_full), which a
// Kafka client retries like the refusal itself. acks=0 requests keep
// nothing: they are read, counted, and not answered.

// What the answer built from kept costs for the moment it is encoded,
// besides the names (encoded once; the answer's strings alias kept's
// bytes): per partition kmsg's struct (~90 bytes) and its encoding (~70
// from v8 on), rounded up; per topic its struct.
const (
	answerTopicCost     = 96
	answerPartitionCost = 192
)

// kafkaMaxTopicName is the longest topic name Kafka accepts.
const kafkaMaxTopicName = 249

// refusalRoom is the room refusals share: at least max_request_bytes, and
// enough for one refusal of any request Kafka could accept, with
// max_partitions_per_request one-partition topics of the longest name:
// kept while reading (names up to twice their bytes, slices grow by
// doubling: 16 bytes a topic, 8 a partition), then the answer (names once
// more, answerTopicCost, answerPartitionCost). 10.7 MB by default.
func refusalRoom(cfg Config) int64 {
	perTopic := int64(3*kafkaMaxTopicName + 16 + 8 + answerTopicCost + answerPartitionCost)
	return max(int64(cfg.MaxRequestBytes), int64(cfg.MaxPartitions)*perTopic)
}

var refusalReaders = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 4<<10) }}

// stream reads Kafka's primitive types from at most n bytes of a
// connection, recording the first error (an io error or errMalformed).
type stream struct {
	r        *bufio.Reader
	lr       io.LimitedReader
	flexible bool
	err      error
}

func (s *stream) fail(format string, args ...any) {
	if s.err == nil {
		s.err = fmt.Errorf("%w: "+format, append([]any{errMalformed}, args...)...)
	}
}

func (s *stream) ioErr(err error) {
	if s.err == nil {
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			if s.lr.N == 0 && s.r.Buffered() == 0 {
				s.fail("truncated")
				return
			}
			err = io.ErrUnexpectedEOF
		}
		s.err = err
	}
}

// left is the bytes of the request not yet consumed.
func (s *stream) left() int64 { return s.lr.N + int64(s.r.Buffered()) }

func (s *stream) skip(n int64) {
	if s.err != nil {
		return
	}
	if n < 0 || n > s.left() {
		s.fail("length past the end")
		return
	}
	for n > 0 {
		k, err := s.r.Discard(int(min(n, 1<<30)))
		n -= int64(k)
		if err != nil {
			s.ioErr(err)
			return
		}
	}
}

func (s *stream) fixed(b []byte) {
	if s.err != nil {
		return
	}
	if int64(len(b)) > s.left() {
		s.fail("truncated")
		return
	}
	if _, err := io.ReadFull(s.r, b); err != nil {
		s.ioErr(err)
	}
}

// peek returns the next n bytes (n at most the reader's size), valid until
// the next read, and consumes them; nil on error. No copy: an array passed
// to fixed would escape through io.ReadFull, an allocation a partition.
func (s *stream) peek(n int) []byte {
	if s.err != nil {
		return nil
	}
	if int64(n) > s.left() {
		s.fail("truncated")
		return nil
	}
	b, err := s.r.Peek(n)
	if err != nil {
		s.ioErr(err)
		return nil
	}
	_, _ = s.r.Discard(n)
	return b
}

func (s *stream) int16() int {
	if b := s.peek(2); b != nil {
		return int(int16(binary.BigEndian.Uint16(b)))
	}
	return 0
}

func (s *stream) int32() int {
	if b := s.peek(4); b != nil {
		return int(int32(binary.BigEndian.Uint32(b)))
	}
	return 0
}

func (s *stream) uvarint() uint64 {
	if s.err != nil {
		return 0
	}
	if s.left() == 0 {
		s.fail("truncated")
		return 0
	}
	// kmsg's 32-bit varint (five bytes at most, the fifth at most 0x0f),
	// read a byte at a time; a read error stays what it is (a deadline is
	// the client being slow, not a bad varint).
	var v uint32
	for i := 0; i < 5; i++ {
		c, err := s.r.ReadByte()
		if err != nil {
			s.ioErr(err)
			return 0
		}
		if i == 4 {
			if c > 0x0f {
				break
			}
			return uint64(v | uint32(c)<<28)
		}
		v |= uint32(c&0x7f) << (7 * i)
		if c < 0x80 {
			return uint64(v)
		}
	}
	s.fail("bad varint")
	return 0
}

// Lengths read as the accepted path reads them (its walk, then kmsg), so
// a request is refused-and-answered exactly when it would have been
// decoded: -1 is null, below that or past the bytes left is malformed.

// length reads a (compact) length; -1 is null.
func (s *stream) length(classic func() int) int {
	var v int
	if s.flexible {
		v = int(s.uvarint()) - 1
	} else {
		v = classic()
	}
	if s.err == nil && (v < -1 || int64(v) > s.left()) {
		s.fail("length past the end")
	}
	if s.err != nil {
		return 0
	}
	return v
}

func (s *stream) nullableString() { s.skip(int64(max(s.length(s.int16), 0))) }
func (s *stream) nullableBytes()  { s.skip(int64(max(s.length(s.int32), 0))) }
func (s *stream) arrayLen() int   { return max(s.length(s.int32), 0) }

func (s *stream) tags() {
	if !s.flexible || s.err != nil {
		return
	}
	n := s.uvarint()
	if s.err == nil && n > uint64(s.left()) {
		s.fail("tag count")
	}
	for i := uint64(0); i < n && s.err == nil; i++ {
		s.uvarint()
		size := s.uvarint()
		if s.err == nil && size > uint64(s.left()) {
			s.fail("tag size")
		}
		s.skip(int64(size))
	}
}

// kept is what a refusal keeps of a request: its acks, the topic names
// back to back, and every partition number.
type kept struct {
	acks   int16
	names  []byte
	topics []keptTopic
	parts  []int32
}

// keptTopic is where a topic's name and partitions end in kept.
type keptTopic struct{ nameEnd, partsEnd int32 }

// grow makes room for n more elements of size bytes in s, reserving the
// capacity it adds.
func grow[T any](s []T, n int, size int64, reserve func(int64) bool) ([]T, bool) {
	if cap(s)-len(s) >= n {
		return s, true
	}
	c := max(2*cap(s), len(s)+n)
	if !reserve(int64(c-cap(s)) * size) {
		return s, false
	}
	ns := make([]T, len(s), c)
	copy(ns, s)
	return ns, true
}

// answerCost is what response costs for the moment it takes to encode.
func (k *kept) answerCost() int64 {
	// Names once: the answer's strings alias kept's bytes; its encoding
	// copies them.
	return int64(len(k.topics))*answerTopicCost + int64(len(k.names)) + int64(len(k.parts))*answerPartitionCost
}

// response is the answer's skeleton for the kept topics and partitions:
// every partition "no error, offset unknown", as newProduceResponse.
func (k *kept) response(ver int16) *kmsg.ProduceResponse {
	resp := kmsg.NewPtrProduceResponse()
	resp.SetVersion(ver)
	resp.Topics = make([]kmsg.ProduceResponseTopic, len(k.topics))
	name, part := int32(0), int32(0)
	for t, kt := range k.topics {
		rt := &resp.Topics[t]
		*rt = kmsg.NewProduceResponseTopic()
		// An alias, not a copy: k.names is not written again, and the
		// answer is encoded before k is dropped.
		rt.Topic = unsafe.String(unsafe.SliceData(k.names[name:kt.nameEnd]), int(kt.nameEnd-name))
		rt.Partitions = make([]kmsg.ProduceResponseTopicPartition, kt.partsEnd-part)
		for p := range rt.Partitions {
			rp := &rt.Partitions[p]
			*rp = kmsg.NewProduceResponseTopicPartition()
			rp.Partition = k.parts[int(part)+p]
			rp.BaseOffset, rp.LogAppendTime, rp.LogStartOffset = -1, -1, -1
		}
		name, part = kt.nameEnd, kt.partsEnd
	}
	return resp
}

// refuse answers a produce request of n bytes (after the fixed header) that
// the memory budget has no room for: every partition is told to retry. See
// the top of this file.
func (cn *conn) refuse(ver int16, corr int32, n int) *connErr {
	r := cn.r
	_ = cn.c.SetReadDeadline(cn.bodyBy)
	br := refusalReaders.Get().(*bufio.Reader)
	defer func() {
		br.Reset(nil)
		refusalReaders.Put(br)
	}()
	var held int64
	defer func() { r.refusals.Release(held) }()
	reserve := func(k int64) bool {
		if !r.refusals.TryReserve(k) {
			return false
		}
		held += k
		return true
	}
	k, err := readRefused(br, cn.c, n, ver, r.cfg.MaxPartitions, reserve)
	if err == nil && k.acks != 0 && !reserve(k.answerCost()) {
		err = errNoRoom
	}
	if err != nil {
		var le *limitError
		switch {
		case errors.As(err, &le):
			return cn.fail("too_many_partitions", "%v", err)
		case errors.Is(err, errNoRoom):
			return cn.fail("queue_full", "%v", err)
		case errors.Is(err, errMalformed):
			return cn.fail("malformed_request", "Produce v%d: %v", ver, err)
		}
		return cn.slow(err)
	}
	cn.r.m.Error(consumer.Reason(consumer.ErrFull))
	if k.acks == 0 {
		cn.r.logWarn("queue_full", "acks=0 produce request dropped: ferry's buffer is full", "remote", cn.c.RemoteAddr().String())
		return nil
	}
	resp := k.response(ver)
	code, msg := codeFor(consumer.ErrFull).Code, consumer.ErrFull.Error()
	for t := range resp.Topics {
		for p := range resp.Topics[t].Partitions {
			rp := &resp.Topics[t].Partitions[p]
			rp.ErrorCode, rp.ErrorMessage = code, &msg
		}
	}
	resp.ThrottleMillis = int32(time.Second / time.Millisecond)
	cn.answerNow(corr, resp) // encoded here: the room is given back after
	return nil
}

// errNoRoom: the refusals' room is spent.
var errNoRoom = errors.New("ferry's buffer is full and so is the room for refusing requests; reconnect and retry")

// readRefused reads a Produce request of n bytes (request header from the
// client id on, then the body) from src through br, skipping its records,
// and returns what a refusal keeps of it (nothing but acks for acks=0),
// asking reserve before it keeps more. It accepts exactly what the
// accepted path (skipHeader, countPartitions, kmsg) decodes. Errors: an io
// error from src, errMalformed, a *limitError (max_partitions), errNoRoom.
func readRefused(br *bufio.Reader, src io.Reader, n int, ver int16, maxParts int, reserve func(int64) bool) (*kept, error) {
	s := &stream{r: br}
	s.lr = io.LimitedReader{R: src, N: int64(n)}
	br.Reset(&s.lr)
	limit := func() error {
		return &limitError{what: "topic-partitions in one produce request", limit: maxParts, field: "max_partitions_per_request"}
	}
	// Request header (v1, or v2 with tags): the client id, any negative
	// length read as null (as skipHeader does on the accepted path).
	if n := s.int16(); n > 0 {
		s.skip(int64(n))
	}
	if ver >= 9 {
		s.flexible = true
		s.tags()
	}
	s.nullableString() // transactional_id
	k := &kept{acks: int16(s.int16())}
	keep := k.acks != 0
	s.skip(4) // timeout
	topics, total := s.arrayLen(), 0
	if topics > maxParts {
		// A topic counts as one even with no partition (countPartitions).
		return nil, limit()
	}
	// Room is reserved as bytes arrive, never for what a length only
	// declares: names in chunks of the read buffer, topics and partitions
	// one at a time (grow doubles, so what is held stays within about twice
	// what was kept).
	var ok bool
	for t := 0; t < topics && s.err == nil; t++ {
		size := s.length(s.int16)
		if s.err != nil {
			break
		}
		if size < 0 {
			return nil, fmt.Errorf("%w: a null topic name", errMalformed)
		}
		if keep {
			for rem := size; rem > 0 && s.err == nil; {
				// What has arrived (at least one byte, which waits for
				// the next read): room for bytes sent, not declared.
				c := min(rem, max(s.r.Buffered(), 1))
				if k.names, ok = grow(k.names, c, 1, reserve); !ok {
					return nil, errNoRoom
				}
				at := len(k.names)
				k.names = k.names[:at+c]
				s.fixed(k.names[at:])
				rem -= c
			}
		} else {
			s.skip(int64(size))
		}
		parts := s.arrayLen()
		if s.err != nil {
			break
		}
		if total += max(parts, 1); total > maxParts {
			return nil, limit()
		}
		for p := 0; p < parts && s.err == nil; p++ {
			idx := int32(s.int32())
			if keep && s.err == nil {
				if k.parts, ok = grow(k.parts, 1, 4, reserve); !ok {
					return nil, errNoRoom
				}
				k.parts = append(k.parts, idx)
			}
			s.nullableBytes() // the records, skipped unread
			s.tags()
		}
		s.tags()
		if keep && s.err == nil {
			if k.topics, ok = grow(k.topics, 1, 8, reserve); !ok {
				return nil, errNoRoom
			}
			k.topics = append(k.topics, keptTopic{int32(len(k.names)), int32(len(k.parts))})
		}
	}
	s.tags()
	s.skip(s.left()) // whatever follows, as kmsg ignores it
	if s.err != nil {
		return nil, s.err
	}
	return k, nil
}
