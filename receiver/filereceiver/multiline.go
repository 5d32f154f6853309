package filereceiver

// Multiline: one record per group of lines (a stack trace and the line
// that threw it), for programs that log several lines per event.
//
// A group is a first line and the lines that belong to it: with
// start_pattern, every line up to the next line that matches it; with
// continue_pattern, every following line that matches it. Groups are cut
// out of one read, like lines, so a group is always whole in one span and
// a file's committed offset still lands between records: a group that
// may still grow (its end is the end of the read) is not sent; the next
// read starts at its first line. It is sent once a line that ends it is
// written, or when the file has not grown for flush_timeout (the program
// wrote its last event and is quiet), or when the file is let go. A group
// is cut (sent, with ferry.file.continued: "true", and counted as
// multiline_cut) when it reaches max_lines or max_line_bytes, or when one
// read cannot hold it and its next line (max_line_bytes + 4KiB, at least
// 260KiB): the rest follows as records of their own, nothing is lost.
// Lines longer than max_line_bytes are split as without multiline; their
// pieces are records of their own.

import (
	"regexp"
	"time"
)

// multiline groups lines; nil when neither pattern is set.
type multiline struct {
	start, cont *regexp.Regexp
	maxLines    int
	flush       time.Duration
}

func newMultiline(c Multiline) *multiline {
	if c.StartPattern == "" && c.ContinuePattern == "" {
		return nil
	}
	m := &multiline{maxLines: c.MaxLines, flush: c.FlushTimeout}
	if c.StartPattern != "" {
		m.start = regexp.MustCompile(c.StartPattern) // checked by Check
	} else {
		m.cont = regexp.MustCompile(c.ContinuePattern)
	}
	return m
}

// group joins frame's lines of buf into records, in place (out may be
// lines[:0]). inLong: the first line finishes a line split in the last
// read. flush: the last group is complete (the file is quiet or let go);
// stuck: the read could not have been longer, so a group that fills it is
// sent rather than waited for. It returns the records, where the next read
// starts (the first line of a group held back, else consumed), whether a
// group was held back, and the groups cut.
func (m *multiline) group(buf []byte, lines []lineRef, consumed, maxBytes int, inLong, flush, stuck bool) (recs []lineRef, next int, held bool, cut int) {
	out := lines[:0]
	var cur lineRef
	n := 0 // lines in cur; 0: none
	emit := func(cutHere bool) {
		// A cut group of one line is a whole line: the marker would read
		// as a piece of a long line (joined without a "\n").
		cur.cont = cutHere && n > 1
		if cutHere {
			cut++
		}
		out = append(out, cur)
		n = 0
	}
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if l.cont || inLong {
			// A piece of a long line, or its last piece: a record of its
			// own, as without multiline.
			if n > 0 {
				emit(false)
			}
			out = append(out, l)
			inLong = l.cont
			continue
		}
		if n > 0 {
			joins := m.cont != nil && m.cont.Match(buf[l.start:l.end]) ||
				m.start != nil && !m.start.Match(buf[l.start:l.end])
			switch {
			case !joins:
				emit(false)
			case n >= m.maxLines || l.end-cur.start > maxBytes:
				emit(true)
			default:
				cur.end = l.end
				n++
				continue
			}
		}
		cur = lineRef{start: l.start, end: l.end}
		n = 1
	}
	next = consumed
	if n > 0 {
		switch {
		case flush:
			emit(false)
		case stuck && len(out) == 0:
			// It cannot grow within one read: cut it here.
			emit(true)
		default:
			next, held = cur.start, true
		}
	}
	return out, next, held, cut
}
