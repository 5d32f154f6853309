package httpbody

import (
	"errors"
	"io"
	"math/bits"
	"sync"
)

var errTooLarge = errors.New("body too large")

// Buf is a pooled body buffer. It is a pointer so a pool round trip does
// not allocate a slice header.
type Buf struct {
	B     []byte
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

func (p *bufPool) get(n int) *Buf {
	c := classFor(n)
	if v := p.classes[c].Get(); v != nil {
		b := v.(*Buf)
		b.B = b.B[:0]
		return b
	}
	size := 1 << (c + minClassShift)
	if size < n {
		size = n
	}
	return &Buf{B: make([]byte, 0, size), class: c}
}

func (p *bufPool) put(b *Buf) {
	if b == nil {
		return
	}
	p.classes[b.class].Put(b)
}

// readAll reads r into a pooled buffer sized from hint, refusing more than
// max bytes. It always returns the buffer (also on error) for put.
func (p *bufPool) readAll(r io.Reader, hint, max int64) (*Buf, error) {
	if hint <= 0 {
		hint = 16 << 10
	}
	b := p.get(int(min(hint, max+1)))
	for {
		if len(b.B) == cap(b.B) {
			if int64(len(b.B)) > max {
				return b, errTooLarge
			}
			nb := p.get(min(2*cap(b.B), int(max)+1))
			nb.B = append(nb.B, b.B...)
			p.put(b)
			b = nb
		}
		n, err := r.Read(b.B[len(b.B):cap(b.B)])
		b.B = b.B[:len(b.B)+n]
		if int64(len(b.B)) > max {
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
