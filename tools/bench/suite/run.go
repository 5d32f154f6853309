package suite

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ferryhq/ferry/tools/bench/load"
	"github.com/ferryhq/ferry/tools/bench/report"
)

// The reference figures (report/reference.json) under the names the
// tables use.
var (
	seedPan     = report.Ref.Pan.PerSecBySize
	seedKafkaPP = report.Ref.KafkaProducer.PerSecBySize
	seedKafkaCP = report.Ref.KafkaConsumer
	seedOTLP    = report.Ref.BKCollectorHTTP.ReqPerSec
	seedSDKMBs  = report.Ref.JavaSDK.MBPerSec
	seedSDKCPU  = report.Ref.JavaSDK.CPUPercent
	seedMicro   = report.Ref.BKCollectorMicro.Rows
)

// producer settings every producing tool uses, so rows compare like for like.
var ppProps = []string{"acks=all", "linger.ms=5", "compression.type=lz4", "batch.size=1000000", "enable.idempotence=true"}

type prodRow struct {
	size                   int
	n                      int64
	pp, direct, via, local load.Result
	use, localUse          agentUsage
	// Each round's ratio to the mean of the direct runs just before and
	// just after it; via and local are the rounds whose ratio is the
	// median, direct the mean of every direct run.
	viaRatios, localRatios []float64
}

// producerRounds: rounds of (HTTP, local protocol, direct) per record
// size. The table's ratios are medians over them, each round paired with
// the direct runs either side of it: one run each moved a ratio by up to
// ±0.15 on this machine (issue 37).
const producerRounds = 3

func (s *suite) producerRounds() int {
	if s.quick {
		return 1
	}
	return producerRounds
}

// startKafka starts a fresh local broker and warms its JVM, so the first
// measured tool is not penalised; the returned func stops it.
func (s *suite) startKafka() (func(), error) {
	stop := func() { _, _ = s.exec("scripts/kafka-local", "stop", "--port", strconv.Itoa(s.port)) }
	s.stepf("a fresh local Kafka on %s", s.brokers)
	stop()
	if _, err := s.exec("scripts/kafka-local", "start", "--port", strconv.Itoa(s.port)); err != nil {
		return stop, err
	}
	cp, err := s.exec("scripts/kafka-local", "classpath")
	if err != nil {
		return stop, err
	}
	s.cp = strings.TrimSpace(cp)
	if t, err := s.topic("warmup", 3); err == nil {
		n := "300000"
		if s.quick {
			n = "30000"
		}
		_, _ = s.bench("produce", "--target", "kafka://"+s.brokers, "--topic", t, "--num-records", n, "--record-size", "100")
		s.deleteTopic(t)
	}
	return stop, nil
}

// runFiles is --only files: the log files section alone, rewritten in
// place in the report.
func (s *suite) runFiles() error {
	stop, err := s.startKafka()
	defer stop()
	if err != nil {
		return err
	}
	rows, err := s.filesBench()
	if err != nil {
		return err
	}
	s.stepf("rewriting the files section of %s and %s/files-cpu.svg", s.doc.Out, s.doc.Charts)
	s.writeFiles(rows)
	if _, err := os.Stat(s.doc.Out); err != nil {
		return os.WriteFile(s.doc.Out, []byte(s.doc.String()), 0o644)
	}
	return replaceSection(s.doc.Out, filesBegin, filesEnd, s.doc.String())
}

// runProducers is --only producers: section 1 alone, rewritten in place
// (the figures issue 37's first goal is judged by, without the hour of the
// whole suite).
func (s *suite) runProducers() error {
	stop, err := s.startKafka()
	defer stop()
	if err != nil {
		return err
	}
	rows, err := s.producers()
	if err != nil {
		return err
	}
	s.stepf("rewriting the producers section of %s and %s/producers-mb.svg", s.doc.Out, s.doc.Charts)
	s.writeProducers(rows)
	return replaceSection(s.doc.Out, prodBegin, prodEnd, s.doc.String())
}

