package filereceiver

// Reading: one read of a file becomes one span of lines, one batch.

import (
	"bytes"
	"io"
	"log/slog"
	"strconv"
	"time"
	"unsafe"

	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/record"
)

// The headers every record carries: ferry's own namespace
// (routing.ReservedHeaderPrefix), which clients cannot forge.
const (
	HeaderPath      = "ferry.file.path"
	HeaderOffset    = "ferry.file.offset"
	HeaderContinued = "ferry.file.continued"
)

var trueValue = []byte("true")

// lineRef is one record's value in a read buffer, [start, end), without
// its line end; cont: a piece of a longer line, more of it follows.
type lineRef struct {
	start, end int
	cont       bool
}

// frame finds the records of buf: each line ending in "\n" (a "\r" before
// it dropped; empty lines skipped), pieces of maxLine bytes of a longer
// line, and, when final (the file is let go), the unterminated rest. It
// stops after maxLines records. consumed is where the next read starts;
// inLong says the last record was a piece of a line that goes on; split
// counts the lines that began to be split here.
func frame(buf []byte, maxLine, maxLines int, final, inLong bool, out []lineRef) (lines []lineRef, consumed int, stillLong bool, split int) {
	pos := 0
	piece := func() {
		out = append(out, lineRef{pos, pos + maxLine, true})
		if !inLong {
			split++
		}
		inLong = true
		pos += maxLine
	}
	for len(out) < maxLines && pos < len(buf) {
		i := bytes.IndexByte(buf[pos:], '\n')
		if i < 0 {
			switch rest := len(buf) - pos; {
			case rest > maxLine+1:
				// Longer than maxLine even without a "\r\n" to come.
				piece()
				continue
			case final:
				end := len(buf)
				if buf[end-1] == '\r' {
					end--
				}
				for end-pos > maxLine && len(out) < maxLines {
					piece()
				}
				if end-pos > maxLine {
					break // out of records: the rest next time
				}
				if end > pos {
					out = append(out, lineRef{pos, end, false})
				}
				inLong = false
				pos = len(buf)
			}
			break
		}
		nl := pos + i
		end := nl
		if end > pos && buf[end-1] == '\r' {
			end--
		}
		for end-pos > maxLine && len(out) < maxLines {
			piece()
		}
		if end-pos > maxLine {
			break // out of records mid-line: the rest next time
		}
		if end > pos {
			out = append(out, lineRef{pos, end, false})
		}
		inLong = false
		pos = nl + 1
	}
	return out, pos, inLong, split
}

// read reads f from readOff into one span (nil when nothing complete was
// there: a partial last line waits for the file to grow, or for final; a
// multiline group that may still grow waits for its next line, or for
// flush or final).
func (r *Receiver) read(f *file, now time.Time, final, flush bool) *span {
	maxLine := int(r.cfg.MaxLineBytes)
	want := min(int64(r.chunk), f.size-f.readOff)
	if f.lineHint > 0 && r.ml == nil {
		// As much as maxBatchRecords lines like the last ones take, but
		// always room for a longest line.
		want = min(want, int64(max(f.lineHint*maxBatchRecords, maxLine+2, 64<<10)))
	}
	if want <= 0 {
		return nil
	}
	buf := make([]byte, want)
	var n int
	var err error
	if f.gz {
		n, err = f.gzReadAt(buf, f.readOff)
	} else {
		n, err = f.f.ReadAt(buf, f.readOff)
	}
	if err != nil && err != io.EOF {
		r.m.Error("read_error")
		r.log.Log(slog.LevelError, "read", "files: read failed; tried again at the next poll", "path", f.path, "err", err)
		f.retryAt = now.Add(r.cfg.PollInterval)
		return nil
	}
	buf = buf[:n]
	if int64(n) < want {
		f.size = f.readOff + int64(n) // shorter than the poll saw: the next poll says why
	}
	if r.cfg.ReadRateBytes > 0 {
		r.tokens -= float64(n)
	}
	atEnd := f.readOff+int64(n) >= f.size
	lines, consumed, inLong, split := frame(buf, maxLine, maxBatchRecords, final && atEnd, f.inLong, r.lines[:0])
	r.lines = lines
	if split > 0 {
		r.m.Errors("line_too_long").Add(float64(split))
	}
	if len(lines) == maxBatchRecords {
		f.examined = f.readOff + int64(consumed)
	} else {
		f.examined = f.readOff + int64(n)
	}
	if r.ml != nil {
		stuck := len(lines) == maxBatchRecords || n == r.chunk
		var held bool
		var cut int
		lines, consumed, held, cut = r.ml.group(buf, lines, consumed, maxLine, f.inLong, (final || flush) && atEnd, stuck)
		if cut > 0 {
			r.m.Errors("multiline_cut").Add(float64(cut))
		}
		if f.held = held; held {
			// Lines after a group are lines of their own, never a piece.
			inLong = false
			f.heldAt = now
		}
	}
	if consumed == 0 {
		return nil
	}
	s := &span{f: f, start: f.readOff, end: f.readOff + int64(consumed)}
	s.doneFn = func(err error) { r.complete(s, err) }
	s.b.OnFailure = func(_ int, err error) {
		s.sawFailure.Store(true)
		if permanent(err) {
			reason := consumer.Reason(err)
			r.m.Error(reason)
			r.drop(reason, 1, err, f)
			return
		}
		s.retry.Store(true)
	}
	f.readOff += int64(consumed)
	f.inLong = inLong
	if len(lines) > 0 && r.ml == nil {
		f.lineHint = max(consumed/len(lines), 1)
	}
	if len(lines) > 0 {
		r.build(f, s, buf, lines, now)
	}
	r.mu.Lock()
	s.gen = f.gen
	r.inflight += s.mem
	f.inflight += s.mem
	r.fm.inflight.Set(float64(r.inflight))
	r.mu.Unlock()
	return s
}

