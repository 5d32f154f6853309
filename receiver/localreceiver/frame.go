package localreceiver

import (
	"sync"
	"time"

	"github.com/ferryhq/ferry/protocol"
	"github.com/ferryhq/ferry/receiver"
	"github.com/ferryhq/ferry/record"
)

// frame is one produce frame between its hand-off and its answer.
type frame struct {
	// finish delivers the answer (a binary connection's Result, a text
	// connection's lines).
	finish   func([]protocol.Range, *protocol.Receipt)
	id       uint32
	n        int   // records in the frame
	size     int64 // bytes it counts in flight
	deadline time.Time
	answered bool // guarded by cn.fmu
	est      int  // what the answer is counted as while pending (guarded by cn.fmu)
	// fewWords: words on the first receiver.MaxMessages ranges only (a binary
	// Result; text mode answers each line with its own).
	fewWords bool

	// idx maps a batch index to the frame index when some records were
	// refused before the hand-off (nil: the batch is the frame).
	idx []int
	// pre holds the refusals decided before the hand-off (nil: none).
	pre []error

	mu    sync.Mutex
	fails []error // by frame index, from the exporter (nil: none)

	// rc collects where the records went when the frame asked for a
	// receipt (version 2); only the completion reads it.
	rc *record.Receipt
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

// done is the batch's completion: answer the frame, with its receipt if
// it asked for one. The Receipt is complete here (every record's Ack came
// before) and nothing writes to it any more.
func (fr *frame) done(err error) {
	var rc *protocol.Receipt
	if fr.rc != nil {
		rc = placements(fr.rc)
	}
	fr.finish(fr.ranges(err), rc)
}

// placements turns a batch's receipt into a result's: the acknowledged
// records in record order (the batch's order is the frame's), merged into
// runs of consecutive offsets; or the spool's id.
func placements(rc *record.Receipt) *protocol.Receipt {
	out := &protocol.Receipt{SpoolID: rc.SpoolID}
	for _, r := range rc.Ranges(nil) {
		out.Placements = append(out.Placements, protocol.Placement{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Count: uint32(r.Count)})
	}
	return out
}

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
			if fr.fewWords && len(out) >= receiver.MaxMessages {
				rg.Message = ""
			}
			rg.Message = receiver.ClipMessage(rg.Message)
		}
		if k := len(out) - 1; k >= 0 && out[k].Status == rg.Status && out[k].Reason == rg.Reason && out[k].Message == rg.Message {
			out[k].Count++
			continue
		}
		out = append(out, rg)
	}
	return out
}
