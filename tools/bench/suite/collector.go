package suite

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/tools/bench/load"
	"github.com/ferryhq/ferry/tools/bench/proc"
	"github.com/ferryhq/ferry/tools/bench/report"
	"github.com/ferryhq/ferry/tools/otlpgen"
)

// The OpenTelemetry Collector beside ferry (issue 15): the same OTLP load,
// the same broker, in the same run. Each row starts one agent on the same
// OTLP ports with a fresh topic, runs a closed-loop load for a while, then
// waits until Kafka's end offsets stop moving (the Collector answers
// before it exports, the spool before it sends) and counts the items that
// reached the topic by reading it back. So "items/s into Kafka" and CPU
// per item cover the whole delivery, not just the answers.

// colLinger20 is ferry answering after Kafka's ack with a 20 ms linger.
const colLinger20 = "ferry, linger 20 ms (answered after Kafka's ack)"

// colCollector is the Collector as shipped, the base of every ratio.
const colCollector = "OpenTelemetry Collector v0.155.0"

// colCollectorDefaults is the Collector as a new user configures it
// (otlp → batch → kafka, nothing else set but the brokers and the topic):
// the base of the few-in-flight rows, where ferry runs on its defaults too.
const colCollectorDefaults = "OpenTelemetry Collector v0.155.0 on its defaults (otlp → batch → kafka)"

// fewInFlight is what an application's SDKs keep in flight: a batch
// processor exports one request at a time per signal, so an agent serving
// a few applications sees a few requests at once (issue 37, item 3).
const fewInFlight = 4

// The rows of the table on Go's runtime settings that are not in the main
// table.
const (
	colCollectorSteady = "OpenTelemetry Collector v0.155.0 with GODEBUG=schedtrace=2147483647 (the same setting)"
	colFerryGoMonitor  = "ferry, runtime.monitor_deep_sleep: true (Go's own monitor behaviour)"
	colCollectorOneP   = "OpenTelemetry Collector v0.155.0 with GOMAXPROCS=1 (one P, what ferry's adaptive_procs picks at this load)"
	colFerryEveryCore  = "ferry, runtime.adaptive_procs: false (Go's scheduler on every core)"
)

// colSystem is one agent setup of the comparison.
type colSystem struct {
	name string
	sets []string // ferry's overrides; nil: the Collector
	env  []string // added to the Collector's environment
}

const (
	colGRPC = "127.0.0.1:14317"
	colHTTP = "127.0.0.1:14318"
	// colZipkin: the Collector's zipkin receiver (ferry serves Zipkin on
	// its OTLP/HTTP listener, colHTTP).
	colZipkin = "127.0.0.1:19411"
)

type colRow struct {
	signal, protocol, system string
	body                     string // logs: random or text (otlpgen's body kinds); "" for spans
	count                    int
	rate                     int // items/s offered; 0: closed loop, as fast as answers come
	accepted, delivered      int64
	failed                   int64
	failures                 string
	logBytes                 int64   // the topic's log segments on the broker: what the agent's batches take in Kafka
	seconds                  float64 // from the first request until the last item was in Kafka
	cpuSec                   float64
	rssMiB                   float64
	p50, p99                 float64
	// runs: at the fixed rates, the CPU µs per item of every repetition
	// (the row is the median one); lostElsewhere: items the other
	// repetitions lost, so a loss is never hidden by the median.
	runs          []float64
	lostElsewhere int64
	// switches: the agent's thread switches over the same span as cpuSec
	// (proc.Switches): each is a thread going to sleep and woken again,
	// which on a virtual machine costs tens of µs of CPU.
	switches int64
	// monitor: a row of the table on Go's monitor thread (the
	// runtime.monitor_deep_sleep setting), not of the main table.
	monitor bool
	// format: what the load sends (load.Formats; "" is OTLP), for the
	// other doors' section.
	format string
	// inflight: the load's concurrency (0: 64, the main table's).
	inflight int
	// defaults: the row of the few-in-flight shape, both agents on their
	// defaults (the Collector's config is collectorDefaultsConfig).
	defaults bool
}

