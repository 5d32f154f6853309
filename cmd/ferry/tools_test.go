package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/buffer/spool"
	"github.com/ferryhq/ferry/config"
	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/consumer/consumertest"
	"github.com/ferryhq/ferry/deadletter"
	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/telemetry"
)

// Tests of ferry spool and ferry deadletter replay, run in-process on a
// spool the spool package itself wrote and a dead-letter file its writer
// wrote; Kafka is franz-go's kfake.

func spoolConfig(dir string) spool.Config {
	return spool.Config{Dir: dir, SegmentBytes: 64 << 10, MaxBytes: 64 << 20, Fsync: "interval", FsyncInterval: 10 * time.Millisecond, WriteBuffer: 8 << 20, ReadAhead: 4 << 20}
}

// batch is n records from id from, in topics "orders" and (every third)
// "audit", with keys, headers and timestamps.
func batch(from, n int) *record.Batch {
	b := &record.Batch{}
	for i := from; i < from+n; i++ {
		r := record.Record{Topic: "orders", Key: []byte(fmt.Sprintf("k%d", i%7)), Value: []byte(fmt.Sprintf("order-%06d", i)),
			Headers: []record.Header{{Key: "h", Value: []byte("v")}}, Timestamp: time.Unix(1700000000+int64(i), 0)}
		if i%3 == 2 {
			r.Topic = "audit"
		}
		b.Records = append(b.Records, r)
	}
	return b
}

func appendBatch(t *testing.T, s *spool.Spool, b *record.Batch) {
	t.Helper()
	done := make(chan error, 1)
	b.OnDone(func(err error) { done <- err })
	if err := s.Consume(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// writeSpool makes a stopped agent's spool in a new directory: acked
// records Kafka acknowledged before a stop, then pending ones written while
// Kafka was down.
func writeSpool(t *testing.T, acked, pending int) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "spool")
	sink := &consumertest.Sink{}
	s, err := spool.Open(spoolConfig(dir), telemetry.TestSettings(), spool.Links{Next: sink})
	if err != nil {
		t.Fatal(err)
	}
	_ = s.Start(context.Background())
	for i := 0; i < acked; i += 100 {
		appendBatch(t, s, batch(i, 100))
	}
	deadline := time.Now().Add(20 * time.Second)
	for s.Backlog() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("backlog %d", s.Backlog())
		}
		time.Sleep(5 * time.Millisecond)
	}
	_ = s.Shutdown(context.Background())
	_ = s.Close()
	s, err = spool.Open(spoolConfig(dir), telemetry.TestSettings(), spool.Links{Next: &consumertest.Holder{}})
	if err != nil {
		t.Fatal(err)
	}
	for i := acked; i < acked+pending; i += 100 {
		appendBatch(t, s, batch(i, 100))
	}
	_ = s.Close()
	return dir
}

// lockedBuffer is a stderr several goroutines write to (the exporter's
// log, the progress line), as they may to os.Stderr.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func ferry(args ...string) (code int, stdout, stderr string) {
	var o bytes.Buffer
	var e lockedBuffer
	switch args[0] {
	case "spool":
		code = spoolCmd(args[1:], &o, &e)
	case "deadletter":
		code = deadletterCmd(args[1:], &o, &e)
	}
	return code, o.String(), e.String()
}

func segFiles(t *testing.T, dir string) []string {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(dir, "*.seg"))
	return m
}