func (s *suite) run() error {
	stop, err := s.startKafka()
	defer stop()
	if err != nil {
		return err
	}

	prod, err := s.producers()
	if err != nil {
		return err
	}
	front, err := s.kafkaFront()
	if err != nil {
		return err
	}
	pan, err := s.panLike()
	if err != nil {
		return err
	}
	cons, err := s.consumers()
	if err != nil {
		return err
	}
	otlp, err := s.otlpTable()
	if err != nil {
		return err
	}
	lingers, err := s.lingerSweep()
	if err != nil {
		return err
	}
	col, err := s.otlpVsCollector()
	if err != nil {
		return err
	}
	modes, err := s.deliveryModes()
	if err != nil {
		return err
	}
	eo, err := s.exactlyOnceCost()
	if err != nil {
		return err
	}
	micro, err := s.micro()
	if err != nil {
		return err
	}
	java, err := s.javaTables()
	if err != nil {
		return err
	}
	files, err := s.filesBench()
	if err != nil {
		return err
	}
	doors, err := s.doorsBench()
	if err != nil {
		return err
	}
	s.stepf("writing %s and the charts in %s", s.doc.Out, s.doc.Charts)
	return s.write(prod, front, pan, cons, otlp, lingers, col, modes, eo, micro, java, files, doors)
}

func (s *suite) sizes() []int {
	if s.quick {
		return []int{16, 100, 1000}
	}
	return []int{10, 16, 32, 64, 100, 1000, 5000}
}

// records per size: about 5 s through ferry on 2 cores (Kafka's tool
// takes up to 3× longer at the smallest sizes), so figures are steady.
var recordsBySize = map[int]int64{10: 10e6, 16: 10e6, 32: 10e6, 64: 6e6, 100: 5e6, 1000: 1.2e6, 5000: 200e3}

func (s *suite) records(size int) int64 {
	n, ok := recordsBySize[size]
	if !ok {
		n = int64(max(100e3, 500e6/float64(size)))
	}
	if s.quick {
		n = max(5000, n/100)
	}
	return n
}

func viaBatch(size int) int { return min(1000, max(1, (512<<10)/size)) }

// settle writes every dirty page to disk before a timed run: a run of
// 1000 B records leaves ~1 GB dirty, which the kernel writes back 30 s
// later (vm.dirty_expire_centisecs), in the middle of the next runs, so
// each run's figure depended on the one before it (the same direct run at
// 5000 B: 135,079 rec/s, then 53,263 four runs later).
func (s *suite) settle() {
	start := time.Now()
	syscall.Sync()
	if d := time.Since(start); d > time.Second {
		s.logf("  (%s writing the previous runs' pages to disk first)", d.Round(100*time.Millisecond))
	}
}

