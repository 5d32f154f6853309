package kafkafront

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferryhq/ferry/consumer"
)

// Refusing a produce request the memory budget has no room for.
//
// The client must be told per partition to retry (a Kafka client answered
// otherwise fails the batch or drops the connection), and the answer names
// every topic and partition of the request, so the request is read whole.
// It is read as a stream: the record batches are skipped unread and only
// the names and partition numbers are kept. Each refusing connection reads
// on its own body_timeout with a few KiB of buffer, so a client trickling
// its request delays nobody else's refusal. (The refusal used to read the
// request into one buffer of max_request_bytes shared by all connections;
// four clients holding back their last byte kept every other client's
// "retry" waiting twenty seconds.)
//
// What a refusal keeps (names, the answer's structs) is reserved from a
// budget of its own, max_request_bytes wide, before it is kept; a request
// whose names do not fit while others are being refused ends its
// connection, which a Kafka client retries like a refusal.

// refusalCost is what the answer keeps per topic (besides its name) and per
// partition: kmsg's structs, with room for the encoded answer.
const (
	refusalTopicCost     = 96
	refusalPartitionCost = 96
)

// maxTopicName is Kafka's own bound on a topic name: a longer one is no
// topic any broker accepts.
const maxTopicName = 249

var refusalReaders = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 4<<10) }}

// stream reads Kafka's primitive types from at most n bytes of a
// connection, recording the first error (an io error or errMalformed).
type stream struct {
	r        *bufio.Reader
	lr       io.LimitedReader
	flexible bool
	err      error
	scratch  [maxTopicName]byte
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

func (s *stream) int16() int {
	var b [2]byte
	s.fixed(b[:])
	return int(int16(binary.BigEndian.Uint16(b[:])))
}

func (s *stream) int32() int {
	var b [4]byte
	s.fixed(b[:])
	return int(int32(binary.BigEndian.Uint32(b[:])))
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
	resp, acks, err := readRefused(br, cn.c, n, ver, r.cfg.MaxPartitions, func(k int64) bool {
		if !r.refusals.TryReserve(k) {
			return false
		}
		held += k
		return true
	})
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
	if acks == 0 {
		cn.r.logWarn("queue_full", "acks=0 produce request dropped: ferry's buffer is full", "remote", cn.c.RemoteAddr().String())
		return nil
	}
	for t := range resp.Topics {
		for p := range resp.Topics[t].Partitions {
			setError(&resp.Topics[t].Partitions[p], consumer.ErrFull)
		}
	}
	resp.ThrottleMillis = int32(time.Second / time.Millisecond)
	cn.answerNow(corr, resp)
	return nil
}

// errNoRoom: the refusals' room is spent.
var errNoRoom = errors.New("ferry's buffer is full and so is the room for refusing requests; reconnect and retry")

// readRefused reads a Produce request of n bytes (request header from the
// client id on, then the body) from src through br, skipping its records,
// and returns the answer's skeleton (every partition "no error, offset
// unknown") and the request's acks. Before it keeps a name or a topic's
// partitions it asks reserve for their cost. Errors: an io error from src,
// errMalformed, a *limitError (max_partitions), errNoRoom.
func readRefused(br *bufio.Reader, src io.Reader, n int, ver int16, maxParts int, reserve func(int64) bool) (*kmsg.ProduceResponse, int16, error) {
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
	acks := int16(s.int16())
	s.skip(4) // timeout
	resp := kmsg.NewPtrProduceResponse()
	resp.SetVersion(ver)
	topics, total := s.arrayLen(), 0
	if topics > maxParts {
		// Each topic takes an entry of the answer even with no partition.
		return nil, 0, limit()
	}
	for t := 0; t < topics && s.err == nil; t++ {
		size := s.length(s.int16)
		if s.err != nil {
			break
		}
		if size < 0 {
			return nil, 0, fmt.Errorf("%w: a null topic name", errMalformed)
		}
		if size > maxTopicName {
			return nil, 0, fmt.Errorf("%w: a topic name of %d bytes (Kafka's limit is %d)", errMalformed, size, maxTopicName)
		}
		if !reserve(refusalTopicCost + int64(size)) {
			return nil, 0, errNoRoom
		}
		name := s.scratch[:size]
		s.fixed(name)
		parts := s.arrayLen()
		if s.err != nil {
			break
		}
		if total += parts; total > maxParts {
			return nil, 0, limit()
		}
		if !reserve(refusalPartitionCost * int64(parts)) {
			return nil, 0, errNoRoom
		}
		rt := kmsg.NewProduceResponseTopic()
		rt.Topic = string(name)
		rt.Partitions = make([]kmsg.ProduceResponseTopicPartition, 0, parts)
		for p := 0; p < parts && s.err == nil; p++ {
			rp := kmsg.NewProduceResponseTopicPartition()
			rp.Partition = int32(s.int32())
			rp.BaseOffset, rp.LogAppendTime, rp.LogStartOffset = -1, -1, -1
			s.nullableBytes() // the records, skipped unread
			s.tags()
			rt.Partitions = append(rt.Partitions, rp)
		}
		s.tags()
		resp.Topics = append(resp.Topics, rt)
	}
	s.tags()
	s.skip(s.left()) // whatever follows, as kmsg ignores it
	if s.err != nil {
		return nil, 0, s.err
	}
	return resp, acks, nil
}
