package kafkafront

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"sync"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/snappy"

	"github.com/ferryhq/ferry/protocol"
)

// A produce request carries, per partition, Kafka record batches (magic
// v2, the only format Produce v3 and later allow). Their layout, from the
// Kafka protocol guide:
//
//	baseOffset int64 | batchLength int32 | partitionLeaderEpoch int32 |
//	magic int8 | crc uint32 (CRC-32C of attributes..end) |
//	attributes int16 | lastOffsetDelta int32 | firstTimestamp int64 |
//	maxTimestamp int64 | producerId int64 | producerEpoch int16 |
//	baseSequence int32 | recordCount int32 | records
//
// and each record, varints zig-zag encoded:
//
//	length varint | attributes int8 | timestampDelta varlong |
//	offsetDelta varint | keyLength varint (-1: null) | key |
//	valueLength varint (-1: null) | value | headerCount varint |
//	headers (keyLength varint | key | valueLength varint | value)
const (
	batchHeader    = 61
	batchCRCStart  = 21 // attributes onwards are checksummed
	attrCodec      = 0x07
	attrTxn        = 0x10
	attrControl    = 0x20
	codecNone      = 0
	codecGzip      = 1
	codecSnappy    = 2
	codecLZ4       = 3
	codecZstd      = 4
	minRecordBytes = 7 // length, attributes, two deltas, key, value, header count
)

var crc32c = crc32.MakeTable(crc32.Castagnoli)

// errCorrupt: the bytes are not a valid record batch (Kafka's
// CORRUPT_MESSAGE); the client's data is refused for that partition.
var errCorrupt = errors.New("corrupt record batch")

// errOldFormat: a message set older than v2 (Kafka's
// UNSUPPORTED_FOR_MESSAGE_FORMAT, which clients do not retry).
var errOldFormat = errors.New("unsupported record format")

// batch is one record batch's header fields ferry uses.
type batch struct {
	attrs      int16
	firstTS    int64
	producerID int64
	epoch      int16
	baseSeq    int32
	count      int32
	crc        uint32
	records    []byte // as sent: compressed when attrs say so
}

// nextBatch splits the first batch off b.
func nextBatch(b []byte) (bt batch, rest []byte, err error) {
	if len(b) < batchHeader {
		return bt, nil, fmt.Errorf("%w: %d bytes, a batch header is %d", errCorrupt, len(b), batchHeader)
	}
	length := int64(int32(binary.BigEndian.Uint32(b[8:])))
	if length < batchHeader-12 || length > int64(len(b)-12) {
		return bt, nil, fmt.Errorf("%w: batch length %d with %d bytes left", errCorrupt, length, len(b)-12)
	}
	end := 12 + int(length)
	if magic := b[16]; magic != 2 {
		return bt, nil, fmt.Errorf("%w: record format v%d; ferry takes v2 batches only", errOldFormat, magic)
	}
	bt.crc = binary.BigEndian.Uint32(b[17:])
	if crc32.Checksum(b[batchCRCStart:end], crc32c) != bt.crc {
		return bt, nil, fmt.Errorf("%w: CRC mismatch", errCorrupt)
	}
	bt.attrs = int16(binary.BigEndian.Uint16(b[21:]))
	bt.firstTS = int64(binary.BigEndian.Uint64(b[27:]))
	bt.producerID = int64(binary.BigEndian.Uint64(b[43:]))
	bt.epoch = int16(binary.BigEndian.Uint16(b[51:]))
	bt.baseSeq = int32(binary.BigEndian.Uint32(b[53:]))
	bt.count = int32(binary.BigEndian.Uint32(b[57:]))
	bt.records = b[batchHeader:end]
	if bt.count < 0 {
		return bt, nil, fmt.Errorf("%w: record count %d", errCorrupt, bt.count)
	}
	return bt, b[end:], nil
}

// rawRecord is one record, its slices pointing into the batch.
type rawRecord struct {
	tsDelta    int64
	key, value []byte
	headers    []byte // the header section, nheaders entries
	nheaders   int
}

// nextRecord splits the first record off p.
func nextRecord(p []byte) (r rawRecord, rest []byte, err error) {
	length, k := binary.Varint(p)
	if k <= 0 || length < minRecordBytes-1 || length > int64(len(p)-k) {
		return r, nil, fmt.Errorf("%w: record length", errCorrupt)
	}
	body, rest := p[k:k+int(length)], p[k+int(length):]
	if len(body) < 1 {
		return r, nil, fmt.Errorf("%w: empty record", errCorrupt)
	}
	body = body[1:] // attributes: unused by v2
	if r.tsDelta, k = binary.Varint(body); k <= 0 {
		return r, nil, fmt.Errorf("%w: timestamp delta", errCorrupt)
	}
	body = body[k:]
	if _, k = binary.Varint(body); k <= 0 {
		return r, nil, fmt.Errorf("%w: offset delta", errCorrupt)
	}
	body = body[k:]
	var ok bool
	if r.key, body, ok = nullableBytes(body); !ok {
		return r, nil, fmt.Errorf("%w: key", errCorrupt)
	}
	if r.value, body, ok = nullableBytes(body); !ok {
		return r, nil, fmt.Errorf("%w: value", errCorrupt)
	}
	nh, k := binary.Varint(body)
	// A header takes at least two bytes, so the count is bounded by what
	// is left before anything is allocated for it.
	if k <= 0 || nh < 0 || nh > int64(len(body)-k)/2 {
		return r, nil, fmt.Errorf("%w: header count", errCorrupt)
	}
	r.nheaders, r.headers = int(nh), body[k:]
	return r, rest, nil
}

