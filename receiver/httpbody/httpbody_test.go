package httpbody

import (
	"bufio"
	"bytes"
	stdgzip "compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"

	"github.com/ferryhq/ferry/buffer/budget"
	"github.com/ferryhq/ferry/protocol"
)

// testMax is the body limit of most tests: a power of two, as the default
// max_request_bytes (8MiB) is, small enough to read quickly.
const testMax = 256 << 10

// watched is a real budget that remembers what was asked of it: the most
// it ever held, the largest single reservation granted, and the counts.
type watched struct {
	*budget.Budget
	mu                          sync.Mutex
	base                        int64 // held at the last reset
	peak, largest               int64
	granted, refused, released  int
	grantedBytes, releasedBytes int64
}

func newWatched(limit int64) *watched { return &watched{Budget: budget.New(limit)} }

func (w *watched) Reserve(n, ceiling int64) bool {
	ok := w.Budget.Reserve(n, ceiling)
	w.mu.Lock()
	defer w.mu.Unlock()
	if !ok {
		w.refused++
		return false
	}
	w.granted++
	w.grantedBytes += n
	w.largest = max(w.largest, n)
	w.peak = max(w.peak, w.Used())
	return true
}

func (w *watched) Release(n int64) {
	w.mu.Lock()
	w.released++
	w.releasedBytes += n
	w.mu.Unlock()
	w.Budget.Release(n)
}

// reset forgets the history (not what is held).
func (w *watched) reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.base, w.peak, w.largest = w.Used(), w.Used(), 0
	w.granted, w.refused, w.released, w.grantedBytes, w.releasedBytes = 0, 0, 0, 0, 0
}

// empty fails unless every reservation was given back.
func (w *watched) empty(t *testing.T, what string) {
	t.Helper()
	if u := w.Used(); u != 0 {
		t.Errorf("%s: %d bytes of the budget still reserved", what, u)
	}
	if w.base+w.grantedBytes != w.releasedBytes {
		t.Errorf("%s: %d bytes held and %d reserved, %d released", what, w.base, w.grantedBytes, w.releasedBytes)
	}
}

// counting counts the bytes read from r.
type counting struct {
	r io.Reader
	n int64
}

func (c *counting) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// request returns a POST of body with Content-Encoding enc ("" for none)
// and Content-Length cl (-1: unknown, as a chunked request), and the
// counter of the bytes read from its body.
func request(body []byte, enc string, cl int64) (*http.Request, *counting) {
	src := &counting{r: bytes.NewReader(body)}
	req := httptest.NewRequest(http.MethodPost, "/", nil)
	req.Body = io.NopCloser(src)
	req.ContentLength = cl
	if enc != "" {
		req.Header.Set("Content-Encoding", enc)
	}
	return req, src
}

// payload is n bytes of JSON-ish text (it compresses, as real bodies do,
// without being all one byte), the same for a seed.
func payload(n int, seed uint64) []byte {
	words := []string{`{"level":"info",`, `"msg":"request served",`, `"status":200,`, `"bytes":`, `"trace":"`, `"},`, "\n"}
	rng := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, 0, n+64)
	for len(b) < n {
		b = append(b, words[rng.IntN(len(words))]...)
		b = strconv.AppendUint(b, rng.Uint64N(1e6), 10)
	}
	return b[:n]
}

func gzipped(t *testing.T, data []byte) []byte {
	t.Helper()
	var out bytes.Buffer
	w := stdgzip.NewWriter(&out)
	if _, err := w.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// zstdFrame compresses data into one frame that declares its size (what
// EncodeAll writes, as most clients do).
func zstdFrame(t *testing.T, data []byte) []byte {
	t.Helper()
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1))
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	return enc.EncodeAll(data, nil)
}

