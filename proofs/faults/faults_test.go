package faults

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/proofs/harness/agenttest"
	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
)

func spoolSets(t *testing.T, mode, dir string) []string {
	return []string{"delivery.mode=" + mode, "delivery.spool.dir=" + dir,
		"delivery.dead_letter.file=" + filepath.Join(t.TempDir(), "dead.ndjson")}
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// 1. The broker is killed with SIGKILL under load and restarted: every
// record acknowledged to a client is in Kafka afterwards, in every mode.
func TestBrokerKilledUnderLoad(t *testing.T) {
	b := kafkatest.Start(t)
	modes := []string{"kafka", "spool", "spill", "exactly_once"}
	total, killAt, restartAt := dur(14*time.Second, 60*time.Second), dur(4*time.Second, 20*time.Second), dur(8*time.Second, 40*time.Second)
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			topic := kafkatest.NewTopic(t, b.Addr, "fault-broker-"+strings.ReplaceAll(mode, "_", "-"), 3)
			ackTimeout := "60s"
			if mode == "spill" {
				// Requests caught waiting when the broker dies get 504 soon, so
				// the clients' next requests show the spill.
				ackTimeout = "3s"
			}
			var vopts []kgo.Opt
			dmode := mode
			if mode == "exactly_once" {
				dmode = "spool"
				vopts = append(vopts, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
			}
			sets := append(spoolSets(t, dmode, t.TempDir()), "delivery.spool.fsync=interval", "receivers.http.ack_timeout="+ackTimeout)
			if mode == "exactly_once" {
				sets = append(sets, "delivery.guarantee=exactly_once")
			}
			a := startAgent(t, b.Addr, sets...)
			ctx, cancel := context.WithTimeout(context.Background(), total)
			defer cancel()
			go func() {
				time.Sleep(killAt)
				b.Kill(t)
				time.Sleep(restartAt - killAt)
				b.Restart(t)
			}()
			l := load(ctx, t, func() string { return a.HTTP }, topic, loadSpec{clients: 8, batch: 100, size: 100, perSec: 20000})
			a.Alive()
			delivered, lost, dups, took := verify(t, b.Addr, topic, l, 3*time.Minute, vopts...)
			o := outcome{Test: "1. broker SIGKILL, restarted", Mode: strings.Replace(mode, "exactly_once", "spool, exactly_once (read_committed)", 1),
				Duration: fmt.Sprintf("%s, kill at %s, restart at %s", total, killAt, restartAt),
				Offered:  l.offered.Load(), Acked: l.ackedN.Load(), Delivered: delivered, Lost: lost, Duplicates: dups,
				Refused: l.refused(), PeakRSSMiB: mib(a.peakRSS.Load()), Recovery: fmt.Sprintf("all in Kafka %.1fs after load", took.Seconds()),
				Note: l.statuses()}
			if mode != "kafka" {
				o.Note += fmt.Sprintf("; %0.f records retried from the spool", a.Metric("ferry_spool_retried_records_total"))
			}
			spilled := a.Metric("ferry_spill_records_total")
			if mode == "spill" {
				o.Note += fmt.Sprintf("; %0.f records spilled", spilled)
			}
			record(t, o)
			a.Stop()
			if lost > 0 {
				t.Fatalf("%d acknowledged records are not in Kafka", lost)
			}
			if l.ackedN.Load() == 0 {
				t.Fatal("nothing was acknowledged")
			}
			if mode == "spill" && spilled == 0 {
				t.Fatal("the broker was down for seconds and nothing spilled to disk")
			}
			if mode == "exactly_once" && dups > 0 {
				t.Fatalf("exactly once: %d duplicates seen by a read_committed consumer", dups)
			}
		})
	}
}

