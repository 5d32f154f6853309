// Package suite owns make bench (and make bench-quick): a fresh local Kafka,
// then every reference table measured on this machine beside the reference
// tool run in the same session, written to BENCHMARKS.md with charts.
package suite

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferryhq/ferry/tools/bench/load"
	"github.com/ferryhq/ferry/tools/bench/proc"
	"github.com/ferryhq/ferry/tools/bench/report"
)

// Cmd is make bench (and make bench-quick): a fresh local Kafka, then
// every reference table measured on this machine next to the reference tool
// run in the same session, written to BENCHMARKS.md with charts.
//
// Everything it runs is a separate process — Kafka's own Java tools, this
// binary's produce/consume/otlp, the ferry agent — so each figure is what a
// user gets by running that command, and the agent's CPU and RSS are read
// from /proc while it runs.
func Cmd(args []string) error {
	fs := flag.NewFlagSet("suite", flag.ContinueOnError)
	s := &suite{started: time.Now()}
	fs.BoolVar(&s.quick, "quick", false, "tiny runs of every step (make bench-quick): checks the harness, figures not meaningful")
	fs.StringVar(&s.doc.Out, "out", "BENCHMARKS.md", "the report to write")
	fs.StringVar(&s.doc.Charts, "charts", "docs/bench", "directory for the SVG charts (linked from the report)")
	fs.IntVar(&s.port, "port", 29392, "port of the local Kafka the suite starts (and the next one for its controller)")
	fs.StringVar(&s.ferry, "ferry", "bin/ferry", "the ferry binary")
	fs.StringVar(&s.only, "only", "", "run one section and rewrite it in place in --out: producers (section 1: every record size direct, over HTTP and the local protocol), files (log files beside the Collector's filelog and rsyslog), doors (Zipkin, remote write, span metrics), exactly_once (its cost against at least once), curves (cost curves: topics, partitions, connections, tokens, keys, record size), collector_few (OTLP at 4 in flight beside the Collector, both on defaults; printed, not written)")
	fs.StringVar(&s.curvesOnly, "curves", "", "with --only curves: run these curves alone (comma-separated: topics, partitions, connections, tokens, keys, size), e.g. to profile one")
	fs.StringVar(&s.profileDir, "profile", "", "with --only curves: after each curve's top point's window, a 5 s CPU profile and a heap profile of its agent into this directory (curve-NAME.cpu.pprof, .heap.pprof)")
	fs.Var(&s.agentSets, "agent-set", "a setting added to every agent the suite starts (repeatable), e.g. telemetry.admin.pprof=true to profile a point")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var err error
	if s.self, err = os.Executable(); err != nil {
		return err
	}
	if _, err := os.Stat("scripts/kafka-local"); err != nil {
		return fmt.Errorf("run the suite from the repository root (scripts/kafka-local not found)")
	}
	if s.work, err = os.MkdirTemp("", "ferry-suite"); err != nil {
		return err
	}
	defer os.RemoveAll(s.work)
	s.brokers = fmt.Sprintf("127.0.0.1:%d", s.port)
	s.total = 15
	switch s.only {
	case "":
		return s.run()
	case "files":
		s.total = 3
		return s.runFiles()
	case "doors":
		s.total = 3
		return s.runDoors()
	case "exactly_once":
		s.total = 3
		return s.runExactlyOnce()
	case "producers":
		s.total = 2
		return s.runProducers()
	case "collector_few":
		s.total = 2
		return s.runCollectorFew()
	case "curves":
		s.total = 9
		return s.runCurves()
	}
	return fmt.Errorf("--only %q: the sections that run alone are: producers, files, doors, exactly_once, collector_few, curves", s.only)
}

type suite struct {
	quick bool
	doc   report.Doc
	// What a thread switch and a 20 µs timed sleep cost in CPU here
	// (proc.SwitchCost, proc.SleepCost), for the Machine table.
	switchCost, sleepCost string
	port                  int
	ferry                 string
	only                  string
	curvesOnly            string
	profileDir            string
	agentSets             multiSet
	otelcol, rsyslogd     string
	filesNote             string // what the files section could not measure
	self                  string
	work                  string
	brokers               string
	cp                    string
	started               time.Time
	step                  int
	total                 int
	topics                int
	// the 100 B topic the producers leave for the consumers
	consumeTopic string
	consumeN     int64
}

