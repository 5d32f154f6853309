package receiver

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// TestClipMessage: words longer than MaxMessageBytes are cut to it, at a
// character's start, and marked; shorter ones are kept.
func TestClipMessage(t *testing.T) {
	if got := ClipMessage("short"); got != "short" {
		t.Fatalf("short: %q", got)
	}
	for _, s := range []string{strings.Repeat("a", 10000), strings.Repeat("é", 10000), strings.Repeat("日本", 1000)} {
		got := ClipMessage(s)
		if len(got) > MaxMessageBytes || !utf8.ValidString(got) || !strings.HasSuffix(got, "…") {
			t.Fatalf("%d bytes, valid %v: %q", len(got), utf8.ValidString(got), got[len(got)-8:])
		}
	}
}
