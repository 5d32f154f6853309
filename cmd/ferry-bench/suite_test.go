package main

import (
	"encoding/xml"
	"io"
	"math"
	"os"
	"strings"
	"testing"
)

// TestParsePP reads Kafka's ProducerPerformance final line, and the line
// ferry-bench produce prints is the same shape.
func TestParsePP(t *testing.T) {
	kafka := "5000 records sent, 2487.562189 records/sec (0.24 MB/sec), 14.38 ms avg latency, 1020.00 ms max latency.\n" +
		"100000 records sent, 385171.4 records/sec (36.73 MB/sec), 83.63 ms avg latency, 412.00 ms max latency, 44 ms 50th, 290 ms 95th, 321 ms 99th, 390 ms 99.9th.\n"
	r, err := parsePP(kafka)
	if err != nil || r.Records != 100000 || r.RecordsSec != 385171.4 || r.MBSec != 36.73 || r.P99MS != 321 {
		t.Fatalf("%+v %v", r, err)
	}
	run := &run{o: produceOpts{recordSize: 100}}
	run.acked.Store(1000)
	out := captureStdout(t, func() { _ = run.finish() })
	r, err = parsePP(out)
	if err != nil || r.Records != 1000 {
		t.Fatalf("ferry-bench's own final line does not parse as ProducerPerformance's: %q (%v)", out, err)
	}
	if _, err := parsePP("nothing here"); err == nil {
		t.Fatal("garbage parsed")
	}
}

func TestParseCP(t *testing.T) {
	out := "start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec\n" +
		"2026-11-21 16:00:00:000, 2026-11-21 16:00:10:000, 1525.8860, 147.0167, 50000000, 4817442.2300, 9, 10370, 147.1443, 4821623.2400\n"
	l, err := parseCP(out)
	if err != nil || l.nMsg != 50e6 || l.fetchMS != 10370 || math.Abs(l.mbSec-147.0167) > 1e-9 {
		t.Fatalf("%+v %v", l, err)
	}
}

// TestBarChart: the chart is well-formed SVG with a bar per measured value
// and none for a missing one.
func TestBarChart(t *testing.T) {
	svg := barChart("t <&>", "MB/s", []string{"10 B", "100 B"}, []series{{"a", []float64{1, 2}}, {"b", []float64{3, math.NaN()}}})
	if err := xml.Unmarshal([]byte(svg), new(struct{})); err != nil {
		t.Fatalf("not XML: %v", err)
	}
	if n := strings.Count(svg, "<rect x="); n != 3+2 { // 3 bars + 2 legend swatches
		t.Fatalf("%d rects", n)
	}
	if niceStep(0.7) != 1 || niceStep(130) != 200 || niceStep(4.1e6) != 5e6 {
		t.Fatal("niceStep")
	}
}

func captureStdout(t *testing.T, fn func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stdout
	os.Stdout = w
	fn()
	os.Stdout = old
	w.Close()
	b, _ := io.ReadAll(r)
	return string(b)
}
