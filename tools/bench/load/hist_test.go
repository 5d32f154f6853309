package load

import (
	"math"
	"testing"
	"time"
)

func TestHistQuantiles(t *testing.T) {
	var h hist
	for i := 1; i <= 100000; i++ {
		h.add(time.Duration(i)*time.Microsecond, 1)
	}
	for _, c := range []struct {
		q    float64
		want float64 // µs
	}{{0.5, 50000}, {0.95, 95000}, {0.99, 99000}, {0.999, 99900}} {
		got := float64(h.quantile(c.q).Microseconds())
		if math.Abs(got-c.want)/c.want > 0.035 {
			t.Errorf("q%.3f = %.0f µs, want %.0f ±3.5%%", c.q, got, c.want)
		}
	}
	if h.max() != 100*time.Millisecond || h.mean() < 49*time.Millisecond || h.mean() > 51*time.Millisecond {
		t.Errorf("max %v mean %v", h.max(), h.mean())
	}
	// Weighted samples: one request of 1000 records counts 1000 times.
	var w hist
	w.add(time.Millisecond, 1000)
	w.add(time.Second, 1)
	if w.quantile(0.99) > 2*time.Millisecond {
		t.Errorf("weighted p99 %v", w.quantile(0.99))
	}
	for us := uint64(0); us < 1<<40; us = us*3 + 1 {
		v := bucketValue(bucketOf(us))
		if us > 64 && math.Abs(float64(v)-float64(us))/float64(us) > 0.035 {
			t.Fatalf("bucket of %d reads back %d", us, v)
		}
	}
}
