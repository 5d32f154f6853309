package suite

import (
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/tools/bench/load"
	"github.com/ferryhq/ferry/tools/bench/report"
)

// The other doors (issue 34): Zipkin beside the Collector's zipkin
// receiver, Prometheus remote write beside the same samples sent as OTLP
// (the Collector's prometheusremotewrite receiver's module is not served
// by the proxy this project builds from), and span metrics' cost per span.
// Rows are measured as section 5's (collectorRow): the same load tool, the
// same broker, read back from Kafka.

const (
	doorsBegin = "<!-- doors:begin -->"
	doorsEnd   = "<!-- doors:end -->"
)

// doorCase is one table of the section: the systems that take turns on
// the same load.
type doorCase struct {
	what    string // the table's first column
	signal  string
	count   int // spans or samples per request
	rate    int // items/s at the fixed rate
	systems []doorSystem
}

type doorSystem struct {
	colSystem
	format string
	base   bool // the row the others are compared with
}

const (
	doorFerryZipkin   = "ferry, zipkin door"
	doorFerryRW       = "ferry, prometheus_remote_write door"
	doorFerryRWOTLP   = "ferry, the same samples over OTLP/HTTP"
	doorColRWOTLP     = "OpenTelemetry Collector v0.155.0, the same samples over OTLP/HTTP"
	doorColZipkin     = "OpenTelemetry Collector v0.155.0, zipkin receiver"
	doorFerrySpans    = "ferry, OTLP/HTTP traces"
	doorFerrySpansRED = "ferry, OTLP/HTTP traces + span_metrics"
)

func (s *suite) doorCases() []doorCase {
	ferry := func(name string, sets ...string) colSystem {
		return colSystem{name: name, sets: append([]string{}, sets...)}
	}
	doors := "receivers.otlp.doors=[zipkin,prometheus_remote_write]"
	rates := map[string]int{"zipkin": 20000, "rw": 100000, "spans": 150000} // spans: section 5's fixed rate
	if s.quick {
		rates = map[string]int{"zipkin": 5000, "rw": 20000, "spans": 30000}
	}
	return []doorCase{
		{what: "Zipkin v2 JSON, 100 spans a request", signal: "traces", count: 100, rate: rates["zipkin"], systems: []doorSystem{
			{colSystem{name: doorColZipkin}, load.FormatZipkin, true},
			{ferry(doorFerryZipkin, doors), load.FormatZipkin, false},
		}},
		{what: "Prometheus remote write 1.0, 500 samples a request", signal: "metrics", count: 500, rate: rates["rw"], systems: []doorSystem{
			{colSystem{name: doorColRWOTLP}, load.FormatRemoteWriteOTLP, true},
			{ferry(doorFerryRWOTLP, doors), load.FormatRemoteWriteOTLP, false},
			{ferry(doorFerryRW, doors), load.FormatRemoteWrite, false},
		}},
		{what: "OTLP spans, 100 a request: span metrics' cost", signal: "traces", count: 100, rate: rates["spans"], systems: []doorSystem{
			{ferry(doorFerrySpans), "", true},
			{ferry(doorFerrySpansRED, "processors.span_metrics.enabled=true"), "", false},
		}},
	}
}

type doorRow struct {
	colRow
	what string
	base bool
}

// doorsBench runs every case: a closed loop (one run each) and the fixed
// rate (three runs each, agents taking turns, the median by CPU per item).
func (s *suite) doorsBench() ([]doorRow, error) {
	s.stepf("the other doors: Zipkin beside the Collector's zipkin receiver, remote write beside the same samples over OTLP, span metrics' cost")
	bin, err := s.exec("scripts/otelcol-local", "build")
	if err != nil {
		return nil, err
	}
	bin = strings.TrimSpace(bin)
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.brokers))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	d := 10 * time.Second
	reps := 3
	if s.quick {
		d, reps = 2*time.Second, 1
	}
	var rows []doorRow
	for _, c := range s.doorCases() {
		for _, fixed := range []bool{false, true} {
			n := 1
			if fixed {
				n = reps
			}
			runs := make([][]colRow, len(c.systems))
			for rep := 0; rep < n; rep++ {
				for i, sys := range c.systems {
					row := colRow{signal: c.signal, protocol: "http", system: sys.name, count: c.count, format: sys.format}
					if fixed {
						row.rate = c.rate
					}
					r, err := s.collectorRow(adm, bin, row, sys.colSystem, d, false)
					if err != nil {
						return nil, err
					}
					runs[i] = append(runs[i], r)
				}
			}
			for i, rs := range runs {
				rows = append(rows, doorRow{medianRun(rs), c.what, c.systems[i].base})
			}
		}
	}
	return rows, nil
}

// doorBase is the base row of r's case and load.
func doorBase(rows []doorRow, r doorRow) (doorRow, bool) {
	for _, b := range rows {
		if b.base && b.what == r.what && b.rate == r.rate {
			return b, true
		}
	}
	return doorRow{}, false
}

