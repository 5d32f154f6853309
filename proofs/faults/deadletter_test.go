package faults

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
)

// TestDeadLetterReplayAfterTopicCreated: in spool mode, records sent to a
// topic that does not exist yet are answered 200 and end up in the
// dead-letter file. The tools, run as the real binary against the stopped
// agent's state: spool verify finds the spool clean; deadletter replay
// refuses while the agent runs, and once the agent is stopped and the
// topic created, sends every dead letter to Kafka (key, value, headers as
// they were) and removes the file.
func TestDeadLetterReplayAfterTopicCreated(t *testing.T) {
	brokers := kafkatest.Shared(t)
	topic := fmt.Sprintf("fault-dlq-%d", time.Now().UnixNano())
	dir := t.TempDir()
	dead := filepath.Join(t.TempDir(), "dead.ndjson")
	a := startAgent(t, brokers, "delivery.mode=spool", "delivery.spool.dir="+dir, "delivery.dead_letter.file="+dead)
	const n = 20
	var body bytes.Buffer
	for i := 0; i < n; i++ {
		fmt.Fprintf(&body, "dlq-%02d\n", i)
	}
	req, _ := http.NewRequest("POST", "http://"+a.HTTP+"/v1/messages/"+topic, &body)
	req.Header.Set("Content-Type", "application/x-ndjson") // a record per line
	req.Header.Set("X-Ferry-Key", "k")
	req.Header.Set("X-Ferry-Header-Src", "replay")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("POST to a missing topic in spool mode: %d, want 200", res.StatusCode)
	}
	// franz-go takes 1–20 s to decide the topic is unknown.
	deadline := time.Now().Add(60 * time.Second)
	for a.Metric(`ferry_dead_letter_records_total{reason="unknown_topic",sink="file"}`) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%v dead letters after 60 s, want %d", a.Metric(`ferry_dead_letter_records_total{reason="unknown_topic",sink="file"}`), n)
		}
		time.Sleep(200 * time.Millisecond)
	}

	ferry := func(args ...string) (int, string) {
		t.Helper()
		out, err := exec.Command(ferryBin, args...).CombinedOutput()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatal(err)
		}
		code := 0
		if ee != nil {
			code = ee.ExitCode()
		}
		return code, string(out)
	}
	replay := []string{"deadletter", "replay", "--set", "exporter.kafka.brokers=[" + brokers + "]", "--set", "delivery.mode=spool", "--set", "delivery.spool.dir=" + dir,
		"--file", dead, "--rate", "100"}
	if code, out := ferry(replay...); code != 2 || !strings.Contains(out, "stop the agent") {
		t.Fatalf("replay while the agent runs: exit %d\n%s", code, out)
	}
	a.Stop()
	if code, out := ferry("spool", "verify", "--dir", dir); code != 0 || !strings.Contains(out, "no damage") {
		t.Fatalf("spool verify: exit %d\n%s", code, out)
	}

	kafkatest.CreateTopic(t, brokers, topic, 3)
	code, out := ferry(replay...)
	t.Logf("ferry deadletter replay:\n%s", out)
	if code != 0 || !strings.Contains(out, fmt.Sprintf("sent %d (%s=%d)", n, topic, n)) || !strings.Contains(out, "removed") {
		t.Fatalf("replay: exit %d\n%s", code, out)
	}
	if _, err := os.Stat(dead); !os.IsNotExist(err) {
		t.Fatalf("the dead-letter file is still there: %v", err)
	}
	recs := kafkatest.Consume(t, brokers, topic, n, 30*time.Second)
	var got []string
	for _, r := range recs {
		if string(r.Key) != "k" || len(r.Headers) != 1 || r.Headers[0].Key != "src" || string(r.Headers[0].Value) != "replay" {
			t.Fatalf("record %q: key %q, headers %v", r.Value, r.Key, r.Headers)
		}
		got = append(got, string(r.Value))
	}
	sort.Strings(got)
	if len(got) != n || got[0] != "dlq-00" || got[n-1] != fmt.Sprintf("dlq-%02d", n-1) {
		t.Fatalf("in Kafka: %v", got)
	}
}
