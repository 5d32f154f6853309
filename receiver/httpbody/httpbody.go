// Package httpbody owns reading HTTP request bodies for ferry's receivers:
// bounded by a byte limit both as sent and after gzip or zstd decompression
// (a compression bomb stops at the limit, before memory grows), into pooled
// buffers that the caller returns with Put once the data is acknowledged.
package httpbody

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
)

// Error is a refused body: the HTTP status, a counter reason and a message.
type Error struct {
	Status int
	Reason string
	Msg    string
}

func (e *Error) Error() string { return e.Msg }

// Reader reads bodies up to a limit. Safe for concurrent use.
type Reader struct {
	max   int64
	bufs  bufPool
	gzipP sync.Pool
	zstdP sync.Pool
}

// NewReader returns a Reader refusing bodies over max bytes.
func NewReader(max int64) *Reader { return &Reader{max: max} }

// Put returns a buffer from Read to the pool. b must not be used after.
func (r *Reader) Put(b *Buf) { r.bufs.put(b) }

// Get returns an empty pooled buffer with room for n bytes.
func (r *Reader) Get(n int) *Buf { return r.bufs.get(n) }

// Read reads and decodes req's body within the limit. On error the
// returned Error says the HTTP status, a counter reason and a message.
func (r *Reader) Read(req *http.Request) (*Buf, *Error) {
	max := r.max
	if req.ContentLength > max {
		return nil, &Error{http.StatusRequestEntityTooLarge, "request_too_large", fmt.Sprintf("body of %d bytes exceeds max_request_bytes (%d)", req.ContentLength, max)}
	}
	enc := strings.ToLower(strings.TrimSpace(req.Header.Get("Content-Encoding")))
	switch enc {
	case "", "identity", "gzip", "zstd":
	default:
		return nil, &Error{http.StatusUnsupportedMediaType, "unsupported_content_encoding", fmt.Sprintf("unsupported Content-Encoding %q: use gzip, zstd or none", enc)}
	}
	raw, err := r.bufs.readAll(req.Body, req.ContentLength, max)
	if err != nil {
		r.bufs.put(raw) // readAll returns its buffer even on error
		if errors.Is(err, errTooLarge) {
			return nil, &Error{http.StatusRequestEntityTooLarge, "request_too_large", fmt.Sprintf("body exceeds max_request_bytes (%d)", max)}
		}
		return nil, &Error{http.StatusBadRequest, "read_error", "reading body: " + err.Error()}
	}
	if enc == "" || enc == "identity" {
		return raw, nil
	}
	defer r.bufs.put(raw)
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
	out, err := r.bufs.readAll(dec, int64(len(raw.B))*4, max)
	if err != nil {
		r.bufs.put(out)
		if errors.Is(err, errTooLarge) || errors.Is(err, zstd.ErrDecoderSizeExceeded) || errors.Is(err, zstd.ErrWindowSizeExceeded) {
			return nil, &Error{http.StatusRequestEntityTooLarge, "request_too_large", fmt.Sprintf("decompressed body exceeds max_request_bytes (%d)", max)}
		}
		return nil, &Error{http.StatusBadRequest, "corrupt_body", fmt.Sprintf("invalid %s body: %v", enc, err)}
	}
	return out, nil
}
