package protocol

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"

	"github.com/ferryhq/ferry/lz4frame"
)

// Decompressor returns a reader of body's decompressed bytes (c is lz4 or
// zstd) and a function to call once it is no longer read (its decoder goes
// back to a pool). For a caller that grows its output as it reads, so a
// frame costs what it inflates to rather than the limit; the caller bounds
// the bytes it reads.
func Decompressor(body []byte, c byte) (io.Reader, func(), error) {
	switch c {
	case CompressLZ4:
		lr := lz4Readers.Get().(*lz4.Reader)
		lr.Reset(bytes.NewReader(body))
		return readErr{lr}, func() { lr.Reset(nil); lz4Readers.Put(lr) }, nil
	case CompressZstd:
		zr := zstdReaders.Get().(*zstd.Decoder)
		if err := zr.Reset(bytes.NewReader(body)); err != nil {
			zstdReaders.Put(zr)
			return nil, nil, fmt.Errorf("%w: zstd: %v", ErrMalformed, err)
		}
		return readErr{zr}, func() { _ = zr.Reset(nil); zstdReaders.Put(zr) }, nil
	}
	return nil, nil, fmt.Errorf("%w: unknown compression %d", ErrMalformed, c)
}

// readErr marks a decoder's errors (other than the end) as a malformed body.
type readErr struct{ r io.Reader }

func (e readErr) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil && err != io.EOF {
		err = fmt.Errorf("%w: decompressing: %v", ErrMalformed, err)
	}
	return n, err
}

// Decompress appends the decompressed body to dst, refusing more than max
// bytes of output: a small frame that inflates past the limit (a
// compression bomb) stops at the limit, before memory grows.
func Decompress(dst, body []byte, c byte, max int) ([]byte, error) {
	var r io.Reader
	switch c {
	case CompressNone:
		if len(body) > max {
			return dst, &TooLargeError{What: "produce body", Size: int64(len(body)), Limit: int64(max)}
		}
		return append(dst, body...), nil
	case CompressLZ4:
		lr := lz4Readers.Get().(*lz4.Reader)
		defer lz4Readers.Put(lr)
		lr.Reset(bytes.NewReader(body))
		r = lr
	case CompressZstd:
		zr := zstdReaders.Get().(*zstd.Decoder)
		defer zstdReaders.Put(zr)
		if err := zr.Reset(bytes.NewReader(body)); err != nil {
			return dst, fmt.Errorf("%w: zstd: %v", ErrMalformed, err)
		}
		r = zr
	default:
		return dst, fmt.Errorf("%w: unknown compression %d", ErrMalformed, c)
	}
	// Output is read into dst's capacity, grown only while that is below
	// the limit: a caller that reserved exactly start+max bytes (the
	// budget's accounting, records already pointing into dst) never sees
	// dst move or grow past its reservation. At the limit one more byte
	// decides between "exactly max" and "too large".
	start := len(dst)
	for {
		if len(dst) == min(cap(dst), start+max) {
			if len(dst)-start == max {
				var one [1]byte
				n, err := io.ReadFull(r, one[:])
				if n > 0 {
					return dst[:start], &TooLargeError{What: "decompressed produce body", Size: int64(max + 1), Limit: int64(max)}
				}
				if errors.Is(err, io.EOF) {
					return dst, nil
				}
				return dst[:start], fmt.Errorf("%w: decompressing: %v", ErrMalformed, err)
			}
			dst = append(dst, 0)[:len(dst)]
		}
		n, err := r.Read(dst[len(dst):min(cap(dst), start+max)])
		dst = dst[:len(dst)+n]
		if errors.Is(err, io.EOF) {
			return dst, nil
		}
		if err != nil {
			return dst[:start], fmt.Errorf("%w: decompressing: %v", ErrMalformed, err)
		}
	}
}

// Compress appends src compressed with c to dst.
func Compress(dst, src []byte, c byte) ([]byte, error) {
	switch c {
	case CompressNone:
		return append(dst, src...), nil
	case CompressZstd:
		return zstdEncoder.EncodeAll(src, dst), nil
	case CompressLZ4:
		// ferry's own encoder, the one its Kafka exporter uses (package
		// lz4frame): several times faster than pierrec/lz4's writer; any
		// LZ4 frame reader takes its output.
		return lz4frame.Append(dst, src), nil
	}
	return dst, fmt.Errorf("protocol: unknown compression %d", c)
}

var (
	lz4Readers  = sync.Pool{New: func() any { return lz4.NewReader(nil) }}
	zstdReaders = sync.Pool{New: func() any {
		// A window larger than this is refused rather than allocated
		// (docs/protocol.md: compress with a window of at most 16 MiB).
		d, _ := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true), zstd.WithDecoderMaxWindow(16<<20))
		return d
	}}
	zstdEncoder, _ = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1))
)
