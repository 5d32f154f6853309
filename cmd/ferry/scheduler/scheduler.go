// Package scheduler sizes Go's scheduler to the agent's load
// (runtime.adaptive_procs in default.yaml).
//
// A per-host agent spends most of its life under a light, steady trickle:
// requests arrive, are handled in a fraction of a millisecond, and the
// process goes idle again, hundreds of times a second. With Go's scheduler
// running on every core (GOMAXPROCS = the CPUs), each goroutine made ready
// while a core is idle wakes a second OS thread to look for work, which
// mostly finds none and sleeps again: two thread switches, each costing
// several µs of CPU on a virtual machine. At 500 OTLP requests/s that was
// 16-22% of the agent's CPU with the same latency (BENCHMARKS.md, section
// on the Collector), so on one P the agent does the same work for less.
//
// The Controller samples the process's CPU time every Interval.
//
// Going up: at one P, a sample at SaturatedAt cores or more (one P is
// saturated) gives the scheduler back every core at once, so a burst gets
// full capacity within one interval and only the load that saturates one
// core is slowed. A load above RaiseAt for RaiseFor samples in a row (one
// P busy most of the time, so requests start to queue) gets every core
// too. A single sample between the two does not: it is a blip of a steady
// load (a GC cycle, a spool segment roll, a client catching up), and
// answering it with every core used to cost the rest of the run. In a
// 10 s run of OTLP spans into the spool at 150k/s, one blip at 0.72 cores
// left the agent on every core for its last 4 s and raised its CPU per
// span by 30-45%.
//
// Queueing on one P also gives every core back, whatever the CPU: when the
// goroutines made ready waited for the P WaitAt or more on average in most
// of the last RaiseFor samples (Go's /sched/latencies, the time from ready
// to running), at QueueFloor cores or more. CPU alone cannot tell a load one
// P serves well from a pipeline that one P stalls: 2.3-2.8M records/s of
// 32 B from one local-protocol client kept the agent at 0.4-0.7 cores on
// one P, where the connection's reader (a frame of thousands of records at
// a time), the Kafka client's goroutines and the answers took turns: ready
// goroutines waited 50 µs to 5 ms on average per 100 ms sample, a fifth of
// them 250 µs or more; the client's window filled and the agent then
// waited for it. On every core the same client sent 3.3M/s at 0.75 cores,
// with lower latency (issue 37). Short handlers wait briefly even when one
// P is well used: OTLP traces from 4 clients of 100 spans, 0.35-0.65 cores
// on one P, waited 11-35 µs on average (under 1% of waits 250 µs or more),
// and on every core took 20% more CPU a span for the same spans/s (so
// WaitAt is 100 µs: a first value of 25 µs raised them); 500 and 2,000
// OTLP requests/s wait 6-7 µs.
//
// Going down: on every core, once the mean of the last LowerFor samples
// is below LowerAt. A mean, not every sample: a steady load that takes
// 0.45 cores on one P takes 0.5-0.7 per sample on every core (the
// threads waking each other), and waiting for ten samples in a row under
// LowerAt kept it on every core for seconds after each start or burst.
// The thresholds leave a gap (one P does the same work with less CPU), so
// a load near either does not switch back and forth.
//
// A load under RaiseAt but over LowerAt on every core tries one P after
// ProbeAfter there: on every core it cannot tell whether one P would
// serve it. Without the probe, whichever way such a load came in decided
// for good: OTLP traces at 4 in flight took 1.33-1.39 µs of CPU a span
// when a run began on one P and 1.63-1.75 µs when an earlier load had
// left the agent on every core (0.65-0.70 cores there, over LowerAt), the
// unexplained quarter between a whole make bench and the section alone
// (issue 37). A try fails when one P saturates or stays busy within
// FailWithin samples, or queues within HeldFor; each failure doubles the
// wait before the next try (and before a lowering under LowerAt), up to
// ProbeMax, so a load that needs every core spends at most 2 s (usually
// 100-300 ms) on one P after 10 s, then 20 s, ... then every 5 min; a try
// that holds HeldFor samples starts the waits over. The waits hold back
// only a load of QueueFloor cores or more: an idle agent goes to one P
// within a window, as before, and that lowering is no try (a burst after
// it is no failure).
//
// "Every core" is Go's own default, restored with
// runtime.SetDefaultGOMAXPROCS, so a container's CPU limit (which Go
// follows) is kept. A GOMAXPROCS set in the environment is the user's
// choice: the Controller then does nothing.
package scheduler

