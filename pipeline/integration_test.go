package pipeline

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"github.com/ferryhq/ferry/receiver/httpreceiver"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryhq/ferry/config"
	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
	"github.com/ferryhq/ferry/proofs/harness/leaktest"
	"github.com/ferryhq/ferry/telemetry"
)

func TestMain(m *testing.M) { kafkatest.Main(leaktest.Wrap(m)) }

// startAgent runs a whole pipeline in-process against brokers, listeners on
// free ports.
func startAgent(t *testing.T, brokers string, sets ...string) *Pipeline {
	t.Helper()
	all := append([]string{
		"receivers.http.listen=127.0.0.1:0", "telemetry.admin.listen=127.0.0.1:0",
		"receivers.otlp.http.listen=127.0.0.1:0", "receivers.otlp.grpc.listen=127.0.0.1:0",
		"receivers.local.listen=127.0.0.1:0", "receivers.local.socket=" + shortDir(t) + "/f.sock",
		"exporter.kafka.brokers=[" + brokers + "]", "exporter.kafka.health_check_interval=200ms",
		"exporter.kafka.dial_timeout=1s", "shutdown_timeout=20s",
	}, sets...)
	cfg, err := config.Parse(nil, all)
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(cfg, telemetry.TestSettings())
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = p.Shutdown(ctx)
	})
	return p
}

type answer struct {
	code int
	body map[string]any
}

func send(client *http.Client, url string, body []byte, hdr ...string) (answer, error) {
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/x-ndjson")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := client.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	a := answer{code: res.StatusCode}
	if err := json.Unmarshal(raw, &a.body); err != nil {
		return a, fmt.Errorf("non-JSON answer %d: %q", res.StatusCode, raw)
	}
	return a, nil
}

func readyz(t *testing.T, p *Pipeline) bool {
	res, err := http.Get("http://" + p.Admin.Addr() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	return res.StatusCode == 200
}

func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestHundredThousandRecords: 100k records in 1000 concurrent-ish requests
// from 20 clients; every value arrives exactly once with its key and header,
// and within each key (one per client) the order is the sending order.
func TestHundredThousandRecords(t *testing.T) {
	brokers := kafkatest.Shared(t)
	topic := kafkatest.NewTopic(t, brokers, "it-100k", 4)
	p := startAgent(t, brokers)
	url := "http://" + p.Receiver("http").(*httpreceiver.Receiver).Addr() + "/v1/messages/" + topic

	const clients, requests, perReq = 20, 50, 100
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			client := &http.Client{Timeout: 60 * time.Second}
			for r := 0; r < requests; r++ {
				var body bytes.Buffer
				for i := 0; i < perReq; i++ {
					fmt.Fprintf(&body, `{"c":%d,"seq":%d}`+"\n", c, r*perReq+i)
				}
				a, err := send(client, url, body.Bytes(), "X-Ferry-Key", fmt.Sprintf("client-%d", c), "X-Ferry-Header-Req", strconv.Itoa(r))
				if err != nil || a.code != 200 || a.body["accepted"] != float64(perReq) {
					errs <- fmt.Errorf("client %d request %d: %v %d %v", c, r, err, a.code, a.body)
					return
				}
			}
		}(c)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	total := clients * requests * perReq
	recs := kafkatest.Consume(t, brokers, topic, total, 60*time.Second)
	if len(recs) != total {
		t.Fatalf("consumed %d records, want exactly %d", len(recs), total)
	}
	seen := make(map[string]bool, total)
	last := map[string]int{}
	partOf := map[string]int32{}
	for _, r := range recs {
		var v struct{ C, Seq int }
		if err := json.Unmarshal(r.Value, &v); err != nil {
			t.Fatalf("value %q: %v", r.Value, err)
		}
		id := fmt.Sprintf("%d/%d", v.C, v.Seq)
		if seen[id] {
			t.Fatalf("duplicate %s", id)
		}
		seen[id] = true
		key := string(r.Key)
		if key != fmt.Sprintf("client-%d", v.C) {
			t.Fatalf("record %s has key %q", id, key)
		}
		if len(r.Headers) != 1 || r.Headers[0].Key != "req" || r.Headers[0].Value == nil ||
			string(r.Headers[0].Value) != strconv.Itoa(v.Seq/perReq) {
			t.Fatalf("record %s headers %+v", id, r.Headers)
		}
		if p, ok := partOf[key]; ok && p != r.Partition {
			t.Fatalf("key %s on partitions %d and %d", key, p, r.Partition)
		}
		partOf[key] = r.Partition
		if prev, ok := last[key]; ok && v.Seq <= prev {
			t.Fatalf("key %s: seq %d after %d — order broken", key, v.Seq, prev)
		}
		last[key] = v.Seq
	}
	if len(seen) != total {
		t.Fatalf("%d distinct records, want %d", len(seen), total)
	}
	if got := p.sum("ferry_exporter_sent_records_total"); got != float64(total) {
		t.Errorf("sent counter %v, want %d", got, total)
	}
}

