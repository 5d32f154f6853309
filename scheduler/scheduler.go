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
// The Controller samples the process's CPU time every Interval. At one P,
// a sample above RaiseAt cores gives the scheduler back every core at
// once: a burst gets full capacity within one interval, and only the load
// that saturates one core is slowed. On every core, LowerFor of samples in
// a row below LowerAt cores go back to one P. The gap between the two
// thresholds (one P does the same work with less CPU) keeps a load near
// either from switching back and forth. LowerAt is 0.6, not lower: a load
// that takes 0.5-0.6 cores on every core takes about 0.5 on one P (half
// of it busy, far from RaiseAt), and with a lower threshold such a load,
// once a burst (a segment roll, a GC cycle, a client reconnecting) had
// raised the scheduler to every core, stayed there until ten samples in a
// row happened to fall under it: in a run of OTLP spans into the spool at
// 150k/s, five switches in 10 s against one.
//
// "Every core" is Go's own default, restored with
// runtime.SetDefaultGOMAXPROCS, so a container's CPU limit (which Go
// follows) is kept. A GOMAXPROCS set in the environment is the user's
// choice: the Controller then does nothing.
package scheduler

import (
	"context"
	"log/slog"
	"os"
	"runtime"
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
	Interval = 100 * time.Millisecond
	RaiseAt  = 0.7
	LowerAt  = 0.6
	LowerFor = 10 // samples: a second of light load
)

// policy is the Controller's decision rule, apart from clocks and the
// runtime so that it can be tested on its own.
type policy struct {
	max   int // every core: Go's default GOMAXPROCS
	cur   int
	quiet int
}

// observe takes one sample, the cores of CPU used over the last interval,
// and returns the GOMAXPROCS to run with.
func (p *policy) observe(cores float64) int {
	if p.max <= 1 {
		return p.cur
	}
	switch {
	case p.cur == 1 && cores > RaiseAt:
		p.cur, p.quiet = p.max, 0
	case p.cur > 1 && cores < LowerAt:
		if p.quiet++; p.quiet >= LowerFor {
			p.cur, p.quiet = 1, 0
		}
	default:
		p.quiet = 0
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
}

// New registers the Controller's metrics.
func New(cfg Config, log *slog.Logger, reg prometheus.Registerer) *Controller {
	c := &Controller{cfg: cfg, log: log,
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
	t := time.NewTicker(Interval)
	defer t.Stop()
	lastCPU, lastWall := cpuTime(), time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			cpu := cpuTime()
			wall := now.Sub(lastWall)
			if wall <= 0 {
				continue
			}
			cores := float64(cpu-lastCPU) / float64(wall)
			lastCPU, lastWall = cpu, now
			was := p.cur
			if n := p.observe(cores); n != was {
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
				c.log.Debug("runtime.adaptive_procs: GOMAXPROCS changed", "from", was, "to", p.cur, "cores_used", cores)
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