import (
	"context"
	"log/slog"
	"math"
	"os"
	"runtime"
	"runtime/metrics"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Config is runtime.adaptive_procs.
type Config struct {
	Adaptive bool
}

// The thresholds, in cores of CPU used by the whole process.
const (
	Interval    = 100 * time.Millisecond
	SaturatedAt = 0.9
	RaiseAt     = 0.7
	RaiseFor    = 3 // samples: 300 ms of one P busy most of the time
	LowerAt     = 0.6
	LowerFor    = 10 // samples: the mean of the last second
	// Queueing on one P: a ready goroutine's mean wait for the P, in most
	// of RaiseFor samples, at a load of QueueFloor cores or more.
	WaitAt     = 100 * time.Microsecond
	QueueFloor = 0.3
	// On every core, a load under RaiseAt tries one P again after
	// ProbeAfter samples there. A raise within FailWithin samples of a
	// lowering means one P did not hold the load: the next lowering waits
	// the probe, which doubles each time up to ProbeMax; a lowering that
	// held HeldFor samples starts it over.
	ProbeAfter = 100  // 10 s
	ProbeMax   = 3000 // 5 min
	FailWithin = 20   // 2 s
	HeldFor    = 600  // a minute
)

// policy is the Controller's decision rule, apart from clocks and the
// runtime so that it can be tested on its own.
type policy struct {
	max  int // every core: Go's default GOMAXPROCS
	cur  int
	busy int // samples in a row over RaiseAt, on one P
	// The last RaiseFor samples on one P (cores and the mean wait for the
	// P, in seconds), a ring.
	waits, loads [RaiseFor]float64
	w, wn        int
	// The last samples on every core (n of them, up to LowerFor), a ring.
	recent [LowerFor]float64
	n, at  int
	sum    float64
	// since: samples on every core since the last raise; lowered: samples
	// on one P since the last lowering, and tried: that lowering was of a
	// load (QueueFloor cores or more), not of an idle agent. gate: samples
	// on every core before a load may go to one P (0, or the backoff after
	// one P failed it); probe: samples before a load under RaiseAt tries
	// one P again (ProbeAfter, doubled by each failure up to ProbeMax).
	since, lowered, gate, probe int
	tried                       bool
}

// observe takes one sample, the cores of CPU used over the last interval
// and the mean time a goroutine made ready in it waited for a P (seconds;
// 0 when unknown), and returns the GOMAXPROCS to run with.
func (p *policy) observe(cores, wait float64) int {
	if p.max <= 1 {
		return p.cur
	}
	if p.probe == 0 {
		p.probe = ProbeAfter
	}
	if p.cur == 1 {
		p.lowered++
		if cores < QueueFloor {
			wait = 0 // waits at almost no load (a GC cycle) are not queueing
		}
		p.waits[p.w], p.loads[p.w] = wait, cores
		p.w = (p.w + 1) % RaiseFor
		p.wn = min(p.wn+1, RaiseFor)
		var meanLoad float64
		long := 0 // samples whose goroutines waited WaitAt or more on average
		for i := range p.wn {
			meanLoad += p.loads[i] / float64(p.wn)
			if p.waits[i] >= WaitAt.Seconds() {
				long++
			}
		}
		// Most of the samples, each its own mean wait: one sample of a GC
		// cycle or a burst's first frame is not a queue.
		queued := p.wn == RaiseFor && 2*long > RaiseFor && meanLoad >= QueueFloor
		if cores <= RaiseAt {
			p.busy = 0
		} else {
			p.busy++
		}
		busy := p.busy >= RaiseFor || cores >= SaturatedAt
		if busy || queued {
			switch {
			case p.tried && (p.lowered <= FailWithin || !busy && p.lowered < HeldFor):
				// One P did not hold the load it was tried with (it
				// saturated or stayed busy at once, or it queued within
				// HeldFor): wait longer before the next try, so a load
				// that fails it does not flap. An idle agent's lowering
				// was no try: a burst after it is no failure.
				p.gate, p.probe = p.probe, min(2*p.probe, ProbeMax)
			case p.lowered >= HeldFor:
				p.gate, p.probe = 0, ProbeAfter
			default:
				p.gate = 0
			}
			p.cur, p.busy, p.n, p.at, p.sum, p.w, p.wn, p.since = p.max, 0, 0, 0, 0, 0, 0, 0
		}
		return p.cur
	}
	p.since++
	if p.n == LowerFor {
		p.sum -= p.recent[p.at]
	} else {
		p.n++
	}
	p.recent[p.at], p.sum = cores, p.sum+cores
	p.at = (p.at + 1) % LowerFor
	if p.n == LowerFor {
		// A load under QueueFloor goes down at once: whatever failed on
		// one P before has gone.
		mean := p.sum / LowerFor
		if mean < QueueFloor || p.since >= p.gate && (mean < LowerAt || mean < RaiseAt && p.since >= p.probe) {
			p.cur, p.lowered, p.tried = 1, 0, mean >= QueueFloor
		}
	}
	return p.cur
}

// Controller applies the policy to the running process.
type Controller struct {
	cfg     Config
	log     *slog.Logger
	procs   prometheus.Gauge
	changes prometheus.Counter

	cancel context.CancelFunc
	done   sync.WaitGroup

	// The load the Controller follows: the process's CPU time, the wall
	// clock, and a tick every Interval. A test replaces them before Start
	// to drive it sample by sample.
	cpu   func() time.Duration
	now   func() time.Time
	ticks <-chan time.Time
	// waits is the time goroutines waited for a P, summed, and how many
	// waits were measured, both since the start (schedWaits).
	waits func() (time.Duration, uint64)
}

// New registers the Controller's metrics.
func New(cfg Config, log *slog.Logger, reg prometheus.Registerer) *Controller {
	c := &Controller{cfg: cfg, log: log, cpu: cpuTime, now: time.Now, waits: newSchedWaits(),
		procs: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ferry_runtime_procs",
			Help: "GOMAXPROCS the agent runs with: 1 under a light load, every core above it (runtime.adaptive_procs)."}),
		changes: prometheus.NewCounter(prometheus.CounterOpts{Name: "ferry_runtime_procs_changes_total",
			Help: "Times runtime.adaptive_procs moved GOMAXPROCS between 1 and every core."}),
	}
	reg.MustRegister(c.procs, c.changes)
	c.procs.Set(float64(runtime.GOMAXPROCS(0)))
	return c
}

