package deadletter

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/telemetry"
)

// kafka stands in for the exporter: it answers every record from another
// goroutine, with what fail says (nil: acknowledged), and keeps a copy of
// those it acknowledged. hold keeps batches unanswered (Kafka down).
type kafka struct {
	mu   sync.Mutex
	fail func(r *record.Record) error
	hold bool
	got  []record.Record
	held []*record.Batch
}

func (k *kafka) Consume(_ context.Context, b *record.Batch) error {
	b.Arm()
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.hold {
		k.held = append(k.held, b)
		return nil
	}
	errs := make([]error, len(b.Records))
	for i := range b.Records {
		r := &b.Records[i]
		if k.fail != nil {
			errs[i] = k.fail(r)
		}
		if errs[i] == nil {
			k.got = append(k.got, *r)
		}
	}
	go func() {
		for i, err := range errs {
			b.AckAt(i, err)
		}
	}()
	return nil
}

func (k *kafka) records() []record.Record {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]record.Record{}, k.got...)
}

// deadLetters writes recs through the agent's own writer and returns the
// file and its lines.
func deadLetters(t *testing.T, recs []record.Record) (string, []string) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "dead-letters.ndjson")
	w, err := New(Config{File: file, MaxBytes: 1 << 30}, telemetry.TestSettings(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range recs {
		if err := write(w, &recs[i], "unknown_topic", consumer.UnknownTopic(recs[i].Topic, nil)); err != nil {
			t.Fatal(err)
		}
	}
	_ = w.Close()
	return file, lines(t, file)
}

func lines(t *testing.T, file string) []string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	out := strings.SplitAfter(string(b), "\n")
	if out[len(out)-1] == "" {
		out = out[:len(out)-1]
	}
	return out
}

func sample(topics ...string) []record.Record {
	var out []record.Record
	for i, tp := range topics {
		r := record.Record{Topic: tp, Value: []byte(fmt.Sprintf("v%d\xff", i)), Timestamp: time.Unix(1700000000+int64(i), 0).UTC(),
			Headers: []record.Header{{Key: "b", Value: []byte("2")}, {Key: "a", Value: []byte{0, 1}}}}
		if i%2 == 0 {
			r.Key = []byte(fmt.Sprintf("k%d", i))
		}
		if i == 1 {
			r.SetPartition(2)
		}
		out = append(out, r)
	}
	return out
}

// TestReplayTopicMissingThenCreated: the records of a topic Kafka still
// refuses stay in the file, byte for byte and in order, with lines that are
// not dead letters; the others reach Kafka whole (key, value, headers,
// timestamp, partition) and leave the file. Once the topic exists, a second
// replay sends the rest, and the file keeps only the unreadable line.
func TestReplayTopicMissingThenCreated(t *testing.T) {
	in := sample("a", "b", "a", "b", "a", "a")
	file, orig := deadLetters(t, in)
	f, _ := os.OpenFile(file, os.O_APPEND|os.O_WRONLY, 0)
	_, _ = f.WriteString("not json\n")
	f.Close()
	k := &kafka{fail: func(r *record.Record) error {
		if r.Topic == "b" {
			return consumer.UnknownTopic("b", nil)
		}
		return nil
	}}
	var progress []ReplayProgress
	sum, err := Replay(context.Background(), ReplayOptions{File: file, Rate: 1000, Progress: func(p ReplayProgress) { progress = append(progress, p) }}, k)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Lines != 7 || sum.Sent != 4 || sum.Failed["unknown_topic"] != 2 || sum.Unreadable != 1 || sum.Kept != 3 || sum.Removed || sum.Topics["a"] != 4 {
		t.Fatalf("summary %+v", sum)
	}
	if got := lines(t, file); strings.Join(got, "") != orig[1]+orig[3]+"not json\n" {
		t.Fatalf("file after the first replay:\n%s", strings.Join(got, ""))
	}
	if len(progress) == 0 || progress[len(progress)-1].Sent != 4 || progress[len(progress)-1].Failed != 2 {
		t.Fatalf("progress %+v", progress)
	}
	got := k.records()
	if len(got) != 4 {
		t.Fatalf("Kafka has %d records", len(got))
	}
	for j, i := range []int{0, 2, 4, 5} {
		w, g := in[i], got[j]
		wp, _ := w.Partition()
		gp, _ := g.Partition()
		if g.Topic != w.Topic || !bytes.Equal(g.Value, w.Value) || !bytes.Equal(g.Key, w.Key) || (g.Key == nil) != (w.Key == nil) ||
			!g.Timestamp.Equal(w.Timestamp) || gp != wp || len(g.Headers) != 2 || g.Headers[0].Key != "a" || !bytes.Equal(g.Headers[0].Value, []byte{0, 1}) {
			t.Fatalf("record %d in Kafka %+v, want %+v", i, g, w)
		}
	}

	k.fail = nil // the topic was created
	sum, err = Replay(context.Background(), ReplayOptions{File: file, Rate: 1000}, k)
	if err != nil || sum.Sent != 2 || sum.FailedTotal() != 0 || sum.Kept != 1 {
		t.Fatalf("second replay: %v %+v", err, sum)
	}
	if got := lines(t, file); strings.Join(got, "") != "not json\n" {
		t.Fatalf("file after the second replay: %q", got)
	}
	if got := k.records(); len(got) != 6 || got[4].Topic != "b" || got[5].Topic != "b" {
		t.Fatalf("Kafka has %d records", len(got))
	}
	if p, ok := k.records()[4].Partition(); !ok || p != 2 {
		t.Fatalf("the partition the client chose was not kept: %d %v", p, ok)
	}
	entries, _ := os.ReadDir(filepath.Dir(file))
	if len(entries) != 1 {
		t.Fatalf("files left beside the dead letters: %v", entries)
	}
}

