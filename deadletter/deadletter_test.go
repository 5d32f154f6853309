package deadletter

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/consumer/consumertest"
	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/telemetry"
)

func TestFileKeepsRecordAndReason(t *testing.T) {
	file := filepath.Join(t.TempDir(), "dl", "dead.ndjson")
	w, err := New(Config{File: file, MaxBytes: 1 << 20}, telemetry.TestSettings(), nil)
	if err != nil {
		t.Fatal(err)
	}
	in := record.Record{Topic: "orders", Key: []byte("k\x00"), Value: []byte("v\xff\n"), Headers: []record.Header{{Key: "h", Value: []byte("x")}}}
	if err := write(w, &in, "record_too_large", consumer.TooLarge("record", 9, 5, nil)); err != nil {
		t.Fatal(err)
	}
	_ = w.Close()
	f, _ := os.Open(file)
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		t.Fatal("no line written")
	}
	out, reason, msg, err := Decode(sc.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if out.Topic != "orders" || !bytes.Equal(out.Key, in.Key) || !bytes.Equal(out.Value, in.Value) || len(out.Headers) != 1 ||
		reason != "record_too_large" || msg == "" {
		t.Fatalf("got %+v %q %q", out, reason, msg)
	}
	if v := testutil.ToFloat64(w.count.WithLabelValues("file", "record_too_large")); v != 1 {
		t.Fatalf("counted %v", v)
	}
}

func TestFileBoundDropsAndCounts(t *testing.T) {
	file := filepath.Join(t.TempDir(), "dead.ndjson")
	w, _ := New(Config{File: file, MaxBytes: 1 << 20}, telemetry.TestSettings(), nil)
	defer w.Close()
	big := record.Record{Topic: "t", Value: bytes.Repeat([]byte("a"), 300<<10)}
	for i := 0; i < 5; i++ {
		if err := write(w, &big, "record_too_large", nil); err != nil {
			t.Fatal(err)
		}
	}
	fi, _ := os.Stat(file)
	if fi.Size() > 1<<20 {
		t.Fatalf("file %d bytes past its bound", fi.Size())
	}
	if d := testutil.ToFloat64(w.count.WithLabelValues("dropped", "record_too_large")); d != 3 {
		t.Fatalf("dropped %v, want 3 (2 fit in 1 MiB as base64)", d)
	}
}

func TestTopicThenFileFallback(t *testing.T) {
	file := filepath.Join(t.TempDir(), "dead.ndjson")
	sink := &consumertest.Sink{}
	w, _ := New(Config{File: file, MaxBytes: 1 << 20, Topic: "dlq"}, telemetry.TestSettings(), sink)
	defer w.Close()
	r := record.Record{Topic: "orders", Value: []byte("v")}
	_ = write(w, &r, "topic_rejected", errors.New("denied"))
	waitFor(t, func() bool { return testutil.ToFloat64(w.count.WithLabelValues("topic", "topic_rejected")) == 1 })
	got := sink.Records()
	if len(got) != 1 || got[0].Topic != "dlq" || len(got[0].Headers) != 2 {
		t.Fatalf("topic got %+v", got)
	}
	// A record with a chosen partition (and no key to say where it
	// belongs) carries it in a header.
	sink.Reset()
	r.SetPartition(3)
	_ = write(w, &r, "topic_rejected", errors.New("denied"))
	waitFor(t, func() bool { return testutil.ToFloat64(w.count.WithLabelValues("topic", "topic_rejected")) == 2 })
	if got = sink.Records(); len(got) != 1 || len(got[0].Headers) != 3 || got[0].Headers[2].Key != "ferry.dead_letter.partition" || string(got[0].Headers[2].Value) != "3" {
		t.Fatalf("topic got %+v", got)
	}
	if _, chosen := got[0].Partition(); chosen {
		t.Fatal("the dead letter itself is placed by the dead-letter topic's partitioner")
	}
	r.SetPartition(-1)
	// The dead-letter topic itself fails: the file takes the record.
	sink.Err = consumer.UnknownTopic("dlq", nil)
	_ = write(w, &r, "topic_rejected", errors.New("denied"))
	waitFor(t, func() bool { return testutil.ToFloat64(w.count.WithLabelValues("file", "topic_rejected")) == 1 })
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 5 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// write stores r and waits for the dead letter to be settled.
func write(w *Writer, r *record.Record, reason string, cause error) error {
	ch := make(chan error, 1)
	w.Write(r, reason, cause, func(err error) { ch <- err })
	select {
	case err := <-ch:
		return err
	case <-time.After(10 * time.Second):
		return errors.New("dead letter never settled")
	}
}
