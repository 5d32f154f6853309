package scheduler

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestPolicy(t *testing.T) {
	p := &policy{max: 4, cur: 4}
	// A light load goes to one P only once a whole window of LowerFor
	// samples is in.
	for i := 1; i < LowerFor; i++ {
		if got := p.observe(0.1, 0); got != 4 {
			t.Fatalf("sample %d of light load: %d, want 4 until %d samples", i, got, LowerFor)
		}
	}
	if got := p.observe(0.1, 0); got != 1 {
		t.Fatalf("after %d light samples: %d, want 1", LowerFor, got)
	}
	// Between the thresholds nothing moves: one P does the same work with
	// less CPU, so a load just under RaiseAt on one P must not come back.
	for range 3 * LowerFor {
		if got := p.observe((LowerAt+RaiseAt)/2, 0); got != 1 {
			t.Fatalf("between thresholds on one P: %d", got)
		}
	}
	// A blip above RaiseAt (a GC cycle, a segment roll) is not a load: one
	// P stays until RaiseFor samples in a row are above it.
	for round := range 3 {
		for i := 1; i < RaiseFor; i++ {
			if got := p.observe(RaiseAt+0.05, 0); got != 1 {
				t.Fatalf("round %d: sample %d above RaiseAt: %d, want 1 until %d in a row", round, i, got, RaiseFor)
			}
		}
		if got := p.observe(RaiseAt, 0); got != 1 { // not above: the run starts again
			t.Fatalf("at RaiseAt: %d", got)
		}
	}
	for i := 1; i < RaiseFor; i++ {
		p.observe(RaiseAt+0.05, 0)
	}
	if got := p.observe(RaiseAt+0.05, 0); got != 4 {
		t.Fatalf("%d samples above RaiseAt: %d, want 4", RaiseFor, got)
	}
	// On every core, a load whose mean is at or above LowerAt stays, however
	// many of its samples are below it.
	for i := range 3 * LowerFor {
		c := 0.5
		if i%2 == 1 {
			c = 0.8
		}
		if got := p.observe(c, 0); got != 4 {
			t.Fatalf("sample %d of a load of mean 0.65: %d, want 4", i, got)
		}
	}
	// A load of mean 0.55 whose samples scatter around LowerAt (0.45 and
	// 0.65, as a steady load does on every core) goes back to one P within
	// a window: waiting for LowerFor samples in a row under LowerAt kept
	// such a load on every core.
	for i := 0; p.cur != 1; i++ {
		if i == LowerFor {
			t.Fatalf("a load of mean 0.55 still on every core after %d samples", i)
		}
		c := 0.45
		if i%2 == 1 {
			c = 0.65
		}
		p.observe(c, 0)
	}
	// One P saturated: every core back at once, a burst does not wait.
	if got := p.observe(SaturatedAt, 0); got != 4 {
		t.Fatalf("at SaturatedAt: %d, want 4", got)
	}
	// The window starts again after a switch: one light sample is not a
	// second of light load.
	if got := p.observe(0.01, 0); got != 4 {
		t.Fatalf("one light sample after a raise: %d, want 4", got)
	}
	// One core only: nothing to adapt.
	one := &policy{max: 1, cur: 1}
	for range 3 * LowerFor {
		if got := one.observe(5, 0); got != 1 {
			t.Fatalf("one core: %d", got)
		}
	}
}

