package prom

import (
	"fmt"
	"math"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/ferryhq/ferry/otlp/door"
)

var appendVarint = protowire.AppendVarint

var errBuckets = fmt.Errorf("a native histogram has more buckets on a side than the bound (MaxBucketsPerPoint)")

// nhist is one native histogram as remote write (v1 and v2, same field
// numbers) and the protobuf exposition carry it.
type nhist struct {
	countInt      uint64
	countFloat    float64
	isFloat       bool
	sum           float64
	schema        int32
	zeroThreshold float64
	zeroInt       uint64
	zeroFloat     float64
	pos, neg      side
	resetHint     int32
	ts, start     int64
	custom        []float64
}

type bspan struct {
	offset int32
	length uint32
}

type side struct {
	spans  []bspan
	deltas []int64   // integer histograms: delta to the previous bucket
	counts []float64 // float histograms: absolute
}

func (h *nhist) reset() {
	*h = nhist{pos: side{h.pos.spans[:0], h.pos.deltas[:0], h.pos.counts[:0]}, neg: side{h.neg.spans[:0], h.neg.deltas[:0], h.neg.counts[:0]}, custom: h.custom[:0]}
}

func (h *nhist) count() uint64 {
	if h.isFloat {
		return f2u(h.countFloat)
	}
	return h.countInt
}

func f2u(v float64) uint64 {
	if !(v > 0) || math.IsInf(v, 1) {
		return 0
	}
	return uint64(math.Round(v))
}

// dense expands a side to dense counts from its first bucket index (the
// spans' gaps filled with zeros), at most limit buckets; ok false past it.
func (s *side) dense(isFloat bool, limit int, out []uint64) (first int32, counts []uint64, ok bool) {
	if len(s.spans) == 0 {
		return 0, out[:0], true
	}
	out = out[:0]
	idx := int64(0)
	bi := 0
	var cur int64
	for si, sp := range s.spans {
		if si == 0 {
			idx = int64(sp.offset)
			first = sp.offset
		} else {
			gap := int64(sp.offset)
			if gap < 0 || int64(len(out))+gap > int64(limit) {
				return 0, nil, false
			}
			for range gap {
				out = append(out, 0)
			}
			idx += gap
		}
		if int64(len(out))+int64(sp.length) > int64(limit) {
			return 0, nil, false
		}
		for range sp.length {
			var v uint64
			if isFloat {
				if bi < len(s.counts) {
					v = f2u(s.counts[bi])
				}
			} else if bi < len(s.deltas) {
				cur += s.deltas[bi]
				if cur > 0 {
					v = uint64(cur)
				}
			}
			bi++
			out = append(out, v)
		}
		idx += int64(sp.length)
	}
	return first, out, true
}

// emitNative writes a family of native histograms: exponential histograms
// (schemas -4..8, OTLP scale = schema, OTLP index = Prometheus index - 1),
// or explicit-bound histograms for custom buckets (schema -53).
func (c *conv) emitNative(f *fam, hists func(s *series, fn func(h *nhist)) error) error {
	w := &c.w
	field := fMetricExpHistogram
	if f.nhcb {
		field = fMetricHistogram
	}
	hm := w.open(protowireNum(field))
	var buf []uint64
	for _, si := range f.series {
		s := &c.series[si]
		err := hists(s, func(h *nhist) {
			stale := isStale(h.sum)
			if h.resetHint == 3 {
				c.st.Drop(door.GaugeHistogram, 1)
				return
			}
			if f.nhcb != (h.schema == -53) || (!f.nhcb && (h.schema < -4 || h.schema > 8)) {
				c.st.Drop(door.BadNativeHistogram, 1) // a schema this family is not of
				return
			}
			if f.nhcb {
				_, d, ok := h.pos.dense(h.isFloat, len(h.custom)+1, buf)
				if !ok || len(h.pos.spans) > 0 && h.pos.spans[0].offset < 0 {
					c.st.Drop(door.BadNativeHistogram, 1) // buckets beyond its bounds
					return
				}
				if !c.point() {
					return
				}
				buf = d
				first := int(0)
				if len(h.pos.spans) > 0 {
					first = int(h.pos.spans[0].offset)
				}
				dp := w.open(fDataPoints)
				c.attrs(fHDPAttributes, s, "")
				if h.start != 0 {
					w.fixed64(fNDPStart, uint64(h.start*msToNs))
				}
				w.fixed64(fNDPTime, uint64(h.ts*msToNs))
				w.fixed64(fHDPCount, h.count())
				w.double(fHDPSum, h.sum)
				bc := w.open(fHDPBuckets)
				for i := range len(h.custom) + 1 {
					var v uint64
					if j := i - first; j >= 0 && j < len(d) {
						v = d[j]
					}
					w.appendFixed(v)
				}
				w.close(bc)
				if len(h.custom) > 0 {
					eb := w.open(fHDPBounds)
					for _, b := range h.custom {
						w.appendFixed(math.Float64bits(b))
					}
					w.close(eb)
				}
				if stale {
					w.varint(fHDPFlags, noRecordedValue)
				}
				w.close(dp)
				return
			}
			if !c.point() {
				return
			}
			dp := w.open(fDataPoints)
			c.attrs(fEDPAttributes, s, "")
			if h.start != 0 {
				w.fixed64(fNDPStart, uint64(h.start*msToNs))
			}
			w.fixed64(fNDPTime, uint64(h.ts*msToNs))
			w.fixed64(fEDPCount, h.count())
			w.double(fEDPSum, h.sum)
			w.varint(fEDPScale, uint64(int64(h.schema)<<1^int64(h.schema)>>63))
			zc := h.zeroInt
			if h.isFloat {
				zc = f2u(h.zeroFloat)
			}
			w.fixed64(fEDPZeroCount, zc)
			for i, sd := range []*side{&h.pos, &h.neg} {
				first, d, ok := sd.dense(h.isFloat, MaxBucketsPerPoint, buf)
				if !ok {
					w.err = errBuckets // the request is refused
					return
				}
				buf = d
				if len(d) == 0 {
					continue
				}
				b := w.open(protowireNum(fEDPPositive + i))
				off := int64(first) - 1
				w.varint(1, uint64(off<<1^off>>63))
				bc := w.open(2)
				for _, v := range d {
					if w.room(10) {
						w.b = appendVarint(w.b, v)
					}
				}
				w.close(bc)
				w.close(b)
			}
			if stale {
				w.varint(fEDPFlags, noRecordedValue)
			}
			if h.zeroThreshold != 0 {
				w.double(fEDPZeroThresh, h.zeroThreshold)
			}
			w.close(dp)
		})
		if err != nil {
			return err
		}
		if w.err == errBuckets {
			return errBuckets
		}
	}
	w.varint(fTemporality, cumulative)
	w.close(hm)
	return w.err
}
