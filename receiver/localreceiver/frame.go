package localreceiver

import (
	"sync"
	"time"

	"github.com/ferryhq/ferry/protocol"
)

// frame is one produce frame between its hand-off and its answer.
type frame struct {
	// finish delivers the answer (a binary connection's Result, a text
	// connection's lines).
	finish   func([]protocol.Range)
	id       uint32
	n        int   // records in the frame
	size     int64 // bytes it counts in flight
	deadline time.Time
	answered bool // guarded by cn.fmu

	// idx maps a batch index to the frame index when some records were
	// refused before the hand-off (nil: the batch is the frame).
	idx []int
	// pre holds the refusals decided before the hand-off (nil: none).
	pre []error

	mu    sync.Mutex
	fails []error // by frame index, from the exporter (nil: none)
}

// reject refuses record i (frame index) before the hand-off.
func (fr *frame) reject(i int, err error) {
	if fr.pre == nil {
		fr.pre = make([]error, fr.n)
		fr.idx = make([]int, i, fr.n)
		for j := range fr.idx {
			fr.idx[j] = j
		}
	}
	fr.pre[i] = err
}

// rejectAll refuses every record not refused already.
func (fr *frame) rejectAll(err error) {
	if fr.pre == nil {
		fr.pre = make([]error, fr.n)
	}
	for i := range fr.pre {
		if fr.pre[i] == nil {
			fr.pre[i] = err
		}
	}
}

// onFailure is the batch's OnFailure: record bi (batch index) failed. It
// runs on the Kafka client's goroutine and only records the outcome.
func (fr *frame) onFailure(bi int, err error) {
	i := bi
	if fr.idx != nil {
		i = fr.idx[bi]
	}
	fr.mu.Lock()
	if fr.fails == nil {
		fr.fails = make([]error, fr.n)
	}
	fr.fails[i] = err
	fr.mu.Unlock()
}

// done is the batch's completion: answer the frame.
func (fr *frame) done(err error) { fr.finish(fr.ranges(err)) }

// ranges describes every record's outcome as runs of equal outcomes.
// batchErr is the batch's error; without per-record failures it applies
// to every record of the batch (a stage that failed the batch as a whole).
func (fr *frame) ranges(batchErr error) []protocol.Range {
	fr.mu.Lock()
	fails := fr.fails
	fr.mu.Unlock()
	if fr.pre == nil && fails == nil && batchErr == nil {
		return []protocol.Range{{Count: uint32(fr.n), Status: protocol.StatusOK}}
	}
	var whole error
	if fails == nil {
		whole = batchErr
	}
	var out []protocol.Range
	for i := 0; i < fr.n; i++ {
		var e error
		switch {
		case fr.pre != nil && fr.pre[i] != nil:
			e = fr.pre[i]
		case fails != nil && fails[i] != nil:
			e = fails[i]
		case fr.pre == nil || fr.pre[i] == nil:
			if whole != nil && !(fr.pre != nil && fr.pre[i] != nil) {
				e = whole
			}
		}
		rg := protocol.Range{Count: 1, Status: protocol.StatusOK}
		if e != nil {
			rg.Status, rg.Reason, rg.Message, rg.RetryAfter = outcome(e)
			if rg.Status == protocol.StatusPermanent {
				rg.RetryAfter = 0
			}
		}
		if k := len(out) - 1; k >= 0 && out[k].Status == rg.Status && out[k].Reason == rg.Reason && out[k].Message == rg.Message {
			out[k].Count++
			continue
		}
		out = append(out, rg)
	}
	return out
}