// TestSpoolInspectAndDump: inspect's table and JSON say what a restart
// replays, per segment and topic; dump prints the records as NDJSON with
// their fields, filtered and limited.
func TestSpoolInspectAndDump(t *testing.T) {
	dir := writeSpool(t, 1000, 600)
	code, out, errs := ferry("spool", "inspect", "--dir", dir)
	if code != 0 {
		t.Fatalf("inspect: %d %s", code, errs)
	}
	for _, want := range []string{"replay      600 records", "SEGMENT", "pending", "orders", "audit", "damage      none"} {
		if !strings.Contains(out, want) {
			t.Fatalf("inspect output lacks %q:\n%s", want, out)
		}
	}
	t.Logf("ferry spool inspect:\n%s", out)
	code, out, _ = ferry("spool", "inspect", "--dir", dir, "--json")
	var rep spool.Report
	if err := json.Unmarshal([]byte(out), &rep); code != 0 || err != nil {
		t.Fatalf("inspect --json: %d %v\n%s", code, err, out)
	}
	pendingByTopic := map[string]int{}
	for _, tp := range rep.Topics {
		pendingByTopic[tp.Topic] = tp.Pending
	}
	// Records 1000..1599: i%3 == 2 are audit (200 of them).
	if rep.ReplayRecords != 600 || pendingByTopic["audit"] != 200 || pendingByTopic["orders"] != 400 {
		t.Fatalf("report: replay %d, topics %+v", rep.ReplayRecords, rep.Topics)
	}

	code, out, errs = ferry("spool", "dump", "--dir", dir, "--pending", "--topic", "audit", "--limit", "5")
	if code != 0 {
		t.Fatalf("dump: %d %s", code, errs)
	}
	sc := bufio.NewScanner(strings.NewReader(out))
	n := 0
	for sc.Scan() {
		var l struct {
			Segment   string
			Offset    int64
			Pending   bool
			Topic     string
			Key       *string
			Value     *string
			Timestamp *time.Time
			Headers   []struct{ Key, Value string }
		}
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		id := 1001 + 3*n // the pending audit records: 1001, 1004, ...
		if !l.Pending || l.Topic != "audit" || l.Value == nil || *l.Value != fmt.Sprintf("order-%06d", id) || l.Key == nil ||
			*l.Key != fmt.Sprintf("k%d", id%7) || len(l.Headers) != 1 || l.Headers[0].Value != "v" || l.Timestamp == nil ||
			l.Timestamp.Unix() != 1700000000+int64(id) || l.Offset < 32 || !strings.HasSuffix(l.Segment, ".seg") {
			t.Fatalf("line %d: %s", n, sc.Text())
		}
		n++
	}
	if n != 5 {
		t.Fatalf("dump --limit 5 printed %d lines", n)
	}
	code, out, _ = ferry("spool", "dump", "--dir", dir, "--limit", "1", "--format", "base64")
	if code != 0 || !strings.Contains(out, `"value":"b3JkZXItMDAw`) {
		t.Fatalf("dump --format base64: %d %s", code, out)
	}
}

// TestSpoolVerifyDamage: a flipped byte in a sealed segment and a torn
// write at the end of the newest: verify names each (segment, offset,
// kind, what recovery does) and exits 1; the spool is not changed; a
// clean spool exits 0.
func TestSpoolVerifyDamage(t *testing.T) {
	dir := writeSpool(t, 0, 2000)
	if code, out, errs := ferry("spool", "verify", "--dir", dir); code != 0 || !strings.Contains(out, "no damage") {
		t.Fatalf("clean spool: %d %s %s", code, out, errs)
	}
	segs := segFiles(t, dir)
	if len(segs) < 2 {
		t.Fatalf("%d segments", len(segs))
	}
	// The second frame of the first segment: its offset from dump.
	var second int64
	n := 0
	if err := spool.Scan(dir, spool.ReadOptions{}, func(e *spool.Entry) bool {
		n++
		second = e.Offset
		return n < 2
	}); err != nil {
		t.Fatal(err)
	}
	flipByte(t, segs[0], second+30)
	last := segs[len(segs)-1]
	fi, _ := os.Stat(last)
	if err := os.Truncate(last, fi.Size()-7); err != nil {
		t.Fatal(err)
	}
	before := dirSum(t, dir)
	code, out, errs := ferry("spool", "verify", "--dir", dir)
	if code != 1 {
		t.Fatalf("verify exit %d, want 1\n%s%s", code, out, errs)
	}
	t.Logf("ferry spool verify:\n%s", out)
	first := filepath.Base(segs[0])
	for _, want := range []string{
		fmt.Sprintf("%s offset %d: damaged_frames", first, second), "checksum mismatch", "skipped by the reader",
		filepath.Base(last) + " offset ", "torn_tail", "truncated at start", "2 damaged stretches",
	} {
		if !strings.Contains(out, want) {
			t.Fatalf("verify output lacks %q:\n%s", want, out)
		}
	}
	if dirSum(t, dir) != before {
		t.Fatal("verify changed the spool")
	}
	code, out, _ = ferry("spool", "verify", "--dir", dir, "--json")
	var rep spool.Report
	if err := json.Unmarshal([]byte(out), &rep); code != 1 || err != nil || len(rep.Damage) != 2 || rep.Damage[0].Offset != second {
		t.Fatalf("verify --json: %d %v %+v", code, err, rep.Damage)
	}
}

