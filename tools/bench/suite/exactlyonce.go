package suite

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/ferryhq/ferry/tools/bench/load"
	"github.com/ferryhq/ferry/tools/bench/report"
)

// eoRow is one guarantee at one record size: a fixed number of records
// offered as fast as the clients go (answered from the spool), timed until
// Kafka has all of them.
type eoRow struct {
	guarantee string
	size      int
	n         float64
	acked     load.Result
	// intoKafka: records per second from the first request until Kafka
	// had (committed, for exactly once) the last record.
	intoKafka float64
	use       agentUsage
	// commitP99 is the transactions' begin-to-commit p99 (exactly once):
	// how much later than at least once records become visible.
	commitP99 float64
	txns      float64
}

// eoBuckets are ferry_exactly_once_transaction_seconds' upper bounds.
var eoBuckets = func() []float64 {
	var b []float64
	for v, i := 0.005, 0; i < 12; v, i = v*2, i+1 {
		b = append(b, v)
	}
	return b
}()

func (s *suite) exactlyOnceCost() ([]eoRow, error) {
	s.stepf("exactly once vs at least once (spool, fsync interval): 100 B and 1 KB records, timed until Kafka has every one")
	var rows []eoRow
	for _, size := range []int{100, 1000} {
		n := map[int]int{100: 4_000_000, 1000: 800_000}[size]
		if s.quick {
			n /= 100
		}
		for _, g := range []string{"at_least_once", "exactly_once"} {
			a, err := s.agent("delivery.mode=spool", "delivery.spool.fsync=interval", "delivery.guarantee="+g)
			if err != nil {
				return nil, err
			}
			t, _ := s.topic("eo", 3)
			row := eoRow{guarantee: g, size: size, n: float64(n)}
			// Warm-up, untimed: the first records to a topic wait for its
			// metadata and, in a transaction, for the producer id and the
			// partitions joining it (about half a second once): a cost of
			// starting, not of each record.
			warm := max(1000, n/100)
			w0 := a.metric("ferry_exporter_sent_records_total")
			if _, err := s.bench("produce", "--target", "http://"+a.http, "--topic", t, "--num-records", fmt.Sprint(warm),
				"--record-size", fmt.Sprint(size), "--batch", "1000", "--concurrency", "4"); err != nil {
				a.stop()
				return nil, err
			}
			for d0 := time.Now(); a.metric("ferry_exporter_sent_records_total")-w0 < float64(warm) && time.Since(d0) < time.Minute; {
				time.Sleep(20 * time.Millisecond)
			}
			c0 := a.metric(`ferry_exactly_once_transactions_total{result="committed"}`)
			sent0 := a.metric("ferry_exporter_sent_records_total")
			var out string
			t0 := time.Now()
			var took time.Duration
			row.use, err = a.measure(func() error {
				out, err = s.bench("produce", "--target", "http://"+a.http, "--topic", t, "--num-records", fmt.Sprint(n),
					"--record-size", fmt.Sprint(size), "--batch", "1000", "--concurrency", "32")
				if err != nil {
					return err
				}
				for a.metric("ferry_exporter_sent_records_total")-sent0 < float64(n) && time.Since(t0) < 5*time.Minute {
					time.Sleep(20 * time.Millisecond)
				}
				took = time.Since(t0)
				return nil
			})
			if err == nil {
				row.acked, err = parsePP(out)
			}
			if err == nil && a.metric("ferry_exporter_sent_records_total")-sent0 < float64(n) {
				err = fmt.Errorf("%s %d B: Kafka had %.0f of %d records after 5 minutes", g, size, a.metric("ferry_exporter_sent_records_total")-sent0, n)
			}
			row.intoKafka = float64(n) / took.Seconds()
			if g == "exactly_once" {
				row.txns = a.metric(`ferry_exactly_once_transactions_total{result="committed"}`) - c0
				row.commitP99 = s.histP99(a, "ferry_exactly_once_transaction_seconds", eoBuckets)
			}
			a.stop()
			s.deleteTopic(t)
			if err != nil {
				return nil, err
			}
			s.logf("%s, %d B: %s rec/s into Kafka (%s acknowledged)", g, size, report.F0(row.intoKafka), report.F0(row.acked.RecordsSec))
			rows = append(rows, row)
		}
	}
	return rows, nil
}

// histP99 reads a histogram's buckets from the agent and returns the upper
// bound of the bucket holding the 99th percentile (NaN without samples).
func (s *suite) histP99(a *benchAgent, name string, bounds []float64) float64 {
	total := a.metric(name + "_count")
	if total <= 0 {
		return math.NaN()
	}
	for _, b := range bounds {
		le := strings.TrimRight(strings.TrimRight(fmt.Sprintf("%f", b), "0"), ".")
		if a.metric(name+`_bucket{le="`+le+`"}`) >= 0.99*total {
			return b
		}
	}
	return math.Inf(1)
}

