package suite

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/ferryhq/ferry/tools/bench/load"
	"github.com/ferryhq/ferry/tools/bench/report"
)

// frontRow is Kafka's ProducerPerformance, unmodified, straight to Kafka
// and with ferry's Kafka front as its only bootstrap server.
type frontRow struct {
	size          int
	n             int64
	direct, front load.Result
	use           agentUsage
	// rate > 0: runs at this fixed rate (records/s), where neither path is
	// saturated, so the latencies compare the paths and not the producer's
	// queue (at full speed a record waits in the producer's buffer behind
	// whatever the slower path has not taken yet): direct, through ferry
	// as shipped, and through ferry with Go's own monitor behaviour
	// (runtime.monitor_deep_sleep: true), taking turns, fixedReps times
	// each, so the default's effect on tails is measured, not assumed.
	rate                             int64
	directRate, frontRate, goMonRate []load.Result
}

// fixedReps is how many times each path runs at the fixed rate: tails on
// a shared machine move by several times from one run to the next.
const fixedReps = 3

// frontGoMonitor is the setting of the front's third fixed-rate path.
const frontGoMonitor = "runtime.monitor_deep_sleep=true"

// frontAddr is the Kafka front's listener in the bench agent.
const frontAddr = "127.0.0.1:19192"

// kafkaFront runs ProducerPerformance direct, then through the front, at
// each size, in the same run against the same broker.
func (s *suite) kafkaFront() ([]frontRow, error) {
	sizes := []int{100, 1000}
	s.stepf("the Kafka front: ProducerPerformance → Kafka, and ProducerPerformance → ferry's front → Kafka, at %v B", sizes)
	frontSets := []string{"receivers.kafka.enabled=true", "receivers.kafka.listen=" + frontAddr}
	a, err := s.agent(frontSets...)
	if err != nil {
		return nil, err
	}
	defer a.stop()
	pp := func(topic, bootstrap string, size int, n, rate int64) (load.Result, error) {
		out, err := s.java("org.apache.kafka.tools.ProducerPerformance", append([]string{"--topic", topic, "--num-records", strconv.FormatInt(n, 10),
			"--record-size", strconv.Itoa(size), "--throughput", strconv.FormatInt(rate, 10), "--producer-props", "bootstrap.servers=" + bootstrap}, ppProps...)...)
		if err != nil {
			return load.Result{}, err
		}
		return parsePP(out)
	}
	var rows []frontRow
	var fixedTopics [2]string // direct, via: the 1 KB topics, kept for the fixed-rate runs
	for _, size := range sizes {
		row := frontRow{size: size, n: s.records(size) / 2}
		s.logf("%d B × %d records: ProducerPerformance → Kafka", size, row.n)
		t1, err := s.topic(fmt.Sprintf("front-direct-%d", size), 3)
		if err != nil {
			return nil, err
		}
		if row.direct, err = pp(t1, s.brokers, size, row.n, -1); err != nil {
			return nil, err
		}
		s.logf("%d B × %d records: ProducerPerformance → ferry's Kafka front (%s) → Kafka", size, row.n, frontAddr)
		t2, err := s.topic(fmt.Sprintf("front-via-%d", size), 3)
		if err != nil {
			return nil, err
		}
		row.use, err = a.measure(func() error {
			row.front, err = pp(t2, frontAddr, size, row.n, -1)
			return err
		})
		if err != nil {
			return nil, err
		}
		s.logf("%d B: %s rec/s direct, %s through the front (%s; ferry %.0f%% CPU)", size, report.F0(row.direct.RecordsSec),
			report.F0(row.front.RecordsSec), report.Ratio(row.front.RecordsSec, row.direct.RecordsSec), row.use.cpu)
		if size == 1000 {
			// Half of what the direct path reached, rounded down to a
			// thousand: both paths sustain it.
			row.rate = max(1000, int64(row.direct.RecordsSec/2)/1000*1000)
			fixedTopics = [2]string{t1, t2}
		} else {
			s.deleteTopic(t1)
			s.deleteTopic(t2)
		}
		rows = append(rows, row)
	}
	a.stop() // the fixed-rate runs start their own agents on the same listener
	for i := range rows {
		if rows[i].rate == 0 {
			continue
		}
		if err := s.frontFixedRate(&rows[i], fixedTopics, frontSets, pp); err != nil {
			return nil, err
		}
	}
	if fixedTopics[0] != "" {
		s.deleteTopic(fixedTopics[0])
		s.deleteTopic(fixedTopics[1])
	}
	return rows, nil
}

// frontFixedRate runs row's fixed rate: direct, through an agent as
// shipped, and through one with Go's own monitor behaviour, in turn,
// fixedReps times; each agent is started for its run alone, as the two
// share the front's listener.
func (s *suite) frontFixedRate(row *frontRow, topics [2]string, sets []string, pp func(topic, bootstrap string, size int, n, rate int64) (load.Result, error)) error {
	n := row.rate * 8
	reps := fixedReps
	if s.quick {
		n, reps = row.rate, 1
	}
	via := func(extra ...string) (load.Result, error) {
		a, err := s.agent(append(slices.Clone(sets), extra...)...)
		if err != nil {
			return load.Result{}, err
		}
		defer a.stop()
		return pp(topics[1], frontAddr, row.size, n, row.rate)
	}
	for rep := 1; rep <= reps; rep++ {
		s.logf("%d B at %s rec/s, run %d of %d: ProducerPerformance → Kafka; → ferry's Kafka front → Kafka; the same with %s",
			row.size, report.Commas(row.rate), rep, reps, frontGoMonitor)
		d, err := pp(topics[0], s.brokers, row.size, n, row.rate)
		if err != nil {
			return err
		}
		f, err := via()
		if err != nil {
			return err
		}
		g, err := via(frontGoMonitor)
		if err != nil {
			return err
		}
		row.directRate, row.frontRate, row.goMonRate = append(row.directRate, d), append(row.frontRate, f), append(row.goMonRate, g)
		s.logf("p50/p99 ms: direct %.0f/%.0f, through the front %.0f/%.0f, with Go's own monitor %.0f/%.0f",
			d.P50MS, d.P99MS, f.P50MS, f.P99MS, g.P50MS, g.P99MS)
	}
	return nil
}