// concurrency is the requests the load keeps in flight.
func (r colRow) concurrency() int {
	if r.inflight == 0 {
		return 64
	}
	return r.inflight
}

// switchesPerRequest is the agent's thread switches per request delivered.
func (r colRow) switchesPerRequest() float64 {
	return float64(r.switches) * float64(r.count) / max(float64(r.delivered), 1)
}

// kafkaBytesPerItem is what an item takes in Kafka: the agent's encoding
// and compression together.
func (r colRow) kafkaBytesPerItem() float64 {
	return float64(r.logBytes) / max(float64(r.delivered), 1)
}

func (r colRow) itemsPerSec() float64 { return float64(r.delivered) / max(r.seconds, 1e-9) }
func (r colRow) usPerItem() float64   { return r.cpuSec * 1e6 / max(float64(r.delivered), 1) }
func (r colRow) load() string {
	if r.rate == 0 {
		return fmt.Sprintf("closed loop, %d in flight", r.concurrency())
	}
	return "fixed " + report.Commas(int64(r.rate)) + " items/s"
}
func (r colRow) lost() int64 { return max(0, r.accepted-r.delivered) }

// what is the row's signal, with the kind of body for logs.
func (r colRow) what() string {
	if r.body == "" {
		return r.signal
	}
	return r.signal + " (" + r.body + ")"
}

// collectorConfig is the Collector's whole configuration: the pipeline a
// user builds for OTLP into Kafka (otlp → memory_limiter → batch → kafka
// with its sending queue), with ferry's producer settings (lz4, acks all).
// The batch processor's size is capped so each Kafka message stays under
// the broker's message.max.bytes (1 MiB by default) and max_message_bytes
// is set to that limit. It keeps together what ferry keeps together by
// default, so both do the same job for the consumers: every span of a
// trace on one partition (its only way: a message per trace keyed by its
// id, partition_traces_by_id; ferry groups a request's traces by
// partition) and a message per resource keyed by its attributes
// (partition_logs_by_resource_attributes). The oversize case leaves the
// batch processor at its default (8192 items, no cap) and raises
// max_message_bytes, which is what a user does when the exporter refuses
// large batches.
//
// format zipkin adds the zipkin receiver (on colZipkin) to the pipeline, so
// Zipkin's v2 API reaches the same batch and exporter.
func collectorConfig(brokers, topic, signal string, oversize bool, format string) string {
	batch := "{send_batch_size: 512, send_batch_max_size: 700, timeout: 200ms}"
	zipkin, receivers := "", "[otlp]"
	if format == load.FormatZipkin {
		zipkin, receivers = "\n  zipkin: {endpoint: "+colZipkin+"}", "[otlp, zipkin]"
	}
	maxMsg := 1000000
	if oversize {
		batch, maxMsg = "{}", 10000000
	}
	return fmt.Sprintf(`receivers:
  otlp:
    protocols:
      grpc: {endpoint: %s, max_recv_msg_size_mib: 16}
      http: {endpoint: %s}%s
processors:
  memory_limiter: {check_interval: 1s, limit_mib: 1024, spike_limit_mib: 256}
  batch: %s
exporters:
  kafka:
    brokers: [%s]
    %s: {topic: %s, encoding: otlp_proto}
    partition_traces_by_id: true
    partition_logs_by_resource_attributes: true
    producer: {compression: lz4, required_acks: all, max_message_bytes: %d}
    sending_queue: {enabled: true}
service:
  telemetry:
    metrics: {level: none}
    logs: {level: warn}
  pipelines:
    %s: {receivers: %s, processors: [memory_limiter, batch], exporters: [kafka]}
`, colGRPC, colHTTP, zipkin, batch, brokers, signal, topic, maxMsg, signal, receivers)
}

