package compat

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
	"github.com/ferryhq/ferry/tools/otlpgen"
)

// TestJavaConsumerReadsFerrysLZ4: the lz4 batches ferry writes with its own
// compressor (package lz4frame, the default codec) are read by
// an unmodified Java consumer, Kafka's ConsoleConsumer, value for value:
// text that compresses, incompressible values across several 64 KiB blocks
// (stored blocks), long runs (long matches), and small records. The broker
// accepting them is a check too: it decompresses every batch to validate it.
func TestJavaConsumerReadsFerrysLZ4(t *testing.T) {
	broker := kafkatest.Shared(t)
	a := front(t, broker)
	topic := kafkatest.NewTopic(t, broker, "compat-lz4", 1)
	g := otlpgen.New(3)
	var values []string
	for range 200 {
		values = append(values, strings.ReplaceAll(g.Text(2000), "\n", " "))
	}
	for range 3 {
		values = append(values, g.String(150<<10))
	}
	values = append(values, strings.Repeat("a", 300<<10), "x", "short value", strings.Repeat("abc", 7))
	via, err := kgo.NewClient(kgo.SeedBrokers(a.KafkaFront), kgo.DefaultProduceTopic(topic), kgo.ProducerBatchCompression(kgo.NoCompression()))
	if err != nil {
		t.Fatal(err)
	}
	defer via.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var recs []*kgo.Record
	for _, v := range values {
		recs = append(recs, &kgo.Record{Value: []byte(v)})
	}
	if err := via.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("produce through ferry: %v", err)
	}
	// ferry wrote lz4 batches (the codec is in each record's attributes).
	for _, r := range kafkatest.Consume(t, broker, topic, len(values), time.Minute) {
		if c := r.Attrs.CompressionType(); c != 3 {
			t.Fatalf("record at offset %d is in a batch of codec %d, want lz4 (3)", r.Offset, c)
		}
	}
	out := java(t, 2*time.Minute, "", "org.apache.kafka.tools.consumer.ConsoleConsumer",
		"--bootstrap-server", broker, "--topic", topic, "--from-beginning",
		"--max-messages", fmt.Sprint(len(values)), "--timeout-ms", "60000")
	got := map[string]int{}
	for _, line := range strings.Split(out, "\n") {
		got[line]++
	}
	for i, v := range values {
		if got[v] == 0 {
			t.Fatalf("value %d (%d bytes, %.40q...) not read back by the Java consumer; it printed:\n%s", i, len(v), v, tail(out, 2000))
		}
		got[v]--
	}
	if !strings.Contains(out, fmt.Sprintf("Processed a total of %d messages", len(values))) {
		t.Fatalf("the Java consumer did not process %d messages:\n%s", len(values), tail(out, 2000))
	}
}
