package ratelimit

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ferryhq/ferry/telemetry"
)

func limiter(t *testing.T, cfg Config) (*Limiter, *time.Time) {
	t.Helper()
	l, err := New(cfg, telemetry.TestSettings())
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	l.now = func() time.Time { return now }
	return l, &now
}

func TestRecordsPerSecondWithBurst(t *testing.T) {
	l, now := limiter(t, Config{Classes: map[string]Class{"small": {RecordsPerSec: 100, BurstRecords: 200}}})
	admitted := 0
	for i := 0; i < 50; i++ {
		if ok, _ := l.Allow("shop", "small", 10, 0); ok {
			admitted += 10
		}
	}
	// The burst (200) admits exactly 200 in requests of 10.
	if admitted != 200 {
		t.Fatalf("admitted %d at once, want the burst of 200", admitted)
	}
	// A request larger than the burst passes when the bucket is full, into
	// debt; nothing more passes until the debt is paid.
	l2, now2 := limiter(t, Config{Classes: map[string]Class{"small": {RecordsPerSec: 100, BurstRecords: 15}}})
	if ok, _ := l2.Allow("a", "small", 40, 0); !ok {
		t.Fatal("request larger than the burst refused on a full bucket")
	}
	if ok, wait := l2.Allow("a", "small", 1, 0); ok || wait < 200*time.Millisecond {
		t.Fatalf("admitted while in debt (wait %v)", wait)
	}
	*now2 = now2.Add(300 * time.Millisecond) // 30 back: debt of 25 paid, 5 left
	if ok, _ := l2.Allow("a", "small", 5, 0); !ok {
		t.Fatal("not admitted after the debt was paid")
	}
	ok, wait := l.Allow("shop", "small", 10, 0)
	if ok || wait <= 0 || wait > time.Second {
		t.Fatalf("over the limit: ok %v wait %v", ok, wait)
	}
	*now = now.Add(time.Second) // 100 records of refill pay the debt of 10 and admit more
	if ok, _ := l.Allow("shop", "small", 10, 0); !ok {
		t.Fatal("refill did not admit")
	}
	// Over 10 seconds at steady pressure the rate holds at ~100/s.
	admitted = 0
	for s := 0; s < 1000; s++ {
		*now = now.Add(10 * time.Millisecond)
		if ok, _ := l.Allow("shop", "small", 5, 0); ok {
			admitted += 5
		}
	}
	if admitted < 950 || admitted > 1100 {
		t.Fatalf("%d records admitted in 10 s at 100/s", admitted)
	}
	if v := testutil.ToFloat64(l.refused.WithLabelValues("shop")); v == 0 {
		t.Fatal("refusals not counted")
	}
}

func TestClassesOverridesAndUnlimited(t *testing.T) {
	l, _ := limiter(t, Config{
		Classes:      map[string]Class{"tiny": {BytesPerSec: 1000}, "free": {RecordsPerSec: 1}},
		DefaultClass: "free",
		Apps:         map[string]string{"vip": "tiny"},
	})
	// vip's token says "free", its override says "tiny" (bytes only).
	if ok, _ := l.Allow("vip", "free", 1000, 600); !ok {
		t.Fatal("vip within bytes refused")
	}
	if ok, _ := l.Allow("vip", "free", 1, 600); ok {
		t.Fatal("vip over its bytes admitted")
	}
	if ok, _ := l.Allow("vip", "free", 1, 300); !ok {
		t.Fatal("vip within what is left refused")
	}
	// No class on the token: default class applies.
	l.Allow("anon", "", 1, 0)
	if ok, _ := l.Allow("anon", "", 1, 0); ok {
		t.Fatal("default class not applied")
	}
	// Without a default, unknown apps are unlimited.
	u, _ := limiter(t, Config{Classes: map[string]Class{"x": {RecordsPerSec: 1}}})
	for i := 0; i < 100; i++ {
		if ok, _ := u.Allow("any", "", 1000, 1<<20); !ok {
			t.Fatal("unlimited app refused")
		}
	}
}