// collectorDefaultsConfig is the Collector's configuration as a new user
// writes it from the components' READMEs: otlp → batch → kafka with only the
// brokers and the topic set, so the exporter's encoding (otlp_proto), its
// split (one message per batch, no key), compression (none) and acks (the
// leader's) are the Collector's own defaults. One change from its defaults:
// the batch is capped at 700 items as in collectorConfig. Measured at 4 in
// flight, the batch processor's default (8192 items, no cap, uncompressed)
// makes messages above the broker's 1 MB message.max.bytes: the Collector,
// having answered OK, dropped 99.96-100 % of the items of every signal
// (traces 1,600 of 5,471,000 in Kafka; logs none; metrics 4,200 points of
// 6.1 million), which is no base for a ratio.
func collectorDefaultsConfig(brokers, topic, signal string) string {
	return fmt.Sprintf(`receivers:
  otlp:
    protocols:
      grpc: {endpoint: %s}
      http: {endpoint: %s}
processors:
  batch: {send_batch_size: 512, send_batch_max_size: 700}
exporters:
  kafka:
    brokers: [%s]
    %s: {topic: %s}
service:
  telemetry:
    metrics: {level: none}
    logs: {level: warn}
  pipelines:
    %s: {receivers: [otlp], processors: [batch], exporters: [kafka]}
`, colGRPC, colHTTP, brokers, signal, topic, signal)
}

// startCollector runs the Collector with a config for topic and waits
// until both OTLP ports accept connections.
func (s *suite) startCollector(bin, topic, signal string, oversize bool, env []string, format string, defaults bool) (*benchAgent, error) {
	cfg := filepath.Join(s.work, "otelcol.yaml")
	text := collectorConfig(s.brokers, topic, signal, oversize, format)
	if defaults {
		text = collectorDefaultsConfig(s.brokers, topic, signal)
	}
	if err := os.WriteFile(cfg, []byte(text), 0o644); err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(s.work, "otelcol.log"))
	if err != nil {
		return nil, err
	}
	a := &benchAgent{s: s, done: make(chan struct{})}
	a.cmd = exec.Command(bin, "--config", cfg)
	a.cmd.Env = append(os.Environ(), env...)
	a.cmd.Stdout, a.cmd.Stderr = logf, logf
	if err := a.cmd.Start(); err != nil {
		return nil, err
	}
	go a.sample()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if portOpen(colGRPC) && portOpen(colHTTP) && (format != load.FormatZipkin || portOpen(colZipkin)) {
			return a, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	a.stop()
	log, _ := os.ReadFile(logf.Name())
	return nil, fmt.Errorf("the Collector did not open its OTLP ports:\n%s", log)
}

func portOpen(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err == nil {
		c.Close()
	}
	return err == nil
}

// logBytes is the size of the topic's log segments on the brokers.
func logBytes(adm *kadm.Client, topic string) int64 {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	offs, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return 0
	}
	// Log dirs are described per partition named.
	set := kadm.TopicsSet{}
	offs.Each(func(o kadm.ListedOffset) { set.Add(topic, o.Partition) })
	dirs, err := adm.DescribeAllLogDirs(ctx, set)
	if err != nil {
		return 0
	}
	var n int64
	dirs.Each(func(d kadm.DescribedLogDir) { n += d.Topics.Size() })
	return n
}

// endOffsets sums the topic's end offsets (records written so far).
func endOffsets(adm *kadm.Client, topic string) int64 {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	offs, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return -1
	}
	var sum int64
	offs.Each(func(o kadm.ListedOffset) {
		if o.Err == nil {
			sum += o.Offset
		}
	})
	return sum
}

// collectorSetup builds (or finds) the Collector and opens an admin client
// on the suite's broker.
func (s *suite) collectorSetup() (bin string, adm *kadm.Client, closeFn func(), d time.Duration, err error) {
	bin, err = s.exec("scripts/otelcol-local", "build")
	if err != nil {
		return "", nil, nil, 0, err
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.brokers))
	if err != nil {
		return "", nil, nil, 0, err
	}
	d = 10 * time.Second
	if s.quick {
		d = 2 * time.Second
	}
	return strings.TrimSpace(bin), kadm.NewClient(cl), cl.Close, d, nil
}