// producers: Kafka's ProducerPerformance, ferry-bench straight to Kafka,
// and ferry-bench through ferry, at every record size, same records count.
func (s *suite) producers() ([]prodRow, error) {
	s.stepf("producers at %v B: Kafka's ProducerPerformance, ferry-bench direct, ferry-bench through ferry (HTTP, and the local protocol)", s.sizes())
	a, err := s.agent()
	if err != nil {
		return nil, err
	}
	defer a.stop()
	var rows []prodRow
	for _, size := range s.sizes() {
		row := prodRow{size: size, n: s.records(size)}
		n := strconv.FormatInt(row.n, 10)
		s.logf("%d B × %s records: ProducerPerformance", size, n)
		t1, err := s.topic(fmt.Sprintf("pp-%d", size), 3)
		if err != nil {
			return nil, err
		}
		s.settle()
		out, err := s.java("org.apache.kafka.tools.ProducerPerformance", append([]string{"--topic", t1, "--num-records", n,
			"--record-size", strconv.Itoa(size), "--throughput", "-1", "--producer-props", "bootstrap.servers=" + s.brokers}, ppProps...)...)
		if err != nil {
			return nil, err
		}
		if row.pp, err = parsePP(out); err != nil {
			return nil, err
		}
		s.logf("%d B: ferry-bench produce --target kafka://", size)
		// direct is franz-go straight to the broker, ferry's reference.
		direct := func(name string) (load.Result, error) {
			t, _ := s.topic(fmt.Sprintf("%s-%d", name, size), 3)
			defer s.deleteTopic(t)
			s.settle()
			out, err := s.bench(append([]string{"produce", "--target", "kafka://" + s.brokers, "--topic", t, "--num-records", n,
				"--record-size", strconv.Itoa(size), "--producer-props"}, strings.Join(ppProps, " "))...)
			if err != nil {
				return load.Result{}, err
			}
			return parsePP(out)
		}
		// through runs ferry-bench through ferry on a fresh topic.
		through := func(name string, args ...string) (load.Result, agentUsage, error) {
			t, _ := s.topic(fmt.Sprintf("%s-%d", name, size), 3)
			defer s.deleteTopic(t)
			s.settle()
			var out string
			use, err := a.measure(func() error {
				var err error
				out, err = s.bench(append([]string{"produce", "--topic", t, "--num-records", n, "--record-size", strconv.Itoa(size)}, args...)...)
				return err
			})
			if err != nil {
				return load.Result{}, use, err
			}
			r, err := parsePP(out)
			return r, use, err
		}
		// One broker on a 2-core machine slows as a run's bytes reach its
		// disk (1000 B: the same direct run gave 384k then 193k rec/s 15 s
		// later), so each round's runs through ferry are compared with the
		// direct runs just before and just after them.
		rounds := s.producerRounds()
		d0, err := direct("direct0")
		if err != nil {
			return nil, err
		}
		directs := []load.Result{d0}
		var vias, locals []load.Result
		var viaUse, localUse []agentUsage
		for round := 1; round <= rounds; round++ {
			s.logf("%d B, round %d/%d: ferry-bench produce --target http:// (through ferry, %d records per request), then --target unix:%s (the Go client over the local protocol, one goroutine), then direct again",
				size, round, rounds, viaBatch(size), a.socket)
			v, vu, err := through(fmt.Sprintf("via%d", round), "--target", "http://"+a.http, "--batch", strconv.Itoa(viaBatch(size)), "--concurrency", "32")
			if err != nil {
				return nil, err
			}
			l, lu, err := through(fmt.Sprintf("local%d", round), "--target", "unix:"+a.socket, "--concurrency", "1")
			if err != nil {
				return nil, err
			}
			d, err := direct(fmt.Sprintf("direct%d", round))
			if err != nil {
				return nil, err
			}
			ref := (directs[len(directs)-1].RecordsSec + d.RecordsSec) / 2
			directs = append(directs, d)
			vias, viaUse = append(vias, v), append(viaUse, vu)
			locals, localUse = append(locals, l), append(localUse, lu)
			row.viaRatios = append(row.viaRatios, v.RecordsSec/max(ref, 1))
			row.localRatios = append(row.localRatios, l.RecordsSec/max(ref, 1))
			s.logf("%d B, round %d: direct %s, HTTP %s (%.2f×, ferry %.0f%% CPU), local %s (%.2f×, ferry %.0f%% CPU)", size, round, report.F0(d.RecordsSec),
				report.F0(v.RecordsSec), row.viaRatios[len(row.viaRatios)-1], vu.cpu, report.F0(l.RecordsSec), row.localRatios[len(row.localRatios)-1], lu.cpu)
		}
		row.direct = meanResults(directs)
		i := medianIndex(row.viaRatios)
		row.via, row.use = vias[i], viaUse[i]
		i = medianIndex(row.localRatios)
		row.local, row.localUse = locals[i], localUse[i]
		s.logf("%d B: %s rec/s Kafka's tool, %s direct (mean of %d), %s through ferry over HTTP (median %.2f×, ferry %.0f%% CPU), %s over the local protocol (median %.2f×, ferry %.0f%% CPU)", size, report.F0(row.pp.RecordsSec),
			report.F0(row.direct.RecordsSec), len(directs), report.F0(row.via.RecordsSec), median(row.viaRatios), row.use.cpu, report.F0(row.local.RecordsSec), median(row.localRatios), row.localUse.cpu)
		rows = append(rows, row)
		if size != 100 {
			s.deleteTopic(t1) // the 100 B topic is kept for the consumers
		} else {
			s.consumeTopic, s.consumeN = t1, row.n
		}
	}
	return rows, nil
}

