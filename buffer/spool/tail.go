package spool

// The tail: what was just appended, handed to the reader in memory.
//
// While the reader keeps up, it would read back from the page cache what
// the appender wrote a moment before: a system call, a copy and a checksum
// over every byte, about 5% of the agent's CPU in spool mode under load.
// Instead the appender keeps each append's buffer (the frames exactly as
// written) on a short list, and the reader sends records straight from
// those buffers: no read, no copy, no checksum (the bytes never left this
// process). The list only holds appends contiguous from where the reader
// will read next (across a roll too), at most 8 MiB (a quarter of the
// read-ahead if that is less), and its buffers are reserved from the
// memory budget as they join it, under a ceiling of the read-ahead plus
// that much: under a closed-loop load the reader's chunks wait for Kafka
// with the whole read-ahead taken, and a list held to the read-ahead alone
// served only an eighth of the bytes from memory. When the reader falls
// behind by more, or the budget is taken,
// the appender stops adding, the reader reads from disk as before, and the
// list starts again once the reader is back at the end. The disk copy is
// written either way and is what recovery reads.

import (
	"encoding/binary"
	"math"

	"github.com/ferryhq/ferry/receipt"
)

type tailBuf struct {
	at, end pos
	buf     []byte
	n       int // records
}

// appendTail is the appender's list; mu guards it.
type appendTail struct {
	tail []tailBuf
	// tailBytes is the memory the list holds (its buffers' capacity),
	// reserved from the budget; at most tailMax.
	tailBytes int64
	tailMax   int64
	// tailArmed: appends contiguous from tailEnd are kept. The reader arms
	// it when the list is empty and it is reading the active segment; an
	// append that is not contiguous or does not fit disarms it.
	tailArmed bool
	tailEnd   pos
}

// keepTail keeps buf, written at at with n records, for the reader if it
// is contiguous with the list; false if the caller keeps buf. Called with
// s.mu held, after the write.
func (s *Spool) keepTail(buf []byte, at pos, n int) bool {
	if !s.tailArmed {
		return false
	}
	// A roll seals the segment where the list ends and starts the next:
	// still contiguous for the reader.
	next := at.seg == s.tailEnd.seg+1 && at.off == segHeader && s.segs[s.tailEnd.seg] == s.tailEnd.off
	if at != s.tailEnd && !next || s.tailBytes+int64(cap(buf)) > s.tailMax ||
		!s.budget.Reserve(int64(cap(buf)), s.ceiling+s.tailMax) {
		s.tailArmed = false
		return false
	}
	end := pos{at.seg, at.off + int64(len(buf))}
	s.tail = append(s.tail, tailBuf{at: at, end: end, buf: buf, n: n})
	s.tailEnd, s.tailBytes = end, s.tailBytes+int64(cap(buf))
	return true
}

// dropPassedTail gives back the buffers the reader has read past from disk.
// Called with s.mu held.
func (s *Spool) dropPassedTail() { s.dropTailBefore(s.rpos) }

// dropTailBefore gives back the buffers that end at or before p. Called
// with s.mu held.
func (s *Spool) dropTailBefore(p pos) {
	i := 0
	for i < len(s.tail) && !p.less(s.tail[i].end) {
		s.tailBytes -= int64(cap(s.tail[i].buf))
		s.budget.Release(int64(cap(s.tail[i].buf)))
		s.putBuf(s.tail[i].buf)
		i++
	}
	if i > 0 {
		clear(s.tail[:i])
		s.tail = append(s.tail[:0], s.tail[i:]...)
	}
}

// dropTail gives back every kept buffer (the reader has stopped).
func (s *Spool) dropTail() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tailArmed = false
	s.dropTailBefore(pos{math.MaxUint64, 0})
}

// armTail starts keeping appends if the list is empty and the reader is in
// the active segment. Called by the reader with s.mu held.
func (s *Spool) armTail(sealed bool) {
	s.dropPassedTail()
	if !sealed && len(s.tail) == 0 && !s.tailArmed {
		s.tailArmed, s.tailEnd = true, pos{s.wseg, s.woff}
	}
}

// takeTail takes the kept appends that start at the read position (all of
// them that are contiguous, up to maxRecs records, at least one append),
// with the memory they hold (already reserved); none if the next bytes are
// not in memory.
func (s *Spool) takeTail(dst [][]byte, ats []pos, maxRecs int) (bufs [][]byte, bufAt []pos, end pos, n int, held int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dropPassedTail()
	if len(s.tail) == 0 || s.tail[0].at != s.rpos {
		return dst, ats, pos{}, 0, 0
	}
	i := 0
	for ; i < len(s.tail); i++ {
		t := &s.tail[i]
		if i > 0 && n+t.n > maxRecs {
			break
		}
		dst = append(dst, t.buf)
		ats = append(ats, t.at)
		held += int64(cap(t.buf))
		n += t.n
		end = t.end
	}
	s.tailBytes -= held
	clear(s.tail[:i])
	s.tail = append(s.tail[:0], s.tail[i:]...)
	return dst, ats, end, n, held
}

// framesOf decodes the records of appended buffers into c's batch: whole
// frames the appender encoded, so no checksum is needed. It returns the
// bytes of frames that did not decode (never expected; counted as damage).
func (s *Spool) framesOf(c *chunk) (bad, badFrames int64) {
	for j, buf := range c.bufs {
		for i := 0; i+frameHeader <= len(buf); {
			n := int(binary.LittleEndian.Uint32(buf[i:]))
			if !s.decodeInto(c, buf[i+frameHeader:i+frameHeader+n]) {
				bad += int64(frameHeader + n)
				badFrames++
			} else if c.track {
				c.at = append(c.at, receipt.Pos{Seg: c.bufAt[j].seg, Off: c.bufAt[j].off + int64(i)})
			}
			i += frameHeader + n
		}
	}
	return bad, badFrames
}
