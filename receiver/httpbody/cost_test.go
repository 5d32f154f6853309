package httpbody

// What a body costs the memory budget: its own buffer, not the buffers it
// grew through, nor a buffer twice its size to find its end, nor the next
// size class of a limit that is not a power of two. Each test failed on
// the code before the fix (a 1 MiB body reserved 3 MiB; a 4 MiB body was
// refused 429 by an idle agent with memory_limit = max_request_bytes).

import (
	"bytes"
	stdgzip "compress/gzip"
	"net/http/httptest"
	"testing"

	"github.com/ferryhq/ferry/buffer/budget"
)

// A body of exactly its declared Content-Length, when that length is a
// buffer size class (a power of two >= 4 KiB), costs that buffer: it was
// read into a buffer twice its size and reserved three times its size,
// the first buffer filled and grown just to see EOF.
func TestExactFitCostsItsBuffer(t *testing.T) {
	const max = 8 << 20
	b := budget.New(256 << 20)
	r := NewReader(max)
	r.SetBudget(b)
	req := httptest.NewRequest("POST", "/", bytes.NewReader(make([]byte, 1<<20))) // sets Content-Length 1048576
	buf, e := r.Read(req)
	if e != nil {
		t.Fatal(e.Msg)
	}
	defer r.Put(buf)
	if cap(buf.B) != 1<<20 || buf.Reserved() != 1<<20 {
		t.Fatalf("1 MiB body with Content-Length 1 MiB: buffer of %d, reserved %d (want 1 MiB each)", cap(buf.B), buf.Reserved())
	}
}

// With queue.memory_limit = max_request_bytes (the receivers' Check
// accepts it) an idle agent takes bodies well inside the limit; it
// answered 429 "retry later" to a 4 MiB body of limit 8 MiB, forever.
func TestIdleAgentTakesBodiesWithinLimit(t *testing.T) {
	const max = 8 << 20
	for _, c := range []struct {
		name string
		body func() ([]byte, string, int64)
	}{
		{"4 MiB, Content-Length 4 MiB", func() ([]byte, string, int64) { return make([]byte, 4<<20), "", 4 << 20 }},
		// Growing holds the old buffer and the new one for the copy: a body
		// of unknown length up to half the budget fits.
		{"4 MiB, chunked", func() ([]byte, string, int64) { return make([]byte, 4<<20), "", -1 }},
		{"gzip of 4 MiB", func() ([]byte, string, int64) {
			var z bytes.Buffer
			w := stdgzip.NewWriter(&z)
			_, _ = w.Write(make([]byte, 4<<20))
			_ = w.Close()
			return z.Bytes(), "gzip", int64(z.Len())
		}},
	} {
		b := budget.New(max) // memory_limit = max_request_bytes, nothing else held
		r := NewReader(max)
		r.SetBudget(b)
		body, enc, cl := c.body()
		req := httptest.NewRequest("POST", "/", bytes.NewReader(body))
		req.ContentLength = cl
		if enc != "" {
			req.Header.Set("Content-Encoding", enc)
		}
		buf, e := r.Read(req)
		if e != nil {
			t.Errorf("%s, budget %d and nothing held: %d %s", c.name, max, e.Status, e.Reason)
			continue
		}
		r.Put(buf)
	}
}

// A max that is not a power of two (bytesize parses "10MB" as 10,000,000)
// costs no buffer past it: the last growth was the next size class
// (16 MiB), and a 10 MB body with memory_limit 12MB was refused 429.
func TestNonPowerOfTwoLimit(t *testing.T) {
	const max = 10_000_000
	b := budget.New(12_000_000)
	r := NewReader(max)
	r.SetBudget(b)
	req := httptest.NewRequest("POST", "/", bytes.NewReader(make([]byte, max)))
	buf, e := r.Read(req)
	if e != nil {
		t.Fatalf("a body of exactly max_request_bytes (10MB), memory_limit 12MB, idle: %d %s", e.Status, e.Reason)
	}
	defer r.Put(buf)
	if cap(buf.B) > max {
		t.Fatalf("buffer of %d past the limit %d", cap(buf.B), max)
	}
}
