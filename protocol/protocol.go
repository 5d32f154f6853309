// Package protocol owns ferry's local record protocol, versions 1 to 3: the frames
// a client and the agent exchange over a Unix socket or TCP, how they are
// encoded, and how they are decoded with every size bounded before memory is
// spent on it. docs/protocol.md is the specification; testdata/protocol holds
// the vectors every implementation (this one, the Go client, the Java SDK)
// must pass.
//
// A connection starts with the 4-byte preamble "FRY\x01". Then frames:
//
//	u32 length (big-endian; the bytes after this field) | u8 type | u8 flags | u32 request id | body
//
// Integers in bodies are unsigned LEB128 varints (as protobuf's) unless
// noted; strings and byte strings are a varint length and the bytes.
// Encoding appends to a caller's buffer and decoding returns views into the
// frame, so neither allocates per record.
//
// Version 2 adds delivery receipts and request ids, and nothing else: a
// produce frame may set FlagReceipt (answer where the records landed) and
// FlagRequestID (its body starts with a request id the agent writes on
// every record as the Kafka header ferry.request_id); a result answering
// FlagReceipt sets it too and carries a receipt after its ranges. A v2
// produce frame with neither flag is byte for byte a v1 one, so a client
// that never asks pays nothing. The agent speaks both versions, each
// connection the one its preamble names; a v1 connection is served
// exactly as before (bits 2-7 of a v1 produce's flags are ignored, as v1
// says).
//
// Version 3 adds idempotence, so a client's retry after a lost connection
// or an agent restart is stored once: the hello carries a producer id (16
// random bytes a client makes once per process) and may ask for
// FeatureIdempotence, which the agent grants when it keeps accepted
// sequences durably (delivery mode spool); a produce frame may then set
// FlagSequence, its body starting (after the request id, if any) with the
// frame's sequence number. A retry of the same records under the same
// sequence is answered with the original result and not stored again. A v3
// produce without FlagSequence is byte for byte a v2 one. Bits 5-7 stay
// reserved.
package protocol

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// Preamble opens every binary connection of version 1; its last byte is
// the version (PreambleFor gives another version's).
var Preamble = [4]byte{'F', 'R', 'Y', Version1}

// PreambleFor is the preamble of version v.
func PreambleFor(v byte) [4]byte { return [4]byte{'F', 'R', 'Y', v} }

// The versions this package speaks: Version is the newest.
const (
	Version1 = 1
	Version2 = 2
	Version3 = 3
	Version  = Version3
)

// Spoken reports whether the agent speaks version v.
func Spoken(v byte) bool { return v >= Version1 && v <= Version }

// Flags of a version 2 produce frame (and of its result), beside the
// compression in bits 0-1. Bits 4-7 are reserved (sent 0).
const (
	// FlagReceipt: on a produce, answer with a receipt; on a result, a
	// receipt follows the ranges.
	FlagReceipt byte = 1 << 2
	// FlagRequestID: the produce body starts with a request id (a string)
	// before the record count.
	FlagRequestID byte = 1 << 3
	// FlagSequence (version 3, on a connection granted
	// FeatureIdempotence): the produce body holds the frame's sequence
	// number (a varint) after the request id, if any, and before the
	// record count.
	FlagSequence byte = 1 << 4
)

// HeaderLen is the frame header after the length field: type, flags,
// request id.
const HeaderLen = 6

// Frame types.
const (
	TypeHello   byte = 1 // client → agent, first frame
	TypeHelloOK byte = 2 // agent → client
	TypeProduce byte = 3 // client → agent
	TypeResult  byte = 4 // agent → client, one per Produce, same request id
	TypeError   byte = 5 // agent → client; the agent closes the connection after it
)

// Compression of a Produce frame's body (flags bits 0-1).
const (
	CompressNone byte = 0
	CompressLZ4  byte = 1 // LZ4 frame format
	CompressZstd byte = 2
	compressMask byte = 3
)

