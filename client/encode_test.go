package client

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// TestEncodedLenIsTheEncoding: a batch is sealed at BatchBytes of what the
// sender will write, so encodedLen must be the encoding's exact length,
// for every shape of record (repeated or new topics, no key, an empty
// key, headers, no timestamp, lengths across varint sizes).
func TestEncodedLenIsTheEncoding(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 7))
	sizes := []int{0, 1, 127, 128, 300, 16383, 16384, 70000}
	str := func() string { return strings.Repeat("x", sizes[rng.IntN(len(sizes))]) }
	prev := ""
	for i := range 5000 {
		r := &Record{Topic: prev, Value: []byte(str())}
		if rng.IntN(3) == 0 || i == 0 {
			r.Topic = "t" + str()
		}
		switch rng.IntN(3) {
		case 0:
			r.Key = []byte(str())
		case 1:
			r.Key = []byte{}
		}
		if rng.IntN(2) == 0 {
			r.Timestamp = time.UnixMilli(rng.Int64N(1 << 50))
		}
		for range rng.IntN(3) {
			r.Headers = append(r.Headers, Header{Key: str(), Value: []byte(str())})
		}
		if got, want := encodedLen(prev, r), len(appendRecord(nil, prev, r)); got != want {
			t.Fatalf("record %d: encodedLen %d, encoding %d bytes", i, got, want)
		}
		prev = r.Topic
	}
}
