package report

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/ferryhq/ferry/tools/bench/load"
)

// TableCmd prints the demo's result table from the JSON reports of produce
// (through ferry and direct) and consume, and fails if the consumed count
// does not account for every acknowledged record.
func TableCmd(args []string) error {
	fs := flag.NewFlagSet("table", flag.ContinueOnError)
	via := fs.String("via", "", "produce --report-json through ferry")
	direct := fs.String("direct", "", "produce --report-json straight to Kafka")
	consumed := fs.String("consumed", "", "consume --report-json of the ferry topic")
	cpu := fs.Float64("agent-cpu", 0, "ferry's CPU % during the run (100 = one core)")
	rss := fs.Int64("agent-rss-kb", 0, "ferry's peak RSS in KiB")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var v, d load.Result
	var c load.ConsumeResult
	for _, f := range []struct {
		path string
		into any
	}{{*via, &v}, {*direct, &d}, {*consumed, &c}} {
		b, err := os.ReadFile(f.path)
		if err != nil {
			return err
		}
		if err := json.Unmarshal(b, f.into); err != nil {
			return fmt.Errorf("%s: %w", f.path, err)
		}
	}
	row := func(cols ...string) { fmt.Println("| " + strings.Join(cols, " | ") + " |") }
	row("path", "records acked", "failed", "records/s", "MB/s", "avg ms", "p50 ms", "p99 ms", "max ms")
	row("---", "---:", "---:", "---:", "---:", "---:", "---:", "---:", "---:")
	for _, r := range []struct {
		name string
		r    load.Result
	}{{"HTTP → ferry → Kafka", v}, {"franz-go → Kafka (direct)", d}} {
		row(r.name, fmt.Sprint(r.r.Records), fmt.Sprint(r.r.Failed), fmt.Sprintf("%.0f", r.r.RecordsSec), fmt.Sprintf("%.1f", r.r.MBSec),
			fmt.Sprintf("%.1f", r.r.AvgMS), fmt.Sprintf("%.1f", r.r.P50MS), fmt.Sprintf("%.1f", r.r.P99MS), fmt.Sprintf("%.1f", r.r.MaxMS))
	}
	fmt.Println()
	ratio := 0.0
	if d.RecordsSec > 0 {
		ratio = v.RecordsSec / d.RecordsSec
	}
	fmt.Printf("through ferry / direct:       %.2f×\n", ratio)
	fmt.Printf("through ferry / pan (%s/s):  %.0f×\n", load.Human(Ref.Pan.PerSecBySize[10]), v.RecordsSec/Ref.Pan.PerSecBySize[10])
	if *cpu > 0 {
		fmt.Printf("ferry CPU during the run:     %.0f%% of one core (%.0f records/s per ferry core)\n", *cpu, v.RecordsSec/(*cpu/100))
	}
	if *rss > 0 {
		fmt.Printf("ferry peak RSS:               %.0f MiB\n", float64(*rss)/1024)
	}
	fmt.Printf("consumed back from Kafka:     %d records (acknowledged %d, answered with an error %d)\n", c.Records, v.Records, v.Failed)
	switch {
	case c.Records < v.Records:
		return fmt.Errorf("VERIFY FAILED: %d acknowledged records are missing from Kafka", v.Records-c.Records)
	case c.Records > v.Records+v.Failed:
		return fmt.Errorf("VERIFY FAILED: %d more records in Kafka than were sent", c.Records-v.Records-v.Failed)
	}
	fmt.Println("verified:                     every acknowledged record is in Kafka")
	return nil
}
