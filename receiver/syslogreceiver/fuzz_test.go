package syslogreceiver

import (
	"encoding/json"
	"strings"
	"testing"
)

// checkMessage: whatever the bytes, parsing does not panic, the JSON is
// valid and within the bound reserved for it before it was written.
func checkMessage(t *testing.T, in []byte) {
	var m Message
	parse(in, &m)
	if m.Proto == protoUnknown && m.Err == "" {
		t.Fatalf("unknown protocol without an error: %q", in)
	}
	out := appendJSON(nil, &m, in, testNow)
	if len(out) > jsonBound(&m, in) {
		t.Fatalf("JSON of %d bytes over its bound %d: %q", len(out), jsonBound(&m, in), in)
	}
	if !json.Valid(out) {
		t.Fatalf("invalid JSON %s from %q", out, in)
	}
}

func FuzzRFC5424(f *testing.F) {
	for _, c := range cases5424 {
		f.Add([]byte(c.in))
	}
	f.Add([]byte(`<1>1 - - - - - [a b="\\\"\]"][c d=""]`))
	f.Fuzz(func(t *testing.T, in []byte) { checkMessage(t, in) })
}

func FuzzRFC3164(f *testing.F) {
	for _, c := range cases3164 {
		f.Add([]byte(c.in))
	}
	f.Add([]byte("<13>*Jan  1 00:00:00.1234567890 ABCDEF: x[1: y"))
	f.Fuzz(func(t *testing.T, in []byte) { checkMessage(t, in) })
}

// FuzzFrame: the framer never reads past what it needs (max+maxPrefix
// bytes decide every frame), never returns more than max bytes, and
// consumes what it returns.
func FuzzFrame(f *testing.F) {
	f.Add([]byte("5 hello6 world!<13>x\n"), 16)
	f.Add([]byte("999999999999 x"), 100)
	f.Add([]byte("<13>"+strings.Repeat("y", 40)), 10)
	f.Fuzz(func(t *testing.T, in []byte, max int) {
		max = 1 + max&0xFFF
		for len(in) > 0 {
			kind, msg, n := splitFrame(in, max)
			switch kind {
			case frameNeedMore:
				if len(in) >= max+maxPrefix+1 {
					t.Fatalf("needs more than max+maxPrefix+1 (%d) bytes: %q", max+maxPrefix+1, in)
				}
				return
			case frameTooLarge, frameBadCount:
				return
			}
			if len(msg) > max || n <= 0 || n > len(in) {
				t.Fatalf("kind %d msg %d bytes n %d of %d (max %d)", kind, len(msg), n, len(in), max)
			}
			in = in[n:]
		}
	})
}
