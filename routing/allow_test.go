package routing

import (
	"strings"
	"testing"
)

// TestQuoteTopic: a name a client sent is quoted whole when short, by its
// first 64 bytes and its length when long.
func TestQuoteTopic(t *testing.T) {
	if got := QuoteTopic("logs\x00"); got != `"logs\x00"` {
		t.Fatalf("short: %s", got)
	}
	got := QuoteTopic(strings.Repeat("\xff", 1<<20))
	if len(got) > 64*4+32 || !strings.HasSuffix(got, "… (1048576 bytes)") {
		t.Fatalf("long: %d bytes, %q", len(got), got[max(0, len(got)-40):])
	}
}
