package suite

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/ferryhq/ferry/internal/bench/load"
	"github.com/ferryhq/ferry/internal/bench/report"
)

// frontRow is Kafka's ProducerPerformance, unmodified, straight to Kafka
// and with ferry's Kafka front as its only bootstrap server.
type frontRow struct {
	size          int
	n             int64
	direct, front load.Result
	use           agentUsage
	// rate > 0: a second pair at this fixed rate (records/s), where
	// neither path is saturated, so the latencies compare the paths and not
	// the producer's queue (at full speed a record waits in the producer's
	// buffer behind whatever the slower path has not taken yet).
	rate                  int64
	directRate, frontRate load.Result
}

// frontAddr is the Kafka front's listener in the bench agent.
const frontAddr = "127.0.0.1:19192"

// kafkaFront runs ProducerPerformance direct, then through the front, at
// each size, in the same run against the same broker.
func (s *suite) kafkaFront() ([]frontRow, error) {
	sizes := []int{100, 1000}
	s.stepf("the Kafka front: ProducerPerformance → Kafka, and ProducerPerformance → ferry's front → Kafka, at %v B", sizes)
	a, err := s.agent("receivers.kafka.enabled=true", "receivers.kafka.listen="+frontAddr)
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
			n := row.rate * 8
			if s.quick {
				n = row.rate
			}
			s.logf("%d B at %s rec/s: ProducerPerformance → Kafka, then → ferry's Kafka front → Kafka", size, report.Commas(row.rate))
			if row.directRate, err = pp(t1, s.brokers, size, n, row.rate); err != nil {
				return nil, err
			}
			if row.frontRate, err = pp(t2, frontAddr, size, n, row.rate); err != nil {
				return nil, err
			}
			s.logf("p50/p99 ms direct %.0f/%.0f, through the front %.0f/%.0f", row.directRate.P50MS, row.directRate.P99MS,
				row.frontRate.P50MS, row.frontRate.P99MS)
		}
		rows = append(rows, row)
		s.deleteTopic(t1)
		s.deleteTopic(t2)
	}
	return rows, nil
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
	s.doc.P("At full speed a record's latency is mostly its wait in the producer's own buffer (`buffer.memory`, 32 MiB), which fills behind the slower path; so the p99 above measures the queue, not the path. At a fixed rate both paths sustain, the same producer:")
	s.doc.P("")
	out = nil
	for _, r := range rows {
		if r.rate == 0 {
			continue
		}
		out = append(out, []string{fmt.Sprintf("%d B", r.size), report.Commas(r.rate),
			fmt.Sprintf("%.0f / %.0f", r.directRate.P50MS, r.frontRate.P50MS), fmt.Sprintf("%.0f / %.0f", r.directRate.P99MS, r.frontRate.P99MS),
			fmt.Sprintf("%.0f / %.0f", r.directRate.P999MS, r.frontRate.P999MS)})
	}
	s.doc.Table([]string{"record", "rec/s (--throughput)", "p50 ms (direct/front)", "p99 ms (direct/front)", "p99.9 ms (direct/front)"}, out)
	s.doc.P("Through the front a request also waits for ferry's own batch (`exporter.kafka.linger`, 2 ms) and a second hop.")
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
