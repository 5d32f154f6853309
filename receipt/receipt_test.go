package receipt

import (
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
	if at, _, ok := parseID(id); !ok || at != (Pos{12, 345}) {
		t.Fatalf("%s: %v %v", id, at, ok)
	}
	if !s.Watching() {
		t.Fatal("not watching")
	}
	rc := record.NewReceipt(2)
	rc.Acked(0, "t", 3, 100)
	s.Settle([]Pos{{12, 345}, {12, 365}}, rc)
	st, ok := s.Lookup(id, 9)
	if !ok || st.Pending != 1 || len(st.Ranges) != 1 {
		t.Fatalf("%+v", st)
	}
	s.DeadLettered(Pos{12, 365})
	if st, _ = s.Lookup(id, 9); st.Pending != 0 || st.DeadLettered != 1 || s.Watching() {
		t.Fatalf("%+v", st)
	}
	for _, bad := range []string{"", "1-2", "x-2-0000000000000000", "1-2-zz", strings.Repeat("1", 100)} {
		if _, ok := s.Lookup(bad, 9); ok {
			t.Fatalf("%q found", bad)
		}
	}
	now = now.Add(2 * time.Minute)
	if _, ok := s.Lookup(id, 9); ok {
		t.Fatal("kept past max_age")
	}
}
