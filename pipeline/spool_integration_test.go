package pipeline

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"github.com/ferryhq/ferry/receiver/httpreceiver"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/deadletter"
	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
)

// TestSpoolModeEndToEnd: in spool mode every record arrives once, with its
// key and headers, in order per key; the spool drains and its acknowledged
// segments are deleted.
func TestSpoolModeEndToEnd(t *testing.T) {
	brokers := kafkatest.Shared(t)
	topic := kafkatest.NewTopic(t, brokers, "it-spool", 3)
	dir := t.TempDir()
	p := startAgent(t, brokers, "delivery.mode=spool", "delivery.spool.dir="+dir, "delivery.spool.segment_bytes=256KiB",
		"delivery.dead_letter.file="+filepath.Join(t.TempDir(), "dead.ndjson"))
	url := "http://" + p.Receiver("http").(*httpreceiver.Receiver).Addr() + "/v1/messages/" + topic
	client := &http.Client{Timeout: 30 * time.Second}
	const clients, requests, perReq = 4, 25, 200
	for r := 0; r < requests; r++ {
		for c := 0; c < clients; c++ {
			var body bytes.Buffer
			for i := 0; i < perReq; i++ {
				fmt.Fprintf(&body, "c%d-%06d\n", c, r*perReq+i)
			}
			a, err := send(client, url, body.Bytes(), "X-Ferry-Key", fmt.Sprintf("k%d", c), "X-Ferry-Header-Src", "spool")
			if err != nil || a.code != 200 {
				t.Fatalf("request: %v %d %v", err, a.code, a.body)
			}
		}
	}
	want := clients * requests * perReq
	recs := kafkatest.Consume(t, brokers, topic, want, 60*time.Second)
	if len(recs) != want {
		t.Fatalf("%d records in Kafka, want %d", len(recs), want)
	}
	last := map[string]string{}
	for _, r := range recs {
		k, v := string(r.Key), string(r.Value)
		if !strings.HasPrefix(v, k[1:]+"-") && !strings.HasPrefix(v, "c"+k[1:]) {
			t.Fatalf("value %q under key %q", v, k)
		}
		if len(r.Headers) != 1 || r.Headers[0].Key != "src" || string(r.Headers[0].Value) != "spool" {
			t.Fatalf("headers %v", r.Headers)
		}
		if v <= last[k] {
			t.Fatalf("key %s: %q after %q, order broken", k, v, last[k])
		}
		last[k] = v
	}
	waitFor(t, "the spool to drain and delete its segments", 10*time.Second, func() bool {
		segs, _ := filepath.Glob(filepath.Join(dir, "*.seg"))
		return p.Spool.Backlog() == 0 && len(segs) <= 1
	})
}

// TestSpoolDeadLetters: a record the broker refuses for good (over the
// topic's max.message.bytes) after its client was answered goes to the
// dead-letter file with its reason; the records around it are delivered
// and the spool is not held up.
func TestSpoolDeadLetters(t *testing.T) {
	brokers := kafkatest.Shared(t)
	topic := fmt.Sprintf("it-deadletter-%d", time.Now().UnixNano())
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers))
	if err != nil {
		t.Fatal(err)
	}
	small := "2000"
	resp, err := kadm.NewClient(cl).CreateTopic(context.Background(), 1, 1, map[string]*string{"max.message.bytes": &small}, topic)
	cl.Close()
	if err != nil || resp.Err != nil {
		t.Fatalf("create topic: %v %v", err, resp.Err)
	}
	dead := filepath.Join(t.TempDir(), "dead.ndjson")
	p := startAgent(t, brokers, "delivery.mode=spool", "delivery.spool.dir="+t.TempDir(), "delivery.dead_letter.file="+dead,
		"exporter.kafka.compression=none", "exporter.kafka.linger=0s")
	url := "http://" + p.Receiver("http").(*httpreceiver.Receiver).Addr() + "/v1/messages/" + topic
	client := &http.Client{Timeout: 30 * time.Second}
	post := func(v string) {
		t.Helper()
		a, err := send(client, url, []byte(v))
		if err != nil || a.code != 200 {
			t.Fatalf("request: %v %d %v", err, a.code, a.body)
		}
	}
	// Each record in a batch of its own (the broker refuses a whole
	// batch), by waiting for each to be settled before the next is sent:
	// a sleep between them let a busy machine's spool reader put the large
	// record and "after" in one batch.
	post("before")
	kafkatest.Consume(t, brokers, topic, 1, 30*time.Second)
	post(strings.Repeat("x", 5000))
	var line []byte
	waitFor(t, "the dead letter", 20*time.Second, func() bool {
		f, err := os.Open(dead)
		if err != nil {
			return false
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		sc.Buffer(nil, 1<<20)
		if sc.Scan() {
			line = append([]byte{}, sc.Bytes()...)
			return true
		}
		return false
	})
	post("after")
	recs := kafkatest.Consume(t, brokers, topic, 2, 30*time.Second)
	if len(recs) != 2 || string(recs[0].Value) != "before" || string(recs[1].Value) != "after" {
		t.Fatalf("in Kafka: %d records", len(recs))
	}
	r, reason, msg, err := deadletter.Decode(line)
	if err != nil || reason != "record_too_large" || len(r.Value) != 5000 || r.Topic != topic {
		t.Fatalf("dead letter: %v %q %q topic %q, %d bytes", err, reason, msg, r.Topic, len(r.Value))
	}
	waitFor(t, "the spool to drain", 10*time.Second, func() bool { return p.Spool.Backlog() == 0 })
}
