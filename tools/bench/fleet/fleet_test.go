package fleet

import (
	"strings"
	"testing"
	"time"
)

func TestParseSumsTheSeriesThatSizeAFleet(t *testing.T) {
	text := `# HELP ferry_exporter_kafka_requests_total Requests
ferry_exporter_kafka_requests_total{api="Produce",exporter="kafka"} 120
ferry_exporter_kafka_requests_total{api="Metadata",exporter="kafka"} 4
ferry_exporter_kafka_requests_total{api="ApiVersions",exporter="kafka"} 7
ferry_exporter_kafka_batch_records_sum{exporter="kafka"} 3000
ferry_exporter_kafka_batch_records_count{exporter="kafka"} 150
ferry_exporter_kafka_batch_compressed_bytes_sum{exporter="kafka"} 90000
ferry_exporter_sent_records_total{exporter="kafka",topic="a"} 1000
ferry_exporter_sent_records_total{exporter="kafka",topic="b"} 2000
ferry_exporter_kafka_connections{exporter="kafka"} 7
`
	var s snapshot
	s.parse(strings.NewReader(text))
	want := snapshot{produce: 120, metadata: 4, sent: 3000, batches: 150, batchRecords: 3000, batchBytes: 90000, conns: 7}
	if s != want {
		t.Fatalf("parsed %+v, want %+v", s, want)
	}
	d := want.minus(snapshot{produce: 20, sent: 1000, batches: 50, batchRecords: 1000})
	if d.produce != 100 || d.sent != 2000 || d.batches != 100 || d.batchRecords != 2000 {
		t.Fatalf("difference %+v", d)
	}
}

func TestMarkdownSaysHowToReproduce(t *testing.T) {
	c := Config{Agents: []int{1, 4}, Lingers: []Linger{{Cap: 5 * time.Millisecond}, {Adaptive: true}}, Rate: 1000, Size: 200, Batch: 10,
		Duration: time.Second, Warmup: time.Second, ClusterWarmup: 90 * time.Second, Partitions: 12, Nodes: 3}
	md := Markdown(c, Report{Machine: "2 cores", IdleBrokerCPU: 12,
		Rows: []Row{{Agents: 1, Linger: "5ms", Delivered: 999, ProducePerSec: 50}, {Agents: 4, Linger: "5ms", ProducePerSec: 200}}})
	for _, want := range []string{"| 1 | 5ms | 999 |", "takes 12% of a core", "| 4 | 5ms |", "--agents 1,4 --lingers 5ms,adaptive --rate 1000", "--cluster-warmup 1m30s`",
		"warmed up under the same load for 1m30s, not measured"} {
		if !strings.Contains(md, want) {
			t.Fatalf("table lacks %q:\n%s", want, md)
		}
	}
}

// The --lingers spellings: a duration is fixed, adaptive the default mode,
// adaptive:D the default mode with cap D; anything else is refused.
func TestParseLinger(t *testing.T) {
	for in, want := range map[string]Linger{"50ms": {Cap: 50 * time.Millisecond}, "adaptive": {Adaptive: true},
		" adaptive:50ms": {Adaptive: true, Cap: 50 * time.Millisecond}} {
		got, err := ParseLinger(in)
		if err != nil || got != want {
			t.Fatalf("ParseLinger(%q) = %+v, %v; want %+v", in, got, err, want)
		}
		if back, _ := ParseLinger(got.String()); back != got {
			t.Fatalf("%q does not read back: %+v", got.String(), back)
		}
	}
	for _, bad := range []string{"adaptive50ms", "adaptive:", "adaptive:0s", "fast", "-1s"} {
		if _, err := ParseLinger(bad); err == nil {
			t.Fatalf("ParseLinger(%q) accepted", bad)
		}
	}
}
