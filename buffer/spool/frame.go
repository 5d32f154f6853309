package spool

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"time"

	"github.com/ferryhq/ferry/record"
)

const (
	segMagic    = "FRYSPL01"
	segHeader   = int64(len(segMagic))
	frameHeader = 8
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// appendFrame appends r as one frame.
func appendFrame(dst []byte, r *record.Record) []byte {
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0, 0, 0, 0, 0)
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
	payload := dst[start+frameHeader:]
	binary.LittleEndian.PutUint32(dst[start:], uint32(len(payload)))
	binary.LittleEndian.PutUint32(dst[start+4:], crc32.Checksum(payload, castagnoli))
	return dst
}

var errPayload = errors.New("spool: malformed record in a frame with a valid checksum")

// decoder turns payloads into records that reference the payload bytes.
// It interns the topic: consecutive records nearly always share one, and a
// string per record would be the reader's only allocation.
type decoder struct{ topic string }

func (d *decoder) decode(p []byte, r *record.Record) error {
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
	if nh > 0 {
		r.Headers = make([]record.Header, nh)
		for i := range r.Headers {
			hk, ok1 := field()
			hv, ok2 := field()
			if !ok1 || !ok2 {
				return errPayload
			}
			r.Headers[i] = record.Header{Key: string(hk), Value: hv}
		}
	}
	if len(p) != 0 {
		return errPayload
	}
	return nil
}

// scan walks the frames in buf, whose first byte is at a frame boundary or
// inside damage. fn gets each frame whose checksum matches, with its offset
// in buf; returning false stops the scan before that frame. Bytes that do
// not start a valid frame are skipped one at a time (so a valid frame after
// damage is found again) and counted in skipped; regions counts the damaged
// stretches.
//
// atEnd says that buf ends where the data ends: a frame running past it is
// damage. Otherwise scan stops before an incomplete frame and reports in
// need how many bytes from stop the next read must hold.
func scan(buf []byte, atEnd bool, maxFrame int, fn func(off int, payload []byte) bool) (stop, need int, skipped, regions int64) {
	i, bad := 0, false
	for i+frameHeader <= len(buf) {
		n := int(binary.LittleEndian.Uint32(buf[i:]))
		if n > 0 && n <= maxFrame {
			end := i + frameHeader + n
			if end > len(buf) && !atEnd {
				return i, frameHeader + n, skipped, regions
			}
			if end <= len(buf) && crc32.Checksum(buf[i+frameHeader:end], castagnoli) == binary.LittleEndian.Uint32(buf[i+4:]) {
				if !fn(i, buf[i+frameHeader:end]) {
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
		skipped++
		i++
	}
	if i < len(buf) {
		if !atEnd {
			return i, frameHeader, skipped, regions
		}
		if !bad {
			regions++
		}
		skipped += int64(len(buf) - i)
		i = len(buf)
	}
	return i, 0, skipped, regions
}