func (s *suite) otlpVsCollector() ([]colRow, error) {
	s.stepf("OTLP into Kafka: ferry beside the OpenTelemetry Collector (logs and spans × gRPC and HTTP, 100 items per request)")
	bin, adm, closeFn, d, err := s.collectorSetup()
	if err != nil {
		return nil, err
	}
	defer closeFn()
	systems := []colSystem{
		{colCollector, nil, nil},
		{"ferry (answered after Kafka's ack)", []string{}, nil},
		{"ferry spool, fsync interval (answered from disk)", []string{"delivery.mode=spool", "delivery.spool.fsync=interval"}, nil},
		// At a fixed rate only: the price of the default adaptive linger
		// (sent at once while nothing is in flight), which keeps clients
		// that wait for Kafka's ack fast, in CPU per item, against a long
		// fixed one.
		{colLinger20, []string{"exporter.kafka.linger=20ms", "exporter.kafka.linger_mode=fixed"}, nil},
	}
	// The rate both agents sustain here (items/s), for CPU per item away
	// from overload: about two thirds of the Collector's closed-loop rate.
	fixed := map[string]int{"logs": 50000, "traces": 150000}
	if s.quick {
		fixed = map[string]int{"logs": 10000, "traces": 30000}
	}
	// Every agent runs reps times in each row, the agents taking turns, and
	// the row is its median run by CPU per item: on a shared machine one
	// run's CPU per item moves by up to a fifth, which one run each would
	// put into the ratio. That holds in the closed loop as much as at the
	// fixed rates (one closed-loop row measured 4.21 and 4.38 µs per log in
	// two runs by hand, 4.79 in a third under perf).
	reps := 3
	if s.quick {
		reps = 1
	}
	var rows []colRow
	for _, rate := range []bool{false, true} {
		for _, signal := range []string{"logs", "traces"} {
			// Random log bodies are the seeds' shape and lz4's worst case;
			// text bodies are what applications log.
			bodies := []string{""}
			if signal == "logs" {
				bodies = otlpgen.Bodies
			}
			for _, body := range bodies {
				for _, protocol := range []string{"grpc", "http"} {
					runs := make([][]colRow, len(systems))
					for rep := 0; rep < reps; rep++ {
						for i, sys := range systems {
							if sys.name == colLinger20 && !rate {
								continue
							}
							c := colRow{signal: signal, body: body, protocol: protocol, system: sys.name, count: 100}
							if rate {
								c.rate = fixed[signal]
							}
							r, err := s.collectorRow(adm, bin, c, sys, d, false)
							if err != nil {
								return nil, err
							}
							runs[i] = append(runs[i], r)
						}
					}
					for _, rs := range runs {
						if len(rs) > 0 {
							rows = append(rows, medianRun(rs))
						}
					}
				}
			}
		}
	}
	// Go's runtime: ferry as shipped (runtime.monitor_deep_sleep: false,
	// adaptive_procs: true) beside ferry with Go's own behaviour for each,
	// and the Collector given each of ferry's settings beside the Collector
	// as shipped, at the fixed rate of text logs over gRPC, so what each
	// setting buys each agent is measured.
	monitor := []colSystem{
		systems[0],
		{colCollectorSteady, nil, []string{"GODEBUG=schedtrace=2147483647"}},
		systems[1],
		{colFerryGoMonitor, []string{"runtime.monitor_deep_sleep=true"}, nil},
		{colCollectorOneP, nil, []string{"GOMAXPROCS=1"}},
		{colFerryEveryCore, []string{"runtime.adaptive_procs=false"}, nil},
	}
	runs := make([][]colRow, len(monitor))
	for rep := 0; rep < reps; rep++ {
		for i, sys := range monitor {
			c := colRow{signal: "logs", body: otlpgen.BodyText, protocol: "grpc", system: sys.name, count: 100, rate: fixed["logs"], monitor: true}
			r, err := s.collectorRow(adm, bin, c, sys, d, false)
			if err != nil {
				return nil, err
			}
			runs[i] = append(runs[i], r)
		}
	}
	for _, rs := range runs {
		rows = append(rows, medianRun(rs))
	}
	// A batch above the broker's message.max.bytes: requests of 1,000 logs
	// of 1 KB (1.2 MB, one resource each).
	for _, sys := range systems[:2] { // the Collector and ferry's default
		r, err := s.collectorRow(adm, bin, colRow{signal: "logs", body: otlpgen.BodyRandom, protocol: "http", system: sys.name, count: 1000}, sys, d/2, true)
		if err != nil {
			return nil, err
		}
		rows = append(rows, r)
	}
	few, err := s.collectorFew(adm, bin, d)
	return append(rows, few...), err
}

