package verify

import (
	"testing"
)

func TestSeqRoundTrip(t *testing.T) {
	for _, c := range []struct {
		stream int
		seq    int64
	}{{0, 0}, {31, 49_999_999}, {7, 1}} {
		v := AppendSeq(nil, "a1z", c.stream, c.seq)
		if len(v) > MinRecord && c.seq < 50_000_000 {
			t.Fatalf("id %q longer than %d bytes", v, MinRecord)
		}
		p, s, q, ok := ParseSeq(append(v, "payload.with.dots"...))
		if !ok || p != "a1z" || s != c.stream || q != c.seq {
			t.Fatalf("%q → %q %d %d %v", v, p, s, q, ok)
		}
	}
	for _, bad := range []string{"", "#", "#a.b", "plain value", "#a.1.-5.x"} {
		if _, _, _, ok := ParseSeq([]byte(bad)); ok {
			t.Fatalf("%q parsed", bad)
		}
	}
}

// TestVerifierCounts: lost is exactly the acknowledged ids not read (ids of
// failed requests are not lost), duplicates and per-stream per-partition
// order are counted, and foreign values are set aside.
func TestVerifierCounts(t *testing.T) {
	want := &Report{Producer: "abc", Issued: 10, Failed: [][2]int64{{8, 10}}}
	v := New(want)
	for _, seq := range []int64{0, 1, 2, 4, 3, 5, 5, 6} { // 7 lost; 8, 9 failed; 5 twice; 4 before 3
		v.Add(AppendSeq(nil, "abc", 0, seq), 0)
	}
	v.Add(AppendSeq(nil, "abc", 1, 0), 1) // another stream: 0 again is a duplicate, not disorder
	v.Add([]byte("not an id"), 0)
	v.Add(AppendSeq(nil, "zzz", 0, 1), 0)
	lost, unacked := v.Lost()
	if lost != 1 || unacked != 0 || v.dups != 2 || v.outOfOrd != 1 || v.foreign != 2 || v.distinct != 7 {
		t.Fatalf("lost %d unacked %d dups %d disorder %d foreign %d distinct %d: %s", lost, unacked, v.dups, v.outOfOrd, v.foreign, v.distinct, v.Summary())
	}
	// Without a report: gaps below the highest id are lost.
	v2 := New(nil)
	for _, seq := range []int64{0, 2, 3} {
		v2.Add(AppendSeq(nil, "p", 0, seq), 0)
	}
	if l, _ := v2.Lost(); l != 1 {
		t.Fatalf("lost %d, want 1", l)
	}
}
