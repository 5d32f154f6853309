package faults

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/internal/kafkatest"
)

// full selects the long versions (make faults): durations as the issue
// states them. The short ones keep the same shape and run in make test.
var full = os.Getenv("FERRY_FAULTS") == "full"

var ferryBin string

func TestMain(m *testing.M) {
	flag.Parse()
	if !testing.Short() {
		dir, err := os.MkdirTemp("", "ferry-faults")
		if err != nil {
			panic(err)
		}
		ferryBin = filepath.Join(dir, "ferry")
		root, _ := filepath.Abs("..")
		cmd := exec.Command("go", "build", "-o", ferryBin, "./cmd/ferry")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
			os.Exit(1)
		}
		defer os.RemoveAll(dir)
	}
	kafkatest.Main(withReport(m))
}

// dur picks the short or the full duration.
func dur(short, long time.Duration) time.Duration {
	if full {
		return long
	}
	return short
}

// ---- the agent, as a real process ----

type agent struct {
	t       *testing.T
	cmd     *exec.Cmd
	http    string
	admin   string
	logs    *syncBuffer
	peakRSS atomic.Int64 // bytes, VmHWM sampled while it runs
	exited  chan error
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startAgent runs ferry with the given --set overrides and waits until it
// serves (not until it is ready: Kafka may be down on purpose).
func startAgent(t *testing.T, brokers string, sets ...string) *agent {
	t.Helper()
	a := &agent{t: t, http: freeAddr(t), admin: freeAddr(t), logs: &syncBuffer{}, exited: make(chan error, 1)}
	args := []string{"run",
		"--set", "receivers.http.listen=" + a.http, "--set", "telemetry.admin.listen=" + a.admin,
		"--set", "exporter.kafka.brokers=[" + brokers + "]",
		"--set", "receivers.otlp.enabled=false", "--set", "telemetry.report_interval=5s"}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	a.cmd = exec.Command(ferryBin, args...)
	a.cmd.Stderr = a.logs
	a.cmd.Stdout = a.logs
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { a.exited <- a.cmd.Wait() }()
	t.Cleanup(func() {
		_ = a.cmd.Process.Kill()
		if t.Failed() {
			t.Logf("agent log (tail):\n%s", tail(a.logs.String(), 4000))
		}
	})
	go a.sampleRSS()
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := http.Get("http://" + a.admin + "/healthz")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == 200 {
				return a
			}
		}
		select {
		case err := <-a.exited:
			t.Fatalf("agent exited at start: %v\n%s", err, a.logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent not serving after 30 s:\n%s", a.logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func (a *agent) sampleRSS() {
	path := fmt.Sprintf("/proc/%d/status", a.cmd.Process.Pid)
	for {
		b, err := os.ReadFile(path)
		if err != nil {
			return
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
				if kb*1024 > a.peakRSS.Load() {
					a.peakRSS.Store(kb * 1024)
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// kill ends the agent with SIGKILL, as a crash would.
func (a *agent) kill() {
	_ = a.cmd.Process.Signal(syscall.SIGKILL)
	<-a.exited
}

// stop ends the agent with SIGTERM and requires a clean exit.
func (a *agent) stop() {
	a.t.Helper()
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-a.exited:
		if err != nil {
			a.t.Fatalf("agent exited with %v:\n%s", err, tail(a.logs.String(), 4000))
		}
	case <-time.After(60 * time.Second):
		a.t.Fatal("agent did not stop within 60 s")
	}
}

// alive fails the test if the agent has exited.
func (a *agent) alive() {
	a.t.Helper()
	select {
	case err := <-a.exited:
		a.t.Fatalf("agent died: %v\n%s", err, tail(a.logs.String(), 4000))
	default:
	}
}

// metric sums every series of a metric from /metrics.
func (a *agent) metric(name string) float64 {
	res, err := http.Get("http://" + a.admin + "/metrics")
	if err != nil {
		return -1
	}
	defer res.Body.Close()
	var sum float64
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) || len(line) == len(name) || (line[len(name)] != ' ' && line[len(name)] != '{') {
			continue
		}
		f := strings.Fields(line)
		v, _ := strconv.ParseFloat(f[len(f)-1], 64)
		sum += v
	}
	return sum
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

func (l *ledger) refused() int64 {
	var n int64
	for _, code := range []int{429, 503} {
		if v, ok := l.status.Load(code); ok {
			n += v.(*atomic.Int64).Load()
		}
	}
	return n
}

type loadSpec struct {
	clients    int
	batch      int // records per request
	size       int // bytes per record
	perSec     int // records per second over all clients; 0 = as fast as possible
	retryAfter bool
}

// load offers records to the agent until ctx ends and returns the ledger
// once every client has stopped.
func load(ctx context.Context, t *testing.T, addr func() string, topic string, spec loadSpec) *ledger {
	l := &ledger{acked: make([][]bool, spec.clients)}
	var wg sync.WaitGroup
	for c := 0; c < spec.clients; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			client := &http.Client{Timeout: 60 * time.Second}
			pad := strings.Repeat("x", max(0, spec.size-16))
			var body bytes.Buffer
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
				body.Reset()
				for i := 0; i < spec.batch; i++ {
					fmt.Fprintf(&body, "%d:%d:%s\n", c, seq+i, pad)
				}
				l.offered.Add(int64(spec.batch))
				res, err := client.Post("http://"+addr()+"/v1/messages/"+topic, "application/x-ndjson", &body)
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
	Test       string  `json:"test"`
	Mode       string  `json:"mode"`
	Duration   string  `json:"duration"`
	Offered    int64   `json:"offered"`
	Acked      int64   `json:"acked"`
	Delivered  int64   `json:"delivered"` // distinct ids in Kafka
	Lost       int64   `json:"lost"`      // acknowledged, not in Kafka
	Duplicates int64   `json:"duplicates"`
	Refused    int64   `json:"refused_requests"`
	PeakRSSMiB float64 `json:"peak_rss_mib"`
	Recovery   string  `json:"recovery"`
	Note       string  `json:"note"`
}

// verify reads the topic until every acknowledged id is there (or timeout)
// and counts what is missing and what is there twice.
func verify(t *testing.T, brokers, topic string, l *ledger, timeout time.Duration) (delivered, lost, dups int64, took time.Duration) {
	t.Helper()
	start := time.Now()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxBytes(64<<20))
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

var (
	reportMu sync.Mutex
	results  []outcome
)

func record(t *testing.T, o outcome) {
	t.Helper()
	b, _ := json.Marshal(o)
	t.Logf("result: %s", b)
	reportMu.Lock()
	results = append(results, o)
	reportMu.Unlock()
}

type reportRunner struct{ m *testing.M }

func withReport(m *testing.M) *reportRunner { return &reportRunner{m} }

// Run runs the tests, then, when FERRY_FAULTS_REPORT names a markdown
// file, rewrites the table between its fault markers with the results.
func (r *reportRunner) Run() int {
	code := r.m.Run()
	if path := os.Getenv("FERRY_FAULTS_REPORT"); path != "" && len(results) > 0 {
		if err := writeReport(path); err != nil {
			fmt.Fprintln(os.Stderr, "faults report:", err)
			return 1
		}
	}
	return code
}

const beginMark, endMark = "<!-- faults:begin -->", "<!-- faults:end -->"

func writeReport(path string) error {
	doc, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	i, j := bytes.Index(doc, []byte(beginMark)), bytes.Index(doc, []byte(endMark))
	if i < 0 || j < i {
		return fmt.Errorf("%s has no %s … %s section", path, beginMark, endMark)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n\nMeasured by `make faults` (FERRY_FAULTS=full) on %s, %s.\n\n", beginMark, time.Now().UTC().Format("2006-01-02"), machine())
	b.WriteString("| test | mode | load | offered | acknowledged | delivered | lost | duplicates | refused requests | peak RSS | recovery | notes |\n")
	b.WriteString("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|\n")
	for _, o := range results {
		fmt.Fprintf(&b, "| %s | %s | %s | %d | %d | %d | **%d** | %d | %d | %.0f MiB | %s | %s |\n",
			o.Test, o.Mode, o.Duration, o.Offered, o.Acked, o.Delivered, o.Lost, o.Duplicates, o.Refused, o.PeakRSSMiB, o.Recovery, o.Note)
	}
	b.WriteString("\n")
	out := append(append(append([]byte{}, doc[:i]...), b.String()...), doc[j:]...)
	return os.WriteFile(path, out, 0o644)
}

func machine() string {
	cpu := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "model name"); ok {
				cpu = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	return fmt.Sprintf("%d cores, %s", runtime.NumCPU(), cpu)
}