// TestReplayEverythingRemovesTheFile; and the topic filter leaves the
// others where they are.
func TestReplayTopicFilterAndRemoval(t *testing.T) {
	file, orig := deadLetters(t, sample("a", "b", "a"))
	k := &kafka{}
	sum, err := Replay(context.Background(), ReplayOptions{File: file, Rate: 1000, Topic: "b"}, k)
	if err != nil || sum.Sent != 1 || sum.Skipped != 2 || sum.Kept != 2 {
		t.Fatalf("%v %+v", err, sum)
	}
	if got := strings.Join(lines(t, file), ""); got != orig[0]+orig[2] {
		t.Fatalf("file %q", got)
	}
	sum, err = Replay(context.Background(), ReplayOptions{File: file, Rate: 1000}, k)
	if err != nil || sum.Sent != 2 || !sum.Removed {
		t.Fatalf("%v %+v", err, sum)
	}
	if _, err := os.Stat(file); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("file still there: %v", err)
	}
}

// TestReplayDryRun changes nothing and sends nothing.
func TestReplayDryRun(t *testing.T) {
	file, orig := deadLetters(t, sample("a", "b", "a"))
	k := &kafka{}
	sum, err := Replay(context.Background(), ReplayOptions{File: file, Rate: 1, DryRun: true}, k)
	if err != nil || sum.Sent != 3 || sum.Topics["a"] != 2 || sum.Topics["b"] != 1 || len(k.records()) != 0 {
		t.Fatalf("%v %+v", err, sum)
	}
	if got := strings.Join(lines(t, file), ""); got != strings.Join(orig, "") {
		t.Fatal("a dry run changed the file")
	}
}

// TestReplayInterruptedKeepsAll: Kafka never answers and the replay is
// interrupted: nothing was acknowledged, so every line stays, in order.
func TestReplayInterruptedKeepsAll(t *testing.T) {
	var in []string
	for i := 0; i < 50; i++ {
		in = append(in, "a")
	}
	file, orig := deadLetters(t, sample(in...))
	k := &kafka{hold: true}
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(300*time.Millisecond, cancel)
	sum, err := Replay(ctx, ReplayOptions{File: file, Rate: 50, Grace: 100 * time.Millisecond}, k)
	if err != nil {
		t.Fatal(err)
	}
	if !sum.Interrupted || sum.Sent != 0 || sum.Unanswered == 0 || sum.NotSent == 0 || sum.Kept != 50 || sum.Unanswered+sum.NotSent != 50 {
		t.Fatalf("summary %+v", sum)
	}
	if got := strings.Join(lines(t, file), ""); got != strings.Join(orig, "") {
		t.Fatal("an interrupted replay lost or reordered lines")
	}
	// Kafka answers late: the summary, final, does not change.
	k.mu.Lock()
	held := k.held
	k.mu.Unlock()
	for _, b := range held {
		for i := range b.Records {
			b.AckAt(i, nil)
		}
	}
	if sum.Sent != 0 {
		t.Fatal("a late answer changed the summary")
	}
}

