package suite

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/auth/token"
	"github.com/ferryhq/ferry/tools/bench/proc"
	"github.com/ferryhq/ferry/tools/bench/report"
)

// Cost curves (issue 37): how ferry's CPU per record and memory grow with
// what a user can multiply — topics written, partitions per topic, client
// connections, distinct application tokens, distinct record keys, record
// size. Every point is a fresh agent under a fixed offered rate that every
// point sustains (so CPU per record compares), measured over a window
// after a warm-up that lasts until Kafka takes the offered rate.

const (
	curvesBegin = "<!-- curves:begin -->"
	curvesEnd   = "<!-- curves:end -->"
)

// curveRate is the records/s every count curve offers: well under what the
// slowest point (10,000 topics, every record its own Kafka batch) takes on
// 2 cores shared with the broker and the load.
const curveRate = 10_000

// sizeRate is the bytes/s the record-size curve offers (the records/s
// falls as records grow: 100,000/s of 100 B, 1/s of 10 MB).
const sizeRate = 10_000_000

// curveMaxRecord is the largest record of the size curve, and the limits
// raised for it: the topic's max.message.bytes, the exporter's batch, the
// local protocol's frame.
const curveMaxRecord = 10_000_000

type curvePoint struct {
	curve string
	door  string // "local socket" or "HTTP"
	x     int    // the count multiplied (bytes for the size curve)
	rate  float64
	size  int
	// warm is how long the warm-up took (until Kafka took the offered
	// rate); window the measured span.
	warm, window time.Duration
	recs         float64 // records into Kafka in the window
	cpuSec       float64
	rssPeak      float64 // MiB, from the agent's start to the window's end
	rssSteady    float64 // MiB, at the window's end
	failed       int64   // records the load tool saw fail for good
	decryptions  float64 // tokens decrypted in the window (the verdict cache's misses)
	again        bool    // the curve's first point measured again after the others
}

func (p curvePoint) usPerRec() float64 { return p.cpuSec / p.recs * 1e6 }
func (p curvePoint) intoKafka() float64 {
	return p.recs / p.window.Seconds()
}

type curveSpec struct {
	name, title, xLabel string
	xs                  []int
	doors               []string
}

func (s *suite) curveSpecs() []curveSpec {
	specs := []curveSpec{
		{"topics", "Topics written", "topics", []int{1, 10, 100, 1000, 10000}, []string{"local socket"}},
		{"partitions", "Partitions of the one topic written", "partitions", []int{1, 10, 100, 1000}, []string{"local socket"}},
		{"connections", "Concurrent client connections", "connections", []int{1, 10, 100, 1000, 10000}, []string{"local socket", "HTTP"}},
		{"tokens", "Distinct application tokens", "tokens", []int{1, 10, 100, 1000, 10000, 100000}, []string{"HTTP"}},
		{"keys", "Distinct record keys", "keys", []int{1, 100, 10000, 1000000}, []string{"local socket"}},
		{"size", "Record size (10 MB/s offered)", "record bytes", []int{100, 1000, 10000, 100000, 1000000, curveMaxRecord}, []string{"local socket"}},
	}
	if s.quick {
		for i := range specs {
			specs[i].xs = []int{specs[i].xs[0], specs[i].xs[1]}
		}
	}
	if s.curvesOnly != "" {
		var some []curveSpec
		for _, c := range specs {
			if slices.Contains(strings.Split(s.curvesOnly, ","), c.name) {
				some = append(some, c)
			}
		}
		return some
	}
	return specs
}

// xsFor is the curve's points on door: HTTP connections from 10, since
// one HTTP/1.1 connection carries a request at a time, each waiting for
// Kafka's acknowledgement (a produce round trip, more while one is in flight): about
// 300 requests/s, a third of the offered rate, whatever ferry's cost.
func (c curveSpec) xsFor(door string) []int {
	if c.name != "connections" || door != "HTTP" {
		return c.xs
	}
	var xs []int
	for _, x := range c.xs {
		if x >= 10 {
			xs = append(xs, x)
		}
	}
	return xs
}

