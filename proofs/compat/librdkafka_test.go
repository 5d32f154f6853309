package compat

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
)

// python is an interpreter with confluent-kafka (librdkafka's wheel).
func python(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	out, err := exec.Command(filepath.Join(filepath.Dir(file), "..", "..", "scripts", "confluent-kafka-python")).Output()
	if err != nil {
		t.Fatalf("scripts/confluent-kafka-python: %v", err)
	}
	return strings.TrimSpace(string(out))
}

type rdReport struct {
	Delivered  int              `json:"delivered"`
	Failed     []string         `json:"failed"`
	Left       int              `json:"left"`
	Partitions map[string]int32 `json:"partitions"`
}

func librdkafka(t *testing.T, py, bootstrap, topic string, n int, codec string) rdReport {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, py, "testdata/librdkafka_produce.py", bootstrap, topic, fmt.Sprint(n), codec).CombinedOutput()
	if err != nil {
		t.Fatalf("librdkafka producer: %v\n%s", err, tail(string(out), 3000))
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var r rdReport
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil {
		t.Fatalf("librdkafka producer output: %v\n%s", err, out)
	}
	return r
}

// TestLibrdkafka: librdkafka (confluent-kafka for Python, idempotent,
// acks=all), unmodified, bootstraps from ferry alone; in every codec every
// record reaches the cluster with its key, value and headers, and each key
// lands in the partition librdkafka's own partitioner (not Java's) picks
// when producing to the cluster directly.
func TestLibrdkafka(t *testing.T) {
	broker := kafkatest.Shared(t)
	py := python(t)
	a := front(t, broker)
	const n = 400
	total := 0
	for _, codec := range []string{"none", "gzip", "snappy", "lz4", "zstd"} {
		t.Run(codec, func(t *testing.T) {
			direct := kafkatest.NewTopic(t, broker, "compat", 7)
			want := librdkafka(t, py, broker, direct, n, codec)
			topic := kafkatest.NewTopic(t, broker, "compat", 7)
			got := librdkafka(t, py, a.KafkaFront, topic, n, codec)
			if got.Delivered != n || len(got.Failed) > 0 || got.Left != 0 {
				t.Fatalf("through ferry: %d of %d delivered, failures %v, %d left", got.Delivered, n, got.Failed, got.Left)
			}
			total += n
			for k, p := range want.Partitions {
				if got.Partitions[k] != p {
					t.Fatalf("key %q: partition %d through ferry, %d directly", k, got.Partitions[k], p)
				}
			}
			recs := kafkatest.Consume(t, broker, topic, n, time.Minute)
			if len(recs) != n {
				t.Fatalf("%d records in Kafka, want %d", len(recs), n)
			}
			for _, r := range recs {
				var i int
				fmt.Sscanf(string(r.Value), "value-%d", &i)
				if string(r.Key) != fmt.Sprintf("key-%d", i%23) || r.Partition != want.Partitions[string(r.Key)] {
					t.Fatalf("record %q: key %q partition %d", r.Value, r.Key, r.Partition)
				}
				if len(r.Headers) != 2 || string(r.Headers[0].Value) != "python" || string(r.Headers[1].Value) != fmt.Sprint(i) {
					t.Fatalf("record %q headers %v", r.Value, r.Headers)
				}
			}
		})
	}
	if v := a.Metric(`ferry_receiver_received_records_total{receiver="kafka"}`); v != float64(total) {
		t.Fatalf("ferry counted %v records on the front, want %d", v, total)
	}
}
