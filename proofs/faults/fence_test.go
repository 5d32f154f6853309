package faults

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
)

// 12. Exactly once, two agents with one identity (a copied state
// directory): the newer one fences the older, which stops delivering and
// says so on /readyz; never both write. What the older one accepted after
// the fence stays in its spool.
func TestExactlyOnceSecondAgentFencesFirst(t *testing.T) {
	brokers := kafkatest.Shared(t)
	topic := kafkatest.NewTopic(t, brokers, "fault-fence", 1)
	dirA, dirB := t.TempDir(), t.TempDir()
	eo := func(dir string) []string {
		return append(spoolSets(t, "spool", dir), "delivery.guarantee=exactly_once")
	}
	a := startAgent(t, brokers, eo(dirA)...)
	post := func(addr, values string) int {
		res, err := http.Post("http://"+addr+"/v1/messages/"+topic, "application/x-ndjson", strings.NewReader(values))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode
	}
	if code := post(a.HTTP, "a-before-1\na-before-2\n"); code != 200 {
		t.Fatalf("agent A answered %d", code)
	}
	waitMetric(t, a, `ferry_spool_delivered_records_total`, 2)

	// The copy: B's spool directory has A's identity.
	id, err := os.ReadFile(filepath.Join(dirA, "id"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dirB, "id"), id, 0o600); err != nil {
		t.Fatal(err)
	}
	b := startAgent(t, brokers, eo(dirB)...)
	if code := post(b.HTTP, "b-1\nb-2\n"); code != 200 {
		t.Fatalf("agent B answered %d", code)
	}
	waitMetric(t, b, `ferry_spool_delivered_records_total`, 2)

	// A tries to write again: it is fenced and stops.
	if code := post(a.HTTP, "a-after-1\n"); code != 200 {
		t.Fatalf("agent A answered %d", code)
	}
	waitMetric(t, a, `ferry_exactly_once_fenced`, 1)
	res, err := http.Get("http://" + a.Admin + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 503 || !bytes.Contains(body, []byte("fenced")) {
		t.Fatalf("the fenced agent's /readyz: %d %s", res.StatusCode, body)
	}
	if code := post(b.HTTP, "b-3\n"); code != 200 {
		t.Fatalf("agent B answered %d", code)
	}
	waitMetric(t, b, `ferry_spool_delivered_records_total`, 3)

	got := committedValues(t, brokers, topic)
	want := "a-before-1,a-before-2,b-1,b-2,b-3"
	if strings.Join(got, ",") != want {
		t.Fatalf("read_committed saw %v, want %s (a-after-1 stays in A's spool)", got, want)
	}
	a.Stop()
	b.Stop()
}

func waitMetric(t *testing.T, a *agent, name string, want float64) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for a.Metric(name) < want {
		if time.Now().After(deadline) {
			t.Fatalf("%s is %v after a minute, want %v", name, a.Metric(name), want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func committedValues(t *testing.T, brokers, topic string) []string {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var got []string
	for idle := 0; idle < 3; {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		fs := cl.PollFetches(ctx)
		cancel()
		n := 0
		fs.EachRecord(func(r *kgo.Record) { got = append(got, string(r.Value)); n++ })
		if n == 0 {
			idle++
		}
	}
	return got
}

// waitCommitted reads the topic read_committed until want distinct values
// are there (or two minutes pass) and counts each value's copies.
func waitCommitted(t *testing.T, brokers, topic string, want int) map[string]int {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		seen := map[string]int{}
		for _, v := range committedValues(t, brokers, topic) {
			seen[v]++
		}
		if len(seen) >= want || time.Now().After(deadline) {
			return seen
		}
	}
}