// nextHeader splits the first header off h.
func nextHeader(h []byte) (key, value, rest []byte, err error) {
	var ok bool
	if key, h, ok = nullableBytes(h); !ok || key == nil {
		return nil, nil, nil, fmt.Errorf("%w: header key", errCorrupt)
	}
	if value, h, ok = nullableBytes(h); !ok {
		return nil, nil, nil, fmt.Errorf("%w: header value", errCorrupt)
	}
	return key, value, h, nil
}

// nullableBytes reads a varint length (-1: null) and that many bytes.
func nullableBytes(p []byte) (b, rest []byte, ok bool) {
	n, k := binary.Varint(p)
	if k <= 0 || n < -1 || n > int64(len(p)-k) {
		return nil, nil, false
	}
	if n == -1 {
		return nil, p[k:], true
	}
	end := k + int(n)
	return p[k:end:end], p[end:], true
}

// decompress appends src, compressed with codec, to dst, never past
// cap(dst): the caller reserved that capacity from the memory budget, and
// records already decoded point into dst, so it must not move. Output past
// it is a protocol.TooLargeError.
func decompress(dst, src []byte, codec int) ([]byte, error) {
	room := cap(dst) - len(dst)
	switch codec {
	case codecLZ4:
		return protocol.Decompress(dst, src, protocol.CompressLZ4, room)
	case codecZstd:
		return protocol.Decompress(dst, src, protocol.CompressZstd, room)
	case codecGzip:
		zr := gzipReaders.Get().(*gzip.Reader)
		defer gzipReaders.Put(zr)
		if err := zr.Reset(bytes.NewReader(src)); err != nil {
			return dst, fmt.Errorf("%w: gzip: %v", errCorrupt, err)
		}
		return readCapped(dst, zr)
	case codecSnappy:
		return unsnappy(dst, src)
	}
	return dst, fmt.Errorf("%w: unknown compression codec %d", errCorrupt, codec)
}

var gzipReaders = sync.Pool{New: func() any { return new(gzip.Reader) }}

// readCapped reads r to its end into dst's spare capacity.
func readCapped(dst []byte, r io.Reader) ([]byte, error) {
	start := len(dst)
	for {
		if len(dst) == cap(dst) {
			// Full: one more byte means over the limit.
			var one [1]byte
			if n, _ := io.ReadFull(r, one[:]); n > 0 {
				return dst[:start], tooLarge()
			}
			return dst, nil
		}
		n, err := r.Read(dst[len(dst):cap(dst)])
		dst = dst[:len(dst)+n]
		if errors.Is(err, io.EOF) {
			return dst, nil
		}
		if err != nil {
			return dst[:start], fmt.Errorf("%w: decompressing: %v", errCorrupt, err)
		}
	}
}

func tooLarge() error {
	return &protocol.TooLargeError{What: "decompressed produce request"}
}

// snappyMagic starts the framing the Java client writes (xerial
// snappy-java): the magic, two version words, then blocks each prefixed
// by its big-endian length. Other clients may send one raw block.
var snappyMagic = []byte{0x82, 'S', 'N', 'A', 'P', 'P', 'Y', 0}

func unsnappy(dst, src []byte) ([]byte, error) {
	if !bytes.HasPrefix(src, snappyMagic) {
		return unsnappyBlock(dst, src)
	}
	if len(src) < 16 {
		return dst, fmt.Errorf("%w: snappy framing header", errCorrupt)
	}
	start := len(dst)
	src = src[16:]
	for len(src) > 0 {
		if len(src) < 4 {
			return dst[:start], fmt.Errorf("%w: snappy block length", errCorrupt)
		}
		n := binary.BigEndian.Uint32(src)
		if uint64(n) > uint64(len(src)-4) {
			return dst[:start], fmt.Errorf("%w: snappy block of %d bytes with %d left", errCorrupt, n, len(src)-4)
		}
		var err error
		if dst, err = unsnappyBlock(dst, src[4:4+n]); err != nil {
			return dst[:start], err
		}
		src = src[4+n:]
	}
	return dst, nil
}

// unsnappyBlock checks the block's stated output size against the room
// left before decoding it.
func unsnappyBlock(dst, block []byte) ([]byte, error) {
	n, err := snappy.DecodedLen(block)
	if err != nil {
		return dst, fmt.Errorf("%w: snappy: %v", errCorrupt, err)
	}
	if n > cap(dst)-len(dst) {
		return dst, tooLarge()
	}
	out, err := snappy.Decode(dst[len(dst):len(dst)+n], block)
	if err != nil || len(out) != n {
		return dst, fmt.Errorf("%w: snappy: %v", errCorrupt, err)
	}
	return dst[:len(dst)+n], nil
}
