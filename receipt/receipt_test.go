package receipt

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/record"
)

func TestValidRequestID(t *testing.T) {
	for _, ok := range []string{"a", "req-42", "0f8fad5b-d9cb-469f-a165-70867728950e", "svc.checkout:7_x", strings.Repeat("z", MaxRequestIDBytes)} {
		if !ValidRequestID(ok) {
			t.Errorf("%q refused", ok)
		}
	}
	for _, bad := range []string{"", "a b", "a\"b", "a\nb", "é", "a/b", strings.Repeat("z", MaxRequestIDBytes+1)} {
		if ValidRequestID(bad) {
			t.Errorf("%q taken", bad)
		}
	}
}

func TestOwner(t *testing.T) {
	if Owner("") != 0 || Owner("a") == 0 || Owner("a") == Owner("b") || Owner("a") != Owner("a") {
		t.Fatal("owners")
	}
}

func TestIDRoundTripAndAge(t *testing.T) {
	s, err := NewStore(Config{MaxBytes: 1 << 20, MaxAge: time.Minute}, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	s.now = func() time.Time { return now }
	id := s.Add(Pos{Seg: 12, Off: 345}, 400, []uint32{0, 20}, 9)
	if seq, _, ok := parseID(id); !ok || seq != s.seq || strings.Count(id, "-") != 1 {
		t.Fatalf("%s: %v %v", id, seq, ok)
	}
	if !s.Watching() {
		t.Fatal("not watching")
	}
	rc := record.NewReceipt(2)
	rc.Acked(0, "t", 3, 100)
	s.Settle([]Pos{{12, 345}, {12, 365}}, rc)
	// Pending: the counts, no ranges yet.
	st, ok := s.Lookup(id, 9)
	if !ok || st.Pending != 1 || len(st.Ranges) != 0 {
		t.Fatalf("%+v", st)
	}
	s.DeadLettered(Pos{12, 365})
	if st, _ = s.Lookup(id, 9); st.Pending != 0 || st.DeadLettered != 1 || s.Watching() || len(st.Ranges) != 1 || st.Ranges[0].Offset != 100 {
		t.Fatalf("%+v", st)
	}
	for _, bad := range []string{"", "1-2", "x-0000000000000000", "1-zz", "+1-0000000000000000", "1-2-0000000000000000", strings.Repeat("1", 100)} {
		if _, ok := s.Lookup(bad, 9); ok {
			t.Fatalf("%q found", bad)
		}
	}
	now = now.Add(2 * time.Minute)
	if _, ok := s.Lookup(id, 9); ok {
		t.Fatal("kept past max_age")
	}
}

// TestLookupPages: a receipt of 100,000 records alternating partitions
// (a range each) answers in pages of at most MaxRangesPerAnswer, each
// continuing where the last stopped, covering every record once in
// order; a range cut at a page's end continues in the next.
func TestLookupPages(t *testing.T) {
	s, _ := NewStore(Config{MaxBytes: 16 << 20, MaxAge: time.Hour}, prometheus.NewRegistry())
	const n = 100000
	rel := make([]uint32, n)
	at := make([]Pos, n)
	for i := range rel {
		rel[i] = uint32(i * 40)
		at[i] = Pos{1, 64 + int64(i*40)}
	}
	id := s.Add(Pos{1, 64}, 64+n*40, rel, 7)
	rc := record.NewReceipt(n)
	for i := 0; i < n; i++ {
		// The last 30,000 records are one run in partition 0.
		if i < 70000 {
			rc.Acked(i, "topic", int32(i%2), int64(i))
		} else {
			rc.Acked(i, "topic", 0, int64(i))
		}
	}
	s.Settle(at, rc)
	k, pages := 0, 0
	for from := 0; ; pages++ {
		st, ok := s.LookupFrom(id, 7, from)
		if !ok || st.Pending != 0 || len(st.Ranges) > MaxRangesPerAnswer || st.Records != n {
			t.Fatalf("from %d: %v %+v", from, ok, st.Records)
		}
		for _, r := range st.Ranges {
			for j := 0; j < r.Count; j++ {
				if want := rc.Partition[k]; r.Partition != want || r.Offset+int64(j) != rc.Offset[k] {
					t.Fatalf("record %d: range %+v", k, r)
				}
				k++
			}
		}
		if st.Next != 0 && st.Next != k {
			t.Fatalf("next %d after %d records", st.Next, k)
		}
		if from = st.Next; from == 0 {
			break
		}
	}
	if k != n || pages != 7 {
		t.Fatalf("%d records in %d pages", k, pages)
	}
	if _, ok := s.LookupFrom(id, 7, -1); ok {
		t.Fatal("a negative start was taken")
	}
}

// TestSettleWalk: Settle's walk of positions and entries finds exactly
// what a search per record finds, whatever mix of requests that asked,
// records of clients that did not, segments, gaps and resends (a subset,
// later, in order; or out of order).
func TestSettleWalk(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < 50; round++ {
		s, _ := NewStore(Config{MaxBytes: 16 << 20, MaxAge: time.Hour}, prometheus.NewRegistry())
		type want struct {
			id  string
			off []int64
		}
		var all []Pos
		var wants []want
		var keep []bool // all[i] belongs to a receipt
		idx := map[Pos][2]int{}
		off := int64(64)
		for seg := uint64(1); seg <= 3; seg++ {
			for r := 0; r < 20; r++ {
				nrec := 1 + rng.IntN(5)
				start := off
				var rel []uint32
				for j := 0; j < nrec; j++ {
					rel = append(rel, uint32(off-start))
					all = append(all, Pos{seg, off})
					off += int64(10 + rng.IntN(30))
				}
				asked := rng.IntN(3) == 0
				for j := range rel {
					keep = append(keep, asked)
					if asked {
						idx[Pos{seg, start + int64(rel[j])}] = [2]int{len(wants), j}
					}
				}
				if asked {
					id := s.Add(Pos{seg, start}, off, rel, 1)
					w := want{id: id, off: make([]int64, nrec)}
					for j := range w.off {
						w.off[j] = -1
					}
					wants = append(wants, w)
				}
			}
			off = 64
		}
		// Settle in chunks: in order, some records left for a resend.
		var later []Pos
		for len(all) > 0 {
			n := min(len(all), 1+rng.IntN(40))
			chunk := all[:n]
			all = all[n:]
			var sent []Pos
			for _, p := range chunk {
				if rng.IntN(5) == 0 {
					later = append(later, p)
				} else {
					sent = append(sent, p)
				}
			}
			settle(s, sent, idx, func(w, j int, o int64) { wants[w].off[j] = o })
		}
		if round%2 == 1 {
			rng.Shuffle(len(later), func(i, j int) { later[i], later[j] = later[j], later[i] })
		}
		settle(s, later, idx, func(w, j int, o int64) { wants[w].off[j] = o })
		for _, w := range wants {
			st, ok := s.Lookup(w.id, 1)
			if !ok || st.Pending != 0 {
				t.Fatalf("round %d: %s: %v %+v", round, w.id, ok, st)
			}
			var got []int64
			for _, r := range st.Ranges {
				for j := 0; j < r.Count; j++ {
					got = append(got, r.Offset+int64(j))
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(w.off) {
				t.Fatalf("round %d: %s: got %v want %v", round, w.id, got, w.off)
			}
		}
		if s.Watching() {
			t.Fatalf("round %d: still watching", round)
		}
	}
}

// settle gives each position an offset (1000 + its order) through Settle,
// and tells set which receipt record it is.
func settle(s *Store, at []Pos, idx map[Pos][2]int, set func(w, j int, o int64)) {
	if len(at) == 0 {
		return
	}
	rc := record.NewReceipt(len(at))
	for i, p := range at {
		o := 1000 + int64(p.Seg)*100000 + p.Off
		rc.Acked(i, "t", 0, o)
		if wj, ok := idx[p]; ok {
			set(wj[0], wj[1], o)
		}
	}
	s.Settle(at, rc)
}

// FuzzParseID: no id crashes the parser or passes past MaxIDBytes, and
// whatever parses is found again under the id formatted from it.
func FuzzParseID(f *testing.F) {
	f.Add("4242-9f86d081884c7d65")
	f.Add("0-0000000000000000")
	f.Add("18446744073709551615-ffffffffffffffff")
	f.Add("+1-0000000000000000")
	f.Add("1-2-0000000000000000")
	f.Fuzz(func(t *testing.T, id string) {
		seq, nonce, ok := parseID(id)
		if !ok {
			return
		}
		if len(id) > MaxIDBytes {
			t.Fatalf("%q parsed past the bound", id)
		}
		if s2, n2, ok2 := parseID(formatID(seq, nonce)); !ok2 || s2 != seq || n2 != nonce {
			t.Fatalf("%q: %d %x does not round-trip", id, seq, nonce)
		}
	})
}