// curves measures every point of every curve.
func (s *suite) curves() ([]curvePoint, error) {
	raiseNoFile()
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.brokers))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	var pts []curvePoint
	idle, err := s.idlePoint()
	if err != nil {
		return nil, err
	}
	pts = append(pts, idle)
	for _, c := range s.curveSpecs() {
		s.stepf("cost curve: %s (%s)", c.title, strings.Join(c.doors, ", "))
		prep, err := s.prepareCurve(adm, c)
		if err != nil {
			return nil, err
		}
		for _, door := range c.doors {
			// The first point again at the end: how far the same point
			// moves on this machine in a few minutes (other processes'
			// load, the broker's own state), the noise a step must exceed.
			xs := c.xsFor(door)
			for i, x := range append(xs, xs[0]) {
				p, err := s.curvePoint(c, door, x, prep)
				if err != nil {
					return nil, fmt.Errorf("curve %s, %s, %d: %w", c.name, door, x, err)
				}
				p.again = i == len(xs)
				s.logf("%s %s %s: %.2f µs/record, %s rec/s into Kafka (after %s warm-up), RSS %.0f MiB peak, %.0f steady",
					c.name, door, report.Count(float64(x)), p.usPerRec(), report.F0(p.intoKafka()), p.warm.Round(time.Second), p.rssPeak, p.rssSteady)
				pts = append(pts, p)
			}
		}
	}
	return pts, nil
}

// curvePrep is what a curve's points share: its topics, tokens and keys.
type curvePrep struct {
	tokens  []string
	keyring string // the auth.keys setting the tokens verify with
}

func (s *suite) prepareCurve(adm *kadm.Client, c curveSpec) (curvePrep, error) {
	var prep curvePrep
	top := c.xs[len(c.xs)-1]
	switch c.name {
	case "topics":
		names := make([]string, top)
		for i := range names {
			names[i] = "curve-t-" + strconv.Itoa(i)
		}
		return prep, s.createTopics(adm, names, 1, nil)
	case "partitions":
		for _, x := range c.xs {
			if err := s.createTopics(adm, []string{"curve-p-" + strconv.Itoa(x)}, int32(x), nil); err != nil {
				return prep, err
			}
		}
	case "connections", "keys":
		return prep, s.createTopics(adm, []string{"curve-" + c.name}, 3, nil)
	case "tokens":
		var err error
		if prep.tokens, prep.keyring, err = mintTokens(top); err != nil {
			return prep, err
		}
		return prep, s.createTopics(adm, []string{"curve-tokens"}, 3, nil)
	case "size":
		limit := strconv.Itoa(curveMaxRecord + 1<<20)
		return prep, s.createTopics(adm, []string{"curve-size"}, 3, map[string]*string{"max.message.bytes": &limit})
	}
	return prep, nil
}

// mintTokens issues n tokens, each for an application of its own, with
// the project's token package (what `ferry token issue` does), and
// returns them with the auth.keys setting that verifies them.
func mintTokens(n int) ([]string, string, error) {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, "", err
	}
	ring, err := token.NewKeyring(map[uint16][]byte{1: key}, 1)
	if err != nil {
		return nil, "", err
	}
	out := make([]string, n)
	for i := range out {
		if out[i], err = ring.Issue(token.Claims{App: "app-" + strconv.Itoa(i)}); err != nil {
			return nil, "", err
		}
	}
	return out, "auth.keys=[{id: 1, secret: " + base64.StdEncoding.EncodeToString(key) + ", issue: true}]", nil
}

// createTopics creates topics in requests of 1,000 (10,000 topics take a
// few seconds this way; one at a time, minutes).
func (s *suite) createTopics(adm *kadm.Client, names []string, partitions int32, configs map[string]*string) error {
	t0 := time.Now()
	for i := 0; i < len(names); i += 1000 {
		batch := names[i:min(len(names), i+1000)]
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		res, err := adm.CreateTopics(ctx, partitions, 1, configs, batch...)
		cancel()
		if err != nil {
			return err
		}
		for _, r := range res {
			if r.Err != nil && !strings.Contains(r.Err.Error(), "TOPIC_ALREADY_EXISTS") {
				return fmt.Errorf("creating %s: %w", r.Topic, r.Err)
			}
		}
	}
	if len(names) > 1 || partitions > 100 {
		s.logf("created %d topic(s) of %d partition(s) in %s", len(names), partitions, time.Since(t0).Round(100*time.Millisecond))
	}
	return nil
}

// raiseNoFile lifts this process's soft limit of open files to its hard
// limit (the load tool and the agent inherit it): 10,000 connections need
// 10,000 descriptors on each side.
func raiseNoFile() {
	var l syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l) == nil && l.Cur < l.Max {
		l.Cur = l.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l)
	}
}

