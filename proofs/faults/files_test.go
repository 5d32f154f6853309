package faults

// The files receiver (receivers.files) against the real binary and a real
// Kafka: log files written at a fixed rate with sequence ids
// (tools/bench/fileload), rotated both ways, the agent killed mid-rotation,
// Kafka down, the checkpoint disk full; then the topic read back and every
// file's lines counted: lost, duplicated, out of order.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
	"github.com/ferryhq/ferry/tools/bench/fileload"
)

// The files receiver's bounds in these tests (small, so the duplicate
// bound they give is tight), and the most one read takes beyond them: a
// read starts while the bytes in flight are below the bound and holds at
// most 4096 lines.
const (
	filesMaxInflight     = 4 << 20
	filesMaxFileInflight = 1 << 20
	filesReadLines       = 4096
	filesPoll            = 100 * time.Millisecond
)

// filesSets enables the files receiver on load's files, into topic.
func filesSets(spec fileload.Spec, ckdir, topic string) []string {
	return []string{"receivers.files.enabled=true", "receivers.files.include=[" + spec.Glob() + "]",
		"receivers.files.topic=" + topic, "receivers.files.checkpoint_dir=" + ckdir, "receivers.files.start_at=beginning",
		"receivers.files.poll_interval=" + filesPoll.String(),
		fmt.Sprintf("receivers.files.max_inflight_bytes=%d", filesMaxInflight),
		fmt.Sprintf("receivers.files.max_file_inflight_bytes=%d", filesMaxFileInflight),
		"shutdown_timeout=10s"}
}

// inflightLines bounds the lines a crash repeats from what was in flight:
// the bytes in flight over all files (each line counts at least its own
// bytes) plus one read past the bound.
func inflightLines(size int) int64 { return filesMaxInflight/int64(size) + filesReadLines }

// sentSampler keeps the agent's count of lines sent to Kafka over time, so
// that a kill can be charged with "the lines acknowledged within the last
// checkpoint interval" as they really were.
type sentSampler struct {
	mu      sync.Mutex
	samples []struct {
		at time.Time
		n  float64
	}
}

