package kafkaexporter

import (
	"bytes"
	"encoding/binary"
	"sync"

	"github.com/klauspost/compress/s2"
	"github.com/twmb/franz-go/pkg/kgo"
)

// lz4Compressor writes the lz4 record batches ferry sends to Kafka, at
// about twice the speed of the pure-Go lz4 block search franz-go uses by
// default, with the same ratio: on an agent forwarding logs, compression is
// the largest single cost per record (about half of it on 1 KB logs).
//
// The match search is Snappy's, from klauspost/compress's s2 encoder, which
// has an assembly version; each block's Snappy matches are then written as
// LZ4 sequences. The two formats describe the same thing (literals, then a
// copy of earlier bytes at an offset), and every Snappy copy in a block of
// at most 64 KiB fits LZ4's 16-bit offset, so the result is plain LZ4
// that every Kafka consumer and the broker read: a standard LZ4 frame of
// independent 64 KiB blocks (what Kafka's own Java producer writes), no
// checksums, ended by the end mark.
//
// Any Snappy block the converter does not recognise to the byte is
// written as a stored (uncompressed) LZ4 block instead: the output is
// always valid LZ4 of exactly the input, at worst not smaller.
type lz4Compressor struct{}

var _ kgo.Compressor = lz4Compressor{}

const (
	lz4BlockSize = 64 << 10
	// lz4 frame header: magic, FLG (version 01, independent blocks, no
	// checksums, no content size), BD (64 KiB blocks), and the header
	// checksum byte, (xxh32(FLG, BD) >> 8) & 0xff, constant for these two
	// bytes (TestLZ4FrameHeader checks it against pierrec/lz4's writer).
	lz4FLG, lz4BD, lz4HC = 0x60, 0x40, 0x82
	lz4Stored            = 1 << 31 // block size flag: the block is stored uncompressed
	// LZ4's rules for the end of a block: the last 5 bytes are literals,
	// and the last match starts at least 12 bytes before the end.
	lz4LastLiterals = 5
	lz4MatchLimit   = 12
)

var lz4Magic = [4]byte{0x04, 0x22, 0x4d, 0x18}

var snappyScratch = sync.Pool{New: func() any {
	b := make([]byte, s2.MaxEncodedLen(lz4BlockSize))
	return &b
}}

// Compress implements kgo.Compressor: dst is franz-go's pooled buffer, used
// until the returned slice has been copied into the request.
func (lz4Compressor) Compress(dst *bytes.Buffer, src []byte, _ ...kgo.CompressFlag) ([]byte, kgo.CompressionCodecType) {
	// The header, each block's size and its worst case (stored), the end mark.
	dst.Grow(7 + len(src) + 4*(len(src)/lz4BlockSize+1) + 4)
	return appendLZ4Frame(dst.AvailableBuffer(), src), kgo.CodecLz4
}

// appendLZ4Frame appends src as an LZ4 frame to out.
func appendLZ4Frame(out, src []byte) []byte {
	out = append(out, lz4Magic[:]...)
	out = append(out, lz4FLG, lz4BD, lz4HC)
	scratch := snappyScratch.Get().(*[]byte)
	defer snappyScratch.Put(scratch)
	for len(src) > 0 {
		chunk := src[:min(len(src), lz4BlockSize)]
		src = src[len(chunk):]
		at := len(out)
		out = append(out, 0, 0, 0, 0)
		var ok bool
		if out, ok = appendLZ4Block(out, chunk, s2.EncodeSnappy(*scratch, chunk), at+4+len(chunk)); ok {
			binary.LittleEndian.PutUint32(out[at:], uint32(len(out)-at-4))
			continue
		}
		out = append(out[:at+4], chunk...)
		binary.LittleEndian.PutUint32(out[at:], uint32(len(chunk))|lz4Stored)
	}
	return append(out, 0, 0, 0, 0)
}