// TestPolicyQueueing: on one P, goroutines waiting for it (a pipeline one
// P stalls) bring every core back whatever the CPU; a light load's short
// waits, a blip, or waits at almost no load do not; and a load raised for
// queueing does not go straight back to one P, where it would queue again.
func TestPolicyQueueing(t *testing.T) {
	wait := WaitAt.Seconds()
	light := func(p *policy) {
		t.Helper()
		for i := 0; p.cur != 1; i++ {
			if i > 3*LowerFor {
				t.Fatal("an idle agent never went to one P")
			}
			p.observe(0.01, 0)
		}
	}
	p := &policy{max: 4, cur: 4}
	light(p)
	// A load whose goroutines wait a few µs, as OTLP at 500 and 2,000
	// requests/s, or just under WaitAt, stays on one P.
	for i := range 5 * RaiseFor {
		if got := p.observe(0.25, 7e-6); got != 1 {
			t.Fatalf("sample %d of a light load waiting 7 µs: %d, want 1", i, got)
		}
	}
	for i := range 5 * RaiseFor {
		if got := p.observe(0.65, wait*0.9); got != 1 {
			t.Fatalf("sample %d at 0.65 cores waiting under WaitAt: %d, want 1", i, got)
		}
	}
	// Each sample's wait counts only at QueueFloor or more: two long waits
	// at little load do not make a queue of the next sample's load; nor do
	// long waits whose samples average under QueueFloor.
	for _, run := range [][]struct{ cores, wait float64 }{
		{{0.2, 4 * wait}, {0.2, 4 * wait}, {0.6, 0}},
		{{0.3, 2 * wait}, {0.3, 2 * wait}, {0, 0}},
	} {
		for i, s := range run {
			if got := p.observe(s.cores, s.wait); got != 1 {
				t.Fatalf("sample %d of %v: long waits at little load counted: %d", i, run, got)
			}
		}
		for range RaiseFor {
			p.observe(0.2, 0)
		}
	}
	// Waits at an almost idle agent (a GC cycle on one P) are not a load.
	for i := range 5 * RaiseFor {
		if got := p.observe(QueueFloor-0.1, 4*wait); got != 1 {
			t.Fatalf("sample %d: waits at %.1f cores: %d, want 1", i, QueueFloor-0.1, got)
		}
	}
	// One sample of long waits among short ones is a blip (a GC cycle, a
	// burst's first frame): most of RaiseFor samples decide, not a mean
	// one sample can carry.
	for round := range 3 {
		for i := 1; i < RaiseFor; i++ {
			if got := p.observe(0.6, wait/4); got != 1 {
				t.Fatalf("round %d: %d", round, got)
			}
		}
		if got := p.observe(0.6, 100*wait); got != 1 {
			t.Fatalf("round %d: one sample of long waits: %d, want 1", round, got)
		}
	}
	// OTLP traces from 4 clients, on one P: 0.35-0.65 cores, waits of
	// 11-35 µs; it stays (every core costs it 20% more CPU a span).
	for i, w := range []float64{16e-6, 35e-6, 27e-6, 25e-6, 31e-6, 29e-6, 30e-6} {
		if got := p.observe(0.6, w); got != 1 {
			t.Fatalf("OTLP-like sample %d: %d, want 1", i, got)
		}
	}
	// The local protocol at 2.3M records/s on one P: 0.4-0.7 cores, waits
	// of 50 µs to 5 ms; every core within RaiseFor samples.
	for range RaiseFor {
		p.observe(0.25, 0)
	}
	samples := []struct{ cores, wait float64 }{{0.61, 1197e-6}, {0.56, 5211e-6}, {0.49, 6e-6}}
	for i, s := range samples {
		got := p.observe(s.cores, s.wait)
		if i == 0 && got != 1 {
			t.Fatal("one sample of queueing raised")
		}
		if got == 4 {
			break
		}
		if i == len(samples)-1 {
			t.Fatalf("%d samples of queueing: %d, want 4", len(samples), got)
		}
	}
	// On every core it takes 0.55 cores, under LowerAt: it tries one P
	// within a window, queues there, and is back within FailWithin. Each
	// failed try doubles the wait before the next one, up to ProbeMax.
	queueing := func() int { // samples on every core, then one try
		t.Helper()
		n := 0
		for p.cur == 4 {
			if n++; n > 2*ProbeMax {
				t.Fatal("never tried one P again")
			}
			p.observe(0.55, 0)
		}
		for p.cur == 1 {
			if p.lowered > RaiseFor {
				t.Fatal("queueing again on one P, and still there")
			}
			p.observe(0.6, 2*wait)
		}
		// The one-P samples start afresh at each lowering: the raise
		// takes RaiseFor of them, none left from the last stay.
		if p.lowered != RaiseFor {
			t.Fatalf("raised after %d samples on one P, want %d", p.lowered, RaiseFor)
		}
		return n
	}
	if n := queueing(); n > LowerFor {
		t.Fatalf("the first try came after %d samples, want a window (%d)", n, LowerFor)
	}
	for want := ProbeAfter; want <= 2*ProbeMax; want *= 2 {
		n := queueing()
		if exp := min(want, ProbeMax); n < exp || n > exp+LowerFor {
			t.Fatalf("after a failed try: the next after %d samples, want %d", n, exp)
		}
	}
	// A load that queues on one P only after a few seconds (under HeldFor)
	// failed its try too: the wait grows.
	light(p)
	for range HeldFor {
		p.observe(0.2, 0)
	}
	for range 3 * RaiseFor {
		p.observe(RaiseAt+0.05, 0)
	}
	if p.cur != 4 {
		t.Fatalf("busy on one P: %d", p.cur)
	}
	before := p.probe
	for p.cur == 4 {
		p.observe(0.55, 0)
	}
	for range 50 { // 5 s on one P, then it queues
		p.observe(0.5, 0)
	}
	for p.cur == 1 {
		p.observe(0.6, 2*wait)
	}
	if p.probe != 2*before || p.gate != before {
		t.Fatalf("a try that queued after 5 s: gate %d probe %d, want %d and %d", p.gate, p.probe, before, 2*before)
	}
	// A load that needs every core at 0.8 cores is never tried on one P.
	for i := range 2 * ProbeMax {
		if got := p.observe(0.8, 0); got != 4 {
			t.Fatalf("sample %d of 0.8 cores on every core: %d, want 4", i, got)
		}
	}
	// An idle agent's lowering is no try: bursts that saturate one P
	// after idle spells add no wait. Then a lowering that holds HeldFor
	// samples starts the waits over.
	// (The first lowering, on the way down from 0.8 cores, may be one.)
	light(p)
	p.observe(SaturatedAt+0.05, 0)
	light(p)
	probe := p.probe
	for range 10 {
		p.observe(SaturatedAt+0.05, 0)
		if p.cur != 4 {
			t.Fatal("a saturating burst stayed on one P")
		}
		light(p)
	}
	if p.gate != 0 || p.probe != probe {
		t.Fatalf("bursts after idle spells moved the waits: gate %d probe %d, want 0 and %d", p.gate, p.probe, probe)
	}
	for range HeldFor {
		p.observe(0.2, 0)
	}
	for range RaiseFor {
		p.observe(RaiseAt+0.1, 0)
	}
	if p.cur != 4 {
		t.Fatalf("busy on one P: %d, want 4", p.cur)
	}
	if p.gate != 0 || p.probe != ProbeAfter {
		t.Fatalf("after a minute on one P: gate %d probe %d, want 0 and %d", p.gate, p.probe, ProbeAfter)
	}
	for i := 1; p.cur == 4; i++ {
		if i > ProbeAfter+LowerFor {
			t.Fatalf("a load of 0.67 on every core still there after %d samples", i)
		}
		if got := p.observe(0.67, 0); got == 1 && i < ProbeAfter {
			t.Fatalf("tried one P after %d samples, before ProbeAfter", i)
		}
	}
	for i := range 5 * ProbeAfter {
		if got := p.observe(0.55, 25e-6); got != 1 {
			t.Fatalf("sample %d of the load on one P: %d, want 1", i, got)
		}
	}
}

