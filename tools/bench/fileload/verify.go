package fileload

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/tools/bench/verify"
)

// Result is what the topic holds of a load's lines.
type Result struct {
	Written   int64 `json:"written"`
	Delivered int64 `json:"delivered"` // distinct lines in Kafka
	Lost      int64 `json:"lost"`      // written, not in Kafka
	// LostInWindow: of Lost, the lines in copytruncate's windows (gone from
	// the disk before any reader could be sure to have them).
	LostInWindow int64 `json:"lost_in_window"`
	Duplicated   int64 `json:"duplicated"`
	// OutOfOrder: lines whose first copy in Kafka came after the first copy
	// of a later line of the same file (a replay after a crash is a
	// duplicate, not this).
	OutOfOrder int64 `json:"out_of_order"`
	Foreign    int64 `json:"foreign"` // records without this run's ids
	// PerFileLost is each file's lost lines.
	PerFileLost []int64 `json:"per_file_lost,omitempty"`
	// LostRanges is each file's first lost id ranges [from, to) (at most
	// 8 a file), to see where a loss happened.
	LostRanges [][][2]int64  `json:"lost_ranges,omitempty"`
	Took       time.Duration `json:"took"`
}

func (r Result) String() string {
	s := fmt.Sprintf("%d written, %d read back, %d lost", r.Written, r.Delivered, r.Lost)
	if r.LostInWindow > 0 {
		s += fmt.Sprintf(" (%d of them in copytruncate's window)", r.LostInWindow)
	}
	s += fmt.Sprintf(", %d duplicated, %d out of order", r.Duplicated, r.OutOfOrder)
	if r.Foreign > 0 {
		s += fmt.Sprintf(", %d foreign", r.Foreign)
	}
	return s
}

// Counter counts a run's lines as they are read back. Not safe for
// concurrent use.
type Counter struct {
	run      string
	written  []int64
	windows  [][][2]int64
	seen     [][]uint8 // [file][seq] copies (saturating)
	maxFirst []int64   // [file] highest seq first seen so far
	res      Result
	missing  int64
}

// NewCounter counts against written[i] lines of file i (ids 0..n-1) of the
// run, with copytruncate's windows (nil if none).
func NewCounter(run string, written []int64, windows [][][2]int64) *Counter {
	c := &Counter{run: run, written: written, windows: windows, seen: make([][]uint8, len(written)), maxFirst: make([]int64, len(written))}
	for i, n := range written {
		c.seen[i] = make([]uint8, n)
		c.maxFirst[i] = -1
		c.res.Written += n
	}
	c.missing = c.res.Written
	return c
}

// Add counts one record's value. A value in double quotes is read inside
// them: the Collector's kafka exporter (encoding raw) writes a string log
// body JSON-quoted.
func (c *Counter) Add(v []byte) {
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
		v = v[1 : len(v)-1]
	}
	p, f, seq, ok := verify.ParseSeq(v)
	if !ok || p != c.run || f < 0 || f >= len(c.seen) {
		c.res.Foreign++
		return
	}
	if seq >= int64(len(c.seen[f])) { // written after the count was taken
		c.seen[f] = append(c.seen[f], make([]uint8, seq+1-int64(len(c.seen[f])))...)
	}
	n := c.seen[f][seq]
	if n < 255 {
		c.seen[f][seq]++
	}
	if n > 0 {
		c.res.Duplicated++
		return
	}
	c.res.Delivered++
	if seq < c.written[f] {
		c.missing--
	}
	if seq < c.maxFirst[f] {
		c.res.OutOfOrder++
	}
	c.maxFirst[f] = max(c.maxFirst[f], seq)
}

// Missing is how many written lines have not been read yet.
func (c *Counter) Missing() int64 { return c.missing }

// Result is the count so far.
func (c *Counter) Result() Result {
	r := c.res
	r.Lost, r.LostInWindow = 0, 0
	r.PerFileLost = make([]int64, len(c.written))
	r.LostRanges = make([][][2]int64, len(c.written))
	for f, n := range c.written {
		w := c.windows
		for s := int64(0); s < n; s++ {
			if c.seen[f][s] != 0 {
				continue
			}
			r.Lost++
			r.PerFileLost[f]++
			if k := len(r.LostRanges[f]); k > 0 && r.LostRanges[f][k-1][1] == s {
				r.LostRanges[f][k-1][1] = s + 1
			} else if k < 8 {
				r.LostRanges[f] = append(r.LostRanges[f], [2]int64{s, s + 1})
			}
			if f < len(w) {
				for _, rg := range w[f] {
					if s >= rg[0] && s < rg[1] {
						r.LostInWindow++
						break
					}
				}
			}
		}
	}
	return r
}

// Check reads topic from its start until every written line is there, or
// nothing new came for quiet, or timeout; then it keeps reading until
// nothing came for a third of quiet, to count late duplicates. progress, if
// set, is called about every 5 s.
func Check(ctx context.Context, brokers, topic string, c *Counter, quiet, timeout time.Duration, progress func(Result)) (Result, error) {
	start := time.Now()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxBytes(64<<20))
	if err != nil {
		return Result{}, err
	}
	defer cl.Close()
	deadline := start.Add(timeout)
	lastNew := time.Now()
	lastProgress := time.Now()
	var complete time.Time
	for time.Now().Before(deadline) && ctx.Err() == nil {
		pctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		fs := cl.PollFetches(pctx)
		cancel()
		n := 0
		fs.EachRecord(func(r *kgo.Record) {
			n++
			c.Add(r.Value)
		})
		if n > 0 {
			lastNew = time.Now()
		}
		if c.Missing() == 0 && complete.IsZero() {
			complete = time.Now()
		}
		if !complete.IsZero() && time.Since(complete) > quiet/3 && time.Since(lastNew) > quiet/3 {
			break
		}
		// Lines are missing and nothing more comes (before the first
		// record, the consumer's own start counts too: wait longer).
		if complete.IsZero() && time.Since(lastNew) > quiet && (c.res.Delivered+c.res.Foreign > 0 || time.Since(start) > max(quiet, 20*time.Second)) {
			break
		}
		if progress != nil && time.Since(lastProgress) > 5*time.Second {
			lastProgress = time.Now()
			progress(c.Result())
		}
	}
	r := c.Result()
	r.Took = time.Since(start)
	return r, ctx.Err()
}
