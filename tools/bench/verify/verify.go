// Package verify owns ferry-bench's delivery check: sequence ids written
// into record values by produce --seq, the record of which ids a run failed
// to send, and the count of lost, duplicated and out-of-order records that
// consume --verify makes of what it read back.
package verify

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"sync"
)

// Sequence ids let consume --verify check delivery record by record. A value
// starts with
//
//	#<producer>.<stream>.<seq>.
//
// in base 36, then payload bytes up to --record-size. producer is random per
// produce run; stream is the sending worker (one in-order stream of
// requests, so its records must keep their order within a partition); seq
// is unique within the run. The shortest record that holds an id is 16
// bytes, the smallest size Kafka's own perf table uses.
const MinRecord = 16

// AppendSeq writes the id prefix.
func AppendSeq(dst []byte, producer string, stream int, seq int64) []byte {
	dst = append(dst, '#')
	dst = append(dst, producer...)
	dst = append(dst, '.')
	dst = strconv.AppendInt(dst, int64(stream), 36)
	dst = append(dst, '.')
	dst = strconv.AppendInt(dst, seq, 36)
	return append(dst, '.')
}

// ParseSeq reads the id prefix; ok is false for a value without one.
func ParseSeq(v []byte) (producer string, stream int, seq int64, ok bool) {
	if len(v) < 7 || v[0] != '#' {
		return "", 0, 0, false
	}
	v = v[1:]
	var parts [3][]byte
	for i := range parts {
		j := bytes.IndexByte(v, '.')
		if j <= 0 {
			return "", 0, 0, false
		}
		parts[i], v = v[:j], v[j+1:]
	}
	s, err1 := strconv.ParseInt(string(parts[1]), 36, 32)
	q, err2 := strconv.ParseInt(string(parts[2]), 36, 64)
	if err1 != nil || err2 != nil || q < 0 {
		return "", 0, 0, false
	}
	return string(parts[0]), int(s), q, true
}

func NewProducerID() string {
	return strconv.FormatInt(int64(rand.IntN(36*36*36-1296)+1296), 36) // 3 chars
}

// Ledger records which ids a run failed to send; every other id below
// issued was acknowledged. Failures are rare, so ranges stay few.
type Ledger struct {
	mu     sync.Mutex
	failed [][2]int64
}

func (l *Ledger) Fail(from, n int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if k := len(l.failed); k > 0 && l.failed[k-1][1] == from {
		l.failed[k-1][1] = from + n
		return
	}
	l.failed = append(l.failed, [2]int64{from, from + n})
}

// Report is what produce writes for consume --verify (in --report-json).
type Report struct {
	Producer string     `json:"producer"`
	Issued   int64      `json:"issued"`
	Failed   [][2]int64 `json:"failed,omitempty"`
}

// Verifier counts lost, duplicated and out-of-order records. Not safe for
// concurrent use.
type Verifier struct {
	want      *Report // nil: no report; lost is then gaps below the highest id seen
	seen      map[string][]uint64
	last      map[[3]int64]int64 // (stream, partition, producer hash) → last seq
	foreign   int64
	dups      int64
	outOfOrd  int64
	distinct  int64
	producers map[string]int64
}

func New(want *Report) *Verifier {
	return &Verifier{want: want, seen: map[string][]uint64{}, last: map[[3]int64]int64{}, producers: map[string]int64{}}
}

func (v *Verifier) Add(value []byte, partition int32) {
	p, stream, seq, ok := ParseSeq(value)
	if !ok || (v.want != nil && p != v.want.Producer) {
		v.foreign++
		return
	}
	bits := v.seen[p]
	for int64(len(bits))*64 <= seq {
		bits = append(bits, make([]uint64, max(len(bits), 1024))...)
	}
	v.seen[p] = bits
	w, m := seq/64, uint64(1)<<(seq%64)
	if bits[w]&m != 0 {
		v.dups++
	} else {
		bits[w] |= m
		v.distinct++
		v.producers[p] = max(v.producers[p], seq+1)
	}
	ph, _ := strconv.ParseInt(p, 36, 64)
	k := [3]int64{int64(stream), int64(partition), ph}
	if last, ok := v.last[k]; ok && seq < last {
		v.outOfOrd++
	}
	v.last[k] = max(seq, v.last[k])
}

// lost counts acknowledged ids that were not read.
func (v *Verifier) Lost() (lost, unacked int64) {
	count := func(p string, upTo int64, failed [][2]int64) {
		bits := v.seen[p]
		sort.Slice(failed, func(i, j int) bool { return failed[i][0] < failed[j][0] })
		fi := 0
		for s := int64(0); s < upTo; s++ {
			for fi < len(failed) && failed[fi][1] <= s {
				fi++
			}
			isFailed := fi < len(failed) && failed[fi][0] <= s
			present := s/64 < int64(len(bits)) && bits[s/64]&(1<<(s%64)) != 0
			switch {
			case !present && !isFailed:
				lost++
			case present && isFailed:
				unacked++
			}
		}
	}
	if v.want != nil {
		count(v.want.Producer, v.want.Issued, v.want.Failed)
		return
	}
	for p, hi := range v.producers {
		count(p, hi, nil)
	}
	return
}

func (v *Verifier) Summary() string {
	lost, unacked := v.Lost()
	s := fmt.Sprintf("verify: %d distinct, %d lost, %d duplicated, %d out of order", v.distinct, lost, v.dups, v.outOfOrd)
	if unacked > 0 {
		s += fmt.Sprintf(", %d present though their request failed", unacked)
	}
	if v.foreign > 0 {
		s += fmt.Sprintf(", %d without this run's ids", v.foreign)
	}
	return s
}

// Failed returns the id ranges [from, to) that failed to send.
func (l *Ledger) Failed() [][2]int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([][2]int64(nil), l.failed...)
}

// Duplicated is the number of records read more than once.
func (v *Verifier) Duplicated() int64 { return v.dups }

// OutOfOrder is the number of records read after a later one of the same
// stream and partition.
func (v *Verifier) OutOfOrder() int64 { return v.outOfOrd }
