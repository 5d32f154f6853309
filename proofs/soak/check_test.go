package soak

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/tools/bench/proc"
)

// verdict is what the read_committed consumer found for one source.
type verdict struct {
	offered, acked  int64
	delivered       int64 // distinct ids in Kafka
	lost            int64 // acknowledged, not in Kafka
	ackedDups       int64 // extra copies of acknowledged ids
	unackedIn       int64 // ids never acknowledged that are in Kafka
	unackedTwice    int64 // ids never acknowledged in Kafka more than once
	unknown         int64 // records whose id was never offered, or unreadable
	firstLost       int64 // the first lost seq, -1 if none
	firstAckedTwice int64 // the first acknowledged id seen twice, -1 if none
}

// check reads the whole topic with isolation read_committed until every
// acknowledged id has arrived (or timeout passed), then until nothing has
// come for idle, and judges every id of every source.
func check(t *testing.T, brokers, topic string, ledgers []*ledger, timeout, idle time.Duration) ([]verdict, time.Duration) {
	t.Helper()
	start := time.Now()
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokers, ",")...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxBytes(64<<20))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	seen := make([][]uint8, len(ledgers))
	var unknown [nSources]int64
	var missing int64
	for _, l := range ledgers {
		missing += l.ackedN.Load()
	}
	deadline := time.Now().Add(timeout)
	lastRecord := time.Now()
	for time.Now().Before(deadline) {
		if missing == 0 && time.Since(lastRecord) > idle {
			break
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		fetches := cl.PollFetches(ctx)
		cancel()
		fetches.EachRecord(func(r *kgo.Record) {
			lastRecord = time.Now()
			src, seq, ok := parseID(r.Value)
			if !ok || src >= len(ledgers) {
				unknown[0]++
				return
			}
			if int64(seq) >= ledgers[src].offered.Load() {
				unknown[src]++
				return
			}
			for len(seen[src]) <= seq {
				seen[src] = append(seen[src], 0)
			}
			if seen[src][seq] < 255 {
				seen[src][seq]++
			}
			if seen[src][seq] == 1 && ledgers[src].isAcked(seq) {
				missing--
			}
		})
	}
	out := make([]verdict, len(ledgers))
	for src, l := range ledgers {
		v := verdict{offered: l.offered.Load(), acked: l.ackedN.Load(), unknown: unknown[src], firstLost: -1, firstAckedTwice: -1}
		l.mu.Lock()
		for seq := 0; int64(seq) < v.offered; seq++ {
			n := 0
			if seq < len(seen[src]) {
				n = int(seen[src][seq])
			}
			acked := seq < len(l.acked) && l.acked[seq]
			if n > 0 {
				v.delivered++
			}
			switch {
			case acked && n == 0:
				v.lost++
				if v.firstLost < 0 {
					v.firstLost = int64(seq)
				}
			case acked && n > 1:
				v.ackedDups += int64(n - 1)
				if v.firstAckedTwice < 0 {
					v.firstAckedTwice = int64(seq)
				}
			case !acked && n > 0:
				v.unackedIn++
				if n > 1 {
					v.unackedTwice++
				}
			}
		}
		l.mu.Unlock()
		out[src] = v
	}
	return out, time.Since(start)
}

func parseID(v []byte) (src, seq int, ok bool) {
	i := bytes.IndexByte(v, ':')
	if i <= 0 {
		return 0, 0, false
	}
	j := bytes.IndexByte(v[i+1:], ':')
	if j <= 0 {
		return 0, 0, false
	}
	src, err1 := strconv.Atoi(string(v[:i]))
	seq, err2 := strconv.Atoi(string(v[i+1 : i+1+j]))
	return src, seq, err1 == nil && err2 == nil && src >= 0 && seq >= 0
}

// ---- the leak check ----

// sample is the agent's footprint at one moment.
type sample struct {
	at         time.Duration // since the load started
	rss        int64
	goroutines float64
	fds        int
	spool      int64
}

type sampler struct {
	mu      sync.Mutex
	samples []sample
}

func (s *sampler) add(x sample) {
	s.mu.Lock()
	s.samples = append(s.samples, x)
	s.mu.Unlock()
}

