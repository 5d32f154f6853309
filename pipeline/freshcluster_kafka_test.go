package pipeline

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.opentelemetry.io/collector/pdata/plog/plogotlp"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"

	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
	"github.com/ferryhq/ferry/receiver/httpreceiver"
	"github.com/ferryhq/ferry/receiver/otlpreceiver"
	"github.com/ferryhq/ferry/tools/otlpgen"
)

// TestFreshClusterWorks (issue 36 item 0): a broker with
// auto.create.topics.enable=false (scripts/kafka-local) and none of the
// OTLP topics; ferry with its defaults (the topic names made unique to
// this run, create_topics.partitions set): the first OTLP exports are
// accepted without anyone creating a topic by hand, and afterwards the
// three topics exist with the configured partitions. A topic a request
// names is still not created.
func TestFreshClusterWorks(t *testing.T) {
	brokers := kafkatest.Shared(t)
	suffix := strings.ReplaceAll(time.Now().Format("150405.000000"), ".", "")
	topics := map[string]string{"traces": "fresh-spans-" + suffix, "metrics": "fresh-metrics-" + suffix, "logs": "fresh-logs-" + suffix}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	// A Metadata request of its own each time (kadm's Metadata answers
	// from the client's cache, which would still say "missing").
	describe := func() map[string]int {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		req := kmsg.NewPtrMetadataRequest()
		for _, name := range topics {
			req.Topics = append(req.Topics, kmsg.MetadataRequestTopic{Topic: kmsg.StringPtr(name)})
		}
		resp, err := req.RequestWith(ctx, cl)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]int{}
		for _, d := range resp.Topics {
			if d.ErrorCode == 0 && d.Topic != nil {
				out[*d.Topic] = len(d.Partitions)
			}
		}
		return out
	}
	if got := describe(); len(got) != 0 {
		t.Fatalf("topics exist before the agent started: %v", got)
	}
	p := startAgent(t, brokers, "receivers.otlp.traces.topic="+topics["traces"], "receivers.otlp.metrics.topic="+topics["metrics"],
		"receivers.otlp.logs.topic="+topics["logs"], "exporter.kafka.create_topics.partitions=3")
	addr := p.Receiver("otlp").(*otlpreceiver.Receiver).HTTPAddr()
	gen := otlpgen.New(7)
	spans, _ := ptraceotlp.NewExportRequestFromTraces(gen.Traces(20)).MarshalProto()
	logs, _ := plogotlp.NewExportRequestFromLogs(gen.Logs(20, 100)).MarshalProto()
	for _, c := range []struct {
		path string
		body []byte
	}{{"/v1/traces", spans}, {"/v1/logs", logs}} {
		// As an SDK would: the first export right after start.
		res, err := http.Post("http://"+addr+c.path, "application/x-protobuf", bytes.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != 200 {
			t.Fatalf("%s: status %d on a fresh cluster", c.path, res.StatusCode)
		}
	}
	got := describe()
	for _, name := range topics {
		if got[name] != 3 {
			t.Fatalf("after the exports: partitions %v, want 3 for each of %v", got, topics)
		}
	}
	if n := len(kafkatest.Consume(t, brokers, topics["traces"], 1, 10*time.Second)); n < 1 {
		t.Fatal("no trace record in Kafka")
	}
	// A name a request chooses (the messages API) is not created.
	a, err := send(http.DefaultClient, "http://"+p.Receiver("http").(*httpreceiver.Receiver).Addr()+"/v1/messages/fresh-client-"+suffix, []byte("{}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if a.code != 404 || !strings.Contains(a.body["error"].(string), "kafka-topics.sh --create --topic fresh-client-"+suffix) {
		t.Fatalf("client-named topic: %d %v", a.code, a.body)
	}
}