// TestReplayDeadLetterTopicFallback: a dead letter meant for the
// dead-letter topic that fell back to the file goes back to its own topic,
// without the dead-letter headers.
func TestReplayDeadLetterTopicFallback(t *testing.T) {
	file := filepath.Join(t.TempDir(), "dead.ndjson")
	failing := &kafka{fail: func(*record.Record) error { return consumer.UnknownTopic("dlq", nil) }}
	w, _ := New(Config{File: file, MaxBytes: 1 << 20, Topic: "dlq"}, telemetry.TestSettings(), failing)
	r := record.Record{Topic: "orders", Value: []byte("v"), Headers: []record.Header{{Key: "h", Value: []byte("1")}}}
	r.SetPartition(2) // chosen (OTLP's trace_partition, or a Kafka-front client): the dead letter keeps it
	if err := write(w, &r, "topic_rejected", errors.New("denied")); err != nil {
		t.Fatal(err)
	}
	_ = w.Close()
	if got := lines(t, file); len(got) != 1 || !strings.Contains(got[0], `"topic":"dlq"`) {
		t.Fatalf("file %q", got)
	}
	k := &kafka{}
	if _, err := Replay(context.Background(), ReplayOptions{File: file, Rate: 10, Topic: "orders"}, k); err != nil {
		t.Fatal(err)
	}
	got := k.records()
	if len(got) != 1 || got[0].Topic != "orders" || len(got[0].Headers) != 1 || got[0].Headers[0].Key != "h" {
		t.Fatalf("sent %+v", got)
	}
	if p, ok := got[0].Partition(); !ok || p != 2 {
		t.Fatalf("replayed to partition %d (chosen %v), want its own 2", p, ok)
	}
}

// TestLimiterArithmetic: over any stretch of simulated time the limiter
// lets through at most burst + rate·t records (1 + rate·t from its start),
// whatever the steps between calls; it keeps up with rate for a caller
// that comes back when it says; and when it has nothing to give it says
// how long until it has.
func TestLimiterArithmetic(t *testing.T) {
	for _, rate := range []int{1, 7, 100, 5000} {
		burst := max(1, float64(rate)/100)
		for _, irregular := range []bool{true, false} {
			t0 := time.Unix(0, 0)
			l := newLimiter(rate, t0)
			now := t0
			steps := []time.Duration{time.Millisecond, 3 * time.Millisecond, 50 * time.Millisecond, 0, 333 * time.Millisecond, 7 * time.Millisecond}
			// g(k) = k − rate·(time of record k): at most burst + rate·t
			// records in every window [record i, record j] is
			// g(j) + 1 − burst ≤ min over i ≤ j of g(i).
			total, minG := 0, math.Inf(1)
			sent := func(at time.Time, n int) {
				for range n {
					g := float64(total) - float64(rate)*at.Sub(t0).Seconds()
					minG = min(minG, g)
					if g+1-burst > minG+1e-6 { // float rounding: a millionth of a record
						t.Fatalf("rate %d: more than burst + rate·t records in a window ending at record %d", rate, total)
					}
					if float64(total+1) > 1+float64(rate)*at.Sub(t0).Seconds()+1e-6 {
						t.Fatalf("rate %d: %d records in the first %v", rate, total+1, at.Sub(t0))
					}
					total++
				}
			}
			for i := 0; now.Sub(t0) < 20*time.Second; i++ {
				n, wait := l.take(now, 1000)
				if n == 0 {
					if wait <= 0 {
						t.Fatalf("rate %d: nothing to take and no wait", rate)
					}
					now = now.Add(wait)
					// The wait it named is enough for one token.
					m, _ := l.take(now, 1)
					if m != 1 {
						t.Fatalf("rate %d: after the wait it named (%v) no token", rate, wait)
					}
					sent(now, 1)
					continue
				}
				sent(now, n)
				if irregular {
					now = now.Add(steps[i%len(steps)])
				} else {
					now = now.Add(time.Millisecond)
				}
			}
			if el := now.Sub(t0).Seconds(); !irregular && float64(total) < float64(rate)*el-burst-1 {
				t.Fatalf("rate %d: %d records in %.1f s: it does not keep up", rate, total, el)
			}
		}
	}
}

