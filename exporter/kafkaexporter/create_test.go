package kafkaexporter

import (
	"bytes"
	"context"
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
// Here the broker takes 4 s to answer CreateTopics.
func TestRecordWaitsForTheTopicBeingCreated(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.ControlKey(kmsg.CreateTopics.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.SleepControl(func() { time.Sleep(4 * time.Second) })
		return nil, nil, false
	})
	e, _ := creating(t, c.ListenAddrs(), CreateTopics{Enabled: true, Partitions: 2, ReplicationFactor: -1}, "otlp_spans")
	start := time.Now()
	err, failed := send(t, e, []record.Record{{Topic: "otlp_spans", Value: []byte("first export")}})
	if err != nil || failed != 0 {
		t.Fatalf("record for the topic being created: %v (%d failed after %v)", err, failed, time.Since(start).Round(time.Millisecond))
	}
	if got := partitionsOf(t, e, "otlp_spans"); got["otlp_spans"] != 2 {
		t.Fatalf("partitions: %v", got)
	}
	// A topic the configuration does not name is not held: it still fails
	// as unknown (no one will create it).
	if err, _ := send(t, e, []record.Record{{Topic: "nobody-creates-this", Value: []byte("v")}}); consumer.KindOf(err) != consumer.KindUnknownTopic {
		t.Fatalf("record for an unnamed topic: %v", err)
	}
}
