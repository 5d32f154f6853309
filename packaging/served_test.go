package packaging

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/ferryhq/ferry/proofs/harness/agenttest"
	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
)

// madeByPrometheus are names the alerts use that Prometheus itself makes
// for every target, not the agent.
var madeByPrometheus = map[string]string{"up": "Prometheus's own series for each scrape target"}

// TestMetricNamesServed: every metric the alerting rules and the dashboard
// select is one the real agent serves on /metrics. A metric with labels
// has a series (and so a name on /metrics) only once something counted,
// so the test drives real agents, with a real Kafka, into every state the
// rules and panels watch — and a metric it cannot create fails the test
// just as a misspelt one does:
//
//   - A, spool mode: records in over HTTP and syslog (with a fire-and-forget, a
//     refused Origin, a forged token, an application over its rate limit),
//     OTLP traces (one dropped by a filter, span metrics flushed) and a
//     Zipkin span whose repeated tag the door leaves out; a record for a
//     topic Kafka does not have, which becomes a dead letter; log files
//     read, one rotated and one truncated;
//   - B, kafka mode: log lines and a fire-and-forget record for a missing
//     topic, which the exporter and the files receiver drop;
//   - C, spill mode, Kafka unreachable: batches spilled to disk until the
//     spool is full and refuses;
//   - D, kafka mode, Kafka unreachable: the queue full, log lines refused
//     by it.
func TestMetricNamesServed(t *testing.T) {
	brokers := kafkatest.Shared(t)
	used := usedMetrics(t)
	topic := kafkatest.NewTopic(t, brokers, "packaging", 1)
	missing := fmt.Sprintf("packaging-missing-%d", time.Now().UnixNano())
	dead := deadAddr(t) // nothing listens there: an unreachable Kafka

	scrapes := make([]string, 4)
	agents := []func(*testing.T) string{
		func(t *testing.T) string { return agentSpool(t, brokers, topic, missing) },
		func(t *testing.T) string { return agentKafkaDrops(t, brokers, missing) },
		func(t *testing.T) string { return agentSpill(t, dead) },
		func(t *testing.T) string { return agentQueueFull(t, dead) },
	}
	// The four run at once (each waits on Kafka's or its own timing); the
	// group returns when all are done.
	t.Run("agents", func(t *testing.T) {
		for i, f := range agents {
			t.Run(string(rune('A'+i)), func(t *testing.T) {
				t.Parallel()
				scrapes[i] = f(t)
			})
		}
	})
	if t.Failed() {
		return
	}

	served := map[string]bool{}
	for i, s := range scrapes {
		p := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := p.TextToMetricFamilies(strings.NewReader(s))
		if err != nil {
			t.Fatalf("agent %c's /metrics: %v", 'A'+i, err)
		}
		for name, mf := range fams {
			if len(mf.GetMetric()) == 0 {
				continue
			}
			served[name] = true
			switch mf.GetType() {
			case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
				served[name+"_bucket"], served[name+"_sum"], served[name+"_count"] = true, true, true
			case dto.MetricType_SUMMARY:
				served[name+"_sum"], served[name+"_count"] = true, true
			}
		}
	}
	names := make([]string, 0, len(used))
	for n := range used {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if served[n] || madeByPrometheus[n] != "" {
			continue
		}
		t.Errorf("%s is not served by the agent (used by %s)", n, strings.Join(used[n], "; "))
	}
	if !t.Failed() {
		t.Logf("%d metric names used by the rules and the dashboard, each served by a real agent (or made by Prometheus: up)", len(names))
	}
}

