package filereceiver

import (
	"bytes"
	"strings"
	"testing"
)

// FuzzFrame reads input the way the receiver does, in windows from where
// the last read stopped, and checks that the records put back together
// (pieces joined) are exactly the input's non-empty lines, "\r\n" or "\n"
// ended, the unterminated rest as the last one; that no record exceeds
// max_line_bytes; and that every record's offset is where it is in input.
func FuzzFrame(f *testing.F) {
	f.Add([]byte("a\nb\r\n\nccc\ndd"), uint8(4), uint8(0), uint8(3))
	f.Add([]byte(strings.Repeat("x", 50)+"\r\n"+strings.Repeat("y", 9)), uint8(8), uint8(3), uint8(2))
	f.Add([]byte("abcd\r\nefgh\r\r\n\r\n"), uint8(4), uint8(0), uint8(1))
	f.Fuzz(func(t *testing.T, input []byte, maxLine, extra, maxLines uint8) {
		ml := int(maxLine%64) + 1
		window := ml + 2 + int(extra%16)
		cap := int(maxLines%8) + 1
		var want []string
		parts := strings.Split(string(input), "\n")
		for _, p := range parts {
			if p = strings.TrimSuffix(p, "\r"); p != "" {
				want = append(want, p)
			}
		}
		var got []string
		var cur strings.Builder
		pos, inLong := 0, false
		for rounds := 0; pos < len(input); rounds++ {
			if rounds > 4*len(input)+10 {
				t.Fatalf("no progress at %d", pos)
			}
			end := min(pos+window, len(input))
			buf := input[pos:end]
			lines, consumed, long, _ := frame(buf, ml, cap, end == len(input), inLong, nil)
			for _, l := range lines {
				if l.end-l.start > ml || l.end <= l.start {
					t.Fatalf("record of %d bytes (max %d)", l.end-l.start, ml)
				}
				v := buf[l.start:l.end]
				if !bytes.Equal(input[pos+l.start:pos+l.end], v) {
					t.Fatal("offset does not point at the record")
				}
				cur.Write(v)
				if !l.cont {
					got = append(got, cur.String())
					cur.Reset()
				}
			}
			if consumed == 0 && end < len(input) {
				t.Fatalf("stuck at %d with a window of %d", pos, window)
			}
			if consumed == 0 {
				break
			}
			pos += consumed
			inLong = long
		}
		if cur.Len() > 0 {
			got = append(got, cur.String())
		}
		if strings.Join(got, "\x00") != strings.Join(want, "\x00") {
			t.Fatalf("input %q (max %d, window %d)\ngot  %q\nwant %q", input, ml, window, got, want)
		}
	})
}

// FuzzMultiline reads input in windows as the receiver does with a
// multiline pattern, and checks that the records, split again at their
// "\n"s (pieces joined), are exactly the input's non-empty lines, each once
// and in order; that no record exceeds max_line_bytes or max_lines; that
// every record's offset is where it is in input; and that reading never
// stalls.
func FuzzMultiline(f *testing.F) {
	f.Add([]byte("S1\n a\n\n b\nS2\nx\nS3"), uint8(16), uint8(3), uint8(4), uint8(3), false)
	f.Add([]byte(strings.Repeat(" c\n", 20)+"S\n"), uint8(8), uint8(0), uint8(7), uint8(2), true)
	f.Fuzz(func(t *testing.T, input []byte, maxLine, extra, maxLines, groupLines uint8, cont bool) {
		ml := int(maxLine%64) + 1
		window := ml + 2 + int(extra%16)
		cap := int(maxLines%8) + 1
		cfg := Multiline{StartPattern: "^S", MaxLines: int(groupLines%6) + 2}
		if cont {
			cfg = Multiline{ContinuePattern: `^\s`, MaxLines: cfg.MaxLines}
		}
		m := newMultiline(cfg)
		var want []string
		for _, p := range strings.Split(string(input), "\n") {
			if p = strings.TrimSuffix(p, "\r"); p != "" {
				want = append(want, p)
			}
		}
		var got []string
		var cur strings.Builder
		pos, inLong := 0, false
		for rounds := 0; pos < len(input); rounds++ {
			if rounds > 4*len(input)+10 {
				t.Fatalf("no progress at %d", pos)
			}
			end := min(pos+window, len(input))
			buf := input[pos:end]
			final := end == len(input)
			lines, consumed, long, _ := frame(buf, ml, cap, final, inLong, nil)
			stuck := len(lines) == cap || len(buf) == window
			recs, next, held, _ := m.group(buf, lines, consumed, ml, inLong, final, stuck)
			if held {
				long = false
			}
			for _, l := range recs {
				v := buf[l.start:l.end]
				if l.end-l.start > ml || l.end <= l.start {
					t.Fatalf("record of %d bytes (max %d)", l.end-l.start, ml)
				}
				if n := nonEmptyLines(v); n > cfg.MaxLines {
					t.Fatalf("record of %d lines (max %d)", n, cfg.MaxLines)
				}
				if !bytes.Equal(input[pos+l.start:pos+l.end], v) {
					t.Fatal("offset does not point at the record")
				}
				if l.cont && bytes.IndexByte(v, '\n') < 0 {
					cur.Write(v) // a piece of a long line: the next record goes on
					continue
				}
				// A group's lines, the first ending a long line's pieces.
				ls := strings.Split(string(v), "\n")
				for i, s := range ls {
					if i < len(ls)-1 {
						s = strings.TrimSuffix(s, "\r") // the last line's was cut by frame
					}
					if i == 0 {
						s = cur.String() + s
						cur.Reset()
					}
					if s != "" {
						got = append(got, s)
					}
				}
			}
			if next == 0 && !final {
				t.Fatalf("stuck at %d with a window of %d", pos, window)
			}
			if next == 0 {
				break
			}
			pos += next
			inLong = long
		}
		if cur.Len() > 0 {
			got = append(got, cur.String())
		}
		if strings.Join(got, "\x00") != strings.Join(want, "\x00") {
			t.Fatalf("input %q (max %d, window %d, %+v)\ngot  %q\nwant %q", input, ml, window, cfg, got, want)
		}
	})
}

func nonEmptyLines(v []byte) int {
	n := 0
	for _, s := range strings.Split(string(v), "\n") {
		if strings.TrimSuffix(s, "\r") != "" {
			n++
		}
	}
	return n
}
