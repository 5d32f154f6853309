package sampling

import (
	"crypto/rand"
	"testing"
)

func TestConsistentAndProportional(t *testing.T) {
	d := For(25)
	kept := 0
	const n = 200000
	ids := make([][]byte, n)
	for i := range ids {
		id := make([]byte, 16)
		_, _ = rand.Read(id)
		ids[i] = id
		if d.Keep(id) {
			kept++
		}
	}
	if f := float64(kept) / n; f < 0.24 || f > 0.26 {
		t.Fatalf("kept %.3f of traces at 25%%", f)
	}
	// The same trace gets the same answer every time and on every agent, and
	// a trace kept at 10% is also kept at 25% (consistency across rates).
	ten := For(10)
	for _, id := range ids[:1000] {
		if d.Keep(id) != For(25).Keep(id) {
			t.Fatal("decision not a function of the trace id")
		}
		if ten.Keep(id) && !d.Keep(id) {
			t.Fatal("kept at 10% but dropped at 25%")
		}
	}
	if !For(0).Keep(nil) {
		t.Fatal("0%: an item without a trace id must be kept")
	}
	if For(0).Keep(ids[0]) {
		t.Fatal("0%: an item with a trace id must be dropped")
	}
	var zero Decision
	if !zero.All() || !zero.Keep(ids[0]) {
		t.Fatal("the zero Decision must keep everything")
	}
	if !For(100).All() {
		t.Fatal("100% is all")
	}
}

var kept int

func BenchmarkKeep(b *testing.B) {
	d := For(10)
	id := make([]byte, 16)
	n := 0
	for i := 0; i < b.N; i++ {
		id[15] = byte(i)
		id[9] = byte(i >> 8)
		if d.Keep(id) {
			n++
		}
	}
	kept = n // the result must be used, or the call is optimized away
}