func (s *sampler) last() (sample, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.samples) == 0 {
		return sample{}, false
	}
	return s.samples[len(s.samples)-1], true
}

func rssOf(pid int) int64 { return proc.StatusKB(pid, "VmRSS") << 10 }

func fdsOf(pid int) int {
	es, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return -1
	}
	return len(es)
}

// dirBytes is what the spool's files hold (the disk filler aside).
func dirBytes(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasPrefix(d.Name(), "soak-disk-filler") {
			return nil
		}
		if fi, err := d.Info(); err == nil {
			n += fi.Size()
		}
		return nil
	})
	return n
}

// spoolBytes is dirBytes of a spool directory, and of that the bytes of
// its idempotency key logs (dedup-*.log).
func spoolBytes(dir string) (all, keys int64) {
	all = dirBytes(dir)
	logs, _ := filepath.Glob(filepath.Join(dir, "dedup-*.log"))
	for _, f := range logs {
		if fi, err := os.Stat(f); err == nil {
			keys += fi.Size()
		}
	}
	return all, keys
}

// leakBounds: after warm-up, the median of the last fifth of the soak may
// exceed the median of the fifth after warm-up by at most this factor plus
// this slack (agent restarts and broker faults move the figures; a leak
// grows with time and passes any fixed bound in a long enough soak).
const (
	leakFactor     = 1.5
	leakRSSSlack   = 64 << 20
	leakCountSlack = 50
)

type leakResult struct {
	rss0, rss1     int64
	gor0, gor1     float64
	fds0, fds1     int
	spool0, spool1 int64
	problems       []string
}

func (r leakResult) String() string {
	return fmt.Sprintf("RSS %.0f→%.0f MiB, goroutines %.0f→%.0f, open files %d→%d, spool %.1f→%.1f MiB",
		mib(r.rss0), mib(r.rss1), r.gor0, r.gor1, r.fds0, r.fds1, mib(r.spool0), mib(r.spool1))
}

// leaks compares the window after warm-up with the last one.
func leaks(samples []sample, total time.Duration) leakResult {
	warm := total / 4
	var base, end []sample
	for _, s := range samples {
		switch {
		case s.at >= warm && s.at < warm+total/5:
			base = append(base, s)
		case s.at >= total-total/5 && s.at <= total:
			end = append(end, s)
		}
	}
	var r leakResult
	if len(base) < 3 || len(end) < 3 {
		r.problems = append(r.problems, fmt.Sprintf("too few samples for the leak check (%d after warm-up, %d at the end)", len(base), len(end)))
		return r
	}
	med := func(ss []sample, f func(sample) float64) float64 {
		v := make([]float64, len(ss))
		for i, s := range ss {
			v[i] = f(s)
		}
		sort.Float64s(v)
		return v[len(v)/2]
	}
	r.rss0, r.rss1 = int64(med(base, func(s sample) float64 { return float64(s.rss) })), int64(med(end, func(s sample) float64 { return float64(s.rss) }))
	r.gor0, r.gor1 = med(base, func(s sample) float64 { return s.goroutines }), med(end, func(s sample) float64 { return s.goroutines })
	r.fds0, r.fds1 = int(med(base, func(s sample) float64 { return float64(s.fds) })), int(med(end, func(s sample) float64 { return float64(s.fds) }))
	r.spool0, r.spool1 = int64(med(base, func(s sample) float64 { return float64(s.spool) })), int64(med(end, func(s sample) float64 { return float64(s.spool) }))
	if float64(r.rss1) > float64(r.rss0)*leakFactor+leakRSSSlack {
		r.problems = append(r.problems, fmt.Sprintf("RSS grew from %.0f to %.0f MiB", mib(r.rss0), mib(r.rss1)))
	}
	if r.gor1 > r.gor0*leakFactor+leakCountSlack {
		r.problems = append(r.problems, fmt.Sprintf("goroutines grew from %.0f to %.0f", r.gor0, r.gor1))
	}
	if float64(r.fds1) > float64(r.fds0)*leakFactor+leakCountSlack {
		r.problems = append(r.problems, fmt.Sprintf("open files grew from %d to %d", r.fds0, r.fds1))
	}
	return r
}