func flipByte(t *testing.T, name string, off int64) {
	t.Helper()
	f, err := os.OpenFile(name, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var b [1]byte
	_, _ = f.ReadAt(b[:], off)
	b[0] ^= 0x5A
	if _, err := f.WriteAt(b[:], off); err != nil {
		t.Fatal(err)
	}
}

// dirSum is every file of dir with its content.
func dirSum(t *testing.T, dir string) string {
	t.Helper()
	entries, _ := os.ReadDir(dir)
	var b strings.Builder
	for _, e := range entries {
		c, _ := os.ReadFile(filepath.Join(dir, e.Name()))
		fmt.Fprintf(&b, "%s %x\n", e.Name(), c)
	}
	return b.String()
}

// TestSpoolToolsRespectTheAgentsLock: a spool an agent holds is refused
// (exit 2, saying so) unless --force; validate does not read it; and
// deadletter replay refuses to rewrite the file the agent appends to.
func TestSpoolToolsRespectTheAgentsLock(t *testing.T) {
	dir := writeSpool(t, 0, 100)
	s, err := spool.Open(spoolConfig(dir), telemetry.TestSettings(), spool.Links{Next: &consumertest.Holder{}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, cmd := range []string{"inspect", "verify", "dump"} {
		code, _, errs := ferry("spool", cmd, "--dir", dir)
		if code != 2 || !strings.Contains(errs, "in use by a running ferry") || !strings.Contains(errs, "--force") {
			t.Fatalf("%s on a held spool: %d %s", cmd, code, errs)
		}
	}
	code, out, errs := ferry("spool", "inspect", "--dir", dir, "--force")
	if code != 0 || !strings.Contains(errs, "running agent") || !strings.Contains(out, "replay      100 records") {
		t.Fatalf("inspect --force: %d %s %s", code, out, errs)
	}
	var o, e bytes.Buffer
	cfg := loadConfig(t, "delivery.mode=spool", "delivery.spool.dir="+dir)
	if err := checkSpool(cfg, &o, &e); err != nil || !strings.Contains(o.String(), "in use by a running ferry") {
		t.Fatalf("validate on a held spool: %v %s %s", err, o.String(), e.String())
	}

	dl, _ := deadLetterFile(t, record.Record{Topic: "orders", Value: []byte("x")})
	before, _ := os.ReadFile(dl)
	code, _, errs = ferry("deadletter", "replay", "--set", "delivery.mode=spool", "--set", "delivery.spool.dir="+dir, "--file", dl, "--rate", "10",
		"--set", "exporter.kafka.brokers=[127.0.0.1:1]")
	if code != 2 || !strings.Contains(errs, "stop the agent") {
		t.Fatalf("replay while the agent runs: %d %s", code, errs)
	}
	if after, _ := os.ReadFile(dl); !bytes.Equal(before, after) {
		t.Fatal("the dead-letter file changed")
	}
}

// TestValidateReadsTheSpool: validate says what the next start replays,
// warns of damage without failing, and says nothing of a spool in mode
// kafka.
func TestValidateReadsTheSpool(t *testing.T) {
	dir := writeSpool(t, 0, 300)
	var o, e bytes.Buffer
	if err := checkSpool(loadConfig(t, "delivery.mode=spill", "delivery.spool.dir="+dir), &o, &e); err != nil ||
		!strings.Contains(o.String(), "a start replays 300 records") || e.Len() != 0 {
		t.Fatalf("%v %s %s", err, o.String(), e.String())
	}
	segs := segFiles(t, dir)
	flipByte(t, segs[0], 100)
	o.Reset()
	if err := checkSpool(loadConfig(t, "delivery.mode=spool", "delivery.spool.dir="+dir), &o, &e); err != nil ||
		!strings.Contains(e.String(), "warning") || !strings.Contains(e.String(), "1 damaged stretches") {
		t.Fatalf("damaged: %v %s %s", err, o.String(), e.String())
	}
	o.Reset()
	e.Reset()
	if err := checkSpool(loadConfig(t, "delivery.spool.dir="+dir), &o, &e); err != nil || o.Len()+e.Len() != 0 {
		t.Fatalf("mode kafka: %v %s %s", err, o.String(), e.String())
	}
	if err := checkSpool(loadConfig(t, "delivery.mode=spool", "delivery.spool.dir="+filepath.Join(dir, "new")), &o, &e); err != nil ||
		!strings.Contains(o.String(), "none yet") {
		t.Fatalf("no spool yet: %v %s", err, o.String())
	}
	notDir := filepath.Join(t.TempDir(), "file")
	_ = os.WriteFile(notDir, nil, 0o600)
	if err := checkSpool(loadConfig(t, "delivery.mode=spool", "delivery.spool.dir="+notDir), &o, &e); err == nil {
		t.Fatal("a spool dir that is a file validated")
	}
}

func loadConfig(t *testing.T, sets ...string) *config.Config {
	t.Helper()
	cfg, err := config.Load("", sets)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// deadLetterFile writes recs through the agent's dead-letter writer, as
// Kafka's refusal for an unknown topic, and returns the file and its lines.
func deadLetterFile(t *testing.T, recs ...record.Record) (string, []string) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "dead-letters.ndjson")
	w, err := deadletter.New(deadletter.Config{File: file, MaxBytes: 1 << 30}, telemetry.TestSettings(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range recs {
		done := make(chan error, 1)
		w.Write(&recs[i], "unknown_topic", consumer.UnknownTopic(recs[i].Topic, nil), func(err error) { done <- err })
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	_ = w.Close()
	b, _ := os.ReadFile(file)
	return file, strings.SplitAfter(string(b), "\n")
}

// TestDeadLetterReplayKafka: against kfake, with the topic "audit"
// missing. The first replay sends the "orders" records (they are in Kafka,
// keyed, with their headers and timestamps), and leaves the "audit" ones in
// the file, refused again as unknown_topic, exit 1. The topic is created;
// a second replay sends them and removes the file, exit 0.
func TestDeadLetterReplayKafka(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "orders"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var recs []record.Record
	for i := 0; i < 9; i++ {
		recs = append(recs, batch(i, 1).Records[0])
	}
	file, lines := deadLetterFile(t, recs...)
	sets := []string{"--set", "exporter.kafka.brokers=[" + strings.Join(c.ListenAddrs(), ",") + "]",
		"--set", "exporter.kafka.retry_backoff_max=200ms", "--set", "delivery.spool.dir=" + filepath.Join(t.TempDir(), "none")}

	code, out, errs := ferry(append([]string{"deadletter", "replay", "--file", file, "--rate", "1000", "--dry-run"}, sets...)...)
	if code != 0 || !strings.Contains(out, "would send 9 (audit=3, orders=6)") {
		t.Fatalf("dry run: %d %s %s", code, out, errs)
	}
	code, out, errs = ferry(append([]string{"deadletter", "replay", "--file", file, "--rate", "1000"}, sets...)...)
	t.Logf("first replay:\n%s%s", out, errs)
	if code != 1 || !strings.Contains(out, "sent 6 (orders=6)") || !strings.Contains(out, "refused again: 3 (unknown_topic=3)") ||
		!strings.Contains(out, "3 lines left in "+file) {
		t.Fatalf("first replay: %d\n%s%s", code, out, errs)
	}
	if b, _ := os.ReadFile(file); string(b) != lines[2]+lines[5]+lines[8] {
		t.Fatalf("left in the file:\n%s", b)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 1, 1, nil, "audit"); err != nil {
		t.Fatal(err)
	}
	code, out, errs = ferry(append([]string{"deadletter", "replay", "--file", file, "--rate", "1000", "--topic", "audit"}, sets...)...)
	t.Logf("second replay:\n%s%s", out, errs)
	if code != 0 || !strings.Contains(out, "sent 3 (audit=3)") || !strings.Contains(out, "removed") {
		t.Fatalf("second replay: %d\n%s%s", code, out, errs)
	}
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Fatalf("the file is still there: %v", err)
	}
	got := map[string]*kgo.Record{}
	rd, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics("orders", "audit"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	for len(got) < 9 && ctx.Err() == nil {
		rd.PollFetches(ctx).EachRecord(func(r *kgo.Record) { got[string(r.Value)] = r })
	}
	for _, w := range recs {
		r := got[string(w.Value)]
		if r == nil || r.Topic != w.Topic || string(r.Key) != string(w.Key) || len(r.Headers) != 1 || string(r.Headers[0].Value) != "v" ||
			!r.Timestamp.Equal(w.Timestamp) {
			t.Fatalf("%s in Kafka: %+v", w.Value, r)
		}
	}
}

func TestDeadLetterUsage(t *testing.T) {
	if code, _, errs := ferry("deadletter", "replay", "--file", "x"); code != 2 || !strings.Contains(errs, "--rate") {
		t.Fatalf("no rate: %d %s", code, errs)
	}
	if code, _, errs := ferry("deadletter", "replay", "--rate", "5", "--file", filepath.Join(t.TempDir(), "none")); code != 2 || !strings.Contains(errs, "no such file") {
		t.Fatalf("no file: %d %s", code, errs)
	}
	dl, _ := deadLetterFile(t, record.Record{Topic: "t", Value: []byte("x")})
	if code, _, errs := ferry("deadletter", "replay", "--rate", "5", "--file", dl, "--set", "exporter.type=blackhole"); code != 2 || !strings.Contains(errs, "blackhole") {
		t.Fatalf("blackhole: %d %s", code, errs)
	}
}
