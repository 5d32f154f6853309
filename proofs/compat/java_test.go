package compat

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
)

// kafkaClasspath is the classpath of the Maven jars the local broker runs
// from: Kafka's own Java clients and tools, unmodified.
func kafkaClasspath(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	out, err := exec.Command(filepath.Join(filepath.Dir(file), "..", "..", "scripts", "kafka-local"), "classpath").Output()
	if err != nil {
		t.Fatalf("kafka-local classpath: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1]
}

// java runs a Kafka tool's main class with input on stdin.
func java(t *testing.T, timeout time.Duration, stdin string, class string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "java", append([]string{"-Xmx256m", "-cp", kafkaClasspath(t), class}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", class, err, tail(string(out), 4000))
	}
	return string(out)
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// TestJavaConsoleProducer: Kafka's console producer (the Java client,
// idempotent and acks=all by default) bootstraps from ferry alone; keys,
// values and headers reach the cluster, each key in the partition the
// Java partitioner (murmur2) picks, which franz-go's StickyKeyPartitioner
// reproduces when producing directly.
func TestJavaConsoleProducer(t *testing.T) {
	broker := kafkatest.Shared(t)
	a := front(t, broker)
	topic := kafkatest.NewTopic(t, broker, "compat", 5)
	const n = 300
	var in strings.Builder
	for i := range n {
		fmt.Fprintf(&in, "app:console,seq:%d\tkey-%d\tvalue-%d\n", i, i%23, i)
	}
	java(t, 2*time.Minute, in.String(), "org.apache.kafka.tools.ConsoleProducer",
		"--bootstrap-server", a.KafkaFront, "--topic", topic, "--compression-codec", "lz4",
		"--property", "parse.key=true", "--property", "parse.headers=true",
		"--command-property", "acks=all", "--command-property", "linger.ms=5")
	want := directPartitions(t, broker, 5, "key-%d", 23)
	got := kafkatest.Consume(t, broker, topic, n, time.Minute)
	if len(got) != n {
		t.Fatalf("%d records in Kafka, want %d", len(got), n)
	}
	for _, r := range got {
		var i int
		fmt.Sscanf(string(r.Value), "value-%d", &i)
		if string(r.Key) != fmt.Sprintf("key-%d", i%23) {
			t.Fatalf("record %q has key %q", r.Value, r.Key)
		}
		if r.Partition != want[string(r.Key)] {
			t.Fatalf("key %q in partition %d through ferry, %d directly", r.Key, r.Partition, want[string(r.Key)])
		}
		if len(r.Headers) != 2 || r.Headers[0].Key != "app" || string(r.Headers[0].Value) != "console" ||
			r.Headers[1].Key != "seq" || string(r.Headers[1].Value) != fmt.Sprint(i) {
			t.Fatalf("record %q headers %v", r.Value, r.Headers)
		}
	}
	if v := a.Metric(`ferry_receiver_received_records_total{receiver="kafka"}`); v != n {
		t.Fatalf("ferry counted %v records on the front, want %d", v, n)
	}
}

// directPartitions is where franz-go's Java-compatible partitioner puts
// each of keys format%d (i < keys) in a topic of n partitions.
func directPartitions(t *testing.T, broker string, n int, format string, keys int) map[string]int32 {
	t.Helper()
	topic := kafkatest.NewTopic(t, broker, "compat", n)
	cl, err := kgo.NewClient(kgo.SeedBrokers(broker), kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	want := map[string]int32{}
	for i := range keys {
		r := &kgo.Record{Key: []byte(fmt.Sprintf(format, i))}
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
		want[string(r.Key)] = r.Partition
	}
	return want
}

var perfLine = regexp.MustCompile(`(\d+) records sent, ([\d.]+) records/sec`)

// TestJavaProducerPerformance: Kafka's own load tool, unmodified, through
// ferry: every record it counts as sent is in the cluster.
func TestJavaProducerPerformance(t *testing.T) {
	broker := kafkatest.Shared(t)
	a := front(t, broker)
	topic := kafkatest.NewTopic(t, broker, "compat", 3)
	const n = 20000
	out := java(t, 3*time.Minute, "", "org.apache.kafka.tools.ProducerPerformance",
		"--topic", topic, "--num-records", fmt.Sprint(n), "--record-size", "200", "--throughput", "-1",
		// One flag, several values (argparse nargs "+").
		"--command-property", "bootstrap.servers="+a.KafkaFront, "acks=all", "compression.type=zstd", "linger.ms=5")
	m := perfLine.FindAllStringSubmatch(out, -1)
	if len(m) == 0 || m[len(m)-1][1] != fmt.Sprint(n) {
		t.Fatalf("ProducerPerformance did not report %d records sent:\n%s", n, tail(out, 3000))
	}
	if got := kafkatest.Consume(t, broker, topic, n, time.Minute); len(got) != n {
		t.Fatalf("%d records in Kafka, want %d", len(got), n)
	}
	if v := a.Metric(`ferry_receiver_received_records_total{receiver="kafka"}`); v != n {
		t.Fatalf("ferry counted %v records on the front, want %d", v, n)
	}
}
