// Package httpbody owns reading HTTP request bodies for ferry's receivers:
// bounded by a byte limit both as sent and after gzip or zstd decompression
// (a compression bomb stops at the limit, before memory grows), into pooled
// buffers that the caller returns with Put once the data is acknowledged.
package httpbody

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"
)

// Error is a refused body: the HTTP status, a counter reason and a message.
type Error struct {
	Status int
	Reason string
	Msg    string
}

func (e *Error) Error() string { return e.Msg }

// Budget is the memory bodies are read into: the queue's, so a body being
// read counts against queue.memory_limit like the data it becomes.
type Budget interface {
	Reserve(n, ceiling int64) bool
	Release(n int64)
	Limit() int64
	// Wait blocks until some bytes are released, until, or ctx ends.
	Wait(ctx context.Context, until time.Time)
}

// Reader reads bodies up to a limit. Safe for concurrent use.
type Reader struct {
	max    int64
	budget Budget
	growF  func(*Buf, int) error
	bufs   bufPool
	gzipP  sync.Pool
	zstdP  sync.Pool
}

// NewReader returns a Reader refusing bodies over max bytes.
func NewReader(max int64) *Reader { return &Reader{max: max} }

// SetBudget makes every body reserve its buffer from b before it is read
// (the declared Content-Length at once, then each growth), so clients that
// send bodies slowly, or hold the last byte, cannot hold more memory than
// the budget; a body that does not fit is refused with 429. Call before
// serving.
func (r *Reader) SetBudget(b Budget) { r.budget, r.growF = b, r.grow }

// Budgeted reports whether a budget is set.
func (r *Reader) Budgeted() bool { return r.budget != nil }

// Reserve takes n bytes of the budget for b (a buffer from Get); false if
// they do not fit. Without a budget it always succeeds.
func (r *Reader) Reserve(b *Buf, n int64) bool {
	if r.budget == nil {
		return true
	}
	return r.ReserveBelow(b, n, r.budget.Limit())
}

// ReserveBelow is Reserve while the budget's total stays at or below
// ceiling: a first step that must leave room for the second.
func (r *Reader) ReserveBelow(b *Buf, n, ceiling int64) bool {
	if r.budget == nil {
		return true
	}
	if !r.budget.Reserve(n, ceiling) {
		return false
	}
	b.reserved += n
	return true
}

// Limit returns the budget's bound (0 without one).
func (r *Reader) Limit() int64 {
	if r.budget == nil {
		return 0
	}
	return r.budget.Limit()
}

// ReserveWait is Reserve, waiting until the deadline for room to be
// released; false if none came by then or ctx ended.
func (r *Reader) ReserveWait(ctx context.Context, b *Buf, n int64, until time.Time) bool {
	for !r.Reserve(b, n) {
		if ctx.Err() != nil || !time.Now().Before(until) {
			return false
		}
		r.budget.Wait(ctx, until)
	}
	return true
}

// Move makes n bytes of to's reservation out of from's (what from holds
// beyond n stays with it), reserving only what from lacks; false, and
// nothing changed, if that does not fit. A request that reserved its
// largest size before reading hands its real size on this way, so it
// never needs both at once.
func (r *Reader) Move(from, to *Buf, n int64) bool {
	if r.budget == nil {
		return true
	}
	take := min(n, from.reserved)
	if take < n && !r.Reserve(to, n-take) {
		return false
	}
	from.reserved -= take
	to.reserved += take
	return true
}

// Release gives back b's reservation, when the data is handed to a stage
// that accounts for it itself (the queue reserves the whole batch).
func (r *Reader) Release(b *Buf) {
	if b != nil && b.reserved != 0 {
		r.budget.Release(b.reserved)
		b.reserved = 0
	}
}

// Put returns a buffer from Read to the pool, and its reservation to the
// budget. b must not be used after.
func (r *Reader) Put(b *Buf) {
	r.Release(b)
	r.bufs.put(b)
}

// grow reserves the capacity of a new buffer nb while the old one (of
// capacity old) is still held.
func (r *Reader) grow(nb *Buf, old int) error {
	if r.budget == nil {
		return nil
	}
	if !r.Reserve(nb, int64(cap(nb.B))) {
		return errNoRoom
	}
	return nil
}

// ReadAll reads src into a buffer that starts at hint bytes and grows, each
// step reserved from the budget, up to max: what src really holds is
// charged, not max. Errors: ErrNoRoom (the budget is full), ErrTooLarge
// (more than max), or src's own. The buffer comes back on error too (give
// it to Put).
func (r *Reader) ReadAll(src io.Reader, hint, max int64) (*Buf, error) {
	b, err := r.bufs.readAll(src, hint, max, r.growF, r.Release)
	if err == nil {
		r.trim(b)
	}
	return b, err
}