// load drives a Controller sample by sample: the CPU time and wall clock
// it reads and the ticks it samples on are the test's.
type load struct {
	t     *testing.T
	cpu   atomic.Int64 // ns
	wall  time.Time
	ticks chan time.Time
	// waited (ns) and waits: goroutines' waits for a P, summed and counted.
	waited, waits atomic.Int64
}

// drive makes c (not started) sample l instead of the process; started
// must be called after c.Start.
func drive(t *testing.T, c *Controller) *load {
	start := time.Unix(1700000000, 0)
	l := &load{t: t, wall: start, ticks: make(chan time.Time)}
	c.cpu = func() time.Duration { return time.Duration(l.cpu.Load()) }
	c.waits = func() (time.Duration, uint64) { return time.Duration(l.waited.Load()), uint64(l.waits.Load()) }
	c.now = func() time.Time { return start }
	c.ticks = l.ticks
	return l
}

// tick sends the Controller a tick at the current wall time.
func (l *load) tick() {
	l.t.Helper()
	select {
	case l.ticks <- l.wall:
	case <-time.After(10 * time.Second):
		l.t.Fatal("the controller takes no tick")
	}
}

// started returns once the started Controller has read the clocks it
// measures the first sample from: it takes a tick (one at the start time,
// no wall time passed, which it skips) only after.
func (l *load) started() { l.t.Helper(); l.tick() }

