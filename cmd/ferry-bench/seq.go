package main

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"sync"
	"time"
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
const minSeqRecord = 16

// appendSeq writes the id prefix.
func appendSeq(dst []byte, producer string, stream int, seq int64) []byte {
	dst = append(dst, '#')
	dst = append(dst, producer...)
	dst = append(dst, '.')
	dst = strconv.AppendInt(dst, int64(stream), 36)
	dst = append(dst, '.')
	dst = strconv.AppendInt(dst, seq, 36)
	return append(dst, '.')
}

// parseSeq reads the id prefix; ok is false for a value without one.
func parseSeq(v []byte) (producer string, stream int, seq int64, ok bool) {
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

func newProducerID() string {
	return strconv.FormatInt(int64(rand.IntN(36*36*36-1296)+1296), 36) // 3 chars
}

// seqLedger records which ids a run failed to send; every other id below
// issued was acknowledged. Failures are rare, so ranges stay few.
type seqLedger struct {
	mu     sync.Mutex
	failed [][2]int64
}

func (l *seqLedger) fail(from, n int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if k := len(l.failed); k > 0 && l.failed[k-1][1] == from {
		l.failed[k-1][1] = from + n
		return
	}
	l.failed = append(l.failed, [2]int64{from, from + n})
}

// seqReport is what produce writes for consume --verify (in --report-json).
type seqReport struct {
	Producer string     `json:"producer"`
	Issued   int64      `json:"issued"`
	Failed   [][2]int64 `json:"failed,omitempty"`
}

// verifier counts lost, duplicated and out-of-order records.
type verifier struct {
	want      *seqReport // nil: no report; lost is then gaps below the highest id seen
	seen      map[string][]uint64
	last      map[[3]int64]int64 // (stream, partition, producer hash) → last seq
	foreign   int64
	dups      int64
	outOfOrd  int64
	distinct  int64
	producers map[string]int64
}

func newVerifier(want *seqReport) *verifier {
	return &verifier{want: want, seen: map[string][]uint64{}, last: map[[3]int64]int64{}, producers: map[string]int64{}}
}

func (v *verifier) add(value []byte, partition int32) {
	p, stream, seq, ok := parseSeq(value)
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
func (v *verifier) lost() (lost, unacked int64) {
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

func (v *verifier) summary() string {
	lost, unacked := v.lost()
	s := fmt.Sprintf("verify: %d distinct, %d lost, %d duplicated, %d out of order", v.distinct, lost, v.dups, v.outOfOrd)
	if unacked > 0 {
		s += fmt.Sprintf(", %d present though their request failed", unacked)
	}
	if v.foreign > 0 {
		s += fmt.Sprintf(", %d without this run's ids", v.foreign)
	}
	return s
}

// isTTY reports whether f is a terminal, for a live progress bar.
func isTTY(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// bar draws "[#####.....] done/total what  rate/s  elapsed  ETA" on one
// terminal line.
func bar(done, total int64, what string, elapsed time.Duration, rate float64) string {
	const width = 24
	frac := 0.0
	if total > 0 {
		frac = min(1, float64(done)/float64(total))
	}
	filled := int(frac * width)
	eta := "?"
	if rate > 0 && total > 0 {
		eta = (time.Duration(float64(total-done)/rate) * time.Second).Round(time.Second).String()
	}
	return fmt.Sprintf("\r[%s%s] %s/%s %s  %s/s  %s  ETA %s   ", bytes.Repeat([]byte("#"), filled), bytes.Repeat([]byte("."), width-filled),
		human(float64(done)), human(float64(total)), what, human(rate), elapsed.Round(time.Second), eta)
}

func human(v float64) string {
	switch {
	case v >= 1e9:
		return fmt.Sprintf("%.2fG", v/1e9)
	case v >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.1fk", v/1e3)
	}
	return fmt.Sprintf("%.0f", v)
}
