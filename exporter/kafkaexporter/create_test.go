package kafkaexporter

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/telemetry"
)

// logBuf is a log sink safe for the exporter's goroutines.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// creating builds an exporter that creates want, logging into the returned
// buffer, and starts it.
func creating(t *testing.T, brokers []string, ct CreateTopics, want ...string) (*Exporter, *logBuf) {
	t.Helper()
	logs := &logBuf{}
	set := telemetry.NewSettings(telemetry.Config{Log: telemetry.LogConfig{Level: "info", Format: "text"}}, logs)
	cfg := testCfg(brokers)
	cfg.CreateTopics = ct
	e, err := New(cfg, set, 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	e.want = want
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Shutdown(context.Background()) })
	return e, logs
}

// partitionsOf is the topics' partition counts as the cluster says (0:
// missing).
func partitionsOf(t *testing.T, e *Exporter, topics ...string) map[string]int32 {
	t.Helper()
	got, err := e.Partitions(context.Background(), topics)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int32{}
	for _, ti := range got {
		if ti.Err == nil {
			out[ti.Topic] = ti.Partitions
		}
	}
	return out
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("never: " + what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The configured topics that are missing are created once Kafka is
// reached, with the configured partitions, one INFO line each; a topic
// that exists is left as it is; a record for a created topic is
// delivered.
func TestCreatesMissingConfiguredTopics(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "exists"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	e, logs := creating(t, c.ListenAddrs(), CreateTopics{Enabled: true, Partitions: 3, ReplicationFactor: -1}, "exists", "otlp_spans", "otlp_logs")
	eventually(t, "topics created", func() bool { return testutil.ToFloat64(e.m.created) == 2 })
	got := partitionsOf(t, e, "exists", "otlp_spans", "otlp_logs")
	if got["exists"] != 1 || got["otlp_spans"] != 3 || got["otlp_logs"] != 3 {
		t.Fatalf("partitions after creation: %v", got)
	}
	l := logs.String()
	for _, tp := range []string{"otlp_spans", "otlp_logs"} {
		if n := strings.Count(l, "level=INFO msg=\"created Kafka topic named in the configuration (exporter.kafka.create_topics)\" component=exporter/kafka topic="+tp+" partitions=3"); n != 1 {
			t.Errorf("%d INFO lines for %s; log:\n%s", n, tp, l)
		}
	}
	if strings.Contains(l, "topic=exists") || strings.Contains(l, "WARN") {
		t.Errorf("log speaks of the existing topic or warns:\n%s", l)
	}
	if err, _ := send(t, e, []record.Record{{Topic: "otlp_spans", Value: []byte("v")}}); err != nil {
		t.Fatalf("record to the created topic: %v", err)
	}
}

// A broker that refuses creation (no CREATE right, a policy): one WARN per
// topic with the broker's reason, counted as an error; nothing created,
// and no retry loop until Kafka is reached again.
func TestCreationRefusedIsWarnedWithTheReason(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var asked atomic.Int32
	c.ControlKey(kmsg.CreateTopics.Int16(), func(r kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		asked.Add(1)
		req := r.(*kmsg.CreateTopicsRequest)
		resp := req.ResponseKind().(*kmsg.CreateTopicsResponse)
		for _, rt := range req.Topics {
			st := kmsg.NewCreateTopicsResponseTopic()
			st.Topic = rt.Topic
			st.ErrorCode = kerr.TopicAuthorizationFailed.Code
			st.ErrorMessage = kmsg.StringPtr("Authorization failed.")
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	e, logs := creating(t, c.ListenAddrs(), CreateTopics{Enabled: true, Partitions: -1, ReplicationFactor: -1}, "otlp_spans")
	eventually(t, "creation refused", func() bool {
		return testutil.ToFloat64(e.m.brokerErr.WithLabelValues("create_topic")) == 1
	})
	l := logs.String()
	if !strings.Contains(l, "level=WARN") || !strings.Contains(l, "topic=otlp_spans") ||
		!strings.Contains(l, "TOPIC_AUTHORIZATION_FAILED") || !strings.Contains(l, "Authorization failed.") ||
		!strings.Contains(l, "kafka-topics.sh --create --topic otlp_spans") {
		t.Fatalf("no WARN with the broker's reason and what to do:\n%s", l)
	}
	time.Sleep(300 * time.Millisecond) // a few probe intervals
	if n := asked.Load(); n != 1 || testutil.ToFloat64(e.m.created) != 0 {
		t.Fatalf("%d creation requests, %v created; want 1, 0", n, testutil.ToFloat64(e.m.created))
	}
	if got := partitionsOf(t, e, "otlp_spans"); got["otlp_spans"] != 0 {
		t.Fatalf("the refused topic exists: %v", got)
	}
}

// Kafka unreachable at start: nothing is asked until it is reached; then
// the topics are created without a restart.
func TestCreatesWhenKafkaIsReachedLater(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	e, _ := creating(t, []string{ln.Addr().String()}, CreateTopics{Enabled: true, Partitions: 2, ReplicationFactor: -1}, "otlp_metrics")
	time.Sleep(300 * time.Millisecond)
	if e.Up() {
		t.Fatal("up with no broker")
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(port))
	if err != nil {
		t.Skip("port taken meanwhile:", err)
	}
	defer c.Close()
	eventually(t, "topic created once Kafka is up", func() bool { return testutil.ToFloat64(e.m.created) == 1 })
	if got := partitionsOf(t, e, "otlp_metrics"); got["otlp_metrics"] != 2 {
		t.Fatalf("partitions: %v", got)
	}
}

// create_topics.enabled: false never sends a CreateTopics request.
func TestCreateTopicsDisabled(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var asked atomic.Int32
	c.ControlKey(kmsg.CreateTopics.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		asked.Add(1)
		return nil, nil, false
	})
	e, _ := creating(t, c.ListenAddrs(), CreateTopics{Enabled: false, Partitions: -1, ReplicationFactor: -1}, "otlp_spans")
	eventually(t, "kafka reached", e.Up)
	time.Sleep(300 * time.Millisecond)
	if asked.Load() != 0 || partitionsOf(t, e, "otlp_spans")["otlp_spans"] != 0 {
		t.Fatal("created a topic with create_topics off")
	}
}

func TestCreateTopicsValidation(t *testing.T) {
	for _, c := range []struct {
		ct CreateTopics
		ok bool
	}{
		{CreateTopics{Partitions: -1, ReplicationFactor: -1}, true},
		{CreateTopics{Partitions: 12, ReplicationFactor: 3}, true},
		{CreateTopics{Partitions: 0, ReplicationFactor: -1}, false},
		{CreateTopics{Partitions: -2, ReplicationFactor: -1}, false},
		{CreateTopics{Partitions: 1, ReplicationFactor: 0}, false},
		{CreateTopics{Partitions: 1, ReplicationFactor: 40000}, false},
	} {
		cfg := testCfg([]string{"127.0.0.1:9092"})
		cfg.CreateTopics = c.ct
		err := cfg.Validate()
		if (err == nil) != c.ok {
			t.Errorf("%+v: %v", c.ct, err)
		}
		if err != nil && !strings.Contains(err.Error(), "create_topics.") {
			t.Errorf("error does not name its key: %v", err)
		}
	}
}

// A record for a configured topic that arrives before the creator's first
// round has concluded waits for it instead of failing as unknown. The CI
// failure this guards against: on a loaded machine the topic's creation
// took longer than franz-go's four unknown-topic metadata retries (~1.5 s
// with ferry's backoff), so an OTLP SDK's first export right after start
// got 500 unknown_topic on a cluster ferry was about to create the topic on.
// Here the broker takes 4 s to answer CreateTopics. A topic the
// configuration does not name is not held meanwhile: it fails as unknown
// (no one will create it) while the other still waits.
func TestRecordWaitsForTheTopicBeingCreated(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var answered atomic.Int64 // when the broker went on to create the topic
	c.ControlKey(kmsg.CreateTopics.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.SleepControl(func() { time.Sleep(4 * time.Second) })
		answered.Store(time.Now().UnixNano())
		return nil, nil, false
	})
	e, _ := creating(t, c.ListenAddrs(), CreateTopics{Enabled: true, Partitions: 2, ReplicationFactor: -1}, "otlp_spans")
	start := time.Now()
	held := &record.Batch{Records: []record.Record{{Topic: "otlp_spans", Value: []byte("first export")}}}
	done := make(chan error, 1)
	var doneAt atomic.Int64
	held.OnDone(func(err error) { doneAt.Store(time.Now().UnixNano()); done <- err })
	if err := e.Consume(context.Background(), held); err != nil {
		t.Fatal(err)
	}
	if err, _ := send(t, e, []record.Record{{Topic: "nobody-creates-this", Value: []byte("v")}}); consumer.KindOf(err) != consumer.KindUnknownTopic {
		t.Fatalf("record for an unnamed topic: %v", err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("record for the topic being created: %v (after %v)", err, time.Since(start).Round(time.Millisecond))
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the held record never completed")
	}
	if a := answered.Load(); a == 0 || doneAt.Load() < a {
		t.Fatal("the configured topic's record completed before its topic was created")
	}
	if got := partitionsOf(t, e, "otlp_spans"); got["otlp_spans"] != 2 {
		t.Fatalf("partitions: %v", got)
	}
}

// A cluster that cannot be asked to create (the request fails: a proxy
// without the API) does not hold back records for the configured topics
// that exist: the gate opens after the first round whatever its outcome.
func TestFailedCreationRoundOpensTheGate(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "exists"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.ControlKey(kmsg.CreateTopics.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		return nil, errors.New("no CreateTopics here"), true
	})
	e, _ := creating(t, c.ListenAddrs(), CreateTopics{Enabled: true, Partitions: 1, ReplicationFactor: -1}, "exists", "missing")
	done := make(chan error, 1)
	b := &record.Batch{Records: []record.Record{{Topic: "exists", Value: []byte("v")}}}
	b.OnDone(func(err error) { done <- err })
	if err := e.Consume(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("record for the existing configured topic: %v", err)
		}
	case <-time.After(createRetry / 2):
		t.Fatal("a record for an existing configured topic is held while creation keeps failing")
	}
}

// Records held for a topic's creation when the agent stops: a spooled
// batch's records are failed one by one (OnFailure), so the spool keeps
// them for the next start; another batch's are failed and counted as
// dropped. Kafka is never reached here, so the gate never opens.
func TestHeldRecordsAtShutdown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	logs := &logBuf{}
	set := telemetry.NewSettings(telemetry.Config{Log: telemetry.LogConfig{Level: "info", Format: "text"}}, logs)
	cfg := testCfg([]string{addr})
	cfg.CreateTopics = CreateTopics{Enabled: true, Partitions: 1, ReplicationFactor: -1}
	e, err := New(cfg, set, 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	e.want = []string{"otlp_logs"}
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	var failedAt []int
	spooled := &record.Batch{Spooled: true, Records: []record.Record{{Topic: "otlp_logs", Value: []byte("a")}, {Topic: "otlp_logs", Value: []byte("b")}}}
	spooled.OnFailure = func(i int, err error) {
		if !errors.Is(err, consumer.ErrShuttingDown) {
			t.Errorf("record %d failed with %v", i, err)
		}
		failedAt = append(failedAt, i)
	}
	var spooledDone, plainDone error
	spooled.OnDone(func(err error) { spooledDone = err })
	plain := &record.Batch{Records: []record.Record{{Topic: "otlp_logs", Value: []byte("c")}}}
	plain.OnDone(func(err error) { plainDone = err })
	for _, b := range []*record.Batch{spooled, plain} {
		if err := e.Consume(context.Background(), b); err != nil {
			t.Fatal(err)
		}
	}
	if n := e.gate.records(); n != 3 {
		t.Fatalf("held %d records, want 3", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = e.Shutdown(ctx)
	if len(failedAt) != 2 || failedAt[0] != 0 || failedAt[1] != 1 || spooledDone == nil || plainDone == nil {
		t.Fatalf("spooled batch: OnFailure for %v, done %v; plain batch done %v", failedAt, spooledDone, plainDone)
	}
	if v := testutil.ToFloat64(e.m.dropped.WithLabelValues("otlp_logs", consumer.Reason(consumer.ErrShuttingDown))); v != 1 {
		t.Fatalf("dropped counter %v, want 1 (the spooled records stay in the spool)", v)
	}
	if !strings.Contains(logs.String(), "records=3") {
		t.Fatalf("no shutdown warning counting the held records:\n%s", logs.String())
	}
}

// Exactly once: while the gate is closed every spooled batch is held, not
// only those naming a configured topic — a transaction commits the spool
// position of its last batch, so a later batch for another topic must not
// commit past a held one. Batches that are not spooled are held only for
// a configured topic.
func TestGateHoldsEverySpooledBatchInExactlyOnce(t *testing.T) {
	for _, tc := range []struct {
		eo, spooled bool
		topic       string
		held        bool
	}{{true, true, "client-topic", true}, {true, false, "client-topic", false}, {true, false, "otlp_logs", true},
		{false, true, "client-topic", false}, {false, true, "otlp_logs", true}} {
		g := newGate([]string{"otlp_logs"}, tc.eo)
		b := &record.Batch{Spooled: tc.spooled, Records: []record.Record{{Topic: tc.topic}}}
		if got := g.hold(b); got != tc.held {
			t.Errorf("exactly once %v, spooled %v, topic %s: held %v, want %v", tc.eo, tc.spooled, tc.topic, got, tc.held)
		}
		g.release()
		if g.hold(b) {
			t.Errorf("held by an open gate")
		}
	}
}

// A held spooled batch the exporter cannot hand on when the gate opens is
// failed as retryable, so the spool retries it as it retries a batch
// Consume refused. Here the exactly-once instance was fenced meanwhile:
// its refusal is permanent, and passed on as such the spool would have
// dead-lettered records nothing was wrong with.
func TestHeldSpooledBatchRefusedAtOpeningIsRetried(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cfg := testCfg(c.ListenAddrs())
	cfg.CreateTopics = CreateTopics{Enabled: true, Partitions: 1, ReplicationFactor: -1}
	set := telemetry.TestSettings()
	e, err := New(cfg, set, 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.enableExactlyOnce(eoCfg(t.TempDir())); err != nil {
		t.Fatal(err)
	}
	e.want = []string{"otlp_logs"}
	var creating atomic.Bool
	c.ControlKey(kmsg.CreateTopics.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		for _, tp := range req.(*kmsg.CreateTopicsRequest).Topics {
			if tp.Topic == "otlp_logs" && creating.CompareAndSwap(false, true) {
				c.SleepControl(func() { time.Sleep(time.Second) })
			}
		}
		return nil, nil, false
	})
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer e.Shutdown(context.Background())
	b, done := spooled("otlp_logs", record.SpoolPos{Seg: 1, Off: 10}, "a", "b")
	errs := make(chan error, 2)
	b.OnFailure = func(_ int, err error) { errs <- err }
	if err := e.Consume(context.Background(), b); err != nil {
		t.Fatalf("Consume refused instead of holding: %v", err)
	}
	if e.gate.records() != 2 {
		t.Fatal("the spooled batch is not held")
	}
	why := "fenced by another agent (test)"
	e.eo.stopped.Store(&why)
	wait(t, done)
	for i := 0; i < 2; i++ {
		err := <-errs
		var re *consumer.RetryableError
		if !errors.As(err, &re) {
			t.Fatalf("record failed with %T %v, want a retryable error", err, err)
		}
	}
}