// build makes the span's records: slices of buf (or, for latin-1, of its
// UTF-8 conversion), each with the path and its offset as headers. The
// offsets' digits and the headers are two allocations per batch, not per
// record.
func (r *Receiver) build(f *file, s *span, buf []byte, lines []lineRef, now time.Time) {
	base := s.start // the offset of buf[0]
	latin := r.cfg.Encoding == "latin-1"
	var data []byte
	dpos := 0
	if latin {
		data = latin1(buf, lines)
	}
	digits := len(strconv.AppendInt(nil, s.end, 10))
	arena := make([]byte, 0, len(lines)*digits)
	ncont := 0
	for _, l := range lines {
		if l.cont {
			ncont++
		}
	}
	hdrs := make([]record.Header, 0, (2+len(f.extra))*len(lines)+ncont)
	recs := make([]record.Record, len(lines))
	copied := 0
	for i, l := range lines {
		a := len(arena)
		arena = strconv.AppendInt(arena, base+int64(l.start), 10)
		h := len(hdrs)
		hdrs = append(hdrs, record.Header{Key: HeaderPath, Value: f.pathV}, record.Header{Key: HeaderOffset, Value: arena[a:len(arena):len(arena)]})
		if l.cont {
			hdrs = append(hdrs, record.Header{Key: HeaderContinued, Value: trueValue})
		}
		hdrs = append(hdrs, f.extra...)
		val := buf[l.start:l.end:l.end]
		if latin {
			// latin1 wrote the values one after another: take this one.
			n := utf8Len(buf[l.start:l.end])
			val = data[dpos : dpos+n : dpos+n]
			dpos += n
		}
		key, ts := f.key, now
		if r.json != nil && !l.cont {
			key, ts = r.fromJSON(val, key, ts)
		}
		recs[i] = record.Record{Topic: f.topic, Key: key, Value: val, Headers: hdrs[h:len(hdrs):len(hdrs)], Timestamp: ts}
		copied += len(f.key) + record.HeaderBytes(recs[i].Headers)
		s.bytes += len(key) + len(val)
	}
	s.b.Records = recs
	bufs := cap(arena) + cap(hdrs)*int(unsafe.Sizeof(record.Header{}))
	if latin {
		bufs += cap(data)
	} else {
		bufs += cap(buf)
	}
	s.b.Charge(bufs, copied)
	s.mem = s.b.MemBytes
}

// utf8Len is the length of latin-1 bytes p in UTF-8.
func utf8Len(p []byte) int {
	n := len(p)
	for _, c := range p {
		if c >= 0x80 {
			n++
		}
	}
	return n
}

func utf8Total(buf []byte, lines []lineRef) int {
	n := 0
	for _, l := range lines {
		n += utf8Len(buf[l.start:l.end])
	}
	return n
}

// latin1 converts the lines' values to UTF-8, one after another in one
// buffer of exactly their size.
func latin1(buf []byte, lines []lineRef) []byte {
	out := make([]byte, 0, utf8Total(buf, lines))
	for _, l := range lines {
		for _, c := range buf[l.start:l.end] {
			if c < 0x80 {
				out = append(out, c)
			} else {
				out = append(out, 0xC0|c>>6, 0x80|c&0x3F)
			}
		}
	}
	return out
}

// fromJSON is a JSON line's key and timestamp (json:), or key and ts as
// given when the line or its field cannot be read (counted).
func (r *Receiver) fromJSON(val, key []byte, ts time.Time) ([]byte, time.Time) {
	kv, tv, ok := jsonFields(val, r.json.KeyField, r.json.TimestampField)
	if !ok {
		r.m.Error("invalid_json")
		return key, ts
	}
	if r.json.KeyField != "" {
		if kv != nil {
			key = keyBytes(kv)
		} else {
			r.m.Error("invalid_json")
		}
	}
	if r.json.TimestampField != "" {
		if t, ok := parseTimestamp(tv, r.json.TimestampFormat); tv != nil && ok {
			ts = t
		} else {
			r.m.Error("invalid_timestamp")
		}
	}
	return key, ts
}
