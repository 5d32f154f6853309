package scheduler

import (
	"context"
	"io"
	"log/slog"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestPolicy(t *testing.T) {
	p := &policy{max: 4, cur: 4}
	// A light load goes to one P only after LowerFor samples in a row.
	for i := 1; i < LowerFor; i++ {
		if got := p.observe(0.1); got != 4 {
			t.Fatalf("sample %d of light load: %d, want 4 until %d samples", i, got, LowerFor)
		}
	}
	// A sample at or above LowerAt starts the count again.
	if got := p.observe(LowerAt); got != 4 {
		t.Fatalf("at LowerAt: %d", got)
	}
	for i := 1; i < LowerFor; i++ {
		p.observe(0.2)
	}
	if got := p.observe(0.2); got != 1 {
		t.Fatalf("after %d light samples: %d, want 1", LowerFor, got)
	}
	// Between the thresholds nothing moves: one P does the same work with
	// less CPU, so a load just under RaiseAt on one P must not come back.
	for range 3 * LowerFor {
		if got := p.observe((LowerAt + RaiseAt) / 2); got != 1 {
			t.Fatalf("between thresholds on one P: %d", got)
		}
	}
	if got := p.observe(RaiseAt); got != 1 {
		t.Fatalf("at RaiseAt (not above): %d", got)
	}
	// One sample above RaiseAt gives every core back at once.
	if got := p.observe(RaiseAt + 0.01); got != 4 {
		t.Fatalf("above RaiseAt: %d, want 4", got)
	}
	for range 3 * LowerFor {
		if got := p.observe((LowerAt + RaiseAt) / 2); got != 4 {
			t.Fatalf("between thresholds on every core: %d", got)
		}
	}
	// A load of 0.55 cores on every core (about 0.45 on one P) goes back to
	// one P after a burst raised it: a threshold at 0.5 kept such a load on
	// every core, switching in and out with each burst.
	for range LowerFor {
		p.observe(0.55)
	}
	if got := p.observe(0.55); got != 1 {
		t.Fatalf("0.55 cores for %d samples: %d, want 1", LowerFor+1, got)
	}
	// One core only: nothing to adapt.
	one := &policy{max: 1, cur: 1}
	for range 3 * LowerFor {
		if got := one.observe(5); got != 1 {
			t.Fatalf("one core: %d", got)
		}
	}
}

// TestControllerFollowsTheLoad runs the Controller in this process: idle, it
// goes to one P; a goroutine burning CPU brings every core back; idle
// again, one P; Shutdown leaves Go's default.
func TestControllerFollowsTheLoad(t *testing.T) {
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
	for range 2 {
		go func() {
			for ctx.Err() == nil {
				spins.Add(1)
			}
		}()
	}
	wait("busy", max, 20*time.Second)
	stop()
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