// latencies is a path's runs at the fixed rate as median p50, median p99
// (with the lowest and highest) and median p99.9.
func latencies(runs []load.Result) (p50, p99, p999 string) {
	med := func(f func(load.Result) float64) (m, lo, hi float64) {
		v := make([]float64, len(runs))
		for i, r := range runs {
			v[i] = f(r)
		}
		slices.Sort(v)
		return v[len(v)/2], v[0], v[len(v)-1]
	}
	m50, _, _ := med(func(r load.Result) float64 { return r.P50MS })
	m99, lo, hi := med(func(r load.Result) float64 { return r.P99MS })
	m999, _, _ := med(func(r load.Result) float64 { return r.P999MS })
	p99 = fmt.Sprintf("%.0f", m99)
	if len(runs) > 1 {
		p99 += fmt.Sprintf(" (%.0f–%.0f)", lo, hi)
	}
	return fmt.Sprintf("%.0f", m50), p99, fmt.Sprintf("%.0f", m999)
}

func (s *suite) writeFront(rows []frontRow) {
	s.doc.H("9. The Kafka front: Kafka's own producer through ferry (issue 16)")
	s.doc.P("Kafka's ProducerPerformance, unmodified, once with the broker as `bootstrap.servers` and once with ferry's Kafka front (`receivers.kafka`) as its only bootstrap server; same settings, same broker, same run. Through the front, each produce request is answered after Kafka acknowledged its records (ferry's default delivery mode), with Kafka's offsets. Goal: ≥ 0.7× direct.")
	s.doc.P("")
	var out [][]string
	for _, r := range rows {
		out = append(out, []string{fmt.Sprintf("%d B", r.size), report.Commas(r.n),
			report.F0(r.direct.RecordsSec), report.F1(r.direct.MBSec), report.F0(r.front.RecordsSec), report.F1(r.front.MBSec),
			"**" + report.Ratio(r.front.RecordsSec, r.direct.RecordsSec) + "**",
			fmt.Sprintf("%.0f / %.0f", r.direct.P99MS, r.front.P99MS), report.F0(r.use.cpu) + "%", report.F0(r.use.rssMiB) + " MiB"})
	}
	s.doc.Table([]string{"record", "records", "direct rec/s", "MB/s", "via front rec/s", "MB/s", "front/direct", "p99 ms (direct/front)", "ferry CPU", "ferry peak RSS"}, out)
	s.doc.P("At full speed a record's latency is mostly its wait in the producer's own buffer (`buffer.memory`, 32 MiB), which fills behind the slower path; so the p99 above measures the queue, not the path. At a fixed rate all paths sustain, the same producer, direct, through ferry as shipped, and through ferry with Go's own monitor behaviour (`%s`; section 5 has what the default saves), taking turns; medians of the runs, with the p99 range:", frontGoMonitor)
	s.doc.P("")
	out = nil
	for _, r := range rows {
		if r.rate == 0 || len(r.directRate) == 0 {
			continue
		}
		for _, p := range []struct {
			name string
			runs []load.Result
		}{{"direct to Kafka", r.directRate}, {"through the front, ferry as shipped", r.frontRate}, {"through the front, " + frontGoMonitor, r.goMonRate}} {
			p50, p99, p999 := latencies(p.runs)
			out = append(out, []string{fmt.Sprintf("%d B", r.size), report.Commas(r.rate), p.name, strconv.Itoa(len(p.runs)), p50, p99, p999})
		}
	}
	s.doc.Table([]string{"record", "rec/s (--throughput)", "path", "runs", "p50 ms", "p99 ms (range)", "p99.9 ms"}, out)
	s.doc.P("Through the front a request also waits for ferry's own batch (the adaptive `exporter.kafka.linger`: none while Kafka is idle, at most 50 ms, reached only while Kafka queues) and a second hop.")
	s.doc.P("")
	s.doc.P("- `java -cp $(scripts/kafka-local classpath) org.apache.kafka.tools.ProducerPerformance --topic T --num-records N --record-size B --throughput -1 --producer-props bootstrap.servers=<broker | 127.0.0.1:9192> %s`, with `receivers.kafka.enabled: true`.", strings.Join(ppProps, " "))
	s.doc.P("")
}

// frontSummary is the summary table's line for the front.
func frontSummary(rows []frontRow) []string {
	for _, r := range rows {
		if r.size == 1000 {
			return []string{"Kafka front (issue 16): ProducerPerformance through ferry vs direct, 1 KB", "≥ 0.7× direct",
				report.F0(r.front.RecordsSec) + " vs " + report.F0(r.direct.RecordsSec) + " rec/s", report.Ratio(r.front.RecordsSec, r.direct.RecordsSec)}
		}
	}
	return nil
}