// TestKafkaErrorsReachTheClient: what only a real broker decides.
func TestKafkaErrorsReachTheClient(t *testing.T) {
	brokers := kafkatest.Shared(t)
	errTopic := kafkatest.NewTopic(t, brokers, "it-errors", 1)
	p := startAgent(t, brokers)
	base := "http://" + p.Receiver("http").(*httpreceiver.Receiver).Addr() + "/v1/messages/"
	client := &http.Client{Timeout: 60 * time.Second} // an unknown topic takes up to ~20 s to be known as such

	a, err := send(client, base+"it-no-such-topic", []byte("x\n"))
	if err != nil || a.code != 404 || a.body["reason"] != "unknown_topic" || !strings.Contains(a.body["error"].(string), "it-no-such-topic") {
		t.Fatalf("unknown topic: %v %d %v", err, a.code, a.body)
	}
	big := bytes.Repeat([]byte("b"), 1_200_000)
	a, err = send(client, base+errTopic, big)
	if err != nil || a.code != 413 || a.body["reason"] != "record_too_large" || !strings.Contains(a.body["error"].(string), "1000000") {
		t.Fatalf("too large: %v %d %v", err, a.code, a.body)
	}
	if got := p.sum("ferry_exporter_dropped_records_total"); got != 2 {
		t.Errorf("dropped counter %v, want 2 (one unknown topic, one too large)", got)
	}
	a, err = send(client, base+errTopic, []byte("fine\n"))
	if err != nil || a.code != 200 {
		t.Fatalf("after errors: %v %d %v", err, a.code, a.body)
	}
}