// Features a Hello asks for and a HelloOK grants.
const (
	FeatureLZ4  uint64 = 1 << 0
	FeatureZstd uint64 = 1 << 1
	// FeatureIdempotence (version 3): the agent remembers the sequences
	// of this producer id it accepted, durably, and answers a retry with
	// the original result. Granted only to a hello with a producer id, by
	// an agent whose delivery mode keeps them (spool).
	FeatureIdempotence uint64 = 1 << 2
)

// ProducerIDBytes is the length of a version 3 hello's producer id (or 0:
// none).
const ProducerIDBytes = 16

// Status of a range of records in a Result.
const (
	StatusOK        byte = 0 // durable where the delivery mode says (Kafka, or the spool)
	StatusRetryable byte = 1 // not accepted; sending again may succeed (after RetryAfter)
	StatusPermanent byte = 2 // not accepted; sending again will fail the same way
)

// ErrMalformed is a frame that does not follow the protocol; the agent
// answers it with an Error frame and closes the connection.
var ErrMalformed = errors.New("malformed frame")

// Limits bounds what a decoder accepts; each is checked before memory is
// spent on what it bounds.
type Limits struct {
	MaxFrameBytes  int // a frame after its length field, and a Produce body after decompression
	MaxRecords     int // records in one Produce
	MaxStringBytes int // client name, token, reason, message
	MaxHeaders     int // headers of one record
	MaxTopicBytes  int // Kafka's own bound is 249
}

// DefaultLimits are the agent's defaults (receivers.local).
var DefaultLimits = Limits{MaxFrameBytes: 8 << 20, MaxRecords: 100_000, MaxStringBytes: 4096, MaxHeaders: 256, MaxTopicBytes: 249}

// FrameHeader is a frame's fixed part.
type FrameHeader struct {
	Length    uint32 // bytes after the length field: HeaderLen + body
	Type      byte
	Flags     byte
	RequestID uint32
}

// ParseHeader reads the 10 bytes that start a frame and checks its length
// against max before anything is read or allocated for the body.
func ParseHeader(b [10]byte, max int) (FrameHeader, error) {
	h := FrameHeader{Length: binary.BigEndian.Uint32(b[0:4]), Type: b[4], Flags: b[5], RequestID: binary.BigEndian.Uint32(b[6:10])}
	if h.Length < HeaderLen {
		return h, fmt.Errorf("%w: length %d is shorter than the frame header", ErrMalformed, h.Length)
	}
	if int64(h.Length) > int64(max) {
		return h, &TooLargeError{What: "frame", Size: int64(h.Length), Limit: int64(max)}
	}
	if h.Type < TypeHello || h.Type > TypeError {
		return h, fmt.Errorf("%w: unknown frame type %d", ErrMalformed, h.Type)
	}
	return h, nil
}

// BodyLen is the length of the frame's body.
func (h FrameHeader) BodyLen() int { return int(h.Length) - HeaderLen }

// Compression is the Produce body's compression.
func (h FrameHeader) Compression() byte { return h.Flags & compressMask }

// TooLargeError is a frame or body over a limit.
type TooLargeError struct {
	What        string
	Size, Limit int64
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("%s of %d bytes exceeds the limit (%d)", e.What, e.Size, e.Limit)
}

// AppendFrame appends a frame of type t with body (appended by the caller
// after it: pass body == nil and use BeginFrame/EndFrame to encode in place).
func AppendFrame(dst []byte, t, flags byte, id uint32, body []byte) []byte {
	dst = binary.BigEndian.AppendUint32(dst, uint32(HeaderLen+len(body)))
	dst = append(dst, t, flags)
	dst = binary.BigEndian.AppendUint32(dst, id)
	return append(dst, body...)
}

// BeginFrame appends a frame header whose length EndFrame fills in; it
// returns the header's offset.
func BeginFrame(dst []byte, t, flags byte, id uint32) ([]byte, int) {
	at := len(dst)
	dst = append(dst, 0, 0, 0, 0, t, flags)
	return binary.BigEndian.AppendUint32(dst, id), at
}

