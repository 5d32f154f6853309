package faults

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/proofs/harness/agenttest"
	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
)

// full selects the long versions (make faults): the durations docs/reliability.md
// reports. The short ones keep the same shape and run in make test.
var full = os.Getenv("FERRY_FAULTS") == "full"

var ferryBin string

func TestMain(m *testing.M) {
	flag.Parse()
	bin, cleanup := agenttest.BuildForTests()
	defer cleanup()
	ferryBin = bin
	report.M = m
	clusterReport.M = report
	filesReport.M = clusterReport
	kafkatest.Main(filesReport)
}

// dur picks the short or the full duration.
func dur(short, long time.Duration) time.Duration {
	if full {
		return long
	}
	return short
}

// ---- the agent, as a real process ----

// agent is the real binary with its peak RSS sampled while it runs (VmHWM
// can no longer be read once it is killed).
type agent struct {
	*agenttest.Agent
	peakRSS atomic.Int64
}

// startAgent runs ferry against brokers with the given --set overrides and
// waits until its receivers listen (not until it is ready: Kafka may be
// down on purpose).
func startAgent(t *testing.T, brokers string, sets ...string) *agent {
	t.Helper()
	a := &agent{Agent: agenttest.Start(t, ferryBin, "", append([]string{"exporter.kafka.brokers=[" + brokers + "]",
		"receivers.otlp.enabled=false", "telemetry.report_interval=5s"}, sets...)...)}
	go func() {
		for {
			p := a.Peak()
			if p < 0 {
				return
			}
			if p > a.peakRSS.Load() {
				a.peakRSS.Store(p)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	return a
}

// ---- load with sequence ids ----

// ledger records what each load client offered and what ferry acknowledged.
// Record values are "<client>:<seq>:" plus padding, so the consumer can
// check every acknowledged record by id.
type ledger struct {
	mu      sync.Mutex
	acked   [][]bool // [client][seq]
	offered atomic.Int64
	ackedN  atomic.Int64
	status  sync.Map // code → *atomic.Int64
	errs    atomic.Int64
}

func (l *ledger) count(code int) {
	v, _ := l.status.LoadOrStore(code, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
}

func (l *ledger) statuses() string {
	var parts []string
	for _, code := range []int{200, 202, 429, 503, 504, 500} {
		if v, ok := l.status.Load(code); ok {
			parts = append(parts, fmt.Sprintf("%d×%d", v.(*atomic.Int64).Load(), code))
		}
	}
	if e := l.errs.Load(); e > 0 {
		parts = append(parts, fmt.Sprintf("%d connection errors", e))
	}
	return strings.Join(parts, ", ")
}

// refused counts the requests the agent refused with 429 or 503.
func (l *ledger) refused() *int64 {
	var n int64
	for _, code := range []int{429, 503} {
		if v, ok := l.status.Load(code); ok {
			n += v.(*atomic.Int64).Load()
		}
	}
	return &n
}

type loadSpec struct {
	clients    int
	batch      int // records per request
	size       int // bytes per record
	perSec     int // records per second over all clients; 0 = as fast as possible
	retryAfter bool
	// live, if set, is given the ledger as soon as the load starts.
	live *atomic.Pointer[ledger]
}

// load offers records to the agent until ctx ends and returns the ledger
// once every client has stopped.
func load(ctx context.Context, t *testing.T, addr func() string, topic string, spec loadSpec) *ledger {
	l := &ledger{acked: make([][]bool, spec.clients)}
	if spec.live != nil {
		spec.live.Store(l)
	}
	var wg sync.WaitGroup
	for c := 0; c < spec.clients; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			client := &http.Client{Timeout: 60 * time.Second}
			pad := strings.Repeat("x", max(0, spec.size-16))
			var interval time.Duration
			if spec.perSec > 0 {
				interval = time.Duration(float64(time.Second) * float64(spec.batch*spec.clients) / float64(spec.perSec))
			}
			next := time.Now()
			for seq := 0; ctx.Err() == nil; {
				if interval > 0 {
					if d := time.Until(next); d > 0 {
						select {
						case <-ctx.Done():
							return
						case <-time.After(d):
						}
					}
					next = next.Add(interval)
				}
				// A new buffer per request: net/http may still read a request's
				// body (checking for bytes past its length) after the answer
				// came back, so a reused buffer races with the next request.
				var body []byte
				for i := 0; i < spec.batch; i++ {
					body = fmt.Appendf(body, "%d:%d:%s\n", c, seq+i, pad)
				}
				l.offered.Add(int64(spec.batch))
				res, err := client.Post("http://"+addr()+"/v1/messages/"+topic, "application/x-ndjson", bytes.NewReader(body))
				if err != nil {
					l.errs.Add(1)
					time.Sleep(50 * time.Millisecond)
					seq += spec.batch // ids are never reused: an unanswered request may have landed
					continue
				}
				_, _ = io.Copy(io.Discard, res.Body)
				res.Body.Close()
				l.count(res.StatusCode)
				if res.StatusCode == 200 {
					l.mu.Lock()
					for len(l.acked[c]) < seq+spec.batch {
						l.acked[c] = append(l.acked[c], false)
					}
					for i := seq; i < seq+spec.batch; i++ {
						l.acked[c][i] = true
					}
					l.mu.Unlock()
					l.ackedN.Add(int64(spec.batch))
				} else if res.StatusCode == 429 || res.StatusCode == 503 {
					time.Sleep(100 * time.Millisecond)
				}
				seq += spec.batch
			}
		}(c)
	}
	wg.Wait()
	return l
}

// outcome is one fault run's figures, as docs/reliability.md reports them.
type outcome struct {
	Test       string `json:"test"`
	Mode       string `json:"mode"`
	Duration   string `json:"duration"`
	Offered    int64  `json:"offered"`
	Acked      int64  `json:"acked"`
	Delivered  int64  `json:"delivered"` // distinct ids in Kafka
	Lost       int64  `json:"lost"`      // acknowledged, not in Kafka
	Duplicates int64  `json:"duplicates"`
	// Refused is nil where the test does not count refused requests
	// (the table then says so rather than show a zero nobody counted).
	Refused    *int64  `json:"refused_requests,omitempty"`
	PeakRSSMiB float64 `json:"peak_rss_mib"`
	Recovery   string  `json:"recovery"`
	Note       string  `json:"note"`
}

// verify reads the topic until every acknowledged id is there (or timeout)
// and counts what is missing and what is there twice.
func verify(t *testing.T, brokers, topic string, l *ledger, timeout time.Duration, opts ...kgo.Opt) (delivered, lost, dups int64, took time.Duration) {
	t.Helper()
	start := time.Now()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxBytes(64 << 20)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	seen := make([][]uint8, len(l.acked))
	missing := l.ackedN.Load()
	deadline := time.Now().Add(timeout)
	var idle time.Time
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		fs := cl.PollFetches(ctx)
		cancel()
		n := 0
		fs.EachRecord(func(r *kgo.Record) {
			n++
			c, seq, ok := parseID(r.Value)
			if !ok || c >= len(seen) {
				return
			}
			for len(seen[c]) <= seq {
				seen[c] = append(seen[c], 0)
			}
			if seen[c][seq] < 255 {
				seen[c][seq]++
			}
			if seen[c][seq] == 1 {
				delivered++
				if seq < len(l.acked[c]) && l.acked[c][seq] {
					missing--
				}
			} else {
				dups++
			}
		})
		if missing == 0 {
			// Keep reading briefly for duplicates and late unacknowledged ones.
			if n == 0 {
				if idle.IsZero() {
					idle = time.Now()
				} else if time.Since(idle) > 2*time.Second {
					break
				}
			} else {
				idle = time.Time{}
			}
		}
	}
	return delivered, missing, dups, time.Since(start)
}

func parseID(v []byte) (c, seq int, ok bool) {
	i := bytes.IndexByte(v, ':')
	if i <= 0 {
		return 0, 0, false
	}
	j := bytes.IndexByte(v[i+1:], ':')
	if j <= 0 {
		return 0, 0, false
	}
	c, err1 := strconv.Atoi(string(v[:i]))
	seq, err2 := strconv.Atoi(string(v[i+1 : i+1+j]))
	return c, seq, err1 == nil && err2 == nil
}

// ---- the report ----

var report = &agenttest.Report[outcome]{Env: "FERRY_FAULTS_REPORT", Begin: "<!-- faults:begin -->", End: "<!-- faults:end -->", Render: render}

// clusterReport is the 3-broker cluster's table, a section of its own so
// that its tests can be run (and their table rewritten) alone.
var clusterReport = &agenttest.Report[outcome]{Env: "FERRY_FAULTS_REPORT", Begin: "<!-- cluster:begin -->", End: "<!-- cluster:end -->", Render: render}

// filesReport is the files receiver's table (tests 8 to 11), a section of
// its own so that its tests can be run (and their table rewritten) alone:
// FERRY_FAULTS=full go test -run TestFiles ./proofs/faults.
var filesReport = &agenttest.Report[outcome]{Env: "FERRY_FAULTS_REPORT", Begin: "<!-- files:begin -->", End: "<!-- files:end -->", Render: render}

func record(t *testing.T, o outcome) { report.Add(t, o) }

func recordFiles(t *testing.T, o outcome) { filesReport.Add(t, o) }

func render(results []outcome) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Measured by `make faults` (FERRY_FAULTS=full) on %s, %s.\n\n", time.Now().UTC().Format("2006-01-02"), agenttest.Machine())
	b.WriteString("| test | mode | load | offered | acknowledged | delivered | lost | duplicates | refused requests | peak RSS | recovery | notes |\n")
	b.WriteString("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|\n")
	for _, o := range results {
		refused := "not measured"
		if o.Refused != nil {
			refused = strconv.FormatInt(*o.Refused, 10)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %d | %d | %d | **%d** | %d | %s | %.0f MiB | %s | %s |\n",
			o.Test, o.Mode, o.Duration, o.Offered, o.Acked, o.Delivered, o.Lost, o.Duplicates, refused, o.PeakRSSMiB, o.Recovery, o.Note)
	}
	return b.String()
}