func (s *suite) stepf(format string, a ...any) {
	s.step++
	fmt.Fprintf(os.Stderr, "\n[%s] step %d/%d: %s\n", time.Since(s.started).Round(time.Second), s.step, s.total, fmt.Sprintf(format, a...))
}

func (s *suite) logf(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "[%s]   %s\n", time.Since(s.started).Round(time.Second), fmt.Sprintf(format, a...))
}

// exec runs a command, passing its stderr (progress) through, and returns
// its stdout.
func (s *suite) exec(name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = os.Stderr
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("%s %s: %w\n%s", filepath.Base(name), strings.Join(args, " "), err, out.String())
	}
	return out.String(), nil
}

func (s *suite) bench(args ...string) (string, error) { return s.exec(s.self, args...) }

func (s *suite) java(class string, args ...string) (string, error) {
	return s.exec("java", append([]string{"-Xmx1g", "-cp", s.cp, class}, args...)...)
}

func (s *suite) topic(prefix string, partitions int) (string, error) {
	s.topics++
	t := fmt.Sprintf("%s-%d", prefix, s.topics)
	_, err := s.bench("topic", "create", "--bootstrap-server", s.brokers, "--topic", t, "--partitions", strconv.Itoa(partitions))
	return t, err
}

func (s *suite) deleteTopic(t string) {
	_, _ = s.bench("topic", "delete", "--bootstrap-server", s.brokers, "--topic", t)
}

// ---- the agent ----

type benchAgent struct {
	s       *suite
	cmd     *exec.Cmd
	http    string
	otlp    string
	admin   string
	local   string
	socket  string
	rssPeak atomic.Int64
	done    chan struct{}
	stopped sync.Once
}

func (s *suite) agent(sets ...string) (*benchAgent, error) {
	a := &benchAgent{s: s, http: "127.0.0.1:18088", admin: "127.0.0.1:18089", otlp: "127.0.0.1:14318", local: "127.0.0.1:18090",
		socket: filepath.Join(s.work, "ferry.sock"), done: make(chan struct{})}
	args := []string{"run", "--set", "exporter.kafka.brokers=[" + s.brokers + "]", "--set", "receivers.http.listen=" + a.http,
		"--set", "telemetry.admin.listen=" + a.admin, "--set", "receivers.otlp.http.listen=" + a.otlp,
		"--set", "receivers.otlp.grpc.listen=127.0.0.1:14317", "--set", "telemetry.report_interval=0s",
		"--set", "receivers.local.listen=" + a.local, "--set", "receivers.local.socket=" + a.socket,
		"--set", "delivery.spool.dir=" + filepath.Join(s.work, fmt.Sprintf("spool-%d", time.Now().UnixNano())),
		"--set", "delivery.dead_letter.file=" + filepath.Join(s.work, "dead.ndjson")}
	for _, set := range append(sets, s.agentSets...) {
		args = append(args, "--set", set)
	}
	logf, err := os.Create(filepath.Join(s.work, "agent.log"))
	if err != nil {
		return nil, err
	}
	a.cmd = exec.Command(s.ferry, args...)
	a.cmd.Stdout, a.cmd.Stderr = logf, logf
	if err := a.cmd.Start(); err != nil {
		return nil, err
	}
	go a.sample()
	if proc.WaitReady(a.admin, 20*time.Second) {
		return a, nil
	}
	a.stop()
	log, _ := os.ReadFile(logf.Name())
	return nil, fmt.Errorf("ferry did not become ready:\n%s", log)
}

// sample tracks the agent's peak RSS from /proc (VmRSS, so a window's
// peak can be read by resetting it).
func (a *benchAgent) sample() {
	for {
		select {
		case <-a.done:
			return
		case <-time.After(100 * time.Millisecond):
		}
		kb := proc.StatusKB(a.cmd.Process.Pid, "VmRSS")
		if kb == 0 { // the agent is gone
			return
		}
		if kb*1024 > a.rssPeak.Load() {
			a.rssPeak.Store(kb * 1024)
		}
	}
}

func (a *benchAgent) cpuTicks() int64 { return proc.Ticks(a.cmd.Process.Pid) }

// agentUsage is the agent's CPU (% of one core) and peak RSS while fn runs.
type agentUsage struct {
	cpu    float64
	rssMiB float64
}