// EndFrame sets the length of the frame begun at offset at.
func EndFrame(dst []byte, at int) {
	binary.BigEndian.PutUint32(dst[at:], uint32(len(dst)-at-4))
}

// Hello is the client's first frame.
type Hello struct {
	Version    uint16
	ClientName string
	Token      string
	Features   uint64
	// ProducerID (version 3): ProducerIDBytes random bytes naming the
	// client process across its connections; nil: none.
	ProducerID []byte
}

// AppendHello appends a Hello frame.
func AppendHello(dst []byte, h Hello) []byte {
	dst, at := BeginFrame(dst, TypeHello, 0, 0)
	dst = binary.BigEndian.AppendUint16(dst, h.Version)
	dst = appendString(dst, h.ClientName)
	dst = appendString(dst, h.Token)
	dst = binary.AppendUvarint(dst, h.Features)
	if h.Version >= Version3 {
		dst = appendBytes(dst, h.ProducerID)
	}
	EndFrame(dst, at)
	return dst
}

// DecodeHello decodes a Hello body; the fields it holds are the ones of
// the version it names.
func DecodeHello(body []byte, l Limits) (Hello, error) {
	d := decoder{b: body}
	var h Hello
	h.Version = d.u16()
	h.ClientName = string(d.bytes(l.MaxStringBytes, "client name"))
	h.Token = string(d.bytes(l.MaxStringBytes, "token"))
	h.Features = d.uvarint()
	if h.Version >= Version3 {
		h.ProducerID = d.bytes(ProducerIDBytes, "producer id")
		if d.err == nil && len(h.ProducerID) != 0 && len(h.ProducerID) != ProducerIDBytes {
			d.fail(fmt.Sprintf("a producer id of %d bytes (0 or %d)", len(h.ProducerID), ProducerIDBytes))
		}
	}
	return h, d.end()
}

// HelloOK is the agent's answer to Hello.
type HelloOK struct {
	Version          uint16
	Features         uint64
	MaxFrameBytes    uint32
	MaxRecords       uint32
	MaxInflightBytes uint32
	Server           string
}

// AppendHelloOK appends a HelloOK frame.
func AppendHelloOK(dst []byte, h HelloOK) []byte {
	dst, at := BeginFrame(dst, TypeHelloOK, 0, 0)
	dst = binary.BigEndian.AppendUint16(dst, h.Version)
	dst = binary.AppendUvarint(dst, h.Features)
	dst = binary.BigEndian.AppendUint32(dst, h.MaxFrameBytes)
	dst = binary.BigEndian.AppendUint32(dst, h.MaxRecords)
	dst = binary.BigEndian.AppendUint32(dst, h.MaxInflightBytes)
	dst = appendString(dst, h.Server)
	EndFrame(dst, at)
	return dst
}

// DecodeHelloOK decodes a HelloOK body.
func DecodeHelloOK(body []byte, l Limits) (HelloOK, error) {
	d := decoder{b: body}
	var h HelloOK
	h.Version = d.u16()
	h.Features = d.uvarint()
	h.MaxFrameBytes = d.u32()
	h.MaxRecords = d.u32()
	h.MaxInflightBytes = d.u32()
	h.Server = string(d.bytes(l.MaxStringBytes, "server"))
	return h, d.end()
}

// Header is one record header.
type Header struct {
	Key   []byte
	Value []byte
}

// Record is a record as a Produce frame carries it. Decoded records are
// views into the frame; Key is nil for a record without a key.
type Record struct {
	Topic     []byte
	Key       []byte
	Value     []byte
	Timestamp int64 // milliseconds since the epoch; 0: the agent's receive time
	Headers   []Header
}