// collectorFew is the few-in-flight shape (issue 37, item 3): a closed loop
// of fewInFlight clients, 100 items a request, as an application's SDKs
// send, both agents on their defaults, for every signal over gRPC (what
// the SDKs default to). Each agent runs three times, taking turns; a row is
// its median run.
func (s *suite) collectorFew(adm *kadm.Client, bin string, d time.Duration) ([]colRow, error) {
	systems := []colSystem{
		{colCollectorDefaults, nil, nil},
		{"ferry (answered after Kafka's ack)", []string{}, nil},
	}
	reps := 3
	if s.quick {
		reps = 1
	}
	var rows []colRow
	for _, signal := range []string{"traces", "logs", "metrics"} {
		body := ""
		if signal == "logs" {
			body = otlpgen.BodyText
		}
		runs := make([][]colRow, len(systems))
		for rep := 0; rep < reps; rep++ {
			for i, sys := range systems {
				c := colRow{signal: signal, body: body, protocol: "grpc", system: sys.name, count: 100, inflight: fewInFlight, defaults: true}
				r, err := s.collectorRow(adm, bin, c, sys, d, false)
				if err != nil {
					return nil, err
				}
				runs[i] = append(runs[i], r)
			}
		}
		for _, rs := range runs {
			rows = append(rows, medianRun(rs))
		}
	}
	return rows, nil
}

// runCollectorFew is --only collector_few: the few-in-flight rows alone,
// their table printed on stdout (the whole suite writes them into the
// Collector's section).
func (s *suite) runCollectorFew() error {
	stop, err := s.startKafka()
	defer stop()
	if err != nil {
		return err
	}
	s.stepf("OTLP into Kafka at %d in flight, both agents on their defaults", fewInFlight)
	bin, adm, closeFn, d, err := s.collectorSetup()
	if err != nil {
		return err
	}
	defer closeFn()
	rows, err := s.collectorFew(adm, bin, d)
	if err != nil {
		return err
	}
	s.writeCollectorFew(rows)
	fmt.Print(s.doc.String())
	return nil
}

// medianRun is the run of rs with the median CPU per item (of an even
// number, the lower middle one), carrying every run's figure and the items
// the others lost.
func medianRun(rs []colRow) colRow {
	if len(rs) == 1 {
		return rs[0]
	}
	sorted := slices.Clone(rs)
	slices.SortFunc(sorted, func(a, b colRow) int { return cmp.Compare(a.usPerItem(), b.usPerItem()) })
	m := sorted[(len(sorted)-1)/2]
	for _, r := range rs {
		m.runs = append(m.runs, r.usPerItem())
		m.lostElsewhere += r.lost()
	}
	m.lostElsewhere -= m.lost()
	return m
}