// sample is one Interval in which the process used cores of CPU; it
// returns once the Controller has acted on it: a second tick at the same
// time (skipped, as above) is taken only after the first one's sample is
// done.
func (l *load) sample(cores float64) { l.t.Helper(); l.sampleWaiting(cores, 0) }

// sampleWaiting is sample in which goroutines waited wait on average for a P
// (100 waits measured).
func (l *load) sampleWaiting(cores float64, wait time.Duration) {
	l.t.Helper()
	l.wall = l.wall.Add(Interval)
	l.cpu.Add(int64(cores * float64(Interval)))
	l.waited.Add(100 * int64(wait))
	l.waits.Add(100)
	l.tick()
	l.tick()
}

// TestControllerFollowsTheLoad runs the Controller on a load the test
// makes, sample by sample: idle, it goes to one P after a window of
// samples and not before; a saturated sample brings every core back at
// once; idle again, one P; a steady load over RaiseAt brings every core
// back after RaiseFor samples and not before; each change moves
// GOMAXPROCS, ferry_runtime_procs and the change counter; Shutdown leaves
// Go's default. (TestControllerFollowsRealLoad does the same with this
// process's own CPU, outside make test.)
func TestControllerFollowsTheLoad(t *testing.T) {
	max := runtime.GOMAXPROCS(0)
	if max < 2 {
		t.Skip("one core: nothing to adapt")
	}
	t.Setenv("GOMAXPROCS", "")
	defer runtime.SetDefaultGOMAXPROCS()
	reg := prometheus.NewRegistry()
	c := New(Config{Adaptive: true}, slog.New(slog.NewTextHandler(io.Discard, nil)), reg)
	l := drive(t, c)
	c.Start(context.Background())
	defer c.Shutdown(context.Background())
	l.started()
	changes := 0
	is := func(what string, want int) {
		t.Helper()
		if got := runtime.GOMAXPROCS(0); got != want {
			t.Fatalf("%s: GOMAXPROCS %d, want %d", what, got, want)
		}
		if got := testutil.ToFloat64(c.procs); got != float64(want) {
			t.Fatalf("%s: ferry_runtime_procs %v, want %d", what, got, want)
		}
		if got := testutil.ToFloat64(c.changes); got != float64(changes) {
			t.Fatalf("%s: %v changes counted, want %d", what, got, changes)
		}
	}
	idle := func(what string) {
		t.Helper()
		for i := 1; i < LowerFor; i++ {
			l.sample(0.02)
			is(fmt.Sprintf("%s, sample %d", what, i), max)
		}
		l.sample(0.02)
		changes++
		is(what, 1)
	}
	idle("idle")
	l.sample(SaturatedAt + 0.3)
	changes++
	is("one P saturated", max)
	idle("idle again")
	for i := 1; i < RaiseFor; i++ {
		l.sample(RaiseAt + 0.1)
		is(fmt.Sprintf("busy, sample %d", i), 1)
	}
	l.sample(RaiseAt + 0.1)
	changes++
	is("busy", max)
	l.waited.Add(int64(1000 * time.Millisecond)) // in the idle spell's first sample
	l.waits.Add(10)
	idle("idle once more")
	// A long history of waits does not count: only each interval's own
	// (a mean over everything since the start would raise below).
	for i := range 3 * RaiseFor {
		l.sampleWaiting(0.6, WaitAt/2)
		is(fmt.Sprintf("short waits after long ones, sample %d", i), 1)
	}
	// Goroutines waiting for the one P, at a load under RaiseAt: every
	// core back once most of RaiseFor samples queued, not at the first.
	l.sampleWaiting(0.6, WaitAt*6/5)
	is("queueing, first sample", 1)
	for i := 2; i <= RaiseFor && runtime.GOMAXPROCS(0) == 1; i++ {
		l.sampleWaiting(0.6, WaitAt*6/5)
	}
	changes++
	is("queueing", max)
	c.Shutdown(context.Background())
	if got := runtime.GOMAXPROCS(0); got != max {
		t.Fatalf("after Shutdown: GOMAXPROCS %d, want Go's default %d", got, max)
	}
}