func noFileLimit() uint64 {
	var l syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l) != nil {
		return 0
	}
	return l.Cur
}

// idlePoint is an agent's CPU with no load: what every point's figure
// holds whatever the count.
func (s *suite) idlePoint() (curvePoint, error) {
	s.stepf("cost curves: an idle agent's CPU")
	a, err := s.agent()
	if err != nil {
		return curvePoint{}, err
	}
	defer a.stop()
	time.Sleep(3 * time.Second)
	c0, t0 := a.cpuTicks(), time.Now()
	time.Sleep(8 * time.Second)
	p := curvePoint{curve: "idle", cpuSec: float64(a.cpuTicks()-c0) / clkTck(), window: time.Since(t0)}
	s.logf("idle: %.1f ms CPU a second", p.cpuSec/p.window.Seconds()*1000)
	return p, nil
}

// curvePoint runs one point: a fresh agent, the load at the fixed rate, a
// warm-up until Kafka takes that rate, then the window.
func (s *suite) curvePoint(c curveSpec, door string, x int, prep curvePrep) (curvePoint, error) {
	p := curvePoint{curve: c.name, door: door, x: x, rate: curveRate, size: 100}
	window := 8 * time.Second
	if s.quick {
		window = 2 * time.Second
	}
	sets := []string{}
	batch := 10
	args := []string{"--record-size", "100", "--topic", "curve-" + c.name}
	switch c.name {
	case "topics":
		if x == 1 {
			args = append(args[:2], "--topic", "curve-t-0")
		} else {
			args = append(args[:2], "--topic", "curve-t", "--topics", strconv.Itoa(x))
		}
	case "partitions":
		args = append(args[:2], "--topic", "curve-p-"+strconv.Itoa(x))
		// Spread over every partition: keyless records are otherwise sticky,
		// a partition per batch, and the partition count costs nothing.
		sets = append(sets, "exporter.kafka.partitioner=round_robin")
	case "connections":
		args = append(args, "--connections", strconv.Itoa(x))
		sets = append(sets, fmt.Sprintf("receivers.http.max_connections=%d", x+100), fmt.Sprintf("receivers.local.max_connections=%d", x+100))
	case "tokens":
		f := filepath.Join(s.work, "tokens")
		if err := os.WriteFile(f, []byte(strings.Join(prep.tokens[:x], "\n")), 0o600); err != nil {
			return p, err
		}
		args = append(args, "--tokens", f)
		sets = append(sets, prep.keyring, "receivers.http.auth.mode=required")
	case "keys":
		args = append(args, "--key-space", strconv.Itoa(x))
	case "size":
		p.size, p.rate = x, float64(sizeRate)/float64(x)
		batch = int(min(10, max(1, p.rate/1000)))
		args = []string{"--record-size", strconv.Itoa(x), "--topic", "curve-size"}
		sets = append(sets, fmt.Sprintf("exporter.kafka.max_batch_bytes=%d", curveMaxRecord+1<<20),
			"receivers.local.max_frame_bytes=16MiB", "receivers.http.max_request_bytes=16MiB")
		if p.rate < 10 {
			window = 20 * time.Second // 1 record a second: 20 of them
		}
	}
	top := x == c.xs[len(c.xs)-1] && s.profileDir != ""
	if top {
		sets = append(sets, "telemetry.admin.pprof=true") // served only; profiled after the window
	}
	a, err := s.agent(sets...)
	if err != nil {
		return p, err
	}
	defer a.stop()
	target := "unix:" + a.socket
	if door == "HTTP" {
		target = "http://" + a.http
	}
	// The load runs until killed: the warm-up's length is not known
	// beforehand.
	args = append([]string{"produce", "--target", target, "--throughput", strconv.FormatFloat(p.rate, 'f', -1, 64),
		"--batch", strconv.Itoa(batch), "--num-records", "1000000000000", "--duration", "10m", "--reporting-interval", "600000",
		"--flush-timeout", "5s"}, args...)
	cmd := exec.Command(s.self, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		return p, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	stopLoad := func() error {
		_ = cmd.Process.Signal(syscall.SIGINT)
		select {
		case err := <-done:
			return err
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			return <-done
		}
	}
	// Warm-up: at least 3 s, every connection used once (they are used in
	// turn, batch records a request), and until a second of Kafka's
	// acknowledgements reaches 95 % of the offered rate.
	minWarm := 3 * time.Second
	if c.name == "connections" {
		minWarm += time.Duration(float64(x) / (p.rate / float64(batch)) * float64(time.Second))
	}
	if p.rate < 10 {
		minWarm = 5 * time.Second
	}
	t0 := time.Now()
	last, lastT := a.metric("ferry_exporter_sent_records_total"), time.Now()
	steady := 0 // consecutive seconds at the offered rate
	for {
		select {
		case err := <-done:
			return p, fmt.Errorf("the load ended early: %v\n%s%s", err, out.String(), tail(errb.String(), 2000))
		case <-time.After(time.Second):
		}
		now, sent := time.Now(), a.metric("ferry_exporter_sent_records_total")
		rate := (sent - last) / now.Sub(lastT).Seconds()
		last, lastT = sent, now
		// At the offered rate, neither short of it nor above (a backlog of
		// retried records draining would dilute the window's CPU per
		// record), for two seconds running.
		if (rate >= 0.95*p.rate && rate <= 1.05*p.rate) || p.rate < 10 {
			steady++
		} else {
			steady = 0
		}
		if time.Since(t0) >= minWarm && steady >= 2 {
			break
		}
		if time.Since(t0) > 90*time.Second {
			_ = stopLoad()
			return p, fmt.Errorf("Kafka took %.0f rec/s after 90 s, offered %.0f: not sustained", rate, p.rate)
		}
	}
	p.warm = time.Since(t0)
	pid := a.cmd.Process.Pid
	sent0, dec0, c0, w0 := a.metric("ferry_exporter_sent_records_total"), a.metric("ferry_auth_decryptions_total"), a.cpuTicks(), time.Now()
	time.Sleep(window)
	sent1, dec1, c1, w1 := a.metric("ferry_exporter_sent_records_total"), a.metric("ferry_auth_decryptions_total"), a.cpuTicks(), time.Now()
	p.rssSteady = float64(proc.StatusKB(pid, "VmRSS")) / 1024
	p.rssPeak = max(float64(a.rssPeak.Load())/(1<<20), p.rssSteady)
	p.window, p.recs, p.cpuSec, p.decryptions = w1.Sub(w0), sent1-sent0, float64(c1-c0)/clkTck(), dec1-dec0
	if top {
		s.profile(a, fmt.Sprintf("curve-%s-%s", c.name, strings.ReplaceAll(strings.ToLower(door), " ", "-")))
	}
	_ = stopLoad()
	if m := failedLine.FindStringSubmatch(out.String()); m != nil {
		p.failed, _ = strconv.ParseInt(m[1], 10, 64)
		if p.failed > 0 {
			s.logf("%s %d: load tool: %s", c.name, x, m[0])
		}
	}
	if p.recs <= 0 {
		return p, fmt.Errorf("no record reached Kafka in the window:\n%s", tail(errb.String(), 2000))
	}
	return p, nil
}

// profile saves the agent's CPU profile (5 s, under the same load) and
// heap profile, for finding what grows along a curve.
func (s *suite) profile(a *benchAgent, name string) {
	if err := os.MkdirAll(s.profileDir, 0o755); err != nil {
		return
	}
	for _, pr := range []struct{ path, ext string }{{"profile?seconds=5", "cpu"}, {"heap", "heap"}} {
		res, err := http.Get("http://" + a.admin + "/debug/pprof/" + pr.path)
		if err != nil {
			s.logf("profile: %v", err)
			continue
		}
		f := filepath.Join(s.profileDir, name+"."+pr.ext+".pprof")
		if out, err := os.Create(f); err == nil {
			_, _ = io.Copy(out, res.Body)
			out.Close()
			s.logf("profile: %s", f)
		}
		res.Body.Close()
	}
}

var failedLine = regexp.MustCompile(`(?m)^(\d+) records failed.*$`)

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// runCurves is --only curves: this section alone, rewritten in place.
func (s *suite) runCurves() error {
	stop, err := s.startKafka()
	defer stop()
	if err != nil {
		return err
	}
	pts, err := s.curves()
	if err != nil {
		return err
	}
	s.stepf("rewriting the cost-curves section of %s and its charts in %s", s.doc.Out, s.doc.Charts)
	s.writeCurves(pts)
	return replaceSection(s.doc.Out, curvesBegin, curvesEnd, s.doc.String())
}

func (s *suite) writeCurves(pts []curvePoint) {
	s.doc.P("%s", curvesBegin)
	defer s.doc.P("%s", curvesEnd)
	s.doc.H("12. Cost curves: what a user can multiply (issue 37)")
	s.doc.P("How ferry's CPU per record and memory grow with what a user can multiply. Every point is a fresh agent (defaults,")
	s.doc.P("delivery mode kafka) and the real broker; `ferry-bench produce` offers a **fixed rate** that every point sustains, %s",
		report.Commas(curveRate))
	s.doc.P("records/s of 100 B (the size curve: a fixed 10 MB/s), 10 records a request or claim; after a warm-up (at least 3 s,")
	s.doc.P("every connection used, and until Kafka's acknowledgements are within 5 %% of the offered rate two seconds running) ferry's CPU")
	s.doc.P("(utime + stime from `/proc`) is read over a window of 8 s and divided by the records Kafka acknowledged in it. RSS:")
	s.doc.P("**peak** from the agent's start to the window's end (sampled every 100 ms), **steady** at the window's end. Each")
	s.doc.P("curve ends with its first point measured again: the difference is this machine's noise (it is shared: the broker, the")
	s.doc.P("load and other jobs run on the same 2 cores), which a step along the curve must exceed to mean anything.")
	s.doc.P("")
	s.curveNotes(pts)
	for _, c := range s.curveSpecs() {
		var rows [][]string
		// The chart's x values are every door's; a door without a point
		// at one (HTTP connections start at 10) has a gap there.
		type key struct {
			door string
			x    int
		}
		got := map[key]curvePoint{}
		var doors []string
		for _, p := range pts {
			if p.curve != c.name {
				continue
			}
			if !slices.Contains(doors, p.door) {
				doors = append(doors, p.door)
			}
			what := c.xLabel + ": **" + report.Count(float64(p.x)) + "**"
			if p.again {
				what += " again, after the others"
			} else {
				got[key{p.door, p.x}] = p
			}
			row := []string{what, p.door, report.F0(p.rate), report.F0(p.intoKafka()),
				fmt.Sprintf("%.2f", p.usPerRec()), fmt.Sprintf("%.0f / %.0f", p.rssPeak, p.rssSteady), report.F0(float64(p.failed)),
				p.warm.Round(time.Second).String()}
			if c.name == "tokens" {
				row = append(row, report.F0(p.decryptions/p.window.Seconds()))
			}
			rows = append(rows, row)
		}
		if len(rows) == 0 {
			continue
		}
		s.doc.P("**%s**", c.title)
		s.doc.P("")
		head := []string{c.xLabel, "door", "offered rec/s", "rec/s into Kafka", "ferry CPU µs per record", "RSS MiB peak / steady", "failed", "warm-up"}
		if c.name == "tokens" {
			head = append(head, "decryptions/s (verdict cache misses)")
		}
		s.doc.Table(head, rows)
		var xs []float64
		for _, x := range c.xs {
			for _, d := range doors {
				if _, ok := got[key{d, x}]; ok {
					xs = append(xs, float64(x))
					break
				}
			}
		}
		var cpuL, rssL []report.Series
		for _, d := range doors {
			cpu, peak, steady := report.Series{Name: d}, report.Series{Name: d + " peak"}, report.Series{Name: d + " steady"}
			for _, x := range xs {
				p, ok := got[key{d, int(x)}]
				if !ok {
					p = curvePoint{cpuSec: math.NaN(), recs: 1, rssPeak: math.NaN(), rssSteady: math.NaN()}
				}
				cpu.Values = append(cpu.Values, p.usPerRec())
				peak.Values = append(peak.Values, p.rssPeak)
				steady.Values = append(steady.Values, p.rssSteady)
			}
			cpuL, rssL = append(cpuL, cpu), append(rssL, peak, steady)
		}
		s.doc.P("%s", s.doc.CurveChartFile("curves-"+c.name+".svg", "ferry's cost by "+strings.ToLower(c.title), c.xLabel, xs,
			[]report.Panel{{Unit: "CPU µs per record", Lines: cpuL}, {Unit: "RSS MiB", Lines: rssL}}))
		if text := curveText(c.name, pts); text != "" {
			s.doc.P("%s", text)
			s.doc.P("")
		}
	}
	s.doc.P("Reproduce: `bin/ferry-bench suite --only curves` (this section and `docs/bench/curves-*.svg` alone, rewritten in place;")
	s.doc.P("a fresh Kafka on `--port`, about 10 minutes on 2 cores); one point by hand: `bin/ferry run`, then")
	s.doc.P("`bin/ferry-bench produce --target unix:ferry-data/ferry.sock --topic curve-t --topics 1000 --throughput 10000 --batch 10 --duration 30s`")
	s.doc.P("(`--topics`, `--key-space`, `--tokens FILE`, `--connections`: see `ferry-bench produce -h`) and read `ferry_exporter_sent_records_total`")
	s.doc.P("and the agent's `/proc/PID/stat` before and after.")
}

// curveNotes: what this run could not reach (a lower top point) and why.
func (s *suite) curveNotes(pts []curvePoint) {
	if lim := noFileLimit(); lim < 10_000+1000 {
		s.doc.P("> Open files limited to %d here: the 10,000-connection points need a descriptor per connection in the agent and in the load tool.", lim)
		s.doc.P("")
	}
	for _, p := range pts {
		if p.curve == "idle" {
			s.doc.P("An **idle** agent (same settings, no load) used %.1f ms of CPU a second here (its health checks, status sampler and", p.cpuSec/p.window.Seconds()*1000)
			s.doc.P("timers): %.2f µs of every record's figure at %s records/s, the same at every point.", p.cpuSec/p.window.Seconds()/curveRate*1e6, report.Commas(curveRate))
			s.doc.P("")
		}
	}
}

// curveText says why a curve has its shape, with the run's own figures.
func curveText(name string, pts []curvePoint) string {
	var first, top curvePoint
	var mine []curvePoint
	for _, p := range pts {
		if p.curve == name && !p.again && p.door == pointsDoor(pts, name) {
			mine = append(mine, p)
		}
	}
	if len(mine) < 2 {
		return ""
	}
	first, top = mine[0], mine[len(mine)-1]
	perX := func(a, b curvePoint) float64 { return (b.rssSteady - a.rssSteady) * 1024 / float64(b.x-a.x) } // KiB per unit
	cpuRatio := top.usPerRec() / first.usPerRec()
	switch name {
	case "topics":
		return fmt.Sprintf("**Why it grows.** Up to about 20 topics (the records gathered at this rate while a produce request is in flight, about 2 ms: the adaptive linger) records share "+
			"Kafka batches; beyond, every record is a batch of its own (its header, its lz4 frame, its entry in the produce request): "+
			"the partitions curve below shows that part alone. What grows on past it is the Kafka client's: %s builds each "+
			"produce request by visiting every partition of the broker in turn (`sink.createReq` locks each partition's buffer to see "+
			"if it holds a batch), so a request costs O(partitions written to so far), with records or without; at %s one-partition "+
			"topics that scan is most of the %.1f× CPU per record here. It grows with the number of produce requests, not of records: a longer "+
			"`exporter.kafka.linger` (docs/scaling.md: 500 ms–1 s for fleets) makes fewer requests and cuts it. Memory: %.1f KiB per topic "+
			"(the client's buffer and metadata per partition, ferry's known-topic entry). The warm-up at 1,000 is the broker's: "+
			"after 4 KiB of records a partition (`log.index.interval.bytes`) it writes the first entries of 1,000 fresh partitions' "+
			"memory-mapped index files, and on the machine of 2026-11-29 (2 cores, virtio disk) each first write was a major page fault costing ~9 ms of kernel time, so a "+
			"request handler is busy for ~20 s and every producer stalls alike (measured apart on a fresh broker, same load: "+
			"franz-go direct 16.8 s worst latency, the broker 17.8 s of system CPU and 2,004 major faults; ferry the same). A Go "+
			"client whose buffer stays full past `MaxBlock` (10 s) fails each Produce call that waited that long, about one per load "+
			"worker when the stall outlasts it: the `failed` column (`buffer_full`; 0 to 8 in runs that day). At 10,000 topics a partition reaches 4 KiB only after ~24 s (a record a "+
			"second, each a Kafka batch of its own, ~170 bytes), past the warm-up and the window. Past "+
			"`exporter.kafka.max_pending_topics` (1,000) topics not yet confirmed by Kafka, batches are refused (retryable, after "+
			"5 s) until the first ones are confirmed (the bound keeps a client naming made-up topics from growing every metadata request).",
			franzVersion, report.Count(float64(top.x)), cpuRatio, perX(first, top))
	case "partitions":
		return fmt.Sprintf("**Why it grows.** The records are spread over every partition (`exporter.kafka.partitioner: round_robin`; "+
			"keyless records are sticky by default, one partition a batch, and the partition count then costs nothing). At %s records/s "+
			"and a produce round trip of about 2 ms (the adaptive linger sends a batch when the request in flight is answered), 20 records are gathered per request: from 20 partitions on each record is a Kafka batch of its own, and "+
			"the per-batch work (header, lz4 frame, CRC, the partition's entry in the request, its linger timer) is paid per record — "+
			"%.1f× at %s partitions. Past that point the growth is the client's scan of every partition per produce request (see topics). "+
			"Memory: %.2f KiB per partition.", report.Commas(curveRate), cpuRatio, report.Count(float64(top.x)), perX(first, top))
	case "connections":
		var http []curvePoint
		for _, p := range pts {
			if p.curve == name && !p.again && p.door == "HTTP" {
				http = append(http, p)
			}
		}
		text := fmt.Sprintf("**Flat CPU, linear memory.** The offered rate is the same however many connections carry it, and the "+
			"CPU per record stays within the noise (%.1f× from 1 to %s local connections). Each open connection costs memory, "+
			"%.1f KiB on the local socket (its reading goroutine, its answer writer's goroutine and their stacks, its frame "+
			"buffer)", cpuRatio, report.Count(float64(top.x)), perX(first, top))
		if len(http) >= 2 {
			text += fmt.Sprintf(", %.1f KiB over HTTP (net/http's goroutine and 4 KiB read and write buffers per connection, "+
				"TLS off)", perX(http[0], http[len(http)-1]))
		}
		return text + ": linear, and bounded by `max_connections` (1,024 by default for both; raised for these points)."
	case "tokens":
		return fmt.Sprintf("**Flat.** Each request names a token picked at random. While the tokens fit the verdict cache "+
			"(`auth.cache_size`, 65,536) a check is a lookup; at %s tokens nearly every request's token is one not seen within "+
			"`auth.cache_ttl` and is decrypted (the last column: about one per request), ~0.4 µs, a twentieth of a µs per record at "+
			"10 records a request: lost in the noise (%.2f×). Memory grows by %.1f MiB: the cache's table is fixed, the rest is "+
			"per-application metric series, capped at 1,000 applications (the others count under `_other`).",
			report.Count(float64(top.x)), cpuRatio, top.rssSteady-first.rssSteady)
	case "keys":
		return fmt.Sprintf("**Flat** (%.2f× from 1 to %s keys): a key is hashed (murmur2) into a partition per record whatever its "+
			"value, and ferry keeps nothing per key.", cpuRatio, report.Count(float64(top.x)))
	case "size":
		var cells []string
		for _, p := range mine {
			cells = append(cells, fmt.Sprintf("%s B: %.2f ns", report.Count(float64(p.x)), p.usPerRec()*1000/float64(p.x)))
		}
		return fmt.Sprintf("**Per byte it falls, then stays flat.** The offered bytes/s are fixed, so records/s fall as records grow "+
			"and the idle agent's constant weighs on each record more; per byte: %s. Large records cost their copy, lz4 and CRC32C: "+
			"about a nanosecond a byte. Peak RSS grows to %.0f MiB with %s records: a record is held a few times at once (the frame "+
			"read, the Kafka batch, its compressed copy). The limits raised for this curve: the topic's `max.message.bytes`, "+
			"`exporter.kafka.max_batch_bytes` and `receivers.local.max_frame_bytes` (%s MiB at most a frame by default).",
			strings.Join(cells, ", "), top.rssPeak, report.Count(float64(top.x)), "8")
	}
	return ""
}

// pointsDoor is the first door a curve was measured on.
func pointsDoor(pts []curvePoint, name string) string {
	for _, p := range pts {
		if p.curve == name {
			return p.door
		}
	}
	return ""
}

// franzVersion is the Kafka client this build links (ferry's go.mod).
var franzVersion = func() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "github.com/twmb/franz-go" {
				return "franz-go " + d.Version
			}
		}
	}
	return "franz-go"
}()
