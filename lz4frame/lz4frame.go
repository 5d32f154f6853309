// Package lz4frame writes LZ4 frames faster than the pure-Go block search
// franz-go and pierrec/lz4 use (BenchmarkLZ4: 2.5x on OTLP text logs, 3-5x
// on batches of incompressible bodies, output within a few per cent of
// their size). ferry writes every LZ4 byte it sends with it: the record
// batches to Kafka (exporter/kafkaexporter) and the local protocol's
// compressed frames (protocol, the Go client). On an agent forwarding
// logs, compression is the largest single cost per record.
//
// The output is plain LZ4 that every reader takes: a standard LZ4 frame of
// independent 64 KiB blocks (what Kafka's own Java producer writes), no
// checksums, ended by the end mark. A block that would not be smaller than
// its input is stored (uncompressed) instead, so the output is at worst the
// input plus the framing (MaxLen).
package lz4frame

import (
	"encoding/binary"
	"math/bits"
	"sync"
)

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

// MaxLen is the most an LZ4 frame of n bytes takes: the header, each
// block's size and its worst case (stored), the end mark.
func MaxLen(n int) int { return 7 + n + 4*(n/lz4BlockSize+1) + 4 }

// Append appends src as an LZ4 frame to out.
func Append(out, src []byte) []byte {
	out = append(out, lz4Magic[:]...)
	out = append(out, lz4FLG, lz4BD, lz4HC)
	t := lz4Tables.Get().(*lz4Table)
	defer lz4Tables.Put(t)
	for len(src) > 0 {
		chunk := src[:min(len(src), lz4BlockSize)]
		src = src[len(chunk):]
		at := len(out)
		// Sequences are written in place below limit, the stored block's
		// room, so no write needs to grow out.
		limit := at + 4 + len(chunk)
		if cap(out) < limit {
			out = append(out[:at:at], make([]byte, limit-at)...)
		}
		if o := putLZ4Block(t, out[:limit], at+4, chunk); o > 0 {
			out = out[:o]
			binary.LittleEndian.PutUint32(out[at:], uint32(o-at-4))
			continue
		}
		out = append(out[:at], 0, 0, 0, 0)
		out = append(out, chunk...)
		binary.LittleEndian.PutUint32(out[at:], uint32(len(chunk))|lz4Stored)
	}
	return append(out, 0, 0, 0, 0)
}

// lz4Table maps a hash of 6 bytes to the last position in the block where
// they were seen: positions in a block of at most 64 KiB fit 16 bits, so
// the table is 32 KiB, cleared once per block.
type lz4Table [1 << lz4TableBits]uint16

const lz4TableBits = 14

// lz4Tables holds the tables between frames. On the goroutine's stack, a
// table would grow the stack of every goroutine that compresses: franz-go
// writes each run of produce requests from a new goroutine, so each run
// paid a stack growth and the copy of its frames (1.6 % of an agent's CPU
// in a profile of OTLP traces at 4 requests in flight).
var lz4Tables = sync.Pool{New: func() any { return new(lz4Table) }}

// lz4Hash hashes the 6 low bytes of u, as Snappy's search does
// (multiplicative hashing by a 48-bit prime).
func lz4Hash(u uint64) uint32 {
	const prime6 = 227718039650203
	return uint32(((u << 16) * prime6) >> (64 - lz4TableBits))
}