// TestControllerFollowsRealLoad runs the Controller on this process's own
// CPU: idle, it goes to one P; goroutines burning CPU bring every core
// back; idle again, one P. It needs the test to get close to a whole core
// of CPU, which a busy machine does not give it, so it runs only with
// FERRY_REAL_LOAD=1 (make bench), not in make test.
func TestControllerFollowsRealLoad(t *testing.T) {
	if os.Getenv("FERRY_REAL_LOAD") != "1" {
		t.Skip("needs a whole core of CPU: FERRY_REAL_LOAD=1 (make bench)")
	}
	max := runtime.GOMAXPROCS(0)
	if max < 2 {
		t.Skip("one core: nothing to adapt")
	}
	t.Setenv("GOMAXPROCS", "")
	defer runtime.SetDefaultGOMAXPROCS()
	reg := prometheus.NewRegistry()
	c := New(Config{Adaptive: true}, slog.New(slog.NewTextHandler(io.Discard, nil)), reg)
	c.Start(context.Background())
	defer c.Shutdown(context.Background())
	wait := func(what string, want int, d time.Duration) {
		t.Helper()
		deadline := time.Now().Add(d)
		for runtime.GOMAXPROCS(0) != want {
			if time.Now().After(deadline) {
				t.Fatalf("%s: GOMAXPROCS %d after %v, want %d", what, runtime.GOMAXPROCS(0), d, want)
			}
			time.Sleep(10 * time.Millisecond)
		}
		if got := testutil.ToFloat64(c.procs); got != float64(want) {
			t.Fatalf("%s: ferry_runtime_procs %v, want %d", what, got, want)
		}
	}
	wait("idle", 1, 10*time.Second)
	ctx, stop := context.WithCancel(context.Background())
	var spins atomic.Int64
	var burners sync.WaitGroup
	for range 2 {
		burners.Add(1)
		go func() {
			defer burners.Done()
			for ctx.Err() == nil {
				spins.Add(1)
			}
		}()
	}
	wait("busy", max, 20*time.Second)
	stop()
	burners.Wait()
	wait("idle again", 1, 10*time.Second)
	if n := testutil.ToFloat64(c.changes); n < 3 {
		t.Fatalf("%v changes counted, want at least 3", n)
	}
	c.Shutdown(context.Background())
	if got := runtime.GOMAXPROCS(0); got != max {
		t.Fatalf("after Shutdown: GOMAXPROCS %d, want Go's default %d", got, max)
	}
}

// Off, or with GOMAXPROCS in the environment, the Controller never runs.
func TestControllerLeavesGOMAXPROCS(t *testing.T) {
	max := runtime.GOMAXPROCS(0)
	for _, c := range []struct {
		name string
		cfg  Config
		env  string
	}{{"off", Config{}, ""}, {"GOMAXPROCS set", Config{Adaptive: true}, "2"}} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("GOMAXPROCS", c.env)
			ctl := New(c.cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry())
			ctl.Start(context.Background())
			defer ctl.Shutdown(context.Background())
			if ctl.cancel != nil {
				t.Fatal("the controller started")
			}
			time.Sleep(Interval * (LowerFor + 3))
			if got := runtime.GOMAXPROCS(0); got != max {
				t.Fatalf("GOMAXPROCS %d, want %d", got, max)
			}
		})
	}
}

// TestSchedWaitsReadsGo: the waits come from Go's own scheduler metrics:
// goroutines made ready add to the count, and the sum never goes back.
func TestSchedWaitsReadsGo(t *testing.T) {
	waits := newSchedWaits()
	sum0, n0 := waits()
	var wg sync.WaitGroup
	for range 2000 {
		wg.Add(1)
		go func() { defer wg.Done(); time.Sleep(time.Microsecond) }()
	}
	wg.Wait()
	sum1, n1 := waits()
	if n1 <= n0 || sum1 < sum0 {
		t.Fatalf("waits (%v, %d) then (%v, %d) after 2,000 goroutines ran", sum0, n0, sum1, n1)
	}
}