// Start begins sampling, unless adaptive_procs is off, GOMAXPROCS is set in
// the environment, or there is one core only.
func (c *Controller) Start(context.Context) error {
	max := runtime.GOMAXPROCS(0)
	switch {
	case !c.cfg.Adaptive:
		return nil
	case os.Getenv("GOMAXPROCS") != "":
		c.log.Info("runtime.adaptive_procs: GOMAXPROCS is set in the environment, so it is kept", "gomaxprocs", max)
		return nil
	case max <= 1:
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	c.done.Add(1)
	go func() {
		defer c.done.Done()
		c.run(ctx, &policy{max: max, cur: max})
	}()
	return nil
}

func (c *Controller) run(ctx context.Context, p *policy) {
	ticks := c.ticks
	if ticks == nil {
		t := time.NewTicker(Interval)
		defer t.Stop()
		ticks = t.C
	}
	lastCPU, lastWall := c.cpu(), c.now()
	lastWaited, lastWaits := c.waits()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-ticks:
			cpu := c.cpu()
			wall := now.Sub(lastWall)
			if wall <= 0 {
				continue
			}
			cores := float64(cpu-lastCPU) / float64(wall)
			lastCPU, lastWall = cpu, now
			waited, waits := c.waits()
			var wait float64
			if waits > lastWaits {
				wait = (waited - lastWaited).Seconds() / float64(waits-lastWaits)
			}
			lastWaited, lastWaits = waited, waits
			was := p.cur
			if n := p.observe(cores, wait); n != was {
				if n == p.max {
					// Go's default, which also resumes following a
					// container's CPU limit.
					runtime.SetDefaultGOMAXPROCS()
					p.max = runtime.GOMAXPROCS(0)
					p.cur = p.max
				} else {
					runtime.GOMAXPROCS(n)
				}
				c.procs.Set(float64(p.cur))
				c.changes.Inc()
				c.log.Debug("runtime.adaptive_procs: GOMAXPROCS changed", "from", was, "to", p.cur, "cores_used", cores, "mean_wait_for_a_p", time.Duration(wait*1e9))
			}
		}
	}
}

// Shutdown stops sampling and leaves the scheduler on every core.
func (c *Controller) Shutdown(context.Context) error {
	if c.cancel == nil {
		return nil
	}
	c.cancel()
	c.done.Wait()
	c.cancel = nil
	runtime.SetDefaultGOMAXPROCS()
	c.procs.Set(float64(runtime.GOMAXPROCS(0)))
	return nil
}

// cpuTime is the CPU the process has used, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// newSchedWaits reads Go's scheduling latencies (/sched/latencies:seconds:
// how long goroutines waited, ready, for a P; Go measures a sample of
// them). Each bucket counts at its lower bound, so a mean is never
// overstated.
func newSchedWaits() func() (time.Duration, uint64) {
	sample := []metrics.Sample{{Name: "/sched/latencies:seconds"}}
	return func() (time.Duration, uint64) {
		metrics.Read(sample)
		if sample[0].Value.Kind() != metrics.KindFloat64Histogram {
			return 0, 0 // not in this Go: CPU alone decides
		}
		h := sample[0].Value.Float64Histogram()
		var sum float64
		var n uint64
		for i, c := range h.Counts {
			n += c
			if lo := h.Buckets[i]; lo > 0 && !math.IsInf(lo, 0) {
				sum += float64(c) * lo
			}
		}
		return time.Duration(sum * 1e9), n
	}
}