// meanResults is the mean of several runs of the same records: rates and
// latencies averaged, counts summed.
func meanResults(rs []load.Result) load.Result {
	m := rs[0]
	for _, r := range rs[1:] {
		m.Records += r.Records
		m.Failed += r.Failed
		m.Seconds += r.Seconds
		m.RecordsSec, m.MBSec, m.AvgMS = m.RecordsSec+r.RecordsSec, m.MBSec+r.MBSec, m.AvgMS+r.AvgMS
		m.MaxMS = max(m.MaxMS, r.MaxMS)
		m.P50MS, m.P95MS, m.P99MS, m.P999MS = m.P50MS+r.P50MS, m.P95MS+r.P95MS, m.P99MS+r.P99MS, m.P999MS+r.P999MS
	}
	k := float64(len(rs)) // rates and latencies: the mean; counts: the sum
	m.RecordsSec, m.MBSec, m.AvgMS = m.RecordsSec/k, m.MBSec/k, m.AvgMS/k
	m.P50MS, m.P95MS, m.P99MS, m.P999MS = m.P50MS/k, m.P95MS/k, m.P99MS/k, m.P999MS/k
	return m
}

// medianIndex is the index of vs's median (the lower one of an even count).
func medianIndex(vs []float64) int {
	idx := make([]int, len(vs))
	for i := range idx {
		idx[i] = i
	}
	sort.Slice(idx, func(a, b int) bool { return vs[idx[a]] < vs[idx[b]] })
	return idx[(len(idx)-1)/2]
}

func median(vs []float64) float64 { return vs[medianIndex(vs)] }

// panLike: pan's shape, one message per request, answered on enqueue.
type panResult struct {
	res load.Result
	use agentUsage
}

func (s *suite) panLike() ([]panResult, error) {
	s.stepf("pan's shape: one 100 B message per HTTP request (fire and forget, then acknowledged)")
	a, err := s.agent()
	if err != nil {
		return nil, err
	}
	defer a.stop()
	t, _ := s.topic("pan", 3)
	defer s.deleteTopic(t)
	d := "8s"
	if s.quick {
		d = "2s"
	}
	var out []panResult
	for _, wait := range []string{"false", "true"} {
		var res string
		use, err := a.measure(func() error {
			var err error
			res, err = s.bench("produce", "--target", "http://"+a.http, "--topic", t, "--num-records", "1000000000", "--duration", d,
				"--record-size", "100", "--batch", "1", "--concurrency", "128", "--wait="+wait)
			return err
		})
		if err != nil {
			return nil, err
		}
		r, err := parsePP(res)
		if err != nil {
			return nil, err
		}
		out = append(out, panResult{r, use})
	}
	// The same shape over the local protocol: 128 goroutines, each sending
	// one message and waiting for its acknowledgement (pan's client's send).
	var res string
	use, err := a.measure(func() error {
		var err error
		res, err = s.bench("produce", "--target", "unix:"+a.socket, "--topic", t, "--num-records", "1000000000", "--duration", d,
			"--record-size", "100", "--batch", "1", "--concurrency", "128", "--sync")
		return err
	})
	if err != nil {
		return nil, err
	}
	r, err := parsePP(res)
	if err != nil {
		return nil, err
	}
	out = append(out, panResult{r, use})
	return out, nil
}

