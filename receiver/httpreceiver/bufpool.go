package httpreceiver

import (
	"errors"
	"io"
	"math/bits"
	"sync"
)

var errTooLarge = errors.New("body too large")

// buf is a pooled body buffer. It is a pointer so a pool round trip does
// not allocate a slice header.
type buf struct {
	b     []byte
	class int
}

// bufPool keeps body buffers in power-of-two size classes from 4 KiB to
// 64 MiB, so a steady load reuses buffers instead of churning the heap.
type bufPool struct {
	classes [15]sync.Pool
}

const minClassShift = 12

func classFor(n int) int {
	if n <= 1<<minClassShift {
		return 0
	}
	return min(bits.Len(uint(n-1))-minClassShift, 14)
}

func (p *bufPool) get(n int) *buf {
	c := classFor(n)
	if v := p.classes[c].Get(); v != nil {
		b := v.(*buf)
		b.b = b.b[:0]
		return b
	}
	size := 1 << (c + minClassShift)
	if size < n {
		size = n
	}
	return &buf{b: make([]byte, 0, size), class: c}
}

func (p *bufPool) put(b *buf) {
	if b == nil {
		return
	}
	p.classes[b.class].Put(b)
}

// readAll reads r into a pooled buffer sized from hint, refusing more than
// max bytes. It always returns the buffer (also on error) for put.
func (p *bufPool) readAll(r io.Reader, hint, max int64) (*buf, error) {
	if hint <= 0 {
		hint = 16 << 10
	}
	b := p.get(int(min(hint, max+1)))
	for {
		if len(b.b) == cap(b.b) {
			if int64(len(b.b)) > max {
				return b, errTooLarge
			}
			nb := p.get(min(2*cap(b.b), int(max)+1))
			nb.b = append(nb.b, b.b...)
			p.put(b)
			b = nb
		}
		n, err := r.Read(b.b[len(b.b):cap(b.b)])
		b.b = b.b[:len(b.b)+n]
		if int64(len(b.b)) > max {
			return b, errTooLarge
		}
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
}