func TestValidate(t *testing.T) {
	for _, c := range []Config{
		{DefaultClass: "nope"},
		{Classes: map[string]Class{"a": {RecordsPerSec: -1}}},
		{Classes: map[string]Class{"a": {}}, Apps: map[string]string{"x": "b"}},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}

func BenchmarkAllow(b *testing.B) {
	l, err := New(Config{Classes: map[string]Class{"c": {RecordsPerSec: 1e12, BytesPerSec: 1e15}}, DefaultClass: "c"}, telemetry.TestSettings())
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		l.Allow("shop", "c", 100, 10000)
	}
}

// TestReloadKeepsDebt: a reload that leaves an application's class as it
// was keeps its bucket (a client in debt stays refused); one that changes
// the class starts it afresh under the new one.
func TestReloadKeepsDebt(t *testing.T) {
	cfg := Config{Classes: map[string]Class{"tiny": {BytesPerSec: 1000}, "other": {BytesPerSec: 5}}, DefaultClass: "tiny"}
	l, _ := limiter(t, cfg)
	if ok, _ := l.Allow("a", "", 1, 500_000); !ok {
		t.Fatal("a request larger than the burst refused on a full bucket")
	}
	if ok, _ := l.Allow("b", "other", 1, 5); !ok {
		t.Fatal("b's first request refused")
	}
	if err := l.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if ok, _ := l.Allow("a", "", 1, 10); ok {
		t.Fatal("a reload that changed nothing forgave a's debt")
	}
	cfg.Classes["tiny"] = Class{BytesPerSec: 1_000_000}
	if err := l.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if ok, _ := l.Allow("a", "", 1, 10); !ok {
		t.Fatal("a's class changed and its bucket was not started afresh")
	}
	if ok, _ := l.Allow("b", "other", 1, 5); ok {
		t.Fatal("b's class (from its token) did not change, yet its bucket was refilled")
	}
}

// TestAdmittedAndDebt: what ferry top shows per application: records let
// through (limited or not) and the debt of a bucket that admitted a
// request larger than its burst, falling as the refill pays it back.
func TestAdmittedAndDebt(t *testing.T) {
	set := telemetry.TestSettings()
	l, err := New(Config{Classes: map[string]Class{"small": {RecordsPerSec: 100, BurstRecords: 10}}}, set)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	l.now = func() time.Time { return now }
	debt := func(app string) float64 {
		mfs, err := set.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "ferry_ratelimit_debt_seconds" {
				continue
			}
			for _, m := range mf.GetMetric() {
				if m.GetLabel()[0].GetValue() == app {
					return m.GetGauge().GetValue()
				}
			}
		}
		return 0
	}
	if ok, _ := l.Allow("shop", "small", 60, 600); !ok { // full bucket: admitted whole, 50 records in debt
		t.Fatal("refused on a full bucket")
	}
	if ok, _ := l.Allow("shop", "small", 1, 10); ok {
		t.Fatal("admitted in debt")
	}
	if ok, _ := l.Allow("free", "", 7, 70); !ok { // no class: unlimited, still counted
		t.Fatal("unlimited app refused")
	}
	if v := testutil.ToFloat64(l.admitted.WithLabelValues("shop")); v != 60 {
		t.Fatalf("shop admitted %v records, want 60", v)
	}
	if v := testutil.ToFloat64(l.admittedBytes.WithLabelValues("shop")); v != 600 {
		t.Fatalf("shop admitted %v bytes, want 600", v)
	}
	if v := testutil.ToFloat64(l.admitted.WithLabelValues("free")); v != 7 {
		t.Fatalf("free admitted %v, want 7", v)
	}
	if d := debt("shop"); d < 0.499 || d > 0.501 {
		t.Fatalf("debt %v s, want 0.5 (50 records at 100/s)", d)
	}
	now = now.Add(200 * time.Millisecond)
	if d := debt("shop"); d < 0.299 || d > 0.301 {
		t.Fatalf("debt %v s after 200 ms, want 0.3", d)
	}
	now = now.Add(time.Second)
	if d := debt("shop"); d != 0 {
		t.Fatalf("debt %v after it was paid, want none listed", d)
	}
	if d := debt("free"); d != 0 {
		t.Fatalf("an unlimited app has debt %v", d)
	}
}