func (s *suite) writeDoors(rows []doorRow) {
	s.doc.P("%s", doorsBegin)
	s.doc.H("11. The other doors: Zipkin, Prometheus remote write, span metrics (issue 34)")
	s.doc.P("The same method as section 5 (`ferry-bench otlp --format …`, requests marshalled once and resent, at most 64 in flight,")
	s.doc.P("a fresh 3-partition topic, the topic read back and its spans or data points counted): **closed loop** (one run) and a **fixed")
	s.doc.P("rate** (three runs each, agents taking turns, the median by CPU per item). **Zipkin**: the spans of section 5's traces rows,")
	s.doc.P("as Zipkin v2 JSON (converted by the Collector's own translator) POSTed to `/api/v2/spans` of ferry's zipkin door (on its")
	s.doc.P("OTLP/HTTP listener) and of the Collector's zipkin receiver (v0.155.0 → batch → kafka, section 5's settings). **Remote write**:")
	s.doc.P("what a Prometheus server sends (remote write 1.0, snappy, 500 series of one sample, 8 labels each) to ferry's door, beside the")
	s.doc.P("same samples as the OTLP metrics request the door makes of them, sent over OTLP/HTTP to ferry and to the Collector (its")
	s.doc.P("`prometheusremotewrite` receiver's module is not served by the Go module proxy this project builds from, so it is not built).")
	s.doc.P("An item is a span or a sample (a data point in Kafka). **Span metrics**: OTLP traces into ferry without and with")
	s.doc.P("`processors.span_metrics` (its defaults), same load: issue 34's goal is ≤ 10 %% more CPU per span.")
	s.doc.P("")
	var out [][]string
	for _, r := range rows {
		vs := "–"
		if b, ok := doorBase(rows, r); ok && b.system != r.system {
			vs = report.Ratio(r.usPerItem(), b.usPerItem()) + " CPU, " + report.Ratio(r.itemsPerSec(), b.itemsPerSec()) + " items/s"
		}
		out = append(out, []string{r.what, r.load(), r.system, report.F0(r.itemsPerSec()), fmt.Sprintf("%.0f%%", r.cpuSec/max(r.seconds, 1e-9)*100),
			usPerItem(r.colRow), vs, fmt.Sprintf("%.0f MiB", r.rssMiB), report.F1(r.p50), report.F1(r.p99),
			report.Commas(r.accepted), report.Commas(r.delivered), lostCell(r.colRow)})
	}
	s.doc.Table([]string{"case", "load", "agent", "items/s into Kafka", "agent CPU", "CPU µs per item (median; range)", "vs the first row",
		"peak RSS", "p50 ms", "p99 ms", "items acknowledged", "items in Kafka", "lost"}, out)
	s.doc.P("Reproduce: `bin/ferry-bench suite --only doors` (this section alone, rewritten in place in BENCHMARKS.md); one row by hand:")
	s.doc.P("`bin/ferry run --set 'receivers.otlp.doors=[zipkin]'`, then `bin/ferry-bench otlp --format zipkin --signal traces --count 100")
	s.doc.P("--target http://127.0.0.1:4318 --duration 10s --requests 1000000000 --concurrency 64` and `bin/ferry-bench consume --topic otlp_spans --otlp-items`.")
	s.doc.P("%s", doorsEnd)
}

// doorsSummary: the summary's lines, each door's CPU per item at the
// fixed rate against its base.
func doorsSummary(rows []doorRow) [][]string {
	var out [][]string
	for _, r := range rows {
		if r.base || r.rate == 0 {
			continue
		}
		b, ok := doorBase(rows, r)
		if !ok {
			continue
		}
		goal := ""
		switch r.system {
		case doorFerryZipkin:
			goal = " (issue 34: spans/s beside the Collector's zipkin receiver)"
		case doorFerrySpansRED:
			goal = " (issue 34: ≤ 1.10×)"
		}
		out = append(out, []string{fmt.Sprintf("%s: %s vs %s%s", r.what, r.system, b.system, goal), "–",
			fmt.Sprintf("%.2f µs vs %.2f µs CPU per item at %s items/s", r.usPerItem(), b.usPerItem(), report.Commas(int64(r.rate))),
			report.Ratio(r.usPerItem(), b.usPerItem())})
	}
	return out
}

// runDoors is --only doors: this section alone, rewritten in place.
func (s *suite) runDoors() error {
	stop, err := s.startKafka()
	defer stop()
	if err != nil {
		return err
	}
	rows, err := s.doorsBench()
	if err != nil {
		return err
	}
	s.stepf("rewriting the doors section of %s", s.doc.Out)
	s.writeDoors(rows)
	return replaceSection(s.doc.Out, doorsBegin, doorsEnd, s.doc.String())
}