// 2. The agent is killed with SIGKILL mid-load in spool mode with fsync
// always: after a restart on the same spool every acknowledged record
// arrives. At least once, replays of records Kafka had acknowledged are
// counted; exactly once, a read_committed consumer finds every record
// once, acknowledged or not.
func TestAgentKilledInSpoolMode(t *testing.T) {
	brokers := kafkatest.Shared(t)
	for _, guarantee := range []string{"at_least_once", "exactly_once"} {
		t.Run(guarantee, func(t *testing.T) {
			agentKilledInSpoolMode(t, brokers, guarantee)
		})
	}
}

func agentKilledInSpoolMode(t *testing.T, brokers, guarantee string) {
	topic := kafkatest.NewTopic(t, brokers, "fault-agent-"+strings.ReplaceAll(guarantee, "_", "-"), 3)
	dir := t.TempDir()
	sets := append(spoolSets(t, "spool", dir), "delivery.spool.fsync=always", "delivery.guarantee="+guarantee)
	a := startAgent(t, brokers, sets...)
	var cur atomic.Pointer[agent]
	cur.Store(a)
	total := dur(10*time.Second, 60*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), total)
	defer cancel()
	var restartedIn time.Duration
	var replayed float64
	var a2 *agent
	done := make(chan struct{})
	go func() {
		defer close(done)
		time.Sleep(total / 3)
		a.Kill()
		killed := time.Now()
		a2 = startAgent(t, brokers, sets...)
		restartedIn = time.Since(killed)
		cur.Store(a2)
	}()
	l := load(ctx, t, func() string { return cur.Load().HTTP }, topic, loadSpec{clients: 8, batch: 100, size: 100, perSec: 20000})
	<-done
	a2.Alive()
	var opts []kgo.Opt
	mode := "spool, fsync always"
	if guarantee == "exactly_once" {
		opts = append(opts, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
		mode += ", exactly_once (read_committed)"
	}
	delivered, lost, dups, took := verify(t, brokers, topic, l, 3*time.Minute, opts...)
	replayed = a2.Metric("ferry_spool_replayed_records_total")
	replaySecs := a2.Metric("ferry_spool_replay_seconds")
	recovery := fmt.Sprintf("serving %.1fs after the kill; %0.f records replayed in %.1fs", restartedIn.Seconds(), replayed, replaySecs)
	if guarantee == "exactly_once" {
		recovery += fmt.Sprintf("; %.0f bytes Kafka had committed skipped", a2.Metric("ferry_spool_resume_skipped_bytes_total"))
	}
	record(t, outcome{Test: "2. agent SIGKILL, restarted on its spool", Mode: mode,
		Duration: fmt.Sprintf("%s, kill at %s", total, total/3), Offered: l.offered.Load(), Acked: l.ackedN.Load(),
		Delivered: delivered, Lost: lost, Duplicates: dups, Refused: l.refused(), PeakRSSMiB: mib(a.peakRSS.Load()),
		Recovery: recovery,
		Note:     fmt.Sprintf("%s; verified in %.1fs", l.statuses(), took.Seconds())})
	committed := a2.Metric(`ferry_exactly_once_transactions_total{result="committed"}`)
	a2.Stop()
	if lost > 0 {
		t.Fatalf("%d acknowledged records are not in Kafka", lost)
	}
	if l.ackedN.Load() == 0 {
		t.Fatal("nothing was acknowledged")
	}
	switch guarantee {
	case "exactly_once":
		if dups > 0 {
			t.Fatalf("exactly once: %d duplicates seen by a read_committed consumer", dups)
		}
		if committed == 0 {
			t.Fatal("exactly once: the restarted agent committed no transaction")
		}
	default:
		if dups > int64(replayed) {
			t.Fatalf("%d duplicates but only %v records replayed: duplicates from elsewhere", dups, replayed)
		}
	}
}

