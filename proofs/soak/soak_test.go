package soak

import (
	"context"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferryhq/ferry/proofs/harness/agenttest"
	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
)

// The spool's geometry: small segments so that a soak of minutes cycles
// through many, a disk small enough to fill at once.
const (
	spoolDiskMB     = 96
	spoolSegmentMiB = 4
	// idemMaxMiB is delivery.idempotency.max_bytes's default, which the
	// soak keeps; keyLogBound what its key logs may hold on disk.
	idemMaxMiB  = 16
	keyLogBound = idemMaxMiB<<20 + idemMaxMiB<<20/4 + 64<<10
	spoolMaxMiB = 64
	recordSize  = 100
)

// TestSoak runs each mode's soak against one 3-broker cluster.
func TestSoak(t *testing.T) {
	kafkatest.SkipShort(t)
	s := loadSettings(t)
	t.Logf("seed %d: FERRY_SOAK_SEED=%d reproduces this run's faults; %s of load per mode, modes %s",
		s.seed, s.seed, s.duration, strings.Join(s.modes, ","))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("FAILED with seed %d: reproduce with FERRY_SOAK_SEED=%d FERRY_SOAK_MODES=%s (and FERRY_SOAK_DURATION=%s)",
				s.seed, s.seed, strings.Join(s.modes, ","), s.duration)
		}
	})
	c := kafkatest.StartClusterAt(t, 3, s.port)
	cp := javaProgram(t)
	eo := hasGuarantee(t)
	var ports []int
	for _, n := range c.Nodes {
		ports = append(ports, n.Port)
	}
	nm := probeNetem(ports)
	if nm.why != "" {
		t.Log(nm.why)
	}
	for i, mode := range s.modes {
		t.Run(mode, func(t *testing.T) {
			if mode == "exactly_once" && !eo {
				t.Skip("exactly_once skipped: this agent has no delivery.guarantee (`ferry config default` does not name it)")
			}
			runMode(t, s, c, cp, nm, mode, uint64(i))
		})
	}
}

// key is one application-token key of the agent's auth.keys.
type key struct {
	id     int
	secret string
}

// soak is one mode's run.
type soak struct {
	t        *testing.T
	s        settings
	mode     string
	c        *kafkatest.Cluster
	spoolDir string

	mu     sync.Mutex
	agent  *agenttest.Agent
	keys   []key // the last one signs
	config string

	pHTTP, pLocal, pKafka *proxy
	tk                    *tokens
}

func (k *soak) yaml() string {
	var b strings.Builder
	b.WriteString("auth:\n  keys:\n")
	for i, key := range k.keys {
		fmt.Fprintf(&b, "    - {id: %d, secret: %q, issue: %v}\n", key.id, key.secret, i == len(k.keys)-1)
	}
	fmt.Fprintf(&b, `receivers:
  otlp: {enabled: false}
  http: {auth: {mode: required}}
  local: {auth: {mode: required}}
  kafka: {enabled: true, advertised: %q, auth: {mode: required}}
telemetry: {report_interval: 1m}
`, k.pKafka.addr())
	mode := k.mode
	if mode == "exactly_once" {
		mode = "spool"
	}
	fmt.Fprintf(&b, "delivery:\n  mode: %s\n", mode)
	if k.mode == "exactly_once" {
		b.WriteString("  guarantee: exactly_once\n")
	}
	fmt.Fprintf(&b, "  spool: {dir: %q, segment_bytes: %dMiB, max_bytes: %dMiB}\n", k.spoolDir, spoolSegmentMiB, spoolMaxMiB)
	fmt.Fprintf(&b, "  dead_letter: {file: %q}\n", filepath.Join(filepath.Dir(k.spoolDir), "dead-letters.ndjson"))
	return b.String()
}

func (k *soak) newKey(r *rand.Rand) {
	var b [32]byte
	for i := range b {
		b[i] = byte(r.UintN(256))
	}
	id := 1
	if n := len(k.keys); n > 0 {
		id = k.keys[n-1].id + 1
	}
	k.keys = append(k.keys, key{id: id, secret: hex.EncodeToString(b[:])})
	if len(k.keys) > 3 {
		k.keys = k.keys[len(k.keys)-3:]
	}
}