type consResult struct {
	cp, ours report.ConsumerLine
	verify   string
	verified load.Result
}

// consumers: ConsumerPerformance against ferry-bench consume on the same
// topic, then a produce --seq through ferry checked by consume --verify.
func (s *suite) consumers() (*consResult, error) {
	s.stepf("consumers: Kafka's ConsumerPerformance and ferry-bench consume (%s records of 100 B), then --verify", report.Commas(s.consumeN))
	var c consResult
	n := strconv.FormatInt(s.consumeN, 10)
	out, err := s.java("org.apache.kafka.tools.ConsumerPerformance", "--bootstrap-server", s.brokers, "--topic", s.consumeTopic,
		"--num-records", n, "--timeout", "30000")
	if err != nil {
		return nil, err
	}
	if c.cp, err = parseCP(out); err != nil {
		return nil, err
	}
	out, err = s.bench("consume", "--bootstrap-server", s.brokers, "--topic", s.consumeTopic, "--num-records", n, "--timeout", "30000")
	if err != nil {
		return nil, err
	}
	if c.ours, err = parseCP(out); err != nil {
		return nil, err
	}
	s.deleteTopic(s.consumeTopic)

	a, err := s.agent()
	if err != nil {
		return nil, err
	}
	defer a.stop()
	t, _ := s.topic("verify", 3)
	defer s.deleteTopic(t)
	rep := filepath.Join(s.work, "verify.json")
	vn := "500000"
	if s.quick {
		vn = "20000"
	}
	if _, err := s.bench("produce", "--target", "http://"+a.http, "--topic", t, "--num-records", vn, "--record-size", "100",
		"--batch", "500", "--concurrency", "16", "--seq", "--report-json", rep); err != nil {
		return nil, err
	}
	_ = readJSON(rep, &c.verified)
	out, err = s.bench("consume", "--bootstrap-server", s.brokers, "--topic", t, "--verify", "--produced", rep, "--timeout", "10s")
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "verify:") {
			c.verify = strings.TrimPrefix(line, "verify: ")
		}
	}
	return &c, nil
}

type otlpRow struct {
	shape    string
	exporter string
	qps      float64
	p50, p99 float64
	requests float64
	use      agentUsage
}

func (s *suite) otlpTable() ([]otlpRow, error) {
	s.stepf("bk-collector's OTLP/HTTP load table: logs of count × logLength, blackhole exporter and Kafka (acknowledged)")
	shapes := []struct {
		n, length int
	}{{10, 1024}, {10, 10240}, {10, 102400}, {100, 1024}, {100, 10240}}
	var rows []otlpRow
	for _, exp := range []struct {
		name, conc string
		sets       []string
	}{{"blackhole", "16", []string{"exporter.type=blackhole"}}, {"kafka (acked)", "64", nil}} {
		if exp.sets == nil {
			t := "otlp_logs"
			_, _ = s.bench("topic", "create", "--bootstrap-server", s.brokers, "--topic", t, "--partitions", "3", "--if-not-exists")
		}
		a, err := s.agent(exp.sets...)
		if err != nil {
			return nil, err
		}
		for _, sh := range shapes {
			reqs := 20000
			if sh.n*sh.length >= 1000*1024 || sh.length >= 102400 {
				reqs = 4000
			}
			if s.quick {
				reqs = 300
			}
			var res otlpReport
			use, err := a.measure(func() error {
				var err error
				res, err = s.otlpLoad("--target", "http://"+a.otlp, "--count", strconv.Itoa(sh.n), "--length", strconv.Itoa(sh.length),
					"--requests", strconv.Itoa(reqs), "--concurrency", exp.conc, "--exporter", exp.name)
				return err
			})
			if err != nil {
				a.stop()
				return nil, err
			}
			shape := fmt.Sprintf("%dx%dKB", sh.n, sh.length/1024)
			rows = append(rows, otlpRow{shape: shape, exporter: exp.name, qps: res.QPS, p50: res.P50, p99: res.P99, requests: res.Requests, use: use})
			s.logf("%s %s: %s requests/s (ferry %.0f%% CPU)", exp.name, shape, report.F0(res.QPS), use.cpu)
		}
		a.stop()
	}
	return rows, nil
}