// zstdStream compresses data as a stream: the frame does not declare its
// size, so only reading it tells how large it is. Its window is 64 KiB:
// the decoder refuses a window larger than the limit (see
// TestZstdWindowOverLimit).
func zstdStream(t *testing.T, data []byte) []byte {
	t.Helper()
	var out bytes.Buffer
	enc, err := zstd.NewWriter(&out, zstd.WithEncoderConcurrency(1), zstd.WithWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(enc, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	if err := enc.Close(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

func wantErr(t *testing.T, what string, e *Error, status int, reason, msgPart string) {
	t.Helper()
	if e == nil {
		t.Fatalf("%s: accepted, want %d %s", what, status, reason)
	}
	if e.Status != status || e.Reason != reason || !strings.Contains(e.Msg, msgPart) || e.Error() != e.Msg {
		t.Fatalf("%s: %d %s %q, want %d %s with %q", what, e.Status, e.Reason, e.Msg, status, reason, msgPart)
	}
}

// TestReadIdentity: bodies up to exactly the limit come back whole, with
// or without a declared length, "identity" or no encoding; the buffer
// holds its own reservation (what the budget shows), no buffer is past
// the limit, and Put gives it all back.
func TestReadIdentity(t *testing.T) {
	w := newWatched(4 * testMax)
	r := NewReader(testMax)
	r.SetBudget(w)
	if !r.Budgeted() || r.Limit() != 4*testMax {
		t.Fatalf("Budgeted %v, Limit %d", r.Budgeted(), r.Limit())
	}
	for _, n := range []int{0, 1, 4096, 4097, 100_000, testMax} {
		for _, enc := range []string{"", "identity", " Identity "} {
			for _, declared := range []bool{true, false} {
				what := fmt.Sprintf("%d bytes, encoding %q, declared %v", n, enc, declared)
				body := payload(n, uint64(n))
				cl := int64(n)
				if !declared {
					cl = -1
				}
				req, src := request(body, enc, cl)
				w.reset()
				buf, e := r.Read(req)
				if e != nil {
					t.Fatalf("%s: %d %s %s", what, e.Status, e.Reason, e.Msg)
				}
				if !bytes.Equal(buf.B, body) || src.n != int64(n) {
					t.Fatalf("%s: got %d bytes (read %d), not the body", what, len(buf.B), src.n)
				}
				if cap(buf.B) > testMax || w.largest > testMax {
					t.Fatalf("%s: buffer of %d, largest reservation %d, past the limit %d", what, cap(buf.B), w.largest, testMax)
				}
				if buf.Reserved() < int64(cap(buf.B)) || w.Used() != buf.Reserved() {
					t.Fatalf("%s: capacity %d, reserved %d, budget used %d", what, cap(buf.B), buf.Reserved(), w.Used())
				}
				r.Put(buf)
				w.empty(t, what)
			}
		}
	}
	// An empty body as the server gives it.
	req := httptest.NewRequest(http.MethodPost, "/", http.NoBody)
	buf, e := r.Read(req)
	if e != nil || len(buf.B) != 0 {
		t.Fatalf("http.NoBody: %v, %d bytes", e, len(buf.B))
	}
	r.Put(buf)
	w.empty(t, "http.NoBody")
}

// TestDeclaredTooLarge: a Content-Length over the limit is refused with
// 413 request_too_large naming both sizes, before a byte is read or
// reserved.
func TestDeclaredTooLarge(t *testing.T) {
	w := newWatched(1 << 30)
	r := NewReader(testMax)
	r.SetBudget(w)
	for _, cl := range []int64{testMax + 1, 1 << 40} {
		for _, enc := range []string{"", "gzip", "br"} {
			req, src := request(make([]byte, 10), enc, cl)
			buf, e := r.Read(req)
			if buf != nil {
				t.Fatalf("Content-Length %d: a buffer came back with the refusal", cl)
			}
			wantErr(t, fmt.Sprintf("Content-Length %d, %q", cl, enc), e, http.StatusRequestEntityTooLarge, "request_too_large",
				fmt.Sprintf("body of %d bytes exceeds max_request_bytes (%d)", cl, testMax))
			if src.n != 0 || w.granted != 0 || w.refused != 0 {
				t.Fatalf("Content-Length %d: read %d bytes, %d reservations granted, %d refused before refusing", cl, src.n, w.granted, w.refused)
			}
		}
	}
}

// TestBodyOverLimit: a body over the limit that did not say so (no
// Content-Length, or one that understates it) is refused with 413 once
// the limit is passed: at most one byte past the limit is read, no buffer
// larger than the limit is reserved, the steps it grew through hold at
// most twice the limit, and all of it is given back.
func TestBodyOverLimit(t *testing.T) {
	w := newWatched(2 * testMax)
	r := NewReader(testMax)
	r.SetBudget(w)
	for _, n := range []int{testMax + 1, testMax + 4096, 10 * testMax} {
		for _, cl := range []int64{-1, 0, 10, testMax / 2, testMax} {
			what := fmt.Sprintf("%d bytes, Content-Length %d", n, cl)
			req, src := request(make([]byte, n), "", cl)
			w.reset()
			buf, e := r.Read(req)
			if buf != nil {
				t.Fatalf("%s: a buffer came back with the refusal", what)
			}
			// Not 429: the budget of twice the limit was always enough.
			wantErr(t, what, e, http.StatusRequestEntityTooLarge, "request_too_large",
				fmt.Sprintf("body exceeds max_request_bytes (%d)", testMax))
			if src.n > testMax+1 {
				t.Fatalf("%s: read %d bytes of the body, more than one past the limit %d", what, src.n, testMax)
			}
			if w.largest > testMax || w.peak > 2*testMax {
				t.Fatalf("%s: largest reservation %d, peak %d (limit %d)", what, w.largest, w.peak, testMax)
			}
			w.empty(t, what)
		}
	}
}

// TestContentLengthIsAHint: a Content-Length larger than the body sizes the
// first reservation (the declared length at once, no more than the limit)
// and the body is what it is; a smaller one does not bound what is read.
func TestContentLengthIsAHint(t *testing.T) {
	w := newWatched(4 * testMax)
	r := NewReader(testMax)
	r.SetBudget(w)

	// Declared the limit, sent 10 bytes: the limit is reserved before the
	// first byte, and the 10 bytes come back.
	req, _ := request([]byte("0123456789"), "", testMax)
	buf, e := r.Read(req)
	if e != nil || string(buf.B) != "0123456789" {
		t.Fatalf("longer Content-Length: %v %q", e, buf.B)
	}
	if w.granted != 1 || w.largest != testMax {
		t.Fatalf("longer Content-Length: %d reservations, largest %d; want one of %d", w.granted, w.largest, testMax)
	}
	r.Put(buf)
	w.empty(t, "longer Content-Length")

	// Declared 10, sent 100 000: all of it is read.
	body := payload(100_000, 7)
	req, _ = request(body, "", 10)
	w.reset()
	buf, e = r.Read(req)
	if e != nil || !bytes.Equal(buf.B, body) {
		t.Fatalf("shorter Content-Length: %v, %d bytes", e, len(buf.B))
	}
	r.Put(buf)
	w.empty(t, "shorter Content-Length")
}

// TestContentLengthLiesToTheServer: through a real server, a client that
// declares more than it sends and stops is answered 400 read_error (the
// body ended early), and one that declares less has only the declared
// bytes read as its body; nothing stays reserved.
func TestContentLengthLiesToTheServer(t *testing.T) {
	w := newWatched(4 * testMax)
	r := NewReader(testMax)
	r.SetBudget(w)
	type result struct {
		body string
		e    *Error
	}
	results := make(chan result, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		buf, e := r.Read(req)
		if e != nil {
			results <- result{e: e}
			http.Error(rw, e.Msg, e.Status)
			return
		}
		results <- result{body: string(buf.B)}
		r.Put(buf)
	}))
	defer srv.Close()

	send := func(t *testing.T, cl int, body string) (result, int) {
		t.Helper()
		c, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", cl, body); err != nil {
			t.Fatal(err)
		}
		// The client says no more: the server sees the end of its body.
		if err := c.(*net.TCPConn).CloseWrite(); err != nil {
			t.Fatal(err)
		}
		res := <-results
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return res, resp.StatusCode
	}

	res, code := send(t, 1000, "only ten b")
	if code != http.StatusBadRequest {
		t.Fatalf("declared 1000, sent 10: answered %d", code)
	}
	wantErr(t, "declared 1000, sent 10", res.e, http.StatusBadRequest, "read_error", "reading body: ")
	w.empty(t, "declared 1000, sent 10")

	res, code = send(t, 4, "ABCDEFGH")
	if code != http.StatusOK || res.e != nil || res.body != "ABCD" {
		t.Fatalf("declared 4, sent 8: answered %d, %v %q", code, res.e, res.body)
	}
	w.empty(t, "declared 4, sent 8")
}

// TestReadErrors: a body that fails while it is read is answered 400
// read_error with the cause, and its buffer's reservation is given back.
func TestReadErrors(t *testing.T) {
	w := newWatched(4 * testMax)
	r := NewReader(testMax)
	r.SetBudget(w)
	for _, cl := range []int64{-1, 50_000} {
		req := httptest.NewRequest(http.MethodPost, "/", nil)
		req.Body = io.NopCloser(io.MultiReader(bytes.NewReader(make([]byte, 20_000)), iotest.ErrReader(errors.New("connection reset"))))
		req.ContentLength = cl
		buf, e := r.Read(req)
		if buf != nil {
			t.Fatal("a buffer came back with the refusal")
		}
		wantErr(t, "failing body", e, http.StatusBadRequest, "read_error", "reading body: connection reset")
		w.empty(t, "failing body")
	}
}

// TestCompressed: gzip and zstd bodies (the encodings Read supports; the
// name's case and spaces do not matter) decode to what was sent, exactly
// up to the limit; what is kept reserved is the decoded buffer's capacity
// (the compressed body and the smaller buffers the output grew through
// are given back), and Put gives that back.
func TestCompressed(t *testing.T) {
	w := newWatched(8 * testMax)
	r := NewReader(testMax)
	r.SetBudget(w)
	encodings := []struct {
		name string
		enc  func(*testing.T, []byte) []byte
	}{
		{"gzip", gzipped}, {" GZIP ", gzipped}, {"zstd", zstdFrame}, {"Zstd", zstdStream},
		{"snappy", func(_ *testing.T, b []byte) []byte { return s2.EncodeSnappy(nil, b) }},
	}
	for _, c := range encodings {
		// Twice each: the second time the pooled decoder is reused.
		for i, n := range []int{1, 5000, 100_000, testMax, 7, 100_000, testMax} {
			what := fmt.Sprintf("%q, %d bytes", c.name, n)
			data := payload(n, uint64(n))
			if i >= 5 {
				// Zeros: the output grows from a few times the
				// compressed size through several buffers.
				what += " of zeros"
				data = make([]byte, n)
			}
			z := c.enc(t, data)
			for _, cl := range []int64{int64(len(z)), -1} {
				req, _ := request(z, c.name, cl)
				w.reset()
				buf, e := r.Read(req)
				if e != nil {
					t.Fatalf("%s: %d %s %s", what, e.Status, e.Reason, e.Msg)
				}
				if !bytes.Equal(buf.B, data) {
					t.Fatalf("%s: decoded %d bytes, not what was sent", what, len(buf.B))
				}
				if cap(buf.B) > testMax || w.largest > testMax {
					t.Fatalf("%s: buffer %d, largest reservation %d, past the limit", what, cap(buf.B), w.largest)
				}
				if buf.Reserved() != int64(cap(buf.B)) || w.Used() != buf.Reserved() {
					t.Fatalf("%s: capacity %d, reserved %d, budget used %d", what, cap(buf.B), buf.Reserved(), w.Used())
				}
				r.Put(buf)
				w.empty(t, what)
			}
		}
	}
}

// TestDecompressionBomb: a small compressed body that inflates past the
// limit is refused with 413 request_too_large, before memory grows past
// the limit: no buffer larger than the limit is reserved, the decoded
// steps hold at most twice the limit beside the compressed body, and all
// of it is given back. A zstd frame that declares its size is refused
// from its header, before the output grows.
func TestDecompressionBomb(t *testing.T) {
	w := newWatched(1 << 30)
	r := NewReader(testMax)
	r.SetBudget(w)
	zeros := make([]byte, 16*testMax)
	cases := []struct {
		name, enc string
		body      []byte
		msg       string
	}{
		{"gzip", "gzip", gzipped(t, zeros), "decompressed body exceeds max_request_bytes"},
		{"gzip one byte over", "gzip", gzipped(t, make([]byte, testMax+1)), "decompressed body exceeds max_request_bytes"},
		{"zstd stream", "zstd", zstdStream(t, zeros), "decompressed body exceeds max_request_bytes"},
		{"zstd stream one byte over", "zstd", zstdStream(t, make([]byte, testMax+1)), "decompressed body exceeds max_request_bytes"},
		{"zstd declared", "zstd", zstdFrame(t, zeros), "max_request_bytes"},
	}
	for _, c := range cases {
		if len(c.body) > testMax/8 {
			t.Fatalf("%s: %d bytes compressed, not a bomb", c.name, len(c.body))
		}
		for _, cl := range []int64{int64(len(c.body)), -1} {
			what := fmt.Sprintf("%s, Content-Length %d", c.name, cl)
			// What the compressed body costs read as it is.
			req, _ := request(c.body, "", cl)
			w.reset()
			buf, e := r.Read(req)
			if e != nil {
				t.Fatalf("%s as sent: %s", what, e.Msg)
			}
			r.Put(buf)
			raw := w.peak

			req, _ = request(c.body, c.enc, cl)
			w.reset()
			buf, e = r.Read(req)
			if buf != nil {
				t.Fatalf("%s: a buffer came back with the refusal", what)
			}
			wantErr(t, what, e, http.StatusRequestEntityTooLarge, "request_too_large", c.msg)
			if w.largest > testMax || w.peak > raw+2*testMax {
				t.Fatalf("%s: largest reservation %d, peak %d (limit %d, compressed buffer %d)", what, w.largest, w.peak, testMax, raw)
			}
			// Refused from its header: at most the first small output
			// buffer was taken.
			if c.name == "zstd declared" && w.peak > raw+16<<10 {
				t.Fatalf("%s: %d reserved beside the compressed %d for a frame refused from its header", what, w.peak-raw, raw)
			}
			w.empty(t, what)
		}
	}
}

// TestZstdWindowOverLimit: a zstd frame whose window (the history its
// decoder must keep) is larger than the limit is refused with 413, however
// small its content, so the decoder's memory stays within the limit too.
func TestZstdWindowOverLimit(t *testing.T) {
	w := newWatched(4 * testMax)
	r := NewReader(testMax)
	r.SetBudget(w)
	var z bytes.Buffer
	enc, err := zstd.NewWriter(&z, zstd.WithEncoderConcurrency(1), zstd.WithWindowSize(4*testMax))
	if err != nil {
		t.Fatal(err)
	}
	// More than a block, less than the limit: written as a stream whose
	// header says its window, not its size.
	if _, err := io.Copy(enc, bytes.NewReader(payload(150_000, 5))); err != nil {
		t.Fatal(err)
	}
	if err := enc.Close(); err != nil {
		t.Fatal(err)
	}
	req, _ := request(z.Bytes(), "zstd", -1)
	buf, e := r.Read(req)
	if buf != nil {
		t.Fatal("a buffer came back with the refusal")
	}
	var h zstd.Header
	if err := h.Decode(z.Bytes()); err != nil || h.HasFCS || h.WindowSize <= testMax {
		t.Fatalf("not the frame the test means: %v, size declared %v, window %d", err, h.HasFCS, h.WindowSize)
	}
	wantErr(t, "zstd window 4x the limit", e, http.StatusRequestEntityTooLarge, "request_too_large", "max_request_bytes")
	w.empty(t, "zstd window")
}

// TestUnsupportedEncoding: an encoding Read does not decode (lz4, brotli,
// deflate, a list) is refused with 415 unsupported_content_encoding naming
// it, before the body is read or memory reserved.
func TestUnsupportedEncoding(t *testing.T) {
	w := newWatched(4 * testMax)
	r := NewReader(testMax)
	r.SetBudget(w)
	for _, enc := range []string{"lz4", "br", "deflate", "compress", "gzip, zstd", "x-gzip"} {
		req, src := request(gzipped(t, []byte("hello")), enc, -1)
		buf, e := r.Read(req)
		if buf != nil {
			t.Fatalf("%q: a buffer came back with the refusal", enc)
		}
		wantErr(t, enc, e, http.StatusUnsupportedMediaType, "unsupported_content_encoding", fmt.Sprintf("%q", strings.ToLower(enc)))
		if src.n != 0 || w.granted != 0 {
			t.Fatalf("%q: read %d bytes, %d reservations", enc, src.n, w.granted)
		}
	}
}

// TestCorruptBody: a body that is not what its encoding says is answered
// 400 corrupt_body, and nothing stays reserved.
func TestCorruptBody(t *testing.T) {
	w := newWatched(4 * testMax)
	r := NewReader(testMax)
	r.SetBudget(w)
	good := gzipped(t, payload(50_000, 3))
	badSum := bytes.Clone(good)
	badSum[len(badSum)-8] ^= 0xff // the CRC-32 of the trailer
	for _, c := range []struct {
		name, enc string
		body      []byte
		msg       string
	}{
		{"not gzip", "gzip", []byte("plainly not gzip"), "invalid gzip body"},
		{"empty gzip", "gzip", nil, "invalid gzip body"},
		{"truncated gzip", "gzip", good[:len(good)/2], "invalid gzip body"},
		{"gzip checksum", "gzip", badSum, "invalid gzip body"},
		{"not zstd", "zstd", []byte("plainly not zstd, long enough for a header"), "invalid zstd body"},
		{"truncated zstd", "zstd", zstdStream(t, payload(50_000, 4))[:100], "invalid zstd body"},
	} {
		req, _ := request(c.body, c.enc, int64(len(c.body)))
		buf, e := r.Read(req)
		if buf != nil {
			t.Fatalf("%s: a buffer came back with the refusal", c.name)
		}
		wantErr(t, c.name, e, http.StatusBadRequest, "corrupt_body", c.msg)
		w.empty(t, c.name)
	}
}

// TestExhaustedBudget: a body whose buffer does not fit in the budget is
// refused with 429 queue_full ("retry later") — at once, before a byte of
// it is read, when the first buffer does not fit; when a later growth or
// the decoded buffer does not, with what it held given back — and is
// served once room is released.
func TestExhaustedBudget(t *testing.T) {
	const limit = 2 * testMax
	w := newWatched(limit)
	r := NewReader(testMax)
	r.SetBudget(w)
	hold := func(n int64) *Buf {
		b := r.Get(0)
		if !r.Reserve(b, n) {
			t.Fatalf("could not hold %d of %d", n, w.Used())
		}
		return b
	}
	full := func(t *testing.T, what string, e *Error) {
		t.Helper()
		wantErr(t, what, e, http.StatusTooManyRequests, "queue_full", "retry later")
	}

	// Full: refused before reading.
	held := hold(limit)
	for _, cl := range []int64{5, -1} {
		req, src := request([]byte("hello"), "", cl)
		buf, e := r.Read(req)
		if buf != nil {
			t.Fatal("a buffer came back with the refusal")
		}
		full(t, "full budget", e)
		if src.n != 0 {
			t.Fatalf("read %d bytes of a body that had no room", src.n)
		}
		if w.Used() != limit {
			t.Fatalf("budget used %d, want the %d held", w.Used(), limit)
		}
	}
	r.Put(held)

	// Room for the first buffer (4 KiB), not for growing it.
	held = hold(limit - 8<<10)
	req, src := request(make([]byte, 50_000), "", 100)
	w.reset()
	_, e := r.Read(req)
	full(t, "no room to grow", e)
	if src.n == 0 || w.granted == 0 || w.Used() != held.Reserved() {
		t.Fatalf("no room to grow: read %d, %d granted, budget used %d, held %d", src.n, w.granted, w.Used(), held.Reserved())
	}

	// Room for the compressed body (all of it read), not for what it
	// decodes to.
	z := gzipped(t, make([]byte, 100_000))
	req, src = request(z, "gzip", int64(len(z)))
	_, e = r.Read(req)
	full(t, "no room to decode", e)
	if src.n != int64(len(z)) || w.Used() != held.Reserved() {
		t.Fatalf("no room to decode: read %d of %d, budget used %d, held %d", src.n, len(z), w.Used(), held.Reserved())
	}

	// Room again: the same bodies are served.
	r.Put(held)
	w.empty(t, "after the refusals")
	for _, enc := range []string{"", "gzip"} {
		body := make([]byte, 100_000)
		if enc == "gzip" {
			body = gzipped(t, body)
		}
		req, _ := request(body, enc, -1)
		buf, e := r.Read(req)
		if e != nil || len(buf.B) != 100_000 {
			t.Fatalf("%q with room: %v", enc, e)
		}
		r.Put(buf)
	}
	if w.Used() != 0 {
		t.Fatalf("%d reserved after Put", w.Used())
	}
}

// TestBudgetGivenBack: on one budget, every kind of answer leaves nothing
// reserved once its buffer is Put (or at once, when refused).
func TestBudgetGivenBack(t *testing.T) {
	w := newWatched(3 * testMax)
	r := NewReader(testMax)
	r.SetBudget(w)
	body := payload(150_000, 9)
	cases := []struct {
		name, enc string
		body      []byte
		cl        int64
		status    int // 0: accepted
	}{
		{"identity", "", body, int64(len(body)), 0},
		{"identity chunked", "", body, -1, 0},
		{"empty", "", nil, 0, 0},
		{"gzip", "gzip", gzipped(t, body), -1, 0},
		{"zstd", "zstd", zstdStream(t, body), -1, 0},
		{"declared too large", "", body, testMax + 1, 413},
		{"too large", "", make([]byte, testMax+1), -1, 413},
		{"gzip bomb", "gzip", gzipped(t, make([]byte, 4*testMax)), -1, 413},
		{"zstd bomb", "zstd", zstdFrame(t, make([]byte, 4*testMax)), -1, 413},
		{"lz4", "lz4", body, -1, 415},
		{"corrupt", "gzip", body, -1, 400},
	}
	for i := 0; i < 3; i++ {
		for _, c := range cases {
			req, _ := request(c.body, c.enc, c.cl)
			buf, e := r.Read(req)
			switch {
			case c.status == 0 && e != nil:
				t.Fatalf("%s: %d %s", c.name, e.Status, e.Msg)
			case c.status != 0 && (e == nil || e.Status != c.status):
				t.Fatalf("%s: %v, want %d", c.name, e, c.status)
			case c.status == 0:
				if w.Used() == 0 && len(c.body) > 0 {
					t.Fatalf("%s: nothing reserved for a body being held", c.name)
				}
				r.Put(buf)
			}
			w.empty(t, c.name)
		}
	}
	// Put and Release of nothing, and twice, take nothing back.
	r.Put(nil)
	r.Release(nil)
	b := r.Get(10)
	r.Release(b)
	if !r.Reserve(b, 100) {
		t.Fatal("reserve 100")
	}
	r.Release(b)
	r.Release(b)
	r.Put(b)
	w.empty(t, "Release twice")
}

// TestReadAllLocalFrames: ReadAll as the local protocol uses it, on
// protocol.Decompressor's output for a frame (lz4, zstd) with a hint of a
// few times the frame: the decoded frame comes back holding its own
// capacity; a frame inflating past the limit is ErrTooLarge with no buffer
// past it; a full budget is ErrNoRoom; a corrupt frame is the decoder's
// error; each time the buffer comes back for Put, which frees all.
func TestReadAllLocalFrames(t *testing.T) {
	const max = testMax
	w := newWatched(4 * max)
	r := NewReader(8 << 20) // the Reader's own limit is not ReadAll's
	r.SetBudget(w)
	readFrame := func(frame []byte, c byte) (*Buf, error) {
		src, done, err := protocol.Decompressor(frame, c)
		if err != nil {
			return nil, err
		}
		defer done()
		return r.ReadAll(src, min(max, 4*int64(len(frame))+4<<10), max)
	}
	for _, c := range []byte{protocol.CompressLZ4, protocol.CompressZstd} {
		for _, n := range []int{0, 1000, 100_000, max} {
			data := payload(n, uint64(n)+uint64(c))
			frame, err := protocol.Compress(nil, data, c)
			if err != nil {
				t.Fatal(err)
			}
			w.reset()
			buf, err := readFrame(frame, c)
			if err != nil || !bytes.Equal(buf.B, data) {
				t.Fatalf("compression %d, %d bytes: %v, %d bytes back", c, n, err, len(buf.B))
			}
			if buf.Reserved() != int64(cap(buf.B)) || w.Used() != buf.Reserved() || cap(buf.B) > max {
				t.Fatalf("compression %d, %d bytes: capacity %d, reserved %d, used %d", c, n, cap(buf.B), buf.Reserved(), w.Used())
			}
			r.Put(buf)
			w.empty(t, "frame")
		}

		// A bomb.
		frame, _ := protocol.Compress(nil, make([]byte, 16*max), c)
		w.reset()
		buf, err := readFrame(frame, c)
		if !errors.Is(err, ErrTooLarge) || buf == nil || cap(buf.B) > max || w.largest > max {
			t.Fatalf("compression %d bomb: %v, largest reservation %d", c, err, w.largest)
		}
		r.Put(buf)
		w.empty(t, "bomb")

		// No room.
		held := r.Get(0)
		if !r.Reserve(held, w.Limit()-1000) {
			t.Fatal("hold")
		}
		frame, _ = protocol.Compress(nil, payload(100_000, 1), c)
		buf, err = readFrame(frame, c)
		if !errors.Is(err, ErrNoRoom) || buf == nil {
			t.Fatalf("compression %d, full budget: %v", c, err)
		}
		r.Put(buf)
		r.Put(held)
		w.empty(t, "no room")

		// Corrupt: the decoder's error, marked malformed.
		frame, _ = protocol.Compress(nil, payload(100_000, 2), c)
		frame = frame[:len(frame)/2]
		buf, err = readFrame(frame, c)
		if err == nil || errors.Is(err, ErrTooLarge) || errors.Is(err, ErrNoRoom) || !errors.Is(err, protocol.ErrMalformed) {
			t.Fatalf("compression %d, truncated: %v", c, err)
		}
		if buf != nil {
			r.Put(buf)
		}
		w.empty(t, "corrupt")
	}
}

// TestReadAllSourceError: ReadAll returns its source's error with the
// buffer, which Put frees, also when it comes right at the limit.
func TestReadAllSourceError(t *testing.T) {
	w := newWatched(1 << 20)
	r := NewReader(testMax)
	r.SetBudget(w)
	cause := errors.New("boom")
	buf, err := r.ReadAll(io.MultiReader(bytes.NewReader(make([]byte, 10_000)), iotest.ErrReader(cause)), 0, testMax)
	if !errors.Is(err, cause) || buf == nil {
		t.Fatalf("%v", err)
	}
	r.Put(buf)
	w.empty(t, "source error")

	// Exactly max bytes, then a failure instead of the end: the failure,
	// not "exactly max" and not too large.
	buf, err = r.ReadAll(io.MultiReader(bytes.NewReader(make([]byte, testMax)), iotest.ErrReader(cause)), testMax, testMax)
	if !errors.Is(err, cause) || buf == nil || len(buf.B) != testMax {
		t.Fatalf("failure at the limit: %v", err)
	}
	r.Put(buf)
	w.empty(t, "source error at the limit")
}

// TestWithoutBudget: a Reader without a budget reads and refuses the same,
// reserving nothing, and every budget operation succeeds.
func TestWithoutBudget(t *testing.T) {
	r := NewReader(testMax)
	if r.Budgeted() || r.Limit() != 0 {
		t.Fatalf("Budgeted %v, Limit %d", r.Budgeted(), r.Limit())
	}
	a, b := r.Get(10), r.Get(10)
	if !r.Reserve(a, 1<<40) || !r.ReserveBelow(a, 1<<40, 0) || !r.Move(a, b, 1<<40) ||
		!r.ReserveWait(context.Background(), a, 1<<40, time.Now()) || a.Reserved() != 0 || b.Reserved() != 0 {
		t.Fatalf("without a budget: reserved %d and %d", a.Reserved(), b.Reserved())
	}
	r.Put(a)
	r.Put(b)
	req, _ := request(gzipped(t, []byte("hello")), "gzip", -1)
	buf, e := r.Read(req)
	if e != nil || string(buf.B) != "hello" || buf.Reserved() != 0 {
		t.Fatalf("%v %q, reserved %d", e, buf.B, buf.Reserved())
	}
	r.Put(buf)
	req, _ = request(make([]byte, testMax+1), "", -1)
	if _, e := r.Read(req); e == nil || e.Status != http.StatusRequestEntityTooLarge {
		t.Fatalf("over the limit: %v", e)
	}
}

// TestMove: Move hands n bytes of reservation on, reserving only what the
// first buffer lacks; if that does not fit nothing changes.
func TestMove(t *testing.T) {
	w := newWatched(100)
	r := NewReader(testMax)
	r.SetBudget(w)
	from, to := r.Get(0), r.Get(0)
	if !r.Reserve(from, 60) {
		t.Fatal("reserve 60")
	}
	// from has enough: its bytes change hands, nothing new is reserved.
	if !r.Move(from, to, 40) || from.Reserved() != 20 || to.Reserved() != 40 || w.Used() != 60 {
		t.Fatalf("move 40 of 60: from %d, to %d, used %d", from.Reserved(), to.Reserved(), w.Used())
	}
	// from lacks 30 of 50: all of its 20 move and 30 are reserved.
	if !r.Move(from, to, 50) || from.Reserved() != 0 || to.Reserved() != 90 || w.Used() != 90 {
		t.Fatalf("move 50 of 20: from %d, to %d, used %d", from.Reserved(), to.Reserved(), w.Used())
	}
	// Does not fit: nothing changes.
	other := r.Get(0)
	if !r.Reserve(other, 5) {
		t.Fatal("reserve 5")
	}
	if r.Move(other, to, 20) || other.Reserved() != 5 || to.Reserved() != 90 || w.Used() != 95 {
		t.Fatalf("move that does not fit: other %d, to %d, used %d", other.Reserved(), to.Reserved(), w.Used())
	}
	r.Put(from)
	r.Put(to)
	r.Put(other)
	w.empty(t, "moves")
}

// TestPoolClasses: buffers come in power-of-two classes from 4 KiB to
// 64 MiB, each at least as large as asked, and a buffer put back and got
// again is empty.
func TestPoolClasses(t *testing.T) {
	for n, want := range map[int]int{0: 0, 1: 0, 4096: 0, 4097: 1, 8192: 1, 8193: 2, 1 << 20: 8, 64 << 20: 14, 1 << 30: 14} {
		if c := classFor(n); c != want {
			t.Errorf("classFor(%d) = %d, want %d", n, c, want)
		}
	}
	r := NewReader(testMax)
	for _, n := range []int{0, 1, 4096, 4097, 100_000, 1 << 20} {
		b := r.Get(n)
		if cap(b.B) < n || len(b.B) != 0 || cap(b.B) != 1<<(classFor(n)+minClassShift) {
			t.Fatalf("Get(%d): len %d cap %d", n, len(b.B), cap(b.B))
		}
		b.B = append(b.B, "dirty"...)
		r.Put(b)
		b = r.Get(n)
		if len(b.B) != 0 || cap(b.B) < n {
			t.Fatalf("Get(%d) again: len %d cap %d", n, len(b.B), cap(b.B))
		}
		// Resliced below its class by a user: never handed out too small.
		b.B = b.B[:0:1]
		r.Put(b)
		if b := r.Get(n); cap(b.B) < n {
			t.Fatalf("Get(%d) after a shrunk buffer: cap %d", n, cap(b.B))
		}
	}
}

// TestConcurrentReads: one Reader serves many requests at once (bodies of
// every kind, some refused) from one budget: each gets its own body, the
// budget is never past its limit, and all of it comes back.
func TestConcurrentReads(t *testing.T) {
	w := newWatched(2 << 20)
	r := NewReader(testMax)
	r.SetBudget(w)
	type kind struct {
		enc  string
		body []byte
		want []byte // nil: refused
	}
	var kinds []kind
	for i := range 4 {
		data := payload(20_000*(i+1), uint64(i))
		kinds = append(kinds, kind{"", data, data}, kind{"gzip", gzipped(t, data), data}, kind{"zstd", zstdStream(t, data), data})
	}
	kinds = append(kinds, kind{"gzip", gzipped(t, make([]byte, 2*testMax)), nil}, kind{"", make([]byte, testMax+1), nil})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 30 {
				k := kinds[(g+i)%len(kinds)]
				req, _ := request(k.body, k.enc, -1)
				buf, e := r.Read(req)
				switch {
				case e != nil && e.Status == http.StatusTooManyRequests:
					// The budget was full for a moment: allowed.
				case k.want == nil && e == nil:
					errs <- fmt.Errorf("%q of %d bytes accepted", k.enc, len(k.body))
					r.Put(buf)
				case k.want != nil && e != nil:
					errs <- fmt.Errorf("%q: %s", k.enc, e.Msg)
				case k.want != nil:
					if !bytes.Equal(buf.B, k.want) {
						errs <- fmt.Errorf("%q: another body came back", k.enc)
					}
					r.Put(buf)
				}
				if u := w.Used(); u > w.Limit() {
					errs <- fmt.Errorf("budget used %d past %d", u, w.Limit())
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	w.empty(t, "after all")
}

// TestSnappyBomb: a snappy block whose header declares more than the limit
// is refused from its header (nothing reserved); a damaged one is a 400
// with its reservation given back.
func TestSnappyBomb(t *testing.T) {
	w := newWatched(1 << 30)
	r := NewReader(testMax)
	r.SetBudget(w)
	big := s2.EncodeSnappy(nil, make([]byte, testMax+1))
	req, _ := request(big, "snappy", int64(len(big)))
	w.reset()
	if _, e := r.Read(req); e == nil || e.Status != http.StatusRequestEntityTooLarge || !strings.Contains(e.Msg, "declares") {
		t.Fatalf("bomb: %+v", e)
	}
	if w.largest > int64(len(big))*2 {
		t.Fatalf("reserved %d for a body of %d that declares too much", w.largest, len(big))
	}
	w.empty(t, "bomb")
	bad := s2.EncodeSnappy(nil, bytes.Repeat([]byte("abcd"), 1000))
	bad = bad[:len(bad)-3]
	req, _ = request(bad, "snappy", int64(len(bad)))
	if _, e := r.Read(req); e == nil || e.Status != http.StatusBadRequest || e.Reason != "corrupt_body" {
		t.Fatalf("damaged: %+v", e)
	}
	w.empty(t, "damaged")
}
