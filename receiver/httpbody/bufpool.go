package httpbody

import (
	"errors"
	"io"
	"math/bits"
	"sync"
)

var (
	errTooLarge = errors.New("body too large")
	errNoRoom   = errors.New("no room in the memory budget")
)

// Buf is a pooled body buffer. It is a pointer so a pool round trip does
// not allocate a slice header.
type Buf struct {
	B     []byte
	class int
	// reserved: bytes of the memory budget this buffer holds, given back
	// by Release or Put.
	reserved int64
}

// Reserved returns the bytes of the memory budget b holds.
func (b *Buf) Reserved() int64 { return b.reserved }

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

// classCap is the capacity get(n) gives a buffer it makes.
func classCap(n int) int { return max(1<<(classFor(n)+minClassShift), n) }

func (p *bufPool) get(n int) *Buf {
	c := classFor(n)
	if v := p.classes[c].Get(); v != nil {
		b := v.(*Buf)
		// A buffer resliced below its class by a user is not reused.
		if cap(b.B) >= n {
			b.B = b.B[:0]
			return b
		}
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

// getAtMost is get(n) with no more than max bytes of capacity: a limit
// that is not a power of two (10MB) must not cost the next size class.
func (p *bufPool) getAtMost(n int, max int64) *Buf {
	b := p.get(n)
	if int64(cap(b.B)) > max && int64(n) <= max {
		p.put(b)
		b = &Buf{B: make([]byte, 0, max), class: classFor(int(max))}
	}
	return b
}

// readAll reads r into a pooled buffer sized from hint, refusing more than
// max bytes. grow, if not nil, is asked before a buffer of a new capacity
// is taken (with the old one, both are held for the copy) and may refuse
// with errNoRoom; release then gives back the old buffer's reservation once
// its bytes are copied. A full buffer is grown only when the body has
// more: one byte is read first, so a body that fills its buffer exactly
// (its Content-Length) costs that buffer and no more. It always returns
// the buffer (also on error) for put.
func (p *bufPool) readAll(r io.Reader, hint, max int64, grow func(b *Buf, old int) error, release func(*Buf)) (*Buf, error) {
	if hint <= 0 {
		hint = 16 << 10
	}
	b := p.getAtMost(int(min(hint, max)), max)
	if grow != nil {
		if err := grow(b, 0); err != nil {
			return b, err
		}
	}
	for {
		if len(b.B) == cap(b.B) {
			if int64(len(b.B)) > max {
				return b, errTooLarge
			}
			// Full: one more byte decides between "that was all" and a
			// bigger buffer (at the limit: too large), so no buffer is
			// taken that the body does not need.
			var one [1]byte
			n, err := io.ReadFull(r, one[:])
			switch {
			case n == 0 && errors.Is(err, io.EOF):
				return b, nil
			case n == 0:
				return b, err
			case int64(len(b.B)) == max:
				return b, errTooLarge
			}
			nb := p.getAtMost(min(2*cap(b.B), int(max)), max)
			if grow != nil {
				if err := grow(nb, cap(b.B)); err != nil {
					p.put(nb)
					return b, err
				}
			}
			nb.B = append(append(nb.B, b.B...), one[0])
			if release != nil {
				release(b)
			}
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