// startAgent starts an agent on the mode's spool and points the proxies at it.
func (k *soak) startAgent() *agenttest.Agent {
	k.mu.Lock()
	yaml := k.yaml()
	k.mu.Unlock()
	a := agenttest.Start(k.t, ferryBin, yaml, "exporter.kafka.brokers=["+k.c.Brokers+"]")
	k.mu.Lock()
	k.agent, k.config = a, a.Config
	k.mu.Unlock()
	k.pHTTP.point(a.HTTP)
	k.pLocal.point(a.Local)
	k.pKafka.point(a.KafkaFront)
	return a
}

func (k *soak) cur() *agenttest.Agent {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.agent
}

// issue signs a token with the current signing key of the agent's config file.
func (k *soak) issue() (string, error) {
	k.mu.Lock()
	cfg := k.config
	k.mu.Unlock()
	out, err := exec.Command(ferryBin, "token", "issue", "-c", cfg, "--app", "soak", "--expires", "48h").Output()
	if err != nil {
		return "", fmt.Errorf("ferry token issue: %v", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// row is one mode's line of the report.
type row struct {
	Mode       string `json:"mode"`
	Duration   string `json:"duration"`
	Seed       uint64 `json:"seed"`
	Faults     string `json:"faults"`
	Offered    int64  `json:"offered"`
	Acked      int64  `json:"acked"`
	Delivered  int64  `json:"delivered"`
	Lost       int64  `json:"lost"`
	AckedDups  int64  `json:"acked_duplicates"`
	UnackedIn  int64  `json:"unacked_delivered"`
	UnackTwice int64  `json:"unacked_twice"`
	PerSource  string `json:"per_source"`
	Leak       string `json:"leak"`
	Verdict    string `json:"verdict"`
	Note       string `json:"note"`
}

func runMode(t *testing.T, s settings, c *kafkatest.Cluster, cp string, nm *netem, mode string, stream uint64) {
	r := rand.New(rand.NewPCG(s.seed, stream))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("FAILED in mode %s with seed %d: FERRY_SOAK_SEED=%d FERRY_SOAK_MODES=%s FERRY_SOAK_DURATION=%s reproduces it",
				mode, s.seed, s.seed, mode, s.duration)
		}
	})
	topic := kafkatest.NewTopic(t, c.Nodes[0].Addr, "soak-"+mode, 3)
	dir := t.TempDir()
	k := &soak{t: t, s: s, mode: mode, c: c, spoolDir: filepath.Join(dir, "spool")}
	if err := os.MkdirAll(k.spoolDir, 0o755); err != nil {
		t.Fatal(err)
	}
	var notes []string
	var disk *spoolDisk
	if mode != "kafka" {
		disk = mountSpool(t, k.spoolDir, spoolDiskMB)
		if disk.why != "" {
			notes = append(notes, disk.why)
			t.Log(disk.why)
		}
	}
	if nm.why != "" {
		notes = append(notes, nm.why)
	}
	k.pHTTP, k.pLocal, k.pKafka = newProxy(t), newProxy(t), newProxy(t)
	k.newKey(r)
	k.startAgent()
	k.tk = &tokens{file: filepath.Join(dir, "token")}
	tok, err := k.issue()
	if err != nil {
		t.Fatal(err)
	}
	if err := k.tk.set(tok); err != nil {
		t.Fatal(err)
	}

	// ---- the faults this mode gets ----
	// How long a broker stays down or paused, a disk full, the network bad.
	hold := [2]time.Duration{2 * time.Second, 5 * time.Second}
	if s.full {
		hold = [2]time.Duration{3 * time.Second, 10 * time.Second}
	}
	faults := []fault{
		{"agent-kill", func(r *rand.Rand) (string, error) {
			k.cur().Kill()
			d := sleepRand(r, 0, 2*time.Second)
			k.startAgent()
			return fmt.Sprintf("SIGKILL, a new agent %.1fs later", d.Seconds()), nil
		}},
		{"broker-kill", func(r *rand.Rand) (string, error) {
			n := r.IntN(len(c.Nodes))
			c.Nodes[n].Kill(t)
			d := sleepRand(r, hold[0], hold[1])
			c.Nodes[n].Restart(t)
			return fmt.Sprintf("node %d SIGKILL, restarted %.1fs later", n+1, d.Seconds()), nil
		}},
		{"broker-pause", func(r *rand.Rand) (string, error) {
			n := r.IntN(len(c.Nodes))
			c.Nodes[n].Pause(t)
			d := sleepRand(r, hold[0], hold[1])
			c.Nodes[n].Resume(t)
			return fmt.Sprintf("node %d SIGSTOP for %.1fs", n+1, d.Seconds()), nil
		}},
		{"cut", func(r *rand.Rand) (string, error) {
			n := k.pHTTP.cut() + k.pLocal.cut() + k.pKafka.cut()
			return fmt.Sprintf("%d connection legs reset", n), nil
		}},
		{"rotate", func(r *rand.Rand) (string, error) {
			k.mu.Lock()
			k.newKey(r)
			yaml, cfg, a := k.yaml(), k.config, k.agent
			ids := []string{}
			for _, key := range k.keys {
				ids = append(ids, fmt.Sprint(key.id))
			}
			k.mu.Unlock()
			if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
				return "", err
			}
			a.Reload()
			time.Sleep(500 * time.Millisecond) // the reload is applied before clients use the new key
			tok, err := k.issue()
			if err != nil {
				return "", err
			}
			return "keys " + strings.Join(ids, ",") + ", clients moved to the newest", k.tk.set(tok)
		}},
	}
	if disk != nil && disk.why == "" {
		faults = append(faults, fault{"spool-full", func(r *rand.Rand) (string, error) {
			if err := disk.fill(); err != nil {
				return "", err
			}
			d := sleepRand(r, hold[0], hold[1])
			return fmt.Sprintf("spool disk full for %.1fs", d.Seconds()), disk.free()
		}})
	}
	if nm.why == "" {
		faults = append(faults, fault{"netem", func(r *rand.Rand) (string, error) {
			delay := time.Duration(20+r.IntN(180)) * time.Millisecond
			loss := 1 + r.IntN(10)
			if err := nm.on(delay, loss); err != nil {
				return "", err
			}
			d := sleepRand(r, hold[0], hold[1])
			nm.off()
			return fmt.Sprintf("delay %s, loss %d%% towards the brokers for %.1fs", delay, loss, d.Seconds()), nil
		}})
	}

	// ---- load ----
	ledgers := make([]*ledger, nSources)
	for i := range ledgers {
		ledgers[i] = &ledger{}
	}
	pad := strings.Repeat("x", recordSize-16)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), s.duration)
	defer cancel()
	var loads sync.WaitGroup
	for _, src := range []int{srcHTTP0, srcHTTP1} {
		loads.Add(1)
		go func() { defer loads.Done(); httpLoad(ctx, src, ledgers[src], k.pHTTP.addr(), topic, k.tk, s.rate, pad) }()
	}
	loads.Add(1)
	go func() { defer loads.Done(); goLoad(ctx, t, ledgers[srcGo], k.pLocal.addr(), topic, k.tk, s.rate, pad) }()
	java := startJava(t, cp, k.pLocal.addr(), k.pKafka.addr(), topic, k.tk.file, s.rate, recordSize, ledgers)

	// ---- the leak sampler and the progress line ----
	smp := &sampler{}
	stopSampling := make(chan struct{})
	var sampling sync.WaitGroup
	sampling.Add(1)
	go func() {
		defer sampling.Done()
		// Every second; four times as often in the short version, whose
		// windows are seconds long.
		every := 250 * time.Millisecond
		if s.full {
			every = time.Second
		}
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-stopSampling:
				return
			case <-tick.C:
			}
			a := k.cur()
			pid := a.Cmd.Process.Pid
			g := a.Metric("go_goroutines")
			rss, fds := rssOf(pid), fdsOf(pid)
			if g <= 0 || rss <= 0 || fds < 0 {
				continue // the agent is down or starting
			}
			smp.add(sample{at: time.Since(start), rss: rss, goroutines: g, fds: fds, spool: dirBytes(k.spoolDir)})
		}
	}()
	var counts sync.Map
	totalFaults := func() int64 {
		var n int64
		counts.Range(func(_, v any) bool { n += v.(*atomic.Int64).Load(); return true })
		return n
	}
	logf := func(format string, args ...any) {
		t.Logf("[%s %5.0fs] %s", mode, time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}
	sampling.Add(1)
	go func() {
		defer sampling.Done()
		tick := time.NewTicker(10 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-stopSampling:
				return
			case <-tick.C:
			}
			var acked []string
			for i, l := range ledgers {
				acked = append(acked, fmt.Sprintf("%s %d", sourceNames[i], l.ackedN.Load()))
			}
			x, _ := smp.last()
			logf("progress: %d faults; acknowledged: %s; RSS %.0f MiB, goroutines %.0f, open files %d, spool %.1f MiB",
				totalFaults(), strings.Join(acked, ", "), mib(x.rss), x.goroutines, x.fds, mib(x.spool))
		}
	}()

	// ---- faults until the load's time is up ----
	gap := [2]time.Duration{time.Second, 3 * time.Second}
	if s.full {
		gap = [2]time.Duration{3 * time.Second, 15 * time.Second}
	}
	stopFaults := make(chan struct{})
	schedErr := make(chan error, 1)
	go func() {
		defer close(schedErr)
		// A fault's own t.Fatal (a broker that does not restart) ends this
		// goroutine; the test has failed then, and the deferred close lets it end.
		if err := schedule(t, r, faults, gap, stopFaults, &counts, logf); err != nil {
			schedErr <- err
		}
	}()
	<-ctx.Done()
	close(stopFaults)
	if err := <-schedErr; err != nil {
		t.Error(err)
	}
	loadTime := time.Since(start)
	logf("load stops; faults over (%d injected)", totalFaults())
	loads.Wait()
	java.stop(t)
	close(stopSampling)
	sampling.Wait()
	k.cur().Alive()

	// ---- the checker ----
	checkTimeout, idle := 2*time.Minute, 3*time.Second
	if s.full {
		checkTimeout = 5 * time.Minute
	}
	vs, took := check(t, c.Brokers, topic, ledgers, checkTimeout, idle)
	logf("checked in %.1fs", took.Seconds())

	// The spool, once Kafka has everything, is back to a few segments; its
	// idempotency key logs (dedup-*.log: the clients' keys and frame
	// sequences) stay within delivery.idempotency.max_bytes plus the
	// active file (a quarter of it), whatever the load's length.
	var spoolEnd, keysEnd int64
	if mode != "kafka" {
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(500 * time.Millisecond) {
			spoolEnd, keysEnd = spoolBytes(k.spoolDir)
			if spoolEnd-keysEnd <= 4*spoolSegmentMiB<<20 || time.Now().After(deadline) {
				break
			}
		}
	}
	lk := leaks(smp.samples, loadTime)
	lk.spool1 = spoolEnd
	if spoolEnd-keysEnd > 4*spoolSegmentMiB<<20 {
		lk.problems = append(lk.problems, fmt.Sprintf("the spool's segments hold %.1f MiB after Kafka has every record (4 segments of %d MiB expected at most)", mib(spoolEnd-keysEnd), spoolSegmentMiB))
	}
	if keysEnd > keyLogBound {
		lk.problems = append(lk.problems, fmt.Sprintf("the spool's key logs hold %.1f MiB (delivery.idempotency.max_bytes %d MiB and its active file expected at most)", mib(keysEnd), idemMaxMiB))
	}
	k.cur().Stop()

	// ---- the verdict ----
	var tot verdict
	var per []string
	var failures []string
	for src, v := range vs {
		tot.offered += v.offered
		tot.acked += v.acked
		tot.delivered += v.delivered
		tot.lost += v.lost
		tot.ackedDups += v.ackedDups
		tot.unackedIn += v.unackedIn
		tot.unackedTwice += v.unackedTwice
		tot.unknown += v.unknown
		per = append(per, fmt.Sprintf("%s %d/%d", sourceNames[src], v.acked, v.offered))
		t.Logf("%s: offered %d, acknowledged %d, in Kafka %d, lost %d, duplicates of acknowledged %d, unacknowledged in Kafka %d (twice %d), unknown %d",
			sourceNames[src], v.offered, v.acked, v.delivered, v.lost, v.ackedDups, v.unackedIn, v.unackedTwice, v.unknown)
		if v.lost > 0 {
			failures = append(failures, fmt.Sprintf("%s: %d acknowledged records are not in Kafka (first: %d:%d)", sourceNames[src], v.lost, src, v.firstLost))
		}
		if mode == "exactly_once" && v.ackedDups > 0 {
			failures = append(failures, fmt.Sprintf("%s: %d extra copies of acknowledged records (first: %d:%d) with exactly_once", sourceNames[src], v.ackedDups, src, v.firstAckedTwice))
		}
		if mode == "exactly_once" && v.unackedTwice > 0 {
			failures = append(failures, fmt.Sprintf("%s: %d unacknowledged records in Kafka more than once with exactly_once", sourceNames[src], v.unackedTwice))
		}
		if v.unknown > 0 {
			failures = append(failures, fmt.Sprintf("%s: %d records in Kafka that were never offered", sourceNames[src], v.unknown))
		}
		if v.acked == 0 {
			failures = append(failures, fmt.Sprintf("%s: nothing was acknowledged", sourceNames[src]))
		}
	}
	for _, p := range lk.problems {
		failures = append(failures, "leak check: "+p)
	}
	fc := map[string]int{}
	counts.Range(func(k, v any) bool { fc[k.(string)] = int(v.(*atomic.Int64).Load()); return true })
	verdictText := "pass"
	if len(failures) > 0 {
		verdictText = "**FAIL**: " + strings.Join(failures, "; ")
	}
	report.Add(t, row{Mode: mode, Duration: loadTime.Round(time.Second).String(), Seed: s.seed, Faults: fmtCounts(fc),
		Offered: tot.offered, Acked: tot.acked, Delivered: tot.delivered, Lost: tot.lost, AckedDups: tot.ackedDups,
		UnackedIn: tot.unackedIn, UnackTwice: tot.unackedTwice, PerSource: strings.Join(per, ", "), Leak: lk.String(),
		Verdict: verdictText, Note: strings.Join(notes, "; ")})
	for _, f := range failures {
		t.Errorf("seed %d: %s", s.seed, f)
	}
}

// ---- the report ----

var report = &agenttest.Report[row]{Env: "FERRY_SOAK_REPORT", Begin: "<!-- soak:begin -->", End: "<!-- soak:end -->", Render: render}

func render(rows []row) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Measured by `make soak` on %s, %s.\n\n", time.Now().UTC().Format("2006-01-02"), agenttest.Machine())
	b.WriteString("| mode | load | seed | faults injected | offered | acknowledged (per source: acked/offered) | delivered | lost | duplicates of acknowledged | unacknowledged delivered (twice) | leak check (after warm-up → end) | verdict | notes |\n")
	b.WriteString("|---|---|---:|---|---:|---|---:|---:|---:|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s | %d | %s | %d | %d (%s) | %d | **%d** | %d | %d (%d) | %s | %s | %s |\n",
			r.Mode, r.Duration, r.Seed, r.Faults, r.Offered, r.Acked, r.PerSource, r.Delivered, r.Lost, r.AckedDups,
			r.UnackedIn, r.UnackTwice, r.Leak, r.Verdict, r.Note)
	}
	return b.String()
}
