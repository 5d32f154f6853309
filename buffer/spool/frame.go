package spool

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"time"

	"github.com/ferryhq/ferry/record"
)

// Segment and frame layout (see the package doc). A segment written by this
// version starts with a 32-byte header that records the frame limit in force
// when it was written and the secret its frames are sealed with; older
// segments (FRYSPL01, 8-byte header and frames) are still read, without
// resynchronisation after damage.
const (
	segMagicV1 = "FRYSPL01"
	segMagic   = "FRYSPL02"
	// segHeader is where a current segment's first frame starts.
	segHeader   = int64(32)
	segHeaderV1 = int64(len(segMagicV1))
	frameHeader = 12
	// frameHeaderV1 is the old frame header: length and CRC only.
	frameHeaderV1 = 8
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func crc32c(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// segFormat is how one segment's frames are laid out and checked. tag and
// seed are random per segment and never leave the spool directory: a frame
// is valid only if it carries the tag and its CRC32C, started from seed,
// matches. Client bytes inside a record cannot carry either, so a reader
// resynchronising after damage can never take a client's value for a frame
// (a record the client never sent, to a topic it was not allowed). The tag
// also makes a resync cheap: a 4-byte compare rejects almost every position
// before any checksum is computed, so damage cannot be turned into a
// quadratic scan. Because each segment draws its own, the frames a
// recycled segment file still holds from its previous use never check
// under its new header.
type segFormat struct {
	v1       bool
	maxFrame int    // the largest payload when the segment was written
	tag      uint32 // in every frame header
	seed     uint32 // CRC32C state that every frame's checksum starts from
	secret   [8]byte
	// recycled: the file was an earlier segment's, overwritten in place;
	// past its last frame it may hold that segment's old bytes (stale, not
	// damage).
	recycled bool
}

// segRecycled is the header's flags bit for a recycled file.
const segRecycled = 1

func (f *segFormat) hdrLen() int {
	if f.v1 {
		return frameHeaderV1
	}
	return frameHeader
}

func (f *segFormat) dataStart() int64 {
	if f.v1 {
		return segHeaderV1
	}
	return segHeader
}

// newSegFormat draws a fresh secret for one new segment.
func newSegFormat(maxFrame int) (*segFormat, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	f := &segFormat{maxFrame: maxFrame, tag: binary.LittleEndian.Uint32(b[:4])}
	f.seed = crc32.Update(0, castagnoli, b[:])
	f.secret = b
	return f, nil
}

// header is the segment header: magic | u32 max frame | u32 flags |
// 8-byte secret | u32 reserved | u32 CRC32C of the 28 bytes before it.
// Readers before recycling ignore the flags.
func (f *segFormat) header() []byte {
	h := make([]byte, segHeader)
	copy(h, segMagic)
	binary.LittleEndian.PutUint32(h[8:], uint32(f.maxFrame))
	if f.recycled {
		binary.LittleEndian.PutUint32(h[12:], segRecycled)
	}
	copy(h[16:24], f.secret[:])
	binary.LittleEndian.PutUint32(h[28:], crc32c(h[:28]))
	return h
}

// parseSegHeader reads a segment header (of either version); h holds at
// least segHeader bytes or the whole file if shorter.
func parseSegHeader(h []byte) (*segFormat, error) {
	switch {
	case len(h) >= len(segMagicV1) && string(h[:len(segMagicV1)]) == segMagicV1:
		return &segFormat{v1: true}, nil
	case len(h) < int(segHeader) || string(h[:len(segMagic)]) != segMagic:
		return nil, errors.New("not a spool segment (bad magic or too short)")
	case crc32c(h[:28]) != binary.LittleEndian.Uint32(h[28:]):
		return nil, errors.New("segment header checksum mismatch")
	}
	f := &segFormat{maxFrame: int(binary.LittleEndian.Uint32(h[8:])),
		recycled: binary.LittleEndian.Uint32(h[12:])&segRecycled != 0}
	copy(f.secret[:], h[16:24])
	f.tag = binary.LittleEndian.Uint32(h[16:])
	f.seed = crc32.Update(0, castagnoli, h[16:24])
	if f.maxFrame <= 0 {
		return nil, errors.New("segment header records no frame limit")
	}
	return f, nil
}

// appendFrame appends r as one frame sealed for format f.
func appendFrame(dst []byte, r *record.Record, f *segFormat) []byte {
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
	var ts int64
	if !r.Timestamp.IsZero() {
		ts = r.Timestamp.UnixNano()
	}
	dst = binary.LittleEndian.AppendUint64(dst, uint64(ts))
	dst = binary.AppendUvarint(dst, uint64(len(r.Topic)))
	dst = append(dst, r.Topic...)
	if r.Key == nil {
		dst = append(dst, 0)
	} else {
		dst = binary.AppendUvarint(dst, uint64(len(r.Key))+1)
		dst = append(dst, r.Key...)
	}
	dst = binary.AppendUvarint(dst, uint64(len(r.Value)))
	dst = append(dst, r.Value...)
	dst = binary.AppendUvarint(dst, uint64(len(r.Headers)))
	for i := range r.Headers {
		h := &r.Headers[i]
		dst = binary.AppendUvarint(dst, uint64(len(h.Key)))
		dst = append(dst, h.Key...)
		dst = binary.AppendUvarint(dst, uint64(len(h.Value)))
		dst = append(dst, h.Value...)
	}
	// A partition the client chose trails the record; frames without one
	// are byte for byte what earlier versions wrote.
	if p, ok := r.Partition(); ok {
		dst = binary.AppendUvarint(dst, uint64(p)+1)
	}
	payload := dst[start+frameHeader:]
	binary.LittleEndian.PutUint32(dst[start:], uint32(len(payload)))
	binary.LittleEndian.PutUint32(dst[start+4:], f.tag)
	binary.LittleEndian.PutUint32(dst[start+8:], crc32.Update(f.seed, castagnoli, payload))
	return dst
}

// reseal seals again, for format f, the frames in buf (whole frames, as
// Consume encodes them): a batch encoded for one segment is written to the
// next when a roll comes in between.
func reseal(buf []byte, f *segFormat) {
	for i := 0; i+frameHeader <= len(buf); {
		n := int(binary.LittleEndian.Uint32(buf[i:]))
		binary.LittleEndian.PutUint32(buf[i+4:], f.tag)
		binary.LittleEndian.PutUint32(buf[i+8:], crc32.Update(f.seed, castagnoli, buf[i+frameHeader:i+frameHeader+n]))
		i += frameHeader + n
	}
}

var errPayload = errors.New("spool: malformed record in a frame with a valid checksum")

// decoder turns payloads into records that reference the payload bytes.
// It interns the topic and header keys (consecutive records nearly always
// share them: every OTLP record carries ferry.signal and ferry.encoding),
// and carves the records' headers out of one block for many records, so
// a record costs no allocation of its own (three before: about 2% of the
// agent's CPU in a profile at 150k spans/s in spool mode, with the
// collector's share).
type decoder struct {
	topic string
	keys  []string        // at most maxKeys
	slab  []record.Header // the rest of the current block; its records keep it alive
}

const (
	maxKeys   = 8
	slabBlock = 256
)

// key is b as a string, interned.
func (d *decoder) key(b []byte) string {
	for _, k := range d.keys {
		if string(b) == k {
			return k
		}
	}
	k := string(b)
	if len(d.keys) < maxKeys {
		d.keys = append(d.keys, k)
	}
	return k
}

// decode decodes payload p into r. prev, if not nil, is the record decoded
// just before r into the same chunk: when r's headers are the same as its
// (as every record of one OTLP or NDJSON request has), r shares prev's
// headers instead of taking slab memory of its own. Nothing changes a
// record's headers in place (a slab's slices are full, so an append
// copies), and records of one chunk live and go together.
func (d *decoder) decode(p []byte, r, prev *record.Record) error {
	if len(p) < 8 {
		return errPayload
	}
	if ts := int64(binary.LittleEndian.Uint64(p)); ts != 0 {
		r.Timestamp = time.Unix(0, ts)
	} else {
		r.Timestamp = time.Time{}
	}
	p = p[8:]
	field := func() ([]byte, bool) {
		n, k := binary.Uvarint(p)
		if k <= 0 || n > uint64(len(p)-k) {
			return nil, false
		}
		f := p[k : k+int(n) : k+int(n)]
		p = p[k+int(n):]
		return f, true
	}
	t, ok := field()
	if !ok {
		return errPayload
	}
	if string(t) != d.topic {
		d.topic = string(t)
	}
	r.Topic = d.topic
	n, k := binary.Uvarint(p)
	if k <= 0 || n > uint64(len(p)-k)+1 {
		return errPayload
	}
	p = p[k:]
	if n == 0 {
		r.Key = nil
	} else {
		r.Key = p[: n-1 : n-1]
		p = p[n-1:]
	}
	if r.Value, ok = field(); !ok {
		return errPayload
	}
	nh, k := binary.Uvarint(p)
	if k <= 0 || nh > uint64(len(p)) {
		return errPayload
	}
	p = p[k:]
	r.Headers = nil
	if nh > 0 && prev != nil && len(prev.Headers) == int(nh) {
		q, same := p, true
		for i := 0; i < len(prev.Headers) && same; i++ {
			hk, ok1 := field()
			hv, ok2 := field()
			if !ok1 || !ok2 {
				return errPayload
			}
			same = string(hk) == prev.Headers[i].Key && bytes.Equal(hv, prev.Headers[i].Value)
		}
		if same {
			r.Headers, nh = prev.Headers, 0
		} else {
			p = q // read them again, into r's own
		}
	}
	if nh > 0 {
		// nh is at most the payload's length, which is within a frame.
		if int(nh) > cap(d.slab)-len(d.slab) {
			d.slab = make([]record.Header, 0, max(slabBlock, int(nh)))
		}
		at := len(d.slab)
		d.slab = d.slab[:at+int(nh)]
		hs := d.slab[at : at+int(nh) : at+int(nh)] // appending to it never reaches a neighbour's
		for i := range hs {
			hk, ok1 := field()
			hv, ok2 := field()
			if !ok1 || !ok2 {
				return errPayload
			}
			hs[i] = record.Header{Key: d.key(hk), Value: hv}
		}
		r.Headers = hs
	}
	r.SetPartition(-1)
	if len(p) != 0 {
		part, k := binary.Uvarint(p)
		if k != len(p) || part == 0 || part > 1<<31-1 {
			return errPayload
		}
		r.SetPartition(int32(part - 1))
	}
	return nil
}

// scan walks the frames in buf, whose first byte is at a frame boundary or
// inside damage. fn gets each frame whose tag and checksum match, with its
// offset in buf; returning false stops the scan before that frame. In a
// current segment, bytes that do not start a valid frame are skipped one at
// a time (so a valid frame after damage is found again) and counted in
// skipped; regions counts the damaged stretches. In an old (v1) segment,
// whose frames carry no secret, damage ends the segment: everything from it
// on is counted as skipped, since resynchronising there could take a
// client's bytes for a frame.
//
// atEnd says that buf ends where the data ends: a frame running past it is
// damage. Otherwise scan stops before an incomplete frame and reports in
// need how many bytes from stop the next read must hold.
func scan(buf []byte, atEnd bool, f *segFormat, fn func(off int, payload []byte) bool) (stop, need int, skipped, regions int64) {
	hl := f.hdrLen()
	i, bad := 0, false
	for i+hl <= len(buf) {
		n := int(binary.LittleEndian.Uint32(buf[i:]))
		if n > 0 && n <= f.maxFrame && (f.v1 || binary.LittleEndian.Uint32(buf[i+4:]) == f.tag) {
			end := i + hl + n
			if end > len(buf) && !atEnd {
				return i, hl + n, skipped, regions
			}
			if end <= len(buf) && f.check(buf[i+hl:end], buf[i+hl-4:]) {
				if !fn(i, buf[i+hl:end]) {
					return i, 0, skipped, regions
				}
				i, bad = end, false
				continue
			}
		}
		if !bad {
			regions++
			bad = true
		}
		if f.v1 {
			skipped += int64(len(buf) - i)
			return len(buf), 0, skipped, regions
		}
		skipped++
		i++
	}
	if i < len(buf) {
		if !atEnd {
			return i, hl, skipped, regions
		}
		if !bad {
			regions++
		}
		skipped += int64(len(buf) - i)
		i = len(buf)
	}
	return i, 0, skipped, regions
}

// check reports whether payload's checksum is the one stored in sum.
func (f *segFormat) check(payload, sum []byte) bool {
	want := binary.LittleEndian.Uint32(sum)
	if f.v1 {
		return crc32c(payload) == want
	}
	return crc32.Update(f.seed, castagnoli, payload) == want
}