// 3. Kafka is down while offered load exceeds what ferry can hold: memory
// stays within memory_limit + 64 MiB, the spool within its cap, clients
// get 429/503 once the caps are reached, nothing crashes, and every
// accepted record arrives once Kafka is back.
func TestKafkaDownOverload(t *testing.T) {
	b := kafkatest.Start(t)
	topic := kafkatest.NewTopic(t, b.Addr, "fault-overload", 3)
	b.Kill(t)
	const memLimit, spoolCap = 64 << 20, 256 << 20
	sets := append(spoolSets(t, "spill", t.TempDir()),
		fmt.Sprintf("queue.memory_limit=%d", memLimit), fmt.Sprintf("delivery.spool.max_bytes=%d", spoolCap),
		"delivery.spool.segment_bytes=16MiB", "delivery.spool.fsync=interval", "receivers.http.max_request_bytes=4MiB")
	a := startAgent(t, b.Addr, sets...)
	total := dur(20*time.Second, 3*time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), total)
	defer cancel()
	var peakSpool atomic.Int64
	go func() {
		for ctx.Err() == nil {
			if v := int64(a.Metric("ferry_spool_bytes")); v > peakSpool.Load() {
				peakSpool.Store(v)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}()
	l := load(ctx, t, func() string { return a.HTTP }, topic, loadSpec{clients: 16, batch: 200, size: 1000})
	a.Alive()
	rss := a.peakRSS.Load()
	restart := time.Now()
	b.Restart(t)
	delivered, lost, dups, took := verify(t, b.Addr, topic, l, 5*time.Minute)
	record(t, outcome{Test: "3. Kafka down, load above capacity", Mode: "spill (64 MiB memory, 256 MiB spool)",
		Duration: fmt.Sprintf("%s of 1 KB records, 16 clients", total), Offered: l.offered.Load(), Acked: l.ackedN.Load(),
		Delivered: delivered, Lost: lost, Duplicates: dups, Refused: l.refused(), PeakRSSMiB: mib(rss),
		Recovery: fmt.Sprintf("all in Kafka %.1fs after the restart began", time.Since(restart).Seconds()),
		Note:     fmt.Sprintf("peak spool %.0f MiB; %s; verified in %.1fs", mib(peakSpool.Load()), l.statuses(), took.Seconds())})
	a.Stop()
	if rss > memLimit+64<<20 {
		t.Errorf("peak RSS %.0f MiB exceeds memory_limit + 64 MiB", mib(rss))
	}
	if peakSpool.Load() > spoolCap {
		t.Errorf("spool reached %d bytes, cap %d", peakSpool.Load(), spoolCap)
	}
	if *l.refused() == 0 {
		t.Error("no client was refused although the caps must have been reached")
	}
	if lost > 0 {
		t.Fatalf("%d accepted records are not in Kafka", lost)
	}
}

// deadBroker is an address where no Kafka listens.
func deadBroker(t *testing.T) string { return agenttest.FreeAddr(t) }

// fill offers a fixed number of requests while Kafka is unreachable, so
// they can only land in the spool.
func fill(t *testing.T, a *agent, topic string, requests, batch int) *ledger {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		for a.Metric("ferry_receiver_received_records_total") < float64(requests*batch) && ctx.Err() == nil {
			time.Sleep(20 * time.Millisecond)
		}
		cancel()
	}()
	return load(ctx, t, func() string { return a.HTTP }, topic, loadSpec{clients: 1, batch: batch, size: 200})
}