// lingerRow: the latency-bound acknowledged OTLP path (10 × 1 KB logs per
// request, answered after Kafka's ack) at one exporter.kafka.linger.
type lingerRow struct {
	linger   string
	qps      float64
	p50, p99 float64
	produce  float64 // produce requests per second ferry sent
	use      agentUsage
}

// lingerSweep measures where the acknowledged path's time goes: the same
// load at fixed lingers from the old default (5 ms) down to none, and in
// the default adaptive mode. With a fixed linger each request waits for
// its partition's linger and then a produce round trip.
func (s *suite) lingerSweep() ([]lingerRow, error) {
	s.stepf("the acknowledged OTLP path by linger: 10 × 1 KB logs per request, 64 in flight, answered after Kafka's ack")
	t := "otlp_logs"
	_, _ = s.bench("topic", "create", "--bootstrap-server", s.brokers, "--topic", t, "--partitions", "3", "--if-not-exists")
	d := "8s"
	if s.quick {
		d = "2s"
	}
	var rows []lingerRow
	// Fixed lingers from the old default down to none, then the adaptive
	// mode, the linger only a cap while Kafka is busy: with the cap it had
	// first (2 ms) and the default's (50 ms, for fleets; docs/scaling.md).
	for _, v := range []struct{ linger, mode string }{{"5ms", "fixed"}, {"2ms", "fixed"}, {"1ms", "fixed"}, {"0s", "fixed"}, {"2ms", "adaptive"}, {"50ms", "adaptive"}} {
		l := v.linger + " " + v.mode
		a, err := s.agent("exporter.kafka.linger="+v.linger, "exporter.kafka.linger_mode="+v.mode)
		if err != nil {
			return nil, err
		}
		p0 := a.metric("ferry_exporter_kafka_requests_total{api=\"Produce\"}")
		t0 := time.Now()
		var res otlpReport
		use, err := a.measure(func() error {
			var err error
			res, err = s.otlpLoad("--target", "http://"+a.otlp, "--count", "10", "--length", "1024", "--requests", "1000000000",
				"--duration", d, "--concurrency", "64")
			return err
		})
		produce := (a.metric("ferry_exporter_kafka_requests_total{api=\"Produce\"}") - p0) / time.Since(t0).Seconds()
		a.stop()
		if err != nil {
			return nil, err
		}
		rows = append(rows, lingerRow{linger: l, qps: res.QPS, p50: res.P50, p99: res.P99, produce: produce, use: use})
		s.logf("linger %s: %s requests/s, p50 %.1f ms, %s produce requests/s, ferry %.0f%% CPU", l, report.F0(res.QPS), res.P50, report.F0(produce), use.cpu)
	}
	return rows, nil
}

type modeRow struct {
	name, settings  string
	acked           load.Result
	intoKafka       float64
	drain           time.Duration
	use             agentUsage
	appended, fsync float64
}