// TestKafkaDownThenUp: the agent starts while its broker is down, reports
// not ready, takes fire-and-forget records into its queue, refuses with 503
// once the queue is full (and never holds more than its limit), and delivers
// everything it accepted once the broker is back — without a restart.
func TestKafkaDownThenUp(t *testing.T) {
	b := kafkatest.Start(t)
	topic := kafkatest.NewTopic(t, b.Addr, "it-down", 2)
	b.Kill(t)

	p := startAgent(t, b.Addr, "queue.memory_limit=2MiB", "receivers.http.max_request_bytes=64KiB", "receivers.otlp.enabled=false")
	time.Sleep(500 * time.Millisecond)
	if readyz(t, p) {
		t.Fatal("ready while Kafka is down")
	}
	url := "http://" + p.Receiver("http").(*httpreceiver.Receiver).Addr() + "/v1/messages/" + topic + "?wait=false"
	client := &http.Client{Timeout: 10 * time.Second}
	var accepted []string
	var refused int
	for i := 0; i < 200 && refused < 3; i++ {
		var body bytes.Buffer
		var ids []string
		for j := 0; j < 50; j++ {
			id := fmt.Sprintf("r%d-%d", i, j)
			ids = append(ids, id)
			fmt.Fprintf(&body, "%s %s\n", id, strings.Repeat("p", 200))
		}
		a, err := send(client, url, body.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		switch a.code {
		case 202:
			accepted = append(accepted, ids...)
		case 503:
			refused++
			if a.body["reason"] != "kafka_unavailable" {
				t.Fatalf("503 reason %v", a.body)
			}
		default:
			t.Fatalf("unexpected %d %v", a.code, a.body)
		}
		if p.Queue.Used() > p.Queue.Limit() {
			t.Fatalf("queue %d bytes over its limit %d", p.Queue.Used(), p.Queue.Limit())
		}
	}
	if refused == 0 || len(accepted) == 0 {
		t.Fatalf("accepted %d, refused %d: the queue should fill and refuse", len(accepted), refused)
	}

	b.Restart(t)
	waitFor(t, "readyz after Kafka is back", 60*time.Second, func() bool { return readyz(t, p) })
	recs := kafkatest.Consume(t, b.Addr, topic, len(accepted), 60*time.Second)
	got := map[string]int{}
	for _, r := range recs {
		id, _, _ := strings.Cut(string(r.Value), " ")
		got[id]++
	}
	for _, id := range accepted {
		if got[id] != 1 {
			t.Fatalf("accepted record %s arrived %d times", id, got[id])
		}
	}
	// And new traffic flows with acknowledgements.
	a, err := send(client, "http://"+p.Receiver("http").(*httpreceiver.Receiver).Addr()+"/v1/messages/"+topic, []byte("after\n"))
	if err != nil || a.code != 200 {
		t.Fatalf("after recovery: %v %d %v", err, a.code, a.body)
	}
}

// TestQueueFullWithLiveKafka: Kafka is up but slow to acknowledge (a 2 s
// linger), so the memory queue fills: new requests get 429 with Retry-After,
// the queued-bytes gauge scraped from /metrics never exceeds the limit, and
// every accepted record is delivered.
func TestQueueFullWithLiveKafka(t *testing.T) {
	brokers := kafkatest.Shared(t)
	topic := kafkatest.NewTopic(t, brokers, "it-full", 1)
	p := startAgent(t, brokers, "queue.memory_limit=1MiB", "receivers.http.max_request_bytes=128KiB", "receivers.otlp.enabled=false",
		"exporter.kafka.linger=2s", "exporter.kafka.linger_mode=fixed") // the adaptive mode would send at once
	waitFor(t, "ready", 20*time.Second, func() bool { return readyz(t, p) })
	url := "http://" + p.Receiver("http").(*httpreceiver.Receiver).Addr() + "/v1/messages/" + topic + "?wait=false"
	client := &http.Client{Timeout: 10 * time.Second}
	limit := float64(p.Queue.Limit())
	var accepted, refused int
	for i := 0; i < 40; i++ {
		body := bytes.Repeat([]byte(fmt.Sprintf("%02d", i%100)), 30<<10) // 60 KiB, one record
		req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/octet-stream")
		res, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		switch res.StatusCode {
		case 202:
			accepted++
		case 429:
			refused++
			if res.Header.Get("Retry-After") == "" {
				t.Fatal("429 without Retry-After")
			}
		default:
			t.Fatalf("status %d", res.StatusCode)
		}
		if g := gauge(t, p, "ferry_queue_bytes"); g > limit {
			t.Fatalf("ferry_queue_bytes %v over the limit %v", g, limit)
		}
	}
	if accepted == 0 || refused == 0 {
		t.Fatalf("accepted %d refused %d: want both (Kafka holds batches for 2 s)", accepted, refused)
	}
	recs := kafkatest.Consume(t, brokers, topic, accepted, 30*time.Second)
	if len(recs) != accepted {
		t.Fatalf("%d records in Kafka, %d accepted", len(recs), accepted)
	}
	waitFor(t, "the queue to drain", 10*time.Second, func() bool { return gauge(t, p, "ferry_queue_bytes") == 0 })
}

// gauge scrapes one unlabelled metric from the admin endpoint, as a user would.
func gauge(t *testing.T, p *Pipeline, name string) float64 {
	t.Helper()
	res, err := http.Get("http://" + p.Admin.Addr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	t.Fatalf("%s not in /metrics", name)
	return 0
}