const (
	eoBegin = "<!-- exactly-once:begin -->"
	eoEnd   = "<!-- exactly-once:end -->"
)

// runExactlyOnce is --only exactly_once: this section alone, rewritten in
// place.
func (s *suite) runExactlyOnce() error {
	stop, err := s.startKafka()
	defer stop()
	if err != nil {
		return err
	}
	rows, err := s.exactlyOnceCost()
	if err != nil {
		return err
	}
	s.stepf("rewriting the exactly-once section of %s", s.doc.Out)
	s.writeExactlyOnce(rows)
	return replaceSection(s.doc.Out, eoBegin, eoEnd, s.doc.String())
}

func (s *suite) writeExactlyOnce(rows []eoRow) {
	s.doc.P("%s", eoBegin)
	defer s.doc.P("%s", eoEnd)
	s.doc.H("6b. Exactly once: its cost against at least once (issue 35)")
	s.doc.P("Both rows in spool mode, fsync interval, same run: `ferry-bench produce` offers a fixed number of records (1,000 a request, 32 concurrent; after an untimed warm-up of a hundredth of them to the same topic) and the clock stops when Kafka has the last one (for exactly once: committed, visible to read_committed consumers). Clients are answered from the spool either way, so their figures match; the cost is in the delivery: a Kafka transaction per `delivery.exactly_once.commit_interval` (100 ms), each also writing the spool position to the state topic.")
	s.doc.P("")
	var out [][]string
	base := map[int]float64{}
	for _, r := range rows {
		if r.guarantee == "at_least_once" {
			base[r.size] = r.intoKafka
		}
		ratio, commit, txns := "1.00×", "–", "–"
		if r.guarantee == "exactly_once" {
			ratio = report.Ratio(r.intoKafka, base[r.size])
			commit = fmt.Sprintf("≤ %.0f ms", r.commitP99*1000)
			txns = report.F0(r.txns)
		}
		out = append(out, []string{fmt.Sprintf("%d B", r.size), r.guarantee, report.F0(r.n), report.F0(r.intoKafka), ratio,
			report.F0(r.acked.RecordsSec), report.F1(r.acked.P99MS), txns, commit, report.F0(r.use.cpu) + "%", report.F0(r.use.rssMiB) + " MiB"})
	}
	s.doc.Table([]string{"size", "guarantee", "records", "into Kafka rec/s", "vs at least once (goal ≥ 0.7×)", "acknowledged rec/s", "ack p99 ms",
		"transactions", "commit p99 (added visibility delay)", "ferry CPU", "ferry peak RSS"}, out)
	var said []string
	for _, r := range rows {
		if r.guarantee == "exactly_once" {
			said = append(said, fmt.Sprintf("%d B: %s the records/s into Kafka, visible to read_committed consumers up to %.0f ms (commit p99) after their transaction began", r.size, report.Ratio(r.intoKafka, base[r.size]), r.commitP99*1000))
		}
	}
	if len(said) > 0 {
		s.doc.P("Exactly once against at least once, this run: %s. Client acknowledgements come from the spool either way (the ack p99 column), so the added latency is that visibility delay alone.", strings.Join(said, "; "))
		s.doc.P("")
	}
	s.doc.P("Where a transaction's time goes (exporter/kafkaexporter/exactlyonce.go's design header): one transaction is open at a time and the Kafka client cannot produce the next one's records until the commit returns; on Kafka 4 each commit also bumps the producer epoch, after which the client sends one batch per partition until the first answer. So at every commit the broker path drains and refills: 15-45 ms at 1 KB records against the 100-150 ms a 64 MiB transaction (a quarter of `queue.memory_limit`) takes to send. On this shared 2-core machine a row's figure also moves by a quarter or more from run to run (the spool's reader waits behind appends holding its append lock through a slow write or fsync, up to 1.8 s seen, whichever guarantee is running), so one run's ratio is one sample.")
	s.doc.P("")
	s.doc.P("Reproduce one row: `bin/ferry run --set delivery.mode=spool --set delivery.spool.fsync=interval --set delivery.guarantee=exactly_once` and `bin/ferry-bench produce --target http://127.0.0.1:8088 --topic t --num-records 4000000 --record-size 100 --batch 1000 --concurrency 32`; guarantees in [docs/reliability.md](docs/reliability.md).")
}