// AppendRecord appends one record of a Produce body; prevTopic is the
// previous record's topic in this body ("" for the first), so a run of
// records to one topic names it once.
func AppendRecord(dst []byte, prevTopic string, r *Record) []byte {
	if len(r.Topic) > 0 && string(r.Topic) == prevTopic {
		dst = append(dst, 0)
	} else {
		dst = appendBytes(dst, r.Topic)
	}
	if r.Key == nil {
		dst = append(dst, 0)
	} else {
		dst = binary.AppendUvarint(dst, uint64(len(r.Key))+1)
		dst = append(dst, r.Key...)
	}
	dst = appendBytes(dst, r.Value)
	dst = binary.AppendUvarint(dst, uint64(max(r.Timestamp, 0)))
	dst = binary.AppendUvarint(dst, uint64(len(r.Headers)))
	for i := range r.Headers {
		dst = appendBytes(dst, r.Headers[i].Key)
		dst = appendBytes(dst, r.Headers[i].Value)
	}
	return dst
}

// Records decodes a Produce body (already decompressed) one record at a
// time, without allocating: Next fills a Record whose slices point into the
// body, valid until the body's buffer is reused.
type Records struct {
	d     decoder
	l     Limits
	n     int
	i     int
	topic []byte
	hdrs  []Header
}

// NewRecords starts decoding body. Count is known (and checked against
// l.MaxRecords) before any record is decoded.
func NewRecords(body []byte, l Limits) (*Records, error) {
	rs := &Records{}
	return rs, rs.Reset(body, l)
}

// Reset reuses rs for another body.
func (rs *Records) Reset(body []byte, l Limits) error {
	rs.d, rs.l, rs.i, rs.topic = decoder{b: body}, l, 0, nil
	n := rs.d.uvarint()
	if rs.d.err != nil {
		return rs.d.err
	}
	if n == 0 {
		return fmt.Errorf("%w: a produce frame with no records", ErrMalformed)
	}
	if n > uint64(l.MaxRecords) {
		return &TooLargeError{What: "records in one frame", Size: int64(min(n, 1<<62)), Limit: int64(l.MaxRecords)}
	}
	// Each record takes at least 5 bytes: a count the body cannot hold is a
	// lie, refused before anything is sized from it.
	if n > uint64(len(body)/5+1) {
		return fmt.Errorf("%w: %d records cannot fit in %d bytes", ErrMalformed, n, len(body))
	}
	rs.n = int(n)
	return nil
}

// Len is the number of records in the body.
func (rs *Records) Len() int { return rs.n }

// Next decodes the next record into r; false when done or on error (Err).
// r.Headers reuses one slice across calls: copy it to keep it.
func (rs *Records) Next(r *Record) bool {
	if rs.i >= rs.n || rs.d.err != nil {
		return false
	}
	d := &rs.d
	topic := d.bytes(rs.l.MaxTopicBytes, "topic")
	if len(topic) == 0 {
		if rs.topic == nil {
			d.fail("the first record names no topic")
			return false
		}
		topic = rs.topic
	}
	rs.topic = topic
	r.Topic = topic
	kl := d.uvarint()
	switch {
	case kl == 0:
		r.Key = nil
	case kl-1 > uint64(len(d.b)-d.off):
		d.fail("key longer than the frame")
	default:
		r.Key = d.take(int(kl - 1))
	}
	r.Value = d.bytes(len(d.b), "value")
	ts := d.uvarint()
	if ts > 1<<53 {
		d.fail("timestamp out of range")
	}
	r.Timestamp = int64(ts)
	nh := d.uvarint()
	if nh > uint64(rs.l.MaxHeaders) {
		d.fail(fmt.Sprintf("%d headers exceed the limit (%d)", nh, rs.l.MaxHeaders))
	}
	rs.hdrs = rs.hdrs[:0]
	for j := uint64(0); j < nh && d.err == nil; j++ {
		k := d.bytes(rs.l.MaxStringBytes, "header key")
		v := d.bytes(len(d.b), "header value")
		rs.hdrs = append(rs.hdrs, Header{Key: k, Value: v})
	}
	r.Headers = rs.hdrs
	if d.err != nil {
		return false
	}
	rs.i++
	if rs.i == rs.n && d.off != len(d.b) {
		d.fail("bytes after the last record")
		return false
	}
	return true
}