func (s *suite) deliveryModes() ([]modeRow, error) {
	s.stepf("delivery modes: kafka, spool (fsync interval), spool (fsync always), spill; 100 B records through ferry")
	d := 10 * time.Second
	if s.quick {
		d = 2 * time.Second
	}
	var rows []modeRow
	for _, m := range []struct{ name, settings string }{
		{"kafka", "delivery.mode=kafka"},
		{"spool, fsync interval", "delivery.mode=spool delivery.spool.fsync=interval"},
		{"spool, fsync always", "delivery.mode=spool delivery.spool.fsync=always"},
		{"spill", "delivery.mode=spill"},
	} {
		a, err := s.agent(strings.Fields(m.settings)...)
		if err != nil {
			return nil, err
		}
		t, _ := s.topic("modes", 3)
		row := modeRow{name: m.name, settings: m.settings}
		sent0 := a.metric("ferry_exporter_sent_records_total")
		var out string
		t0 := time.Now()
		row.use, err = a.measure(func() error {
			out, err = s.bench("produce", "--target", "http://"+a.http, "--topic", t, "--num-records", "1000000000",
				"--duration", d.String(), "--record-size", "100", "--batch", "1000", "--concurrency", "32")
			return err
		})
		if err != nil {
			a.stop()
			return nil, err
		}
		row.intoKafka = (a.metric("ferry_exporter_sent_records_total") - sent0) / time.Since(t0).Seconds()
		d0 := time.Now()
		for b := a.metric("ferry_spool_backlog_bytes"); b > 0 && time.Since(d0) < 5*time.Minute; b = a.metric("ferry_spool_backlog_bytes") {
			time.Sleep(100 * time.Millisecond)
		}
		row.drain = time.Since(d0)
		row.appended, row.fsync = a.metric("ferry_spool_appended_records_total"), a.metric("ferry_spool_fsyncs_total")
		row.acked, err = parsePP(out)
		a.stop()
		s.deleteTopic(t)
		if err != nil {
			return nil, err
		}
		s.logf("%s: %s rec/s acknowledged, %s rec/s into Kafka meanwhile", m.name, report.F0(row.acked.RecordsSec), report.F0(row.intoKafka))
		rows = append(rows, row)
	}
	return rows, nil
}

type microRow struct {
	name   string
	ns     float64
	allocs float64
}

var benchLine = regexp.MustCompile(`^Benchmark(\S+?)(?:-\d+)?\s+\d+\s+([\d.]+) ns/op(?:.*?\s(\d+) allocs/op)?`)

// microPkgs are the packages whose Go benchmarks section 7 reports (and
// names in its command line).
var microPkgs = []string{"./otlp/wire", "./otlp/flatjson", "./auth", "./auth/token", "./auth/ratelimit", "./processor/...",
	"./receiver/httpreceiver", "./receiver/otlpreceiver", "./exporter/kafkaexporter", "./buffer/...", "./record", "./client", "./protocol"}

func (s *suite) micro() ([]microRow, error) {
	s.stepf("Go micro-benchmarks: OTLP decode and convert, tokens, limits and processors, the message path, the spool, the Go client")
	bt := "300ms"
	if s.quick {
		bt = "20x"
	}
	cmd := exec.Command("go", append([]string{"test", "-run", "^$", "-bench", ".", "-benchmem", "-benchtime", bt}, microPkgs...)...)
	cmd.Stderr = os.Stderr
	outB, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go test -bench: %w\n%s", err, outB)
	}
	var rows []microRow
	for _, line := range strings.Split(string(outB), "\n") {
		m := benchLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		ns, _ := strconv.ParseFloat(m[2], 64)
		al := math.NaN()
		if m[3] != "" {
			al, _ = strconv.ParseFloat(m[3], 64)
		}
		rows = append(rows, microRow{name: m[1], ns: ns, allocs: al})
	}
	s.logf("%d benchmarks", len(rows))
	return rows, nil
}

// javaRow is one run of the Java producer's benchmark.
type javaRow struct {
	table   string // send_threads, total_size, batch_size
	setting float64
	seed    [4]float64
	fig     map[string]float64
	use     agentUsage
}