// 4. A spool damaged on disk (bytes flipped inside a segment, a torn tail):
// the agent starts, delivers every intact record and counts the damage.
func TestCorruptedSegment(t *testing.T) {
	brokers := kafkatest.Shared(t)
	topic := kafkatest.NewTopic(t, brokers, "fault-corrupt", 1)
	dir := t.TempDir()
	sets := append(spoolSets(t, "spool", dir), "delivery.spool.segment_bytes=1MiB", "shutdown_timeout=2s")
	a := startAgent(t, deadBroker(t), sets...)
	l := fill(t, a, topic, 40, 500)
	a.Stop()
	segs, _ := filepath.Glob(filepath.Join(dir, "*.seg"))
	sort.Strings(segs)
	if len(segs) < 3 {
		t.Fatalf("want ≥ 3 segments, have %d", len(segs))
	}
	flip := func(file string, off int64) {
		f, err := os.OpenFile(file, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		var b [4]byte
		_, _ = f.ReadAt(b[:], off)
		for i := range b {
			b[i] ^= 0x5A
		}
		_, _ = f.WriteAt(b[:], off)
	}
	flip(segs[0], 300_000)
	flip(segs[1], 700_000)
	last := segs[len(segs)-1]
	fi, _ := os.Stat(last)
	if err := os.Truncate(last, fi.Size()-7); err != nil {
		t.Fatal(err)
	}
	a2 := startAgent(t, brokers, sets...)
	delivered, lost, dups, took := verify(t, brokers, topic, l, 10*time.Second)
	corrupt := a2.Metric("ferry_spool_corrupt_bytes_total")
	regions := a2.Metric("ferry_spool_corrupt_regions_total")
	record(t, outcome{Test: "4. corrupted spool (2 flipped spots, torn tail)", Mode: "spool", Duration: "≥ 20,000 records of 200 B",
		Offered: l.offered.Load(), Acked: l.ackedN.Load(), Delivered: delivered, Lost: lost, Duplicates: dups,
		PeakRSSMiB: mib(a2.peakRSS.Load()), Recovery: fmt.Sprintf("delivered in %.1fs", took.Seconds()),
		Note: fmt.Sprintf("lost = the records the damage hit; %0.f damaged bytes in %0.f regions counted", corrupt, regions)})
	a2.Stop()
	if l.ackedN.Load() < 20000 {
		t.Fatalf("acknowledged %d, want ≥ 20000", l.ackedN.Load())
	}
	// A flip costs the one or two frames it touches; the torn tail one.
	if lost == 0 || lost > 5 {
		t.Fatalf("%d records lost; three damaged spots should cost one or two records each", lost)
	}
	if corrupt == 0 || regions < 3 {
		t.Fatalf("damage not counted: %v bytes, %v regions", corrupt, regions)
	}
}

// 5. The disk fills up (a small tmpfs under the spool): clients get clear
// 503s, nothing is acknowledged that was not stored, and after a restart
// with Kafka every acknowledged record arrives.
func TestDiskFull(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	brokers := kafkatest.Shared(t)
	topic := kafkatest.NewTopic(t, brokers, "fault-diskfull", 3)
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs: %v %s", err, out)
	}
	defer exec.Command("umount", "-l", dir).Run()
	sets := append(spoolSets(t, "spool", dir), "delivery.spool.segment_bytes=4MiB", "delivery.spool.fsync=always", "shutdown_timeout=2s")
	a := startAgent(t, deadBroker(t), sets...)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for a.Metric("ferry_receiver_errors_total") < 20 && ctx.Err() == nil {
			time.Sleep(50 * time.Millisecond)
		}
		time.Sleep(time.Second)
		cancel()
	}()
	l := load(ctx, t, func() string { return a.HTTP }, topic, loadSpec{clients: 4, batch: 200, size: 500})
	a.Alive()
	logs := a.Logs.String()
	a.Stop()
	if v, ok := l.status.Load(503); !ok || v.(*atomic.Int64).Load() == 0 {
		t.Fatalf("no 503 from a full disk: %s", l.statuses())
	}
	a2 := startAgent(t, brokers, sets...)
	delivered, lost, dups, took := verify(t, brokers, topic, l, time.Minute)
	record(t, outcome{Test: "5. disk full (24 MiB tmpfs)", Mode: "spool, fsync always", Duration: "until 20 refusals",
		Offered: l.offered.Load(), Acked: l.ackedN.Load(), Delivered: delivered, Lost: lost, Duplicates: dups, Refused: l.refused(),
		PeakRSSMiB: mib(a.peakRSS.Load()), Recovery: fmt.Sprintf("delivered %.1fs after restart", took.Seconds()), Note: l.statuses()})
	a2.Stop()
	if lost > 0 {
		t.Fatalf("%d acknowledged records are not in Kafka", lost)
	}
	if !strings.Contains(logs, "no space left on device") {
		t.Fatalf("the agent's log does not say the disk is full")
	}
}