func (a *benchAgent) measure(fn func() error) (agentUsage, error) {
	a.rssPeak.Store(0)
	t0, c0 := time.Now(), a.cpuTicks()
	err := fn()
	c1, el := a.cpuTicks(), time.Since(t0).Seconds()
	return agentUsage{cpu: float64(c1-c0) / clkTck() / el * 100, rssMiB: float64(a.rssPeak.Load()) / (1 << 20)}, err
}

func clkTck() float64 { return proc.ClkTck() }

// metric sums every series of a metric from the agent's /metrics; a name
// like m{api="Produce"} sums only the series with that label.
func (a *benchAgent) metric(name string) float64 {
	name, label, _ := strings.Cut(name, "{")
	label = strings.TrimSuffix(label, "}")
	res, err := http.Get("http://" + a.admin + "/metrics")
	if err != nil {
		return math.NaN()
	}
	defer res.Body.Close()
	var sum float64
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, name); ok && (strings.HasPrefix(rest, " ") || strings.HasPrefix(rest, "{")) && strings.Contains(rest, label) {
			f := strings.Fields(line)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			sum += v
		}
	}
	return sum
}

// stop ends the agent; calling it again does nothing, so a step may stop
// its agent early and still defer the stop.
func (a *benchAgent) stop() {
	a.stopped.Do(func() {
		close(a.done)
		proc.Stop(a.cmd, 40*time.Second)
	})
}

// ---- parsing the tools' output ----

var ppLine = regexp.MustCompile(`(\d+) records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\), ([\d.]+) ms avg latency, ([\d.]+) ms max latency, (\d+) ms 50th, (\d+) ms 95th, (\d+) ms 99th, (\d+) ms 99.9th`)

// parsePP reads ProducerPerformance's final line (ferry-bench produce
// prints the same, which this also checks).
func parsePP(out string) (load.Result, error) {
	m := ppLine.FindAllStringSubmatch(out, -1)
	if len(m) == 0 {
		return load.Result{}, fmt.Errorf("no ProducerPerformance final line in:\n%s", out)
	}
	l := m[len(m)-1]
	f := func(i int) float64 { v, _ := strconv.ParseFloat(l[i], 64); return v }
	return load.Result{Records: int64(f(1)), RecordsSec: f(2), MBSec: f(3), AvgMS: f(4), MaxMS: f(5), P50MS: f(6), P95MS: f(7), P99MS: f(8), P999MS: f(9)}, nil
}

func parseCP(out string) (report.ConsumerLine, error) {
	for _, line := range strings.Split(out, "\n") {
		f := strings.Split(line, ",")
		if len(f) < 10 || strings.HasPrefix(line, "start.time") {
			continue
		}
		var v [10]float64
		for i := 2; i < 10; i++ {
			x, err := strconv.ParseFloat(strings.TrimSpace(f[i]), 64)
			if err != nil {
				return report.ConsumerLine{}, fmt.Errorf("ConsumerPerformance column %d: %q", i, f[i])
			}
			v[i] = x
		}
		return report.ConsumerLine{MB: v[2], MBSec: v[3], NMsg: v[4], NMsgSec: v[5], RebalanceMS: v[6], FetchMS: v[7], FetchMBSec: v[8], FetchNMsgSec: v[9]}, nil
	}
	return report.ConsumerLine{}, fmt.Errorf("no ConsumerPerformance line in:\n%s", out)
}

// otlpReport is ferry-bench otlp's --report-json.
type otlpReport struct {
	Requests float64 `json:"requests"`
	Items    float64 `json:"items"`
	QPS      float64 `json:"qps"`
	P50      float64 `json:"p50_ms"`
	P99      float64 `json:"p99_ms"`
	Failed   float64 `json:"failed"`
	Failures string  `json:"failures"`
}

// otlpLoad runs ferry-bench otlp with args and returns its report.
func (s *suite) otlpLoad(args ...string) (otlpReport, error) {
	var r otlpReport
	rep := filepath.Join(s.work, "otlp-load.json")
	_ = os.Remove(rep)
	if _, err := s.bench(append(append([]string{"otlp"}, args...), "--header=false", "--report-json", rep)...); err != nil {
		return r, err
	}
	return r, readJSON(rep, &r)
}

func readJSON(path string, into any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, into)
}

type multiSet []string

func (m *multiSet) String() string     { return strings.Join(*m, ",") }
func (m *multiSet) Set(v string) error { *m = append(*m, v); return nil }