// Err is the decoding error, if any; a body that ends before its records
// do is an error too.
func (rs *Records) Err() error {
	if rs.d.err == nil && rs.i < rs.n && rs.d.off >= len(rs.d.b) {
		return fmt.Errorf("%w: the body ends after %d of %d records", ErrMalformed, rs.i, rs.n)
	}
	return rs.d.err
}

// Range is a run of consecutive records with one outcome.
type Range struct {
	// Count is the number of records; 0 (only as a Result's one range)
	// means every record of the frame.
	Count      uint32
	Status     byte
	Reason     string
	RetryAfter time.Duration // rounded to milliseconds on the wire
	Message    string
}

// AppendResult appends a Result frame answering request id.
func AppendResult(dst []byte, id uint32, ranges []Range) []byte {
	dst, at := BeginFrame(dst, TypeResult, 0, id)
	dst = appendRanges(dst, ranges)
	EndFrame(dst, at)
	return dst
}

func appendRanges(dst []byte, ranges []Range) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(ranges)))
	for _, r := range ranges {
		dst = binary.AppendUvarint(dst, uint64(r.Count))
		dst = append(dst, r.Status)
		dst = appendString(dst, r.Reason)
		dst = binary.AppendUvarint(dst, uint64(max(r.RetryAfter, 0)/time.Millisecond))
		dst = appendString(dst, r.Message)
	}
	return dst
}

// DecodeResult decodes a version 1 Result body (or a version 2 one
// without FlagReceipt), appending its ranges to dst.
func DecodeResult(dst []Range, body []byte, l Limits) ([]Range, error) {
	d := decoder{b: body}
	dst = d.ranges(dst, l)
	return dst, d.end()
}

// ranges reads a Result's range count and ranges.
func (d *decoder) ranges(dst []Range, l Limits) []Range {
	n := d.uvarint()
	if d.err != nil {
		return dst
	}
	if n > uint64(l.MaxRecords) || n > uint64(len(d.b)) {
		d.fail(fmt.Sprintf("%d ranges", n))
		return dst
	}
	for i := uint64(0); i < n && d.err == nil; i++ {
		var r Range
		c := d.uvarint()
		// Count 0 is allowed only as the one range: the whole frame (the
		// agent refused it without decoding it, so it does not know how
		// many records it held).
		if c == 0 && n != 1 || c > uint64(l.MaxRecords) {
			d.fail("a range of 0 records beside others, or of too many records")
		}
		r.Count = uint32(c)
		r.Status = d.byte()
		if r.Status > StatusPermanent {
			d.fail(fmt.Sprintf("unknown status %d", r.Status))
		}
		r.Reason = string(d.bytes(l.MaxStringBytes, "reason"))
		ms := d.uvarint()
		if ms > uint64(time.Hour/time.Millisecond) {
			ms = uint64(time.Hour / time.Millisecond)
		}
		r.RetryAfter = time.Duration(ms) * time.Millisecond
		r.Message = string(d.bytes(l.MaxStringBytes, "message"))
		dst = append(dst, r)
	}
	return dst
}

// Placement is a run of a result's accepted records, in record order, at
// consecutive offsets of one partition: Offset … Offset+Count-1.
type Placement struct {
	Topic     string
	Partition int32
	Offset    int64
	Count     uint32
}

// Receipt is what a version 2 result says of where its accepted records
// went: Placements when Kafka had acknowledged them (delivery mode kafka,
// spill from memory); SpoolID when the spool took them first (the client
// looks them up later, GET /receipts/{id}); both when a frame's records
// took both paths is not possible (one frame is one batch).
type Receipt struct {
	SpoolID    string
	Placements []Placement
}

