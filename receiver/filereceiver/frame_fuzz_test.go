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
