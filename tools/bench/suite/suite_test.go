package suite

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/tools/bench/load"
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
	out := load.FinalLine(load.Result{Records: 1000, RecordsSec: 500, MBSec: 0.05, AvgMS: 1.5, MaxMS: 9, P50MS: 1, P95MS: 3, P99MS: 5, P999MS: 8})
	r, err = parsePP(out)
	if err != nil || r.Records != 1000 {
		t.Fatalf("ferry-bench's own final line does not parse as ProducerPerformance's: %q (%v)", out, err)
	}
	if _, err := parsePP("nothing here"); err == nil {
		t.Fatal("garbage parsed")
	}
}

func TestParseCP(t *testing.T) {
	out := "start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.NMsg, nMsg.sec, rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.NMsg.sec\n" +
		"2026-11-21 16:00:00:000, 2026-11-21 16:00:10:000, 1525.8860, 147.0167, 50000000, 4817442.2300, 9, 10370, 147.1443, 4821623.2400\n"
	l, err := parseCP(out)
	if err != nil || l.NMsg != 50e6 || l.FetchMS != 10370 || math.Abs(l.MBSec-147.0167) > 1e-9 {
		t.Fatalf("%+v %v", l, err)
	}
}

// A fixed-rate row is its agent's median run by CPU per item, shows the
// range of all runs, and does not hide an item another run lost.
func TestMedianRun(t *testing.T) {
	run := func(cpu float64, acked, delivered int64) colRow {
		return colRow{cpuSec: cpu, accepted: acked, delivered: delivered}
	}
	m := medianRun([]colRow{run(3, 1e6, 1e6), run(1, 1e6, 1e6), run(2, 1e6, 1e6-5)})
	if m.cpuSec != 2 {
		t.Fatalf("median run has %v CPU s, want the middle one (2)", m.cpuSec)
	}
	if len(m.runs) != 3 || slices.Min(m.runs) != 1 || slices.Max(m.runs) != 3 {
		t.Fatalf("runs %v, want the three runs' µs per item", m.runs)
	}
	if m.lost() != 5 || m.lostElsewhere != 0 || lostCell(m) != "5" {
		t.Fatalf("lost %d, elsewhere %d, cell %q", m.lost(), m.lostElsewhere, lostCell(m))
	}
	m = medianRun([]colRow{run(2, 1e6, 1e6), run(1, 1e6, 1e6-7), run(3, 1e6, 1e6)})
	if m.lost() != 0 || m.lostElsewhere != 7 || lostCell(m) != "0 (7 in its other runs)" {
		t.Fatalf("lost %d, elsewhere %d, cell %q; want another run's 7 shown", m.lost(), m.lostElsewhere, lostCell(m))
	}
	if got := usPerItem(m); got != "2.00 (1.00–3.00)" {
		t.Fatalf("cell %q", got)
	}
	if one := medianRun([]colRow{run(1, 10, 10)}); one.runs != nil {
		t.Fatal("a single run is shown as it is")
	}
}

// The cost curves section: a table and a chart per curve from the points
// measured, the tokens table with the verdict cache's misses; a whole run
// keeps the section from the last --only curves.
func TestWriteCurves(t *testing.T) {
	dir := t.TempDir()
	s := &suite{}
	s.doc.Out, s.doc.Charts = filepath.Join(dir, "B.md"), filepath.Join(dir, "bench")
	var pts []curvePoint
	for _, x := range []int{1, 10} {
		pts = append(pts, curvePoint{curve: "topics", door: "local socket", x: x, rate: 10000, recs: 80000, cpuSec: 0.16 * float64(x),
			window: 8 * time.Second, rssPeak: 40, rssSteady: 35, warm: 3 * time.Second})
		pts = append(pts, curvePoint{curve: "tokens", door: "HTTP", x: x, rate: 10000, recs: 80000, cpuSec: 0.4, window: 8 * time.Second, decryptions: 800})
	}
	s.writeCurves(pts)
	out := s.doc.String()
	for _, want := range []string{curvesBegin, curvesEnd, "12. Cost curves", "| topics: **10** | local socket | 10,000 | 10,000 | 20.00 | 40 / 35 | 0 | 3s |",
		"decryptions/s", "| 100 |", "curves-topics.svg", "curves-tokens.svg", "--only curves", "**Why it grows.**", "10.0× CPU per record", "**Flat.**"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
	if strings.Contains(out, "curves-keys.svg") {
		t.Error("a chart for a curve with no points")
	}
	if _, err := os.Stat(filepath.Join(dir, "bench", "curves-topics.svg")); err != nil {
		t.Fatal(err)
	}
	doc := "# x\n\n" + out + "\n## Reproduce\n"
	if err := os.WriteFile(s.doc.Out, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	if kept := keptSection(s.doc.Out, curvesBegin, curvesEnd); !strings.HasPrefix(kept, curvesBegin) || !strings.HasSuffix(kept, curvesEnd) || !strings.Contains(kept, "20.00") {
		t.Fatalf("kept section:\n%s", kept)
	}
	if keptSection(filepath.Join(dir, "none.md"), curvesBegin, curvesEnd) != "" {
		t.Fatal("a section kept from no file")
	}
}

// The producers table's ratios: the median round, its range, and direct as
// the plain mean of every direct run.
func TestProducerRoundsArithmetic(t *testing.T) {
	if got := roundsRatio([]float64{0.93, 0.81, 0.88}); got != "0.88× (0.81–0.93)" {
		t.Fatalf("roundsRatio %q", got)
	}
	if got := roundsRatio([]float64{0.9}); got != "0.90×" {
		t.Fatalf("one round %q", got)
	}
	if i := medianIndex([]float64{3, 1, 2, 4}); i != 2 {
		t.Fatalf("median index %d (lower median of 4)", i)
	}
	m := meanResults([]load.Result{{RecordsSec: 100, Records: 1, P99MS: 3, MaxMS: 9}, {RecordsSec: 200, Records: 1, P99MS: 6, MaxMS: 5}, {RecordsSec: 600, Records: 1, P99MS: 9, MaxMS: 7}})
	if m.RecordsSec != 300 || m.Records != 3 || m.P99MS != 6 || m.MaxMS != 9 {
		t.Fatalf("mean %+v", m)
	}
}

// A whole run keeps the hand-measured sections (4b, where the time goes at
// small records) where they stand, markers included, and writes nothing
// for a section the report does not have.
func TestKeepHandMeasuredSection(t *testing.T) {
	dir := t.TempDir()
	s := &suite{}
	s.doc.Out = filepath.Join(dir, "B.md")
	old := "# x\n\n<!-- adaptive:begin -->\n\n## 4b. measured by hand: 0.51×\n\n<!-- adaptive:end -->\n\n## 5. y\n"
	if err := os.WriteFile(s.doc.Out, []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}
	s.keep("adaptive")
	s.keep("small-records")
	got := s.doc.String()
	if !strings.Contains(got, "<!-- adaptive:begin -->\n\n## 4b. measured by hand: 0.51×\n\n<!-- adaptive:end -->") {
		t.Fatalf("section 4b not kept:\n%s", got)
	}
	if strings.Contains(got, "small-records") || strings.Contains(got, "## 5.") {
		t.Fatalf("more than the kept section:\n%s", got)
	}
}