// AppendResultReceipt appends a version 2 Result frame: AppendResult's,
// with FlagReceipt and rc after the ranges (rc nil: exactly AppendResult).
func AppendResultReceipt(dst []byte, id uint32, ranges []Range, rc *Receipt) []byte {
	if rc == nil {
		return AppendResult(dst, id, ranges)
	}
	dst, at := BeginFrame(dst, TypeResult, FlagReceipt, id)
	dst = appendRanges(dst, ranges)
	dst = appendString(dst, rc.SpoolID)
	dst = binary.AppendUvarint(dst, uint64(len(rc.Placements)))
	prev := ""
	for i, p := range rc.Placements {
		if i > 0 && p.Topic == prev {
			dst = append(dst, 0)
		} else {
			dst = appendString(dst, p.Topic)
		}
		prev = p.Topic
		dst = binary.AppendUvarint(dst, uint64(max(p.Partition, 0)))
		dst = binary.AppendUvarint(dst, uint64(max(p.Offset, 0)))
		dst = binary.AppendUvarint(dst, uint64(p.Count))
	}
	EndFrame(dst, at)
	return dst
}

// DecodeResultReceipt decodes a Result body of either version: the ranges
// (appended to dst) and, when flags has FlagReceipt, the receipt into rc
// (its Placements appended to). A version 1 result never has the flag.
func DecodeResultReceipt(dst []Range, rc *Receipt, flags byte, body []byte, l Limits) ([]Range, error) {
	d := decoder{b: body}
	dst = d.ranges(dst, l)
	if flags&FlagReceipt != 0 && d.err == nil {
		rc.SpoolID = string(d.bytes(l.MaxStringBytes, "spool id"))
		n := d.uvarint()
		if n > uint64(l.MaxRecords) || n > uint64(len(body)) {
			d.fail(fmt.Sprintf("%d placements", n))
		}
		var prev string
		total := uint64(0)
		for i := uint64(0); i < n && d.err == nil; i++ {
			t := d.bytes(l.MaxTopicBytes, "topic")
			var p Placement
			switch {
			case len(t) > 0:
				p.Topic = string(t)
			case i == 0:
				d.fail("the first placement names no topic")
			default:
				p.Topic = prev
			}
			prev = p.Topic
			part, off, c := d.uvarint(), d.uvarint(), d.uvarint()
			total += c
			if part > 1<<31-1 || off > 1<<63-1 || c == 0 || total > uint64(l.MaxRecords) {
				d.fail("a placement's partition, offset or count out of range")
			}
			p.Partition, p.Offset, p.Count = int32(part), int64(off), uint32(c)
			rc.Placements = append(rc.Placements, p)
		}
	}
	return dst, d.end()
}

// AppendRequestID starts a version 2 produce body that has FlagRequestID:
// the request id, before the record count.
func AppendRequestID(dst []byte, id string) []byte { return appendString(dst, id) }

// MaxRequestIDBytes bounds a produce frame's request id (the agent copies
// it into every record).
const MaxRequestIDBytes = 128

// ErrInvalidRequestID: a produce frame's request id field is well-formed
// (its length is within the frame) but the id is not 1 to
// MaxRequestIDBytes of A-Z a-z 0-9 . _ : -. It is the client's mistake
// about one frame, not a broken stream: the agent answers that frame
// permanent invalid_request_id and the connection goes on (a client that
// resent it after a framing error would loop forever).
var ErrInvalidRequestID = errors.New("invalid request id: it must be 1 to 128 of A-Z a-z 0-9 . _ : -")

// ValidRequestID: 1 to MaxRequestIDBytes of A-Z a-z 0-9 . _ : - (package
// receipt holds the same rule for the HTTP header; the two are one layer
// and do not import each other).
func ValidRequestID[T string | []byte](id T) bool {
	if len(id) == 0 || len(id) > MaxRequestIDBytes {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == ':' || c == '-') {
			return false
		}
	}
	return true
}

// SplitRequestID reads the request id that starts a (decompressed) body
// with FlagRequestID, returning it and the rest of the body (the record
// count and records); a view, no copy. A field whose length runs past the
// body is malformed (the stream cannot be trusted); a field that reads
// but holds no valid id returns ErrInvalidRequestID (the frame alone is
// refused).
func SplitRequestID(body []byte) (id, rest []byte, err error) {
	d := decoder{b: body}
	id = d.bytes(len(body), "request id")
	if d.err != nil {
		return nil, nil, d.err
	}
	if !ValidRequestID(id) {
		return nil, nil, ErrInvalidRequestID
	}
	return id, body[d.off:], nil
}