func (s *sentSampler) run(ctx context.Context, a func() *agent) {
	for ctx.Err() == nil {
		if v := a().Metric("ferry_exporter_sent_records_total"); v >= 0 {
			s.mu.Lock()
			s.samples = append(s.samples, struct {
				at time.Time
				n  float64
			}{time.Now(), v})
			s.mu.Unlock()
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// sentWithin is the most the agent sent in any window of d before now.
func (s *sentSampler) sentWithin(d time.Duration) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var most float64
	for i := len(s.samples) - 1; i >= 0 && time.Since(s.samples[i].at) < 5*d; i-- {
		for j := i - 1; j >= 0 && s.samples[i].at.Sub(s.samples[j].at) <= d; j-- {
			most = max(most, s.samples[i].n-s.samples[j].n)
		}
	}
	return int64(most)
}

func (s *sentSampler) reset() { s.mu.Lock(); s.samples = nil; s.mu.Unlock() }

// pick is dur for counts.
func pick(short, long int) int {
	if full {
		return long
	}
	return short
}

// filesOutcome is a run's row for docs/reliability.md.
func filesOutcome(test, mode string, w *fileload.Writer, r fileload.Result, peak float64, recovery, note string) outcome {
	return outcome{Test: test, Mode: mode, Duration: w.Spec().Describe(), Offered: r.Written, Acked: r.Written,
		Delivered: r.Delivered, Lost: r.Lost, Duplicates: r.Duplicated, PeakRSSMiB: peak, Recovery: recovery,
		Note: fmt.Sprintf("lines written = lines promised; %d rotations; %d out of order; %s", w.Rotations(), r.OutOfOrder, note)}
}

// drained waits until the agent has committed every byte of the files
// (ferry_files_lag_bytes 0 for a second) and returns how long that took.
func drained(t *testing.T, a *agent, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	var zero time.Time
	for time.Since(start) < timeout {
		if a.Metric("ferry_files_lag_bytes") == 0 && a.Metric("ferry_files_inflight_bytes") == 0 {
			if zero.IsZero() {
				zero = time.Now()
			} else if time.Since(zero) > time.Second {
				return zero.Sub(start)
			}
		} else {
			zero = time.Time{}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("the agent still lags %.0f bytes after %s", a.Metric("ferry_files_lag_bytes"), timeout)
	return time.Since(start)
}

// checkFiles reads the topic back until every line written is there (or
// nothing comes for 15 s) and counts.
func checkFiles(t *testing.T, brokers, topic string, w *fileload.Writer) fileload.Result {
	t.Helper()
	c := fileload.NewCounter(w.Spec().Run, w.Written(), w.Windows())
	r, err := fileload.Check(context.Background(), brokers, topic, c, dur(3*time.Second, 10*time.Second), 3*time.Minute,
		func(r fileload.Result) { t.Logf("reading back: %s", r) })
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("result: %s, read back in %.1fs", r, r.Took.Seconds())
	return r
}

// 8. Many files at a fixed rate, rotated every few seconds by rename and
// create, and by copytruncate. Rename and create loses nothing and repeats
// nothing. copytruncate loses only its window: the lines written between
// the copy and the truncation, in neither file; those written since
// ferry's last read are read from the copy, which ferry finds by its first
// bytes.
func TestFilesRotation(t *testing.T) {
	brokers := kafkatest.Shared(t)
	for _, rot := range []fileload.Rotation{fileload.Rename, fileload.CopyTruncate} {
		t.Run(string(rot), func(t *testing.T) {
			topic := kafkatest.NewTopic(t, brokers, "fault-files-"+string(rot), 3)
			spec := fileload.Spec{Dir: t.TempDir(), Files: pick(20, 100), Rate: pick(10000, 20000), LineSize: 100,
				Rotate: rot, RotateEvery: dur(2*time.Second, 5*time.Second)}
			a := startAgent(t, brokers, filesSets(spec, t.TempDir(), topic)...)
			total := dur(6*time.Second, 60*time.Second)
			ctx, cancel := context.WithTimeout(context.Background(), total)
			defer cancel()
			w, err := fileload.Start(ctx, spec)
			if err != nil {
				t.Fatal(err)
			}
			<-w.Done()
			if err := w.Stop(); err != nil {
				t.Fatal(err)
			}
			drained(t, a, 2*time.Minute)
			r := checkFiles(t, brokers, topic, w)
			a.Alive()
			truncs := a.Metric("ferry_files_truncations_total")
			rotations := a.Metric("ferry_files_rotations_total")
			copies := a.Metric("ferry_files_copytruncate_copies_total")
			a.Stop()
			note := fmt.Sprintf("ferry counted %0.f rotations, %0.f truncations", rotations, truncs)
			if rot == fileload.CopyTruncate {
				note += fmt.Sprintf("; lost: %d in copytruncate's window (written between copy and truncate; %d lines in all windows), %d outside it; %0.f copies read from the truncated file's offset",
					r.LostInWindow, w.WindowLines(), r.Lost-r.LostInWindow, copies)
			}
			recordFiles(t, filesOutcome(fmt.Sprintf("8. files rotated by %s under load", rot), "kafka", w, r, mib(a.peakRSS.Load()),
				fmt.Sprintf("all read back %.1fs after the load", r.Took.Seconds()), note))
			if r.Written < int64(float64(spec.Rate)*total.Seconds()*0.8) {
				t.Fatalf("only %d lines written in %s at %d/s", r.Written, total, spec.Rate)
			}
			if w.Rotations() < 2 {
				t.Fatalf("%d rotations", w.Rotations())
			}
			if r.Foreign != 0 || r.OutOfOrder != 0 {
				t.Fatalf("%d foreign records, %d lines out of order", r.Foreign, r.OutOfOrder)
			}
			switch rot {
			case fileload.Rename:
				if r.Lost != 0 {
					t.Fatalf("%d lines lost with rename and create (per file: %v)", r.Lost, r.PerFileLost)
				}
				if rotations < float64(w.Rotations()*int64(spec.Files)) {
					t.Errorf("ferry counted %0.f rotations, the load made %d", rotations, w.Rotations()*int64(spec.Files))
				}
			case fileload.CopyTruncate:
				if r.Lost != r.LostInWindow {
					t.Fatalf("%d lines lost with copytruncate outside its window (%d in it): they are in the copy", r.Lost-r.LostInWindow, r.LostInWindow)
				}
				if truncs == 0 {
					t.Error("ferry counted no truncation")
				}
			}
			// No fault: nothing is sent twice.
			if r.Duplicated != 0 {
				t.Fatalf("%d lines duplicated without any fault", r.Duplicated)
			}
		})
	}
}

// 9. The agent is SIGKILLed several times while the files rotate (rename
// and create every second, so rotations also happen while it is down):
// after each restart it resumes at its checkpoint. Nothing is lost; the
// lines repeated are at most, per kill, what was in flight
// (max_inflight_bytes, plus one read) and what was acknowledged within the
// last checkpoint interval (1 s), as measured from the agent's own counter.
func TestFilesAgentKilledMidRotation(t *testing.T) {
	brokers := kafkatest.Shared(t)
	topic := kafkatest.NewTopic(t, brokers, "fault-files-kill", 3)
	spec := fileload.Spec{Dir: t.TempDir(), Files: pick(10, 50), Rate: pick(10000, 20000), LineSize: 100,
		Rotate: fileload.Rename, RotateEvery: time.Second}
	ckdir := t.TempDir()
	sets := filesSets(spec, ckdir, topic)
	kills := pick(3, 8)
	total := dur(10*time.Second, 60*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), total)
	defer cancel()
	w, err := fileload.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	cur := startAgent(t, brokers, sets...)
	get := func() *agent { mu.Lock(); defer mu.Unlock(); return cur }
	var sampler sentSampler
	sctx, scancel := context.WithCancel(context.Background())
	go sampler.run(sctx, get)
	var bound int64
	var peak float64
	var restarts []string
	for k := 0; k < kills; k++ {
		time.Sleep(total/time.Duration(kills+1) - time.Second)
		// Kill in the middle of a rotation: as soon as one was made, before
		// ferry has read the renamed files to their ends.
		for n := w.Rotations(); w.Rotations() == n; {
			time.Sleep(time.Millisecond)
		}
		a := get()
		recent := sampler.sentWithin(1500 * time.Millisecond)
		bound += inflightLines(spec.LineSize) + recent
		peak = max(peak, mib(a.peakRSS.Load()))
		a.Kill()
		killed := time.Now()
		if os.Getenv("FERRY_FILES_DEBUG") != "" {
			ck, _ := os.ReadFile(filepath.Join(ckdir, "checkpoints.json"))
			ls, _ := exec.Command("sh", "-c", "ls -li "+spec.Dir+" | head -12").CombinedOutput()
			t.Logf("kill %d: checkpoint %s\nfiles:\n%s", k+1, ck, ls)
		}
		time.Sleep(500 * time.Millisecond) // down across a rotation
		sampler.reset()
		n := startAgent(t, brokers, sets...)
		mu.Lock()
		cur = n
		mu.Unlock()
		restarts = append(restarts, fmt.Sprintf("%.1fs", time.Since(killed).Seconds()))
		t.Logf("kill %d: %d lines sent in the 1.5 s before it; serving again %.1fs after", k+1, recent, time.Since(killed).Seconds())
	}
	<-w.Done()
	if err := w.Stop(); err != nil {
		t.Fatal(err)
	}
	drained(t, get(), 2*time.Minute)
	r := checkFiles(t, brokers, topic, w)
	scancel()
	a := get()
	a.Alive()
	peak = max(peak, mib(a.peakRSS.Load()))
	a.Stop()
	recordFiles(t, filesOutcome(fmt.Sprintf("9. files: agent SIGKILL ×%d mid-rotation (rename every 1 s), restarted", kills), "kafka", w, r, peak,
		"serving again after "+strings.Join(restarts, ", "),
		fmt.Sprintf("duplicates bound checked: %d (per kill: max_inflight_bytes %d MiB / line size + one read + lines sent in the 1.5 s before the kill)", bound, filesMaxInflight>>20)))
	if r.Lost != 0 {
		t.Fatalf("%d lines lost (per file: %v; first lost ids per file: %v)", r.Lost, r.PerFileLost, r.LostRanges)
	}
	if r.OutOfOrder != 0 {
		t.Fatalf("%d lines out of order", r.OutOfOrder)
	}
	if r.Duplicated > bound {
		t.Fatalf("%d lines duplicated, more than the in-flight and checkpoint bound (%d)", r.Duplicated, bound)
	}
}

// 10. Kafka is down for a while (30 s in make faults) mid-run: the files
// are the buffer. ferry reads no further than max_inflight_bytes ahead,
// its memory stays bounded, and once Kafka is back every line arrives,
// in order, none twice.
func TestFilesKafkaDown(t *testing.T) {
	b := kafkatest.Start(t)
	topic := kafkatest.NewTopic(t, b.Addr, "fault-files-down", 3)
	spec := fileload.Spec{Dir: t.TempDir(), Files: pick(10, 50), Rate: pick(10000, 20000), LineSize: 100,
		Rotate: fileload.Rename, RotateEvery: dur(2*time.Second, 5*time.Second)}
	a := startAgent(t, b.Addr, filesSets(spec, t.TempDir(), topic)...)
	down := dur(5*time.Second, 30*time.Second)
	total := dur(12*time.Second, 60*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), total)
	defer cancel()
	w, err := fileload.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	var peakInflight, peakLag float64
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for ctx.Err() == nil {
			peakInflight = max(peakInflight, a.Metric("ferry_files_inflight_bytes"))
			peakLag = max(peakLag, a.Metric("ferry_files_lag_bytes"))
			time.Sleep(100 * time.Millisecond)
		}
	}()
	time.Sleep((total - down) / 3)
	b.Kill(t)
	t.Logf("Kafka killed; down for %s", down)
	time.Sleep(down)
	back := time.Now()
	b.Restart(t)
	<-w.Done()
	<-sampled
	if err := w.Stop(); err != nil {
		t.Fatal(err)
	}
	drain := drained(t, a, 3*time.Minute)
	drainedAt := time.Now()
	r := checkFiles(t, b.Addr, topic, w)
	if os.Getenv("FERRY_FILES_DEBUG") != "" {
		t.Logf("after: lag %v, in flight %v, sent %v, received %v", a.Metric("ferry_files_lag_bytes"), a.Metric("ferry_files_inflight_bytes"),
			a.Metric("ferry_exporter_sent_records_total"), a.Metric(`ferry_receiver_received_records_total{receiver="files"}`))
		t.Logf("agent log:\n%s", a.Logs.String())
	}
	a.Alive()
	a.Stop()
	recordFiles(t, filesOutcome(fmt.Sprintf("10. files: Kafka down %s mid-run (rotated by rename)", down), "kafka", w, r, mib(a.peakRSS.Load()),
		fmt.Sprintf("every file committed %.1fs after the restart began (%.1fs after the load)", time.Since(back).Seconds()-time.Since(drainedAt).Seconds(), drain.Seconds()),
		fmt.Sprintf("peak in flight %.1f MiB (bound %d MiB + one read), peak lag %.1f MiB: the files were the buffer", peakInflight/(1<<20), filesMaxInflight>>20, peakLag/(1<<20))))
	if r.Lost != 0 {
		t.Fatalf("%d lines lost (per file: %v; first lost ids per file: %v)", r.Lost, r.PerFileLost, r.LostRanges)
	}
	if r.OutOfOrder != 0 {
		t.Fatalf("%d lines out of order", r.OutOfOrder)
	}
	if peakInflight > filesMaxInflight+float64(filesReadLines*(spec.LineSize+1024)) {
		t.Fatalf("%.0f bytes in flight, bound %d plus one read", peakInflight, filesMaxInflight)
	}
	if peakLag < float64(spec.Rate*spec.LineSize)*down.Seconds()/4 {
		t.Fatalf("peak lag %.0f bytes: ferry did not wait for Kafka in the files", peakLag)
	}
	// The exporter repeats batches Kafka may have taken when the broker died
	// mid-request: at most what was in flight.
	if r.Duplicated > inflightLines(spec.LineSize) {
		t.Fatalf("%d lines duplicated, more than the in-flight bound (%d)", r.Duplicated, inflightLines(spec.LineSize))
	}
}

// 11. The disk holding the checkpoint is full (a small tmpfs as
// checkpoint_dir, filled to its last byte): ferry goes on reading and
// sending, says so (checkpoint_write errors, the log), is killed while the
// disk is full and started again on its old checkpoint (it repeats the
// lines since, never loses one), then space returns and checkpoints are
// written again.
func TestFilesCheckpointDiskFull(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	brokers := kafkatest.Shared(t)
	topic := kafkatest.NewTopic(t, brokers, "fault-files-ckfull", 3)
	ckdir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", ckdir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs: %v %s", err, out)
	}
	defer exec.Command("umount", "-l", ckdir).Run()
	spec := fileload.Spec{Dir: t.TempDir(), Files: 10, Rate: pick(5000, 10000), LineSize: 100,
		Rotate: fileload.Rename, RotateEvery: dur(2*time.Second, 5*time.Second)}
	sets := filesSets(spec, ckdir, topic)
	total := dur(10*time.Second, 60*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), total)
	defer cancel()
	w, err := fileload.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	a := startAgent(t, brokers, sets...)
	time.Sleep(total / 5)
	ck0 := a.Metric("ferry_files_checkpoints_total")
	if ck0 <= 0 {
		t.Fatalf("no checkpoint written before the disk filled (%v)", ck0)
	}
	// Fill the disk to its last byte.
	filler := filepath.Join(ckdir, "filler")
	fill := func() {
		f, err := os.OpenFile(filler, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 4096)
		for {
			if _, err := f.Write(buf); err != nil {
				break
			}
		}
		for _, err := f.Write(buf[:1]); err == nil; _, err = f.Write(buf[:1]) {
		}
		f.Close()
	}
	fill()
	filled := time.Now()
	sentAtFull := a.Metric("ferry_exporter_sent_records_total")
	time.Sleep(total / 5)
	errs := a.Metric(`ferry_receiver_errors_total{receiver="files",reason="checkpoint_write"}`)
	sentFull := a.Metric("ferry_exporter_sent_records_total") - sentAtFull
	logs := a.Logs.String()
	peak := mib(a.peakRSS.Load())
	a.Kill()
	t.Logf("disk full %.1fs: %0.f checkpoint errors, %0.f lines sent meanwhile; agent killed", time.Since(filled).Seconds(), errs, sentFull)
	a = startAgent(t, brokers, sets...)
	fill() // whatever the restart freed (none expected)
	time.Sleep(total / 5)
	sentSecond := a.Metric("ferry_exporter_sent_records_total")
	ckFull := a.Metric("ferry_files_checkpoints_total")
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	freed := time.Now()
	var ckBack float64
	for time.Since(freed) < 10*time.Second {
		if ckBack = a.Metric("ferry_files_checkpoints_total"); ckBack > ckFull {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	back := time.Since(freed)
	<-w.Done()
	if err := w.Stop(); err != nil {
		t.Fatal(err)
	}
	drained(t, a, 2*time.Minute)
	r := checkFiles(t, brokers, topic, w)
	a.Alive()
	peak = max(peak, mib(a.peakRSS.Load()))
	a.Stop()
	// Lines repeated: everything acknowledged since the last checkpoint
	// that reached the disk, which the full disk let grow for as long as it
	// was full; plus what was in flight.
	bound := int64(sentFull) + int64(float64(spec.Rate)*1.5) + inflightLines(spec.LineSize)
	recordFiles(t, filesOutcome("11. files: checkpoint disk full (256 KiB tmpfs), agent SIGKILLed while full, space returned", "kafka", w, r, peak,
		fmt.Sprintf("checkpoints written again %.1fs after space returned", back.Seconds()),
		fmt.Sprintf("%0.f checkpoint_write errors while full, lines sent on meanwhile (%0.f, then %0.f after the restart); duplicates = what was sent since the last checkpoint on disk (bound checked: %d)", errs, sentFull, sentSecond, bound)))
	if r.Lost != 0 {
		t.Fatalf("%d lines lost (per file: %v; first lost ids per file: %v)", r.Lost, r.PerFileLost, r.LostRanges)
	}
	if r.OutOfOrder != 0 {
		t.Fatalf("%d lines out of order", r.OutOfOrder)
	}
	if errs == 0 || !strings.Contains(logs, "no space left on device") {
		t.Fatalf("a full checkpoint disk was not reported: %v checkpoint_write errors; log:\n%s", errs, logs)
	}
	if sentFull < float64(spec.Rate)*(total/5).Seconds()/3 {
		t.Fatalf("ferry stalled while the checkpoint disk was full: %0.f lines sent", sentFull)
	}
	if ckBack <= ckFull {
		t.Fatalf("no checkpoint written within 10 s after space returned")
	}
	if r.Duplicated > bound {
		t.Fatalf("%d lines duplicated, more than sent since the last checkpoint plus in flight (%d)", r.Duplicated, bound)
	}
}
