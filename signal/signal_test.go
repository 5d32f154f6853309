package signal

import "testing"

// TestNamesAndOrder: names round-trip, and the order that indexes tokens'
// per-signal fields stays what issued tokens were written with.
func TestNamesAndOrder(t *testing.T) {
	for i, want := range []string{"traces", "metrics", "logs", "messages"} {
		s := Signal(i)
		if s.String() != want {
			t.Fatalf("signal %d is %q, want %q (tokens index by this order)", i, s, want)
		}
		if p, ok := Parse(want); !ok || p != s {
			t.Fatalf("Parse(%q) = %v, %v", want, p, ok)
		}
	}
	if _, ok := Parse("profiles"); ok {
		t.Fatal("an unknown signal parsed")
	}
}
