package prom

import (
	"math"

	"google.golang.org/protobuf/encoding/protowire"
)

// pbw appends protobuf to b, never past max bytes: beyond, it stops writing
// and remembers ErrTooLarge. A nested message is opened with a one-byte
// length placeholder and closed by writing its real length, moving the
// body right when the length needs more than a byte (at most 4 more):
// one pass, exact lengths, no size pre-computation.
type pbw struct {
	b   []byte
	max int
	err error
}

func (w *pbw) room(n int) bool {
	if w.err != nil {
		return false
	}
	if len(w.b)+n > w.max {
		w.err = ErrTooLarge
		return false
	}
	return true
}

// open starts message field num; close(mark) ends it.
func (w *pbw) open(num protowire.Number) int {
	if !w.room(protowire.SizeTag(num) + 1) {
		return -1
	}
	w.b = protowire.AppendTag(w.b, num, protowire.BytesType)
	w.b = append(w.b, 0)
	return len(w.b)
}

func (w *pbw) close(mark int) {
	if w.err != nil || mark < 0 {
		return
	}
	n := len(w.b) - mark
	k := protowire.SizeVarint(uint64(n))
	if k > 1 {
		if !w.room(k - 1) {
			return
		}
		w.b = append(w.b, make([]byte, k-1)...)
		copy(w.b[mark+k-1:], w.b[mark:mark+n])
	}
	protowire.AppendVarint(w.b[mark-1:mark-1], uint64(n))
}

func (w *pbw) bytes(num protowire.Number, v []byte) {
	if w.room(protowire.SizeTag(num) + protowire.SizeBytes(len(v))) {
		w.b = protowire.AppendTag(w.b, num, protowire.BytesType)
		w.b = protowire.AppendBytes(w.b, v)
	}
}

func (w *pbw) str(num protowire.Number, v string) {
	if w.room(protowire.SizeTag(num) + protowire.SizeBytes(len(v))) {
		w.b = protowire.AppendTag(w.b, num, protowire.BytesType)
		w.b = protowire.AppendString(w.b, v)
	}
}

func (w *pbw) varint(num protowire.Number, v uint64) {
	if w.room(protowire.SizeTag(num) + protowire.SizeVarint(v)) {
		w.b = protowire.AppendTag(w.b, num, protowire.VarintType)
		w.b = protowire.AppendVarint(w.b, v)
	}
}

func (w *pbw) fixed64(num protowire.Number, v uint64) {
	if w.room(protowire.SizeTag(num) + 8) {
		w.b = protowire.AppendTag(w.b, num, protowire.Fixed64Type)
		w.b = protowire.AppendFixed64(w.b, v)
	}
}

func (w *pbw) double(num protowire.Number, v float64) { w.fixed64(num, math.Float64bits(v)) }

// kv writes a KeyValue with a string AnyValue as field num.
func (w *pbw) kv(num protowire.Number, k, v []byte) {
	m := w.open(num)
	w.bytes(1, k)
	a := w.open(2)
	w.bytes(1, v)
	w.close(a)
	w.close(m)
}

// kvInt writes a KeyValue with an int AnyValue.
func (w *pbw) kvInt(num protowire.Number, k []byte, v int64) {
	m := w.open(num)
	w.bytes(1, k)
	a := w.open(2)
	w.varint(3, uint64(v))
	w.close(a)
	w.close(m)
}