// trim gives back what a buffer grown step by step still holds for the
// smaller buffers it replaced (they went back to the pool): what is left
// reserved is the buffer's own capacity.
func (r *Reader) trim(b *Buf) {
	if r.budget != nil && b.reserved > int64(cap(b.B)) {
		r.budget.Release(b.reserved - int64(cap(b.B)))
		b.reserved = int64(cap(b.B))
	}
}

// ErrTooLarge: ReadAll's source held more than its max.
var ErrTooLarge = errTooLarge

// ErrNoRoom: a buffer's reservation did not fit in the budget.
var ErrNoRoom = errNoRoom

// errFull is a body refused because its memory does not fit.
func errFull() *Error {
	return &Error{Status: http.StatusTooManyRequests, Reason: "queue_full",
		Msg: "ferry's buffer is full; retry later"}
}

// Get returns an empty pooled buffer with room for n bytes.
func (r *Reader) Get(n int) *Buf { return r.bufs.get(n) }

// GetReserved is Get(n) with the buffer's capacity reserved first; false,
// and no buffer taken, if it does not fit. A body refused for room then
// costs no buffer (Get before Reserve took, or made, one of the body's size
// only to give it back: under a full budget, a burst of refused 8 MiB
// requests each made an 8 MiB buffer outside the budget).
func (r *Reader) GetReserved(n int) (*Buf, bool) {
	return r.getWith(n, nil, func(k int64) bool { return r.budget.Reserve(k, r.budget.Limit()) })
}

// CouldReserve says whether the budget could ever hold a buffer of n
// bytes beside what with holds (nil: nothing).
func (r *Reader) CouldReserve(n int, with *Buf) bool {
	if r.budget == nil {
		return true
	}
	held := int64(0)
	if with != nil {
		held = with.reserved
	}
	return int64(classCap(n))+held <= r.budget.Limit()
}

// GetMoved is GetReserved whose room is taken from from's reservation
// first (as Move), reserving only what from lacks.
func (r *Reader) GetMoved(from *Buf, n int) (*Buf, bool) {
	return r.getWith(n, from, func(k int64) bool {
		take := min(k, from.reserved)
		if take < k && !r.budget.Reserve(k-take, r.budget.Limit()) {
			return false
		}
		from.reserved -= take
		return true
	})
}

// getWith reserves, with reserve, the capacity get(n) makes a buffer with,
// then takes one, and settles the reservation to the capacity it got (a
// pooled buffer may be smaller, one of a limit that is not a power of two,
// or larger).
func (r *Reader) getWith(n int, from *Buf, reserve func(int64) bool) (*Buf, bool) {
	if r.budget == nil {
		return r.bufs.get(n), true
	}
	want := int64(classCap(n))
	if !reserve(want) {
		return nil, false
	}
	b := r.bufs.get(n)
	if !r.settle(b, want, from) {
		return nil, false
	}
	return b, true
}

// settle makes b, whose capacity want bytes were reserved for, hold a
// reservation of exactly its capacity; false (b put back, nothing held) if
// a larger one does not fit. What b does not need goes back to from, the
// lease it came from, if any (else to the budget).
func (r *Reader) settle(b *Buf, want int64, from *Buf) bool {
	b.reserved = want
	switch c := int64(cap(b.B)); {
	case c < want:
		if from != nil {
			from.reserved += want - c
		} else {
			r.budget.Release(want - c)
		}
		b.reserved = c
	case c > want && !r.Reserve(b, c-want):
		r.Put(b)
		return false
	}
	return true
}

// GetReservedWait is GetReserved, waiting until the deadline for room to be
// released; false if none came by then or ctx ended. The waiter holds no
// buffer while it waits.
func (r *Reader) GetReservedWait(ctx context.Context, n int, until time.Time) (*Buf, bool) {
	for {
		if b, ok := r.GetReserved(n); ok {
			return b, true
		}
		if ctx.Err() != nil || !time.Now().Before(until) {
			return nil, false
		}
		r.budget.Wait(ctx, until)
	}
}