// javaBenchOpts are the JVM's options for the Java producer's benchmark:
// the seed's JVM had a fixed heap (4 GB of its 8) and ran JDK 8, whose
// default collector is the parallel one; here 2 GB of a heap shared with
// Kafka and ferry.
var javaBenchOpts = []string{"-Xms2g", "-Xmx2g", "-XX:+UseParallelGC"}

// javaRecords is how many records each Java producer run measures. A
// fifth as many again go first as an uncounted warm-up (LogBench's
// default): the seed's figures are a JIT-compiled steady state.
func javaRecords(quick bool) string {
	if quick {
		return "20000"
	}
	return "2000000"
}

// javaTables: the Java log producer's three tables (seed 004) with
// ferry's Java producer (sdk/java) through the agent into Kafka.
func (s *suite) javaTables() ([]javaRow, error) {
	s.stepf("the Java producer (sdk/java): the log producer's tables, 10 threads, its ~580-byte log, through ferry into Kafka")
	out, err := s.exec("mvn", "-q", "-B", "-Dstyle.color=never", "-f", "sdk/java/pom.xml", "-DskipTests", "test-compile",
		"dependency:build-classpath", "-Dmdep.outputFile=target/cp.txt")
	if err != nil {
		return nil, fmt.Errorf("building sdk/java: %w\n%s", err, out)
	}
	deps, err := os.ReadFile("sdk/java/target/cp.txt")
	if err != nil {
		return nil, err
	}
	cp := "sdk/java/target/classes:sdk/java/target/test-classes:" + strings.TrimSpace(string(deps))
	a, err := s.agent()
	if err != nil {
		return nil, err
	}
	defer a.stop()
	t, err := s.topic("java", 3)
	if err != nil {
		return nil, err
	}
	defer s.deleteTopic(t)
	records := javaRecords(s.quick)
	ref := report.Ref.JavaSDKTables
	var rows []javaRow
	run := func(table string, seed [4]float64, args ...string) error {
		row := javaRow{table: table, setting: seed[0], seed: seed}
		var out string
		row.use, err = a.measure(func() error {
			var err error
			out, err = s.exec("java", append(append(javaBenchOpts, "-cp", cp, "dev.ferry.producer.bench.LogBench", "--address", "unix:"+a.socket,
				"--topic", t, "--records", records, "--agent-pid", strconv.Itoa(a.cmd.Process.Pid)), args...)...)
			return err
		})
		if err != nil {
			return err
		}
		row.fig = map[string]float64{}
		for _, f := range strings.Fields(out) {
			if k, v, ok := strings.Cut(f, "="); ok {
				row.fig[k], _ = strconv.ParseFloat(v, 64)
			}
		}
		s.logf("%s %s: %.1f MB/s raw, %.1f MB/s compressed, JVM %.0f%% CPU, ferry %.0f%%, %s of %s acknowledged", table, report.F0(seed[0]),
			row.fig["raw_mb_s"], row.fig["compressed_mb_s"], row.fig["jvm_cpu"], row.fig["agent_cpu"], report.F0(row.fig["acked"]), report.F0(row.fig["records"]))
		rows = append(rows, row)
		return nil
	}
	for _, r := range ref.SendThreads {
		if err := run("send_threads", r, "--send-threads", strconv.Itoa(int(r[0]))); err != nil {
			return nil, err
		}
	}
	for _, r := range ref.TotalSize {
		if err := run("total_size", r, "--total-size", strconv.Itoa(int(r[0]))); err != nil {
			return nil, err
		}
	}
	for _, r := range ref.BatchSize {
		if err := run("batch_size", r, "--batch-size", strconv.Itoa(int(r[0]))); err != nil {
			return nil, err
		}
	}
	return rows, nil
}

func dur(ns float64) string {
	switch {
	case ns >= 1e6:
		return fmt.Sprintf("%.2f ms", ns/1e6)
	case ns >= 1e3:
		return fmt.Sprintf("%.1f µs", ns/1e3)
	}
	return fmt.Sprintf("%.1f ns", ns)
}