// hugeLine writes to file, between the dead letters of before and after, a
// line of n bytes: a dead letter whose value is n bytes of base64.
func hugeLine(t *testing.T, before, after []record.Record, n int) (string, []byte) {
	t.Helper()
	file, _ := deadLetters(t, before)
	_, tail := deadLetters(t, after)
	prefix := `{"time":"2024-01-01T00:00:00Z","reason":"record_too_large","error":"","topic":"big","value":"`
	huge := bytes.Repeat([]byte("QUFB"), (n-len(prefix)-3)/4)
	line := append(append([]byte(prefix), huge...), "\"}\n"...)
	f, err := os.OpenFile(file, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(line); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(strings.Join(tail, "")); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return file, line
}

// allocDuring is the bytes fn allocates on the Go heap.
func allocDuring(fn func()) uint64 {
	var a, b runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&a)
	fn()
	runtime.ReadMemStats(&b)
	return b.TotalAlloc - a.TotalAlloc
}

// TestReplayHugeLineBounded: a dead-letter line far over MaxLineBytes (a
// damaged file, or one that is not ferry's) is neither read into memory
// nor decoded: it stays in the file byte for byte, in its place, and the
// dead letters around it are sent.
func TestReplayHugeLineBounded(t *testing.T) {
	file, line := hugeLine(t, sample("a"), sample("b"), 40<<20)
	k := &kafka{}
	var sum *ReplaySummary
	var err error
	alloc := allocDuring(func() {
		sum, err = Replay(context.Background(), ReplayOptions{File: file, Rate: 1000, MaxLineBytes: 1 << 20}, k)
	})
	if err != nil {
		t.Fatal(err)
	}
	if alloc > 8<<20 {
		t.Errorf("a 40 MiB line cost the replay %d bytes of heap", alloc)
	}
	if sum.Sent != 2 || sum.TooLong != 1 || sum.Kept != 1 || len(k.records()) != 2 {
		t.Fatalf("summary %+v, %d records in Kafka", sum, len(k.records()))
	}
	got, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, line) {
		t.Fatalf("the file holds %d bytes, not the huge line's %d", len(got), len(line))
	}
}

// TestReplayHugeLineInterrupted: the same line in the part of the file an
// interrupted replay copies without sending.
func TestReplayHugeLineInterrupted(t *testing.T) {
	file, _ := hugeLine(t, sample("a", "a"), sample("b"), 40<<20)
	orig, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	k := &kafka{hold: true}
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	var sum *ReplaySummary
	alloc := allocDuring(func() {
		sum, err = Replay(ctx, ReplayOptions{File: file, Rate: 1000, InFlight: 1, Grace: 50 * time.Millisecond, MaxLineBytes: 1 << 20}, k)
	})
	if err != nil {
		t.Fatal(err)
	}
	if alloc > 8<<20 {
		t.Errorf("a 40 MiB line cost the replay %d bytes of heap", alloc)
	}
	if !sum.Interrupted || sum.Kept != 4 {
		t.Fatalf("summary %+v", sum)
	}
	got, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, orig) {
		t.Fatal("an interrupted replay changed the file")
	}
}

// TestReplayPartitionUnknownGoesUnplaced: a dead letter whose chosen
// partition no longer exists (reason partition_unknown) is sent back
// without it; any other keeps its partition.
func TestReplayPartitionUnknownGoesUnplaced(t *testing.T) {
	file := filepath.Join(t.TempDir(), "dead.ndjson")
	w, _ := New(Config{File: file, MaxBytes: 1 << 20}, telemetry.TestSettings(), nil)
	gone := record.Record{Topic: "spans", Value: []byte("gone")}
	gone.SetPartition(7)
	kept := record.Record{Topic: "spans", Value: []byte("kept")}
	kept.SetPartition(2)
	if err := write(w, &gone, "partition_unknown", errors.New("partition 7 of topic spans does not exist")); err != nil {
		t.Fatal(err)
	}
	if err := write(w, &kept, "kafka_error", errors.New("refused")); err != nil {
		t.Fatal(err)
	}
	_ = w.Close()
	k := &kafka{}
	if _, err := Replay(context.Background(), ReplayOptions{File: file, Rate: 10}, k); err != nil {
		t.Fatal(err)
	}
	got := k.records()
	if len(got) != 2 {
		t.Fatalf("sent %d", len(got))
	}
	for _, r := range got {
		p, chosen := r.Partition()
		switch string(r.Value) {
		case "gone":
			if chosen {
				t.Fatalf("the partition_unknown dead letter was sent to partition %d again", p)
			}
		case "kept":
			if !chosen || p != 2 {
				t.Fatalf("the other dead letter lost its partition: %d %v", p, chosen)
			}
		}
	}
}