// collectorRow measures one case: row's signal, protocol, system, count and
// rate (0: closed loop) say what to run; sets are ferry's (nil: the
// Collector).
func (s *suite) collectorRow(adm *kadm.Client, bin string, row colRow, sys colSystem, d time.Duration, oversize bool) (colRow, error) {
	sets := sys.sets
	signal := row.signal
	topic, err := s.topic("otlp-"+signal, 3)
	if err != nil {
		return row, err
	}
	defer s.deleteTopic(topic)
	var a *benchAgent
	if sets == nil {
		a, err = s.startCollector(bin, topic, signal, oversize, sys.env, row.format, row.defaults)
	} else {
		a, err = s.agent(append([]string{"receivers.otlp.grpc.listen=" + colGRPC, "receivers.otlp.http.listen=" + colHTTP,
			"receivers.otlp." + signal + ".topic=" + topic}, sets...)...)
	}
	if err != nil {
		return row, err
	}
	defer a.stop()
	target := "http://" + colHTTP
	switch {
	case row.protocol == "grpc":
		target = colGRPC
	case row.format == load.FormatZipkin && sets == nil:
		target = "http://" + colZipkin
	}
	args := []string{"--protocol", row.protocol, "--target", target, "--signal", signal, "--count", strconv.Itoa(row.count),
		"--length", "1024", "--requests", "1000000000", "--duration", d.String(), "--concurrency", strconv.Itoa(row.concurrency()),
		"--rate", strconv.FormatFloat(float64(row.rate)/float64(row.count), 'f', -1, 64), "--exporter", row.system, "--fail-on-error=false"}
	if row.body != "" {
		args = append(args, "--body", row.body)
	}
	if row.format != "" {
		args = append(args, "--format", row.format)
	}
	a.rssPeak.Store(0)
	t0, c0, sw0 := time.Now(), a.cpuTicks(), proc.Switches(a.cmd.Process.Pid)
	res, err := s.otlpLoad(args...)
	if err != nil {
		return row, err
	}
	// Delivery ends when the end offsets have not moved for 3 s (the
	// Collector's queue and the spool drain after the answers; 1 s in a
	// quick run).
	settle := 3 * time.Second
	if s.quick {
		settle = time.Second
	}
	last, lastAt, lastTicks, lastSw := endOffsets(adm, topic), time.Now(), a.cpuTicks(), proc.Switches(a.cmd.Process.Pid)
	for quiet := time.Now(); time.Since(quiet) < settle && time.Since(t0) < 5*time.Minute; {
		time.Sleep(250 * time.Millisecond)
		if n := endOffsets(adm, topic); n != last {
			last, lastAt, lastTicks, lastSw, quiet = n, time.Now(), a.cpuTicks(), proc.Switches(a.cmd.Process.Pid), time.Now()
		}
	}
	row.switches = lastSw - sw0
	row.seconds = lastAt.Sub(t0).Seconds()
	row.logBytes = logBytes(adm, topic)
	row.cpuSec = float64(lastTicks-c0) / clkTck()
	row.rssMiB = float64(a.rssPeak.Load()) / (1 << 20)
	row.accepted, row.failed, row.failures = int64(res.Items), int64(res.Failed), res.Failures
	row.p50, row.p99 = res.P50, res.P99
	if last > 0 { // none written: nothing delivered, nothing to read
		if row.delivered, err = s.otlpItemsIn(topic, last, signal == "metrics"); err != nil {
			return row, err
		}
	}
	// CPU per item delivered: none delivered (the Collector dropping
	// batches the broker refuses) has no such figure, not CPU per one item.
	perItem := fmt.Sprintf("%.2f µs CPU per item", row.usPerItem())
	if row.delivered == 0 {
		perItem = fmt.Sprintf("%.2f s CPU, nothing delivered", row.cpuSec)
	}
	s.logf("%s %s %s, %s: %s items acknowledged, %s in Kafka (%s/s), %s, %.0f MiB peak, p99 %.1f ms, %d requests failed %s",
		row.what(), row.protocol, row.system, row.load(), report.Commas(row.accepted), report.Commas(row.delivered), report.F0(row.itemsPerSec()), perItem,
		row.rssMiB, row.p99, row.failed, row.failures)
	return row, nil
}

// otlpItemsIn reads the topic's n records back and counts the OTLP items
// in them (points: the data points of metrics requests).
func (s *suite) otlpItemsIn(topic string, n int64, points bool) (int64, error) {
	rep := filepath.Join(s.work, "otlp-col-consume.json")
	if _, err := s.bench("consume", "--bootstrap-server", s.brokers, "--topic", topic, "--otlp-items", "--timeout", "10s",
		"--num-records", strconv.FormatInt(n, 10), "--expect", strconv.FormatInt(n, 10), "--report-json", rep,
		"--otlp-points="+strconv.FormatBool(points)); err != nil {
		return 0, err
	}
	var res struct {
		Items *int64 `json:"otlp_items"`
	}
	if err := readJSON(rep, &res); err != nil || res.Items == nil {
		return 0, fmt.Errorf("reading %s back: %v", topic, err)
	}
	return *res.Items, nil
}