// deadAddr is a loopback address where nothing listens.
func deadAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func scrape(t *testing.T, a *agenttest.Agent) string {
	t.Helper()
	res, err := http.Get("http://" + a.Admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// post sends body and returns the status.
func post(t *testing.T, url, ctype string, body []byte, hdr ...string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	req.Header.Set("Content-Type", ctype)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode
}

// waitFor polls until cond holds (or fails the test after d).
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", d, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func writeFile(t *testing.T, path, s string, flag int) {
	t.Helper()
	f, err := os.OpenFile(path, flag|os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
	f.Close()
}

// agentSpool is agent A.
func agentSpool(t *testing.T, brokers, topic, missing string) string {
	logs := t.TempDir()
	udp, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	syslogAddr := udp.LocalAddr().String()
	udp.Close()
	state := t.TempDir()
	cfg := fmt.Sprintf(`exporter: {kafka: {brokers: [%q]}}
delivery:
  mode: spool
  spool: {dir: %q}
  dead_letter: {file: %q}
receivers:
  http: {auth: {mode: optional}}
  otlp:
    doors: [zipkin]
    traces: {topic: %q}
    metrics: {topic: %q}
    logs: {topic: %q}
  files:
    enabled: true
    include: [%q]
    start_at: beginning
    poll_interval: 100ms
    topic: %q
    checkpoint_dir: %q
  syslog: {enabled: true, udp: %q, tcp: "", tls_listen: "", socket: "", topic: %q}
auth:
  keys: [{id: 1, secret: %q, issue: true}]
rate_limits:
  classes: {tiny: {records_per_sec: 1, bytes_per_sec: 1000000, burst_records: 1}}
  apps: {noisy: tiny}
processors:
  attributes:
    drop_if: [{key: drop.me, equals: "yes", signals: [traces]}]
  span_metrics: {enabled: true, interval: 1s}
`, brokers, filepath.Join(state, "spool"), filepath.Join(state, "dead.ndjson"), topic, topic, topic,
		filepath.Join(logs, "*.log"), topic, filepath.Join(state, "files"), syslogAddr, topic, strings.Repeat("ab", 32))
	a := agenttest.Start(t, ferryBin, cfg)
	httpURL := "http://" + a.HTTP + "/v1/messages/"

	if c := post(t, httpURL+topic, "application/x-ndjson", []byte("{\"n\":1}\n{\"n\":2}\n")); c != 200 {
		t.Errorf("A: POST: %d", c)
	}
	if c := post(t, httpURL+topic+"?wait=false", "text/plain", []byte("ff")); c != 200 && c != 202 {
		t.Errorf("A: POST wait=false: %d", c)
	}
	if c := post(t, httpURL+topic, "text/plain", []byte("x"), "Origin", "https://evil.example"); c != 403 {
		t.Errorf("A: POST from a web page: %d, want 403", c)
	}
	if c := post(t, httpURL+topic, "text/plain", []byte("x"), "X-Ferry-Token", "not-a-token"); c != 401 {
		t.Errorf("A: POST with a forged token: %d, want 401", c)
	}
	out, err := exec.Command(ferryBin, "token", "issue", "-c", a.Config, "--app", "noisy").Output()
	if err != nil {
		t.Fatalf("A: token issue: %v", err)
	}
	tok := strings.TrimSpace(string(out))
	limited := false
	for i := 0; i < 5 && !limited; i++ {
		limited = post(t, httpURL+topic, "text/plain", []byte("n"), "X-Ferry-Token", tok) == 429
	}
	if !limited {
		t.Error("A: app noisy was never over its rate limit of one record a second")
	}
	// a topic Kafka does not have: answered from the spool, then a dead letter
	if c := post(t, httpURL+missing, "text/plain", []byte("lost")); c != 200 {
		t.Errorf("A: POST to a missing topic in spool mode: %d", c)
	}
	otlp := `{"resourceSpans":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"shop"}}]},"scopeSpans":[{"spans":[
{"traceId":"5b8efff798038103d269b633813fc60c","spanId":"eee19b7ec3c1b174","name":"GET /","kind":2,"startTimeUnixNano":"1000","endTimeUnixNano":"2000"},
{"traceId":"5b8efff798038103d269b633813fc60d","spanId":"eee19b7ec3c1b175","name":"GET /healthz","kind":2,"startTimeUnixNano":"1000","endTimeUnixNano":"2000",
 "attributes":[{"key":"drop.me","value":{"stringValue":"yes"}}]}]}]}]}`
	if c := post(t, "http://"+a.OTLP+"/v1/traces", "application/json", []byte(otlp)); c != 200 {
		t.Errorf("A: OTLP traces: %d", c)
	}
	zipkin := `[{"traceId":"0000000000000001","id":"0000000000000001","name":"get","tags":{"a":"1","a":"2"}}]`
	if c := post(t, "http://"+a.OTLP+"/api/v2/spans", "application/json", []byte(zipkin)); c != 202 {
		t.Errorf("A: Zipkin span: %d", c)
	}
	c, err := net.Dial("udp", syslogAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitFor(t, 30*time.Second, "A: a syslog message read", func() bool {
		_, _ = c.Write([]byte("<13>1 2026-01-01T00:00:00Z host app - - - hello"))
		return a.Metric("ferry_syslog_messages_total") >= 1
	})
	// log files: read, then one rotated away and one truncated
	writeFile(t, filepath.Join(logs, "a.log"), "a1\na2\n", os.O_APPEND)
	writeFile(t, filepath.Join(logs, "b.log"), "b1\nb2\nb3\n", os.O_APPEND)
	waitFor(t, 30*time.Second, "A: the log lines read", func() bool { return a.Metric("ferry_files_lines_total") >= 5 })
	if err := os.Rename(filepath.Join(logs, "a.log"), filepath.Join(logs, "a.log.1")); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(logs, "b.log"), "b\n", os.O_TRUNC)
	waitFor(t, 30*time.Second, "A: a rotation and a truncation seen", func() bool {
		return a.Metric("ferry_files_rotations_total") >= 1 && a.Metric("ferry_files_truncations_total") >= 1
	})
	// franz-go takes 1-20 s to decide a topic is unknown
	waitFor(t, 60*time.Second, "A: the missing topic's record dead-lettered", func() bool {
		return a.Metric("ferry_dead_letter_records_total") >= 1
	})
	waitFor(t, 30*time.Second, "A: span metrics flushed", func() bool {
		return a.Metric("ferry_processor_span_metrics_flushes_total") >= 1
	})
	waitFor(t, 30*time.Second, "A: every record acknowledged", func() bool {
		return a.Metric(`ferry_exporter_sent_records_total{topic="`+topic+`"}`) >= 1
	})
	return scrape(t, a)
}

// agentKafkaDrops is agent B.
func agentKafkaDrops(t *testing.T, brokers, missing string) string {
	logs := t.TempDir()
	a := agenttest.Start(t, ferryBin, "", "exporter.kafka.brokers=["+brokers+"]",
		"receivers.files.enabled=true", "receivers.files.include=["+filepath.Join(logs, "*.log")+"]",
		"receivers.files.start_at=beginning", "receivers.files.poll_interval=100ms", "receivers.files.topic="+missing,
		"receivers.files.checkpoint_dir="+t.TempDir(), "exporter.kafka.create_topics.enabled=false")
	writeFile(t, filepath.Join(logs, "c.log"), "c1\n", os.O_APPEND)
	if c := post(t, "http://"+a.HTTP+"/v1/messages/"+missing+"?wait=false", "text/plain", []byte("gone")); c != 202 {
		t.Errorf("B: fire-and-forget POST: %d", c)
	}
	waitFor(t, 60*time.Second, "B: records for a missing topic dropped by the exporter and the files receiver", func() bool {
		return a.Metric("ferry_exporter_dropped_records_total") >= 1 && a.Metric("ferry_files_dropped_records_total") >= 1
	})
	return scrape(t, a)
}

// agentSpill is agent C.
func agentSpill(t *testing.T, dead string) string {
	a := agenttest.Start(t, ferryBin, "", "exporter.kafka.brokers=["+dead+"]", "delivery.mode=spill",
		"delivery.spool.dir="+t.TempDir(), "delivery.dead_letter.file="+filepath.Join(t.TempDir(), "dead.ndjson"), "delivery.spool.max_bytes=2MiB", "delivery.spool.segment_bytes=512KiB",
		"queue.memory_limit=16MiB", "receivers.http.max_request_bytes=256KiB",
		"receivers.otlp.enabled=false", "receivers.local.enabled=false")
	body := bytes.Repeat([]byte("x"), 200<<10)
	waitFor(t, 60*time.Second, "C: the spool full and refusing", func() bool {
		post(t, "http://"+a.HTTP+"/v1/messages/t?wait=false", "text/plain", body)
		return a.Metric("ferry_spool_refused_records_total") >= 1 && a.Metric("ferry_spill_records_total") >= 1
	})
	return scrape(t, a)
}

// agentQueueFull is agent D: the queue filled by fire-and-forget requests
// that cannot reach Kafka, then log lines the files receiver hands over
// and the queue refuses (the receiver waits and tries them again). Network
// receivers reserve a request's room before reading it and count a
// refusal in ferry_receiver_errors_total; the files receiver offers its
// batches to the queue itself, which counts them.
func agentQueueFull(t *testing.T, dead string) string {
	logs := t.TempDir()
	a := agenttest.Start(t, ferryBin, "", "exporter.kafka.brokers=["+dead+"]",
		"queue.memory_limit=16MiB", "receivers.http.max_request_bytes=256KiB",
		"receivers.otlp.enabled=false", "receivers.local.enabled=false",
		"receivers.files.enabled=true", "receivers.files.include=["+filepath.Join(logs, "*.log")+"]",
		"receivers.files.start_at=beginning", "receivers.files.poll_interval=100ms",
		"receivers.files.checkpoint_dir="+t.TempDir(), "receivers.files.max_line_bytes=64KiB", "receivers.files.max_inflight_bytes=4MiB")
	body := bytes.Repeat([]byte("x"), 200<<10)
	for post(t, "http://"+a.HTTP+"/v1/messages/t?wait=false", "text/plain", body) == 202 {
	}
	writeFile(t, filepath.Join(logs, "d.log"), strings.Repeat(strings.Repeat("l", 60<<10)+"\n", 8), os.O_APPEND)
	waitFor(t, 30*time.Second, "D: the queue refusing the files receiver's lines", func() bool {
		return a.Metric("ferry_queue_refused_records_total") >= 1
	})
	return scrape(t, a)
}