// Read reads and decodes req's body within the limit. On error the
// returned Error says the HTTP status, a counter reason and a message.
func (r *Reader) Read(req *http.Request) (*Buf, *Error) {
	max := r.max
	if req.ContentLength > max {
		return nil, &Error{http.StatusRequestEntityTooLarge, "request_too_large", fmt.Sprintf("body of %d bytes exceeds max_request_bytes (%d)", req.ContentLength, max)}
	}
	enc := strings.ToLower(strings.TrimSpace(req.Header.Get("Content-Encoding")))
	switch enc {
	case "", "identity", "gzip", "zstd", "snappy":
	default:
		return nil, &Error{http.StatusUnsupportedMediaType, "unsupported_content_encoding", fmt.Sprintf("unsupported Content-Encoding %q: use gzip, zstd, snappy or none", enc)}
	}
	raw, err := r.bufs.readAll(req.Body, req.ContentLength, max, r.growF, r.Release)
	if err != nil {
		r.Put(raw) // readAll returns its buffer even on error
		if errors.Is(err, errNoRoom) {
			return nil, errFull()
		}
		if errors.Is(err, errTooLarge) {
			return nil, &Error{http.StatusRequestEntityTooLarge, "request_too_large", fmt.Sprintf("body exceeds max_request_bytes (%d)", max)}
		}
		return nil, &Error{http.StatusBadRequest, "read_error", "reading body: " + err.Error()}
	}
	if enc == "" || enc == "identity" {
		return raw, nil
	}
	defer r.Put(raw)
	if enc == "snappy" {
		return r.snappy(raw, max)
	}
	var dec io.Reader
	switch enc {
	case "gzip":
		zr, _ := r.gzipP.Get().(*gzip.Reader)
		var err error
		if zr == nil {
			zr, err = gzip.NewReader(bytes.NewReader(raw.B))
		} else {
			err = zr.Reset(bytes.NewReader(raw.B))
		}
		if err != nil {
			return nil, &Error{http.StatusBadRequest, "corrupt_body", "invalid gzip body: " + err.Error()}
		}
		defer r.gzipP.Put(zr)
		dec = zr
	case "zstd":
		zr, _ := r.zstdP.Get().(*zstd.Decoder)
		if zr == nil {
			zr, _ = zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(uint64(max)+1))
		}
		if err := zr.Reset(bytes.NewReader(raw.B)); err != nil {
			r.zstdP.Put(zr)
			if errors.Is(err, zstd.ErrDecoderSizeExceeded) || errors.Is(err, zstd.ErrWindowSizeExceeded) {
				return nil, &Error{http.StatusRequestEntityTooLarge, "request_too_large", fmt.Sprintf("zstd frame declares more than max_request_bytes (%d)", max)}
			}
			return nil, &Error{http.StatusBadRequest, "corrupt_body", "invalid zstd body: " + err.Error()}
		}
		defer func() { _ = zr.Reset(nil); r.zstdP.Put(zr) }()
		dec = zr
	}
	out, err := r.bufs.readAll(dec, int64(len(raw.B))*4, max, r.growF, r.Release)
	if err == nil {
		r.trim(out)
	}
	if err != nil {
		r.Put(out)
		if errors.Is(err, errNoRoom) {
			return nil, errFull()
		}
		if errors.Is(err, errTooLarge) || errors.Is(err, zstd.ErrDecoderSizeExceeded) || errors.Is(err, zstd.ErrWindowSizeExceeded) {
			return nil, &Error{http.StatusRequestEntityTooLarge, "request_too_large", fmt.Sprintf("decompressed body exceeds max_request_bytes (%d)", max)}
		}
		return nil, &Error{http.StatusBadRequest, "corrupt_body", fmt.Sprintf("invalid %s body: %v", enc, err)}
	}
	return out, nil
}

// snappy decodes a snappy block (Prometheus remote write's body): its
// header states the decoded length, which is checked against max and
// reserved before a byte is decoded, so a small body that claims a large
// one costs nothing.
func (r *Reader) snappy(raw *Buf, max int64) (*Buf, *Error) {
	n, err := s2.DecodedLen(raw.B)
	if err != nil {
		return nil, &Error{http.StatusBadRequest, "corrupt_body", "invalid snappy body: " + err.Error()}
	}
	if int64(n) > max {
		return nil, &Error{http.StatusRequestEntityTooLarge, "request_too_large", fmt.Sprintf("snappy body declares %d bytes, over max_request_bytes (%d)", n, max)}
	}
	out := r.bufs.getAtMost(n, max)
	if r.budget != nil && !r.Reserve(out, int64(cap(out.B))) {
		r.Put(out)
		return nil, errFull()
	}
	b, err := s2.Decode(out.B[:n], raw.B)
	if err != nil {
		r.Put(out)
		return nil, &Error{http.StatusBadRequest, "corrupt_body", "invalid snappy body: " + err.Error()}
	}
	out.B = b
	return out, nil
}