// AppendSequence appends a version 3 frame's sequence number (FlagSequence):
// after the request id, if any, before the record count.
func AppendSequence(dst []byte, seq uint64) []byte { return binary.AppendUvarint(dst, seq) }

// SplitSequence reads the sequence number that starts body (after the
// request id, if any) and returns the rest; a missing or overlong varint
// is malformed.
func SplitSequence(body []byte) (seq uint64, rest []byte, err error) {
	d := decoder{b: body}
	seq = d.uvarint()
	if d.err != nil {
		return 0, nil, d.err
	}
	return seq, body[d.off:], nil
}

// AppendError appends an Error frame about request id (0: the connection).
func AppendError(dst []byte, id uint32, reason, msg string) []byte {
	dst, at := BeginFrame(dst, TypeError, 0, id)
	dst = appendString(dst, reason)
	dst = appendString(dst, msg)
	EndFrame(dst, at)
	return dst
}

// DecodeError decodes an Error body.
func DecodeError(body []byte, l Limits) (reason, msg string, err error) {
	d := decoder{b: body}
	reason = string(d.bytes(l.MaxStringBytes, "reason"))
	msg = string(d.bytes(l.MaxStringBytes, "message"))
	return reason, msg, d.end()
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

func appendBytes(dst, b []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(b)))
	return append(dst, b...)
}

// decoder reads a body; the first error sticks and every later read
// returns zero values.
type decoder struct {
	b   []byte
	off int
	err error
}

func (d *decoder) fail(msg string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", ErrMalformed, msg)
	}
}

func (d *decoder) uvarint() uint64 {
	// Most varints of a frame (lengths of small keys and values, header
	// counts, a repeated topic's 0) are one byte: read those inline. The
	// agent decodes several per record, on its hottest path.
	if d.off < len(d.b) && d.b[d.off] < 0x80 && d.err == nil {
		d.off++
		return uint64(d.b[d.off-1])
	}
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b[d.off:])
	if n <= 0 {
		d.fail("bad or truncated varint")
		return 0
	}
	d.off += n
	return v
}

func (d *decoder) byte() byte {
	if d.err != nil || d.off >= len(d.b) {
		d.fail("truncated")
		return 0
	}
	d.off++
	return d.b[d.off-1]
}

func (d *decoder) u16() uint16 {
	if d.err != nil || len(d.b)-d.off < 2 {
		d.fail("truncated")
		return 0
	}
	d.off += 2
	return binary.BigEndian.Uint16(d.b[d.off-2:])
}

func (d *decoder) u32() uint32 {
	if d.err != nil || len(d.b)-d.off < 4 {
		d.fail("truncated")
		return 0
	}
	d.off += 4
	return binary.BigEndian.Uint32(d.b[d.off-4:])
}

func (d *decoder) take(n int) []byte {
	v := d.b[d.off : d.off+n : d.off+n]
	d.off += n
	return v
}

// bytes reads a length-prefixed byte string of at most max bytes.
func (d *decoder) bytes(max int, what string) []byte {
	n := d.uvarint()
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)-d.off) {
		d.fail(what + " longer than the frame")
		return nil
	}
	if n > uint64(max) {
		d.fail(fmt.Sprintf("%s of %d bytes exceeds the limit (%d)", what, n, max))
		return nil
	}
	return d.take(int(n))
}

func (d *decoder) end() error {
	if d.err == nil && d.off != len(d.b) {
		d.fail("bytes after the end of the body")
	}
	return d.err
}

func appendUvarint(dst []byte, v uint64) []byte { return binary.AppendUvarint(dst, v) }

// AppendProduceCount starts a Produce body with its record count.
func AppendProduceCount(dst []byte, n int) []byte { return binary.AppendUvarint(dst, uint64(n)) }