// appendLZ4Block appends the LZ4 block of src, whose Snappy block is snap,
// to out; ok is false (and out is to be cut back) if snap is not what the
// converter expects or the block would reach limit, the length at which a
// stored block is no larger.
func appendLZ4Block(out, src, snap []byte, limit int) (_ []byte, ok bool) {
	n, k := binary.Uvarint(snap)
	if k <= 0 || n != uint64(len(src)) {
		return out, false
	}
	snap = snap[k:]
	// d is the position in src the tags have reached; lit the start of the
	// literals not yet written (Snappy's literals are src's bytes, so only
	// their length is read); a pending match (mOff, mAt, mLen) is held so
	// that Snappy's copies of at most 64 bytes, which it writes one after
	// another for a long match, become one LZ4 match.
	var d, lit, mOff, mAt, mLen int
	for len(snap) > 0 {
		tag := snap[0]
		var length, offset int
		switch tag & 3 {
		case 0: // literal
			m := int(tag >> 2)
			h := 1
			if m >= 60 {
				h += m - 59
				if len(snap) < h {
					return out, false
				}
				m = 0
				for i := h - 1; i >= 1; i-- {
					m = m<<8 | int(snap[i])
				}
			}
			length = m + 1
			if len(snap) < h+length || d+length > len(src) {
				return out, false
			}
			snap = snap[h+length:]
			d += length
			continue
		case 1:
			if len(snap) < 2 {
				return out, false
			}
			length, offset = 4+int(tag>>2&7), int(tag&0xe0)<<3|int(snap[1])
			snap = snap[2:]
		case 2:
			if len(snap) < 3 {
				return out, false
			}
			length, offset = 1+int(tag>>2), int(binary.LittleEndian.Uint16(snap[1:]))
			snap = snap[3:]
		default:
			if len(snap) < 5 {
				return out, false
			}
			length, offset = 1+int(tag>>2), int(binary.LittleEndian.Uint32(snap[1:]))
			snap = snap[5:]
		}
		if offset == 0 || offset > d || offset > 0xffff || d+length > len(src) {
			return out, false
		}
		if mLen > 0 && offset == mOff && d == mAt+mLen {
			mLen += length // Snappy's next piece of one long match
			d += length
			continue
		}
		if mLen > 0 {
			out, lit = appendLZ4Match(out, src, lit, mOff, mAt, mLen)
			if len(out) >= limit {
				return out, false
			}
		}
		mOff, mAt, mLen = offset, d, length
		d += length
	}
	if d != len(src) {
		return out, false
	}
	if mLen > 0 {
		out, lit = appendLZ4Match(out, src, lit, mOff, mAt, mLen)
	}
	out = appendLZ4Sequence(out, src[lit:], 0, 0)
	return out, len(out) < limit
}

// appendLZ4Match appends the sequence of the literals from lit and the
// match of mLen bytes at mAt, and returns where the literals now start. A
// match too close to the block's end is shortened, or left to the
// literals; so is one shorter than LZ4's minimum of 4 bytes.
func appendLZ4Match(out, src []byte, lit, mOff, mAt, mLen int) ([]byte, int) {
	if mAt > len(src)-lz4MatchLimit {
		return out, lit
	}
	mLen = min(mLen, len(src)-lz4LastLiterals-mAt)
	if mLen < 4 {
		return out, lit
	}
	return appendLZ4Sequence(out, src[lit:mAt], mOff, mLen), mAt + mLen
}

// appendLZ4Sequence appends one LZ4 sequence: literals, then a match of
// mLen bytes at offset back; mLen 0 is the block's last sequence, literals
// only.
func appendLZ4Sequence(out, literals []byte, offset, mLen int) []byte {
	ll := len(literals)
	ml := mLen - 4
	if ll < 15 && ml >= 0 && ml < 15 {
		out = append(out, byte(ll<<4|ml))
		out = append(out, literals...)
		return append(out, byte(offset), byte(offset>>8))
	}
	if mLen == 0 {
		ml = 0
	}
	out = append(out, byte(min(ll, 15)<<4|min(ml, 15)))
	if ll >= 15 {
		out = appendLZ4Length(out, ll-15)
	}
	out = append(out, literals...)
	if mLen == 0 {
		return out
	}
	out = append(out, byte(offset), byte(offset>>8))
	if ml >= 15 {
		out = appendLZ4Length(out, ml-15)
	}
	return out
}

func appendLZ4Length(out []byte, n int) []byte {
	for n >= 255 {
		out = append(out, 255)
		n -= 255
	}
	return append(out, byte(n))
}
