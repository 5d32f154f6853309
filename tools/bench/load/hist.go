package load

import (
	"math/bits"
	"sync/atomic"
	"time"
)

// hist is a lock-free latency histogram in microseconds exact below 64 µs
// and 32 linear sub-buckets per power of two above (≤3% error), so percentiles of millions of
// samples cost a fixed 20 KiB and one atomic add per sample.
type hist struct {
	counts [64 * 40]atomic.Uint64
	n      atomic.Uint64
	sumUS  atomic.Uint64
	maxUS  atomic.Uint64
}

func bucketOf(us uint64) int {
	if us < 64 {
		return int(us)
	}
	e := bits.Len64(us) - 6 // keep the top 6 bits: m in [32, 64)
	m := us >> uint(e)
	return 64 + (e-1)*32 + int(m-32)
}

// bucketValue is the midpoint of bucket i.
func bucketValue(i int) uint64 {
	if i < 64 {
		return uint64(i)
	}
	e := (i-64)/32 + 1
	m := uint64((i-64)%32 + 32)
	return m<<uint(e) + (uint64(1)<<uint(e))/2
}

// add records d for weight samples (a request of n records: n samples).
func (h *hist) add(d time.Duration, weight int) {
	us := uint64(d.Microseconds())
	b := bucketOf(us)
	if b >= len(h.counts) {
		b = len(h.counts) - 1
	}
	h.counts[b].Add(uint64(weight))
	h.n.Add(uint64(weight))
	h.sumUS.Add(us * uint64(weight))
	for {
		m := h.maxUS.Load()
		if us <= m || h.maxUS.CompareAndSwap(m, us) {
			break
		}
	}
}

// quantile returns the q-th latency (0 < q < 1).
func (h *hist) quantile(q float64) time.Duration {
	total := h.n.Load()
	if total == 0 {
		return 0
	}
	want := uint64(float64(total) * q)
	var seen uint64
	for i := range h.counts {
		seen += h.counts[i].Load()
		if seen > want {
			return time.Duration(bucketValue(i)) * time.Microsecond
		}
	}
	return time.Duration(h.maxUS.Load()) * time.Microsecond
}

func (h *hist) mean() time.Duration {
	n := h.n.Load()
	if n == 0 {
		return 0
	}
	return time.Duration(h.sumUS.Load()/n) * time.Microsecond
}

func (h *hist) max() time.Duration { return time.Duration(h.maxUS.Load()) * time.Microsecond }