// putLZ4Block writes src, at most lz4BlockSize bytes, as one LZ4 block at
// buf[o:], and returns where it ends, or -1 if it would reach len(buf) (the
// room of a stored block: storing src is then no larger).
//
// The search is Snappy's fast one (klauspost/compress's s2 has it in Go and
// assembly): three positions probed per step through a table of 6-byte
// hashes, the previous match's offset tried first, and a step that grows
// with the length of the literal run, so incompressible input is crossed
// quickly. Matches are written straight as LZ4 sequences: no Snappy block
// in between to convert, which cost a third of the time.
//
// The loads' bounds (lz4_load.go), with n = len(src) at least 15 past the
// first check: every position probed, matched or kept in the table is at
// most sLimit+2 = n-12, so a 4-byte load at one ends by n-8; cv is loaded
// at s <= sLimit+1, ending by n-5; the repeat probe s+1-repeat is at least
// 1, since repeat, the last match's offset, is at most its start, before
// s; the extension loads at s and candidate < s only while s+8 <= mEnd;
// the literal words only while lit+16 <= n; and after a match, s is at
// least 5 and at most sLimit before the load at s-2.
//
// t is a table of any content: it is cleared here, before the search, so
// that every position in it is 0 or one of this block's, before s (the
// loads at candidates rely on it); a block too short to search skips that.
func putLZ4Block(t *lz4Table, buf []byte, o int, src []byte) int {
	n := len(src)
	// LZ4's rules for a block's end: the last match starts at least 12
	// bytes before it (mfLimit) and ends at least 5 before it (mEnd). The
	// search probes s, s+1 and s+2 from 8 bytes loaded at s.
	mfLimit, mEnd := n-lz4MatchLimit, n-lz4LastLiterals
	sLimit := mfLimit - 2
	if sLimit < 1 {
		return putLZ4Sequence(buf, src, o, 0, n, 0, 0)
	}
	*t = lz4Table{}
	lit, s, repeat := 0, 1, 1
	cv := load64(src, s)
	for {
		// Find a match of at least 4 bytes at s (backed over the literals
		// before it) from candidate.
		var candidate int
		for {
			next := s + (s-lit)>>6 + 4
			if next > sLimit {
				return lz4Remainder(buf, o, src, lit)
			}
			h0, h1 := lz4Hash(cv), lz4Hash(cv>>8)
			candidate = int(t[h0])
			c1 := int(t[h1])
			t[h0], t[h1] = uint16(s), uint16(s+1)
			h2 := lz4Hash(cv >> 16)
			if uint32(cv>>8) == load32(src, s+1-repeat) {
				candidate = s + 1 - repeat
				s++
				break
			}
			if uint32(cv) == load32(src, candidate) {
				break
			}
			candidate = int(t[h2])
			if uint32(cv>>8) == load32(src, c1) {
				t[h2] = uint16(s + 2)
				candidate = c1
				s++
				break
			}
			t[h2] = uint16(s + 2)
			if uint32(cv>>16) == load32(src, candidate) {
				s += 2
				break
			}
			cv = load64(src, next)
			s = next
		}
		for candidate > 0 && s > lit && src[candidate-1] == src[s-1] {
			candidate--
			s--
		}
		// Extend forward, up to mEnd, then write the literals and the match;
		// try again right after it before going back to the search.
		for {
			start, offset := s, s-candidate
			s, candidate = s+4, candidate+4
			for {
				if s+8 > mEnd {
					for s < mEnd && src[s] == src[candidate] {
						s, candidate = s+1, candidate+1
					}
					break
				}
				if diff := load64(src, s) ^ load64(src, candidate); diff != 0 {
					s += bits.TrailingZeros64(diff) >> 3
					break
				}
				s, candidate = s+8, candidate+8
			}
			// Most sequences: under 15 literals, copied as two 8-byte words
			// (the bytes past them are overwritten by what follows), and a
			// match length that fits the token and one byte, written
			// whether needed or not.
			if ll, ml := start-lit, s-start-4; ll < 15 && ml < 15+255 && o+20 <= len(buf) && lit+16 <= n {
				buf[o] = byte(ll<<4 | min(ml, 15))
				binary.LittleEndian.PutUint64(buf[o+1:], load64(src, lit))
				binary.LittleEndian.PutUint64(buf[o+9:], load64(src, lit+8))
				o += 1 + ll
				buf[o], buf[o+1], buf[o+2] = byte(offset), byte(offset>>8), byte(ml-15)
				o += 2
				if ml >= 15 {
					o++
				}
			} else if o = putLZ4Sequence(buf, src, o, lit, start, offset, s-start); o < 0 {
				return -1
			}
			lit, repeat = s, offset
			if s > sLimit {
				return lz4Remainder(buf, o, src, lit)
			}
			x := load64(src, s-2)
			h := lz4Hash(x >> 16)
			t[lz4Hash(x)] = uint16(s - 2)
			candidate = int(t[h])
			t[h] = uint16(s)
			if uint32(x>>16) != load32(src, candidate) {
				s++
				cv = load64(src, s)
				break
			}
		}
	}
}

// lz4Remainder writes src[lit:] as the block's last sequence, literals
// only; -1 if the block would not be smaller than storing src.
func lz4Remainder(buf []byte, o int, src []byte, lit int) int {
	if o = putLZ4Sequence(buf, src, o, lit, len(src), 0, 0); o < 0 || o >= len(buf) {
		return -1
	}
	return o
}

// putLZ4Sequence writes one LZ4 sequence at buf[o:]: the literals
// src[lit:end], then a match of mLen bytes at offset back; mLen 0 is the
// block's last sequence, literals only. It returns where the next one goes,
// or -1 if buf has no room for this one.
func putLZ4Sequence(buf, src []byte, o, lit, end, offset, mLen int) int {
	ll, ml := end-lit, mLen-4
	if mLen == 0 {
		ml = 0
	}
	// Most sequences: the literals are copied in 8-byte words, reading and
	// writing up to 7 bytes past them (what follows overwrites those), and
	// the room check bounds n/255 by n>>7, a shift instead of a division.
	if o+(ll>>7)+ll+(ml>>7)+14 <= len(buf) && lit+ll+8 <= len(src) {
		if ll < 15 {
			buf[o] = byte(ll<<4 | min(ml, 15))
			o++
		} else {
			buf[o] = byte(15<<4 | min(ml, 15))
			o = putLZ4Length(buf, o+1, ll-15)
		}
		for i := 0; i < ll; i += 8 {
			binary.LittleEndian.PutUint64(buf[o+i:], binary.LittleEndian.Uint64(src[lit+i:]))
		}
		o += ll
	} else {
		// The exact room: the token, the lengths' extra bytes, the
		// literals and the offset.
		if o+1+ll/255+1+ll+2+ml/255+1 > len(buf) {
			return -1
		}
		buf[o] = byte(min(ll, 15)<<4 | min(ml, 15))
		o++
		if ll >= 15 {
			o = putLZ4Length(buf, o, ll-15)
		}
		o += copy(buf[o:], src[lit:end])
	}
	if mLen == 0 {
		return o
	}
	buf[o], buf[o+1] = byte(offset), byte(offset>>8)
	o += 2
	if ml >= 15 {
		o = putLZ4Length(buf, o, ml-15)
	}
	return o
}

func putLZ4Length(buf []byte, o, n int) int {
	for ; n >= 255; n -= 255 {
		buf[o] = 255
		o++
	}
	buf[o] = byte(n)
	return o + 1
}
