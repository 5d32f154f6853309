// Package fleet owns `ferry-bench fleet`: many ferry agents on one machine
// against one Kafka cluster, each fed by its own load process, to measure
// what a fleet of hosts costs the cluster — connections, requests by API,
// records and bytes per batch, broker and agent CPU — as the number of
// agents grows while the total load stays the same. docs/scaling.md is
// written from its table and turns it into a sizing rule.
package fleet

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
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
)

// Config is one fleet run: every (agents, linger) pair is measured with the
// same total load.
type Config struct {
	Agents   []int
	Lingers  []Linger
	Rate     float64 // records/s offered by the whole fleet
	Size     int     // bytes per record value
	Batch    int     // records per HTTP request
	Duration time.Duration
	Warmup   time.Duration // load before the measured window: start-up metadata and connections are not the steady state
	// ClusterWarmup is an unmeasured row (the first linger, the largest
	// fleet) before the first measured one. The brokers' JVMs compile their
	// hot paths during their first minutes under load, and that cost was
	// billed to whichever row came first: on 2026-11-28 the same row
	// (16 agents, fixed 50 ms) measured its brokers at 156 %, 137 %, 119 %
	// and 94 % of a core in the first four rows after the cluster started.
	ClusterWarmup time.Duration
	Concurrency   int // requests in flight per agent; 0 = enough for the rate at 200 ms a request
	Partitions    int
	Brokers       string // an existing cluster; empty = start one
	Port          int    // first port of the cluster started
	Nodes         int
	Ferry         string
	Out           string // file with <!-- fleet:begin/end --> to rewrite; empty = stdout only
}

// Report is a whole fleet run.
type Report struct {
	Rows    []Row
	Machine string
	// IdleBrokerCPU is the cluster's own CPU (% of one core) with no
	// agent: the floor every row's brokers' CPU includes.
	IdleBrokerCPU float64
}

// Linger is how a row's agents batch: a fixed linger every batch waits
// (exporter.kafka.linger_mode fixed), or the adaptive default, which sends
// at once while no request is in flight and waits at most Cap otherwise (0:
// the default cap).
type Linger struct {
	Adaptive bool
	Cap      time.Duration
}

// ParseLinger reads "50ms" (fixed), "adaptive" (the default mode and cap)
// or "adaptive:50ms" (the default mode, a 50 ms cap).
func ParseLinger(s string) (Linger, error) {
	s = strings.TrimSpace(s)
	if rest, ok := strings.CutPrefix(s, "adaptive"); ok {
		l := Linger{Adaptive: true}
		if rest == "" {
			return l, nil
		}
		d, err := time.ParseDuration(strings.TrimPrefix(rest, ":"))
		if err != nil || !strings.HasPrefix(rest, ":") || d <= 0 {
			return Linger{}, fmt.Errorf("%q: want adaptive or adaptive:<cap>, e.g. adaptive:50ms", s)
		}
		l.Cap = d
		return l, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return Linger{}, fmt.Errorf("%q: want a duration (fixed linger), adaptive or adaptive:<cap>", s)
	}
	return Linger{Cap: d}, nil
}

// String is the flag's spelling (and the table's linger column).
func (l Linger) String() string {
	switch {
	case !l.Adaptive:
		return l.Cap.String()
	case l.Cap == 0:
		return "adaptive"
	}
	return "adaptive:" + l.Cap.String()
}

// Row is one measured (agents, linger) pair.
type Row struct {
	Agents          int     `json:"agents"`
	Linger          string  `json:"linger"`
	Offered         float64 `json:"offered_per_sec"`
	Delivered       float64 `json:"delivered_per_sec"`
	Failed          int64   `json:"failed"`
	P99MS           float64 `json:"p99_ms"`
	ProducePerSec   float64 `json:"produce_requests_per_sec"`
	MetadataPerMin  float64 `json:"metadata_requests_per_min"`
	RecordsPerBatch float64 `json:"records_per_batch"`
	BytesPerBatch   float64 `json:"compressed_bytes_per_batch"`
	BatchesPerReq   float64 `json:"batches_per_request"`
	ConnsPerAgent   float64 `json:"connections_per_agent"`
	AgentCPU        float64 `json:"agent_cpu_pct"`
	BrokerCPU       float64 `json:"broker_cpu_pct"`
	RSSPerAgentMiB  float64 `json:"rss_per_agent_mib"`
}

// Cmd parses flags and runs the fleet.
func Cmd(args []string) error {
	fs := flag.NewFlagSet("fleet", flag.ContinueOnError)
	c := Config{}
	agents := fs.String("agents", "1,4,16", "comma-separated numbers of agents to run side by side")
	lingers := fs.String("lingers", "5ms,50ms,adaptive:2ms,adaptive", "comma-separated ways to batch to try at each size: a duration is a fixed exporter.kafka.linger every batch waits; adaptive is the default (linger_mode adaptive, its default cap, 50 ms); adaptive:2ms the adaptive mode with a 2 ms cap (the default until 2026-11-29)")
	fs.Float64Var(&c.Rate, "rate", 10000, "records/s offered by the whole fleet (split evenly over the agents)")
	fs.IntVar(&c.Size, "record-size", 200, "bytes per record")
	fs.IntVar(&c.Batch, "batch", 10, "records per HTTP request (one application's small request)")
	fs.DurationVar(&c.Duration, "duration", 20*time.Second, "measured load per row")
	fs.DurationVar(&c.Warmup, "warmup", 5*time.Second, "load before each row's measured window (connections and metadata at start-up)")
	fs.DurationVar(&c.ClusterWarmup, "cluster-warmup", 90*time.Second, "unmeasured load before the first row, so the brokers' JVMs have compiled their hot paths (0: none)")
	fs.IntVar(&c.Concurrency, "concurrency", 0, "HTTP requests in flight per agent; 0 = enough for the rate at 200 ms a request")
	fs.IntVar(&c.Partitions, "partitions", 12, "partitions of each row's topic")
	fs.StringVar(&c.Brokers, "brokers", "", "an existing cluster (host:port,...); empty = start a local one with scripts/kafka-local")
	fs.IntVar(&c.Port, "port", 29692, "first port of the local cluster started")
	fs.IntVar(&c.Nodes, "nodes", 3, "brokers in the local cluster started")
	fs.StringVar(&c.Ferry, "ferry", "bin/ferry", "the ferry binary")
	fs.StringVar(&c.Out, "out", "", "a file holding <!-- fleet:begin --> and <!-- fleet:end --> whose text between them is replaced by the table")
	if err := fs.Parse(args); err != nil {
		return err
	}
	for _, f := range strings.Split(*agents, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 64 {
			return fmt.Errorf("--agents: %q is not a number 1..64", f)
		}
		c.Agents = append(c.Agents, n)
	}
	for _, f := range strings.Split(*lingers, ",") {
		l, err := ParseLinger(f)
		if err != nil {
			return fmt.Errorf("--lingers: %v", err)
		}
		c.Lingers = append(c.Lingers, l)
	}
	rep, err := Run(c)
	if err != nil {
		return err
	}
	table := Markdown(c, rep)
	fmt.Print(table)
	if c.Out != "" {
		return report.ReplaceSection(c.Out, "<!-- fleet:begin -->", "<!-- fleet:end -->", table)
	}
	return nil
}

func progress(start time.Time, format string, a ...any) {
	fmt.Fprintf(os.Stderr, "[%s] fleet: %s\n", time.Since(start).Round(time.Second), fmt.Sprintf(format, a...))
}

// Run measures every row.
func Run(c Config) (Report, error) {
	rep := Report{Machine: report.MachineLine()}
	start := time.Now()
	self, err := os.Executable()
	if err != nil {
		return rep, err
	}
	work, err := os.MkdirTemp("", "ferry-fleet")
	if err != nil {
		return rep, err
	}
	defer os.RemoveAll(work)
	var brokerPIDs []int
	if c.Brokers == "" {
		progress(start, "starting a %d-broker cluster on port %d", c.Nodes, c.Port)
		out, err := exec.Command("scripts/kafka-local", "cluster", "start", "--brokers", strconv.Itoa(c.Nodes), "--port", strconv.Itoa(c.Port)).CombinedOutput()
		defer func() {
			_ = exec.Command("scripts/kafka-local", "cluster", "stop", "--port", strconv.Itoa(c.Port)).Run()
		}()
		if err != nil {
			return rep, fmt.Errorf("kafka-local cluster start: %v\n%s", err, out)
		}
		var hosts []string
		for i := 0; i < c.Nodes; i++ {
			p := c.Port + 2*i
			hosts = append(hosts, "127.0.0.1:"+strconv.Itoa(p))
			if b, err := os.ReadFile(filepath.Join(kafkaRoot(), strconv.Itoa(p), "kafka.pid")); err == nil {
				if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
					brokerPIDs = append(brokerPIDs, pid)
				}
			}
		}
		c.Brokers = strings.Join(hosts, ",")
	}
	adm, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(c.Brokers, ",")...))
	if err != nil {
		return rep, err
	}
	defer adm.Close()
	admin := kadm.NewClient(adm)
	if len(brokerPIDs) > 0 {
		idle := max(c.Warmup, 3*time.Second)
		progress(start, "the idle cluster's own CPU, for %s", idle)
		t0, b0 := time.Now(), proc.Ticks(brokerPIDs...)
		time.Sleep(idle)
		rep.IdleBrokerCPU = float64(proc.Ticks(brokerPIDs...)-b0) / proc.ClkTck() / time.Since(t0).Seconds() * 100
	}
	if c.ClusterWarmup > 0 && len(c.Lingers) > 0 && len(c.Agents) > 0 {
		n := slices.Max(c.Agents)
		progress(start, "warming the brokers up: %d agent(s), linger %s, for %s, not measured", n, c.Lingers[0], c.ClusterWarmup)
		w := c
		w.Warmup, w.Duration = 0, c.ClusterWarmup
		if _, err := runRow(w, self, work, admin, brokerPIDs, n, c.Lingers[0], -1); err != nil {
			return rep, fmt.Errorf("cluster warm-up: %w", err)
		}
	}
	for _, linger := range c.Lingers {
		for _, n := range c.Agents {
			progress(start, "%d agent(s), linger %s: %.0f records/s of %d B in requests of %d, for %s", n, linger, c.Rate, c.Size, c.Batch, c.Duration)
			row, err := runRow(c, self, work, admin, brokerPIDs, n, linger, len(rep.Rows))
			if err != nil {
				return rep, err
			}
			progress(start, "  delivered %.0f/s, %.0f Produce requests/s, %.1f records a batch, agents %.0f%% CPU, brokers %.0f%%",
				row.Delivered, row.ProducePerSec, row.RecordsPerBatch, row.AgentCPU, row.BrokerCPU)
			rep.Rows = append(rep.Rows, row)
		}
	}
	return rep, nil
}

func kafkaRoot() string {
	if r := os.Getenv("FERRY_KAFKA_ROOT"); r != "" {
		return r
	}
	return "/tmp/ferry-kafka"
}

func runRow(c Config, self, work string, admin *kadm.Client, brokerPIDs []int, n int, linger Linger, idx int) (Row, error) {
	topic := fmt.Sprintf("fleet-%d-%d-%d", n, idx, time.Now().Unix())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if res, err := admin.CreateTopic(ctx, int32(c.Partitions), -1, nil, topic); err != nil || res.Err != nil {
		return Row{}, fmt.Errorf("create topic %s: %v %v", topic, err, res.Err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = admin.DeleteTopics(ctx, topic)
	}()
	var agents []*agent
	defer func() {
		for _, a := range agents {
			a.stop()
		}
	}()
	for i := 0; i < n; i++ {
		a, err := startAgent(c, work, i, linger)
		if err != nil {
			return Row{}, err
		}
		agents = append(agents, a)
	}
	conc := c.Concurrency
	if conc <= 0 {
		conc = max(4, int(c.Rate/float64(n)/float64(c.Batch)*0.2))
	}
	loads := make([]*exec.Cmd, n)
	reports := make([]string, n)
	stderr := make([]bytes.Buffer, n)
	for i, a := range agents {
		reports[i] = filepath.Join(work, fmt.Sprintf("load-%d.json", i))
		loads[i] = exec.Command(self, "produce", "--target", "http://"+a.http, "--topic", topic,
			"--throughput", fmt.Sprint(c.Rate/float64(n)), "--duration", (c.Warmup + c.Duration).String(), "--num-records", "1000000000",
			"--record-size", strconv.Itoa(c.Size), "--batch", strconv.Itoa(c.Batch), "--concurrency", strconv.Itoa(conc),
			"--reporting-interval", "1000000", "--report-json", reports[i])
		loads[i].Stderr = &stderr[i]
		if err := loads[i].Start(); err != nil {
			return Row{}, err
		}
	}
	time.Sleep(c.Warmup)
	before := make([]snapshot, n)
	for i, a := range agents {
		before[i] = a.snapshot()
	}
	b0 := proc.Ticks(brokerPIDs...)
	t0 := time.Now()
	time.Sleep(c.Duration)
	after := make([]snapshot, n)
	for i, a := range agents {
		after[i] = a.snapshot()
	}
	el := time.Since(t0).Seconds()
	b1 := proc.Ticks(brokerPIDs...)
	for i, l := range loads {
		if err := l.Wait(); err != nil {
			return Row{}, fmt.Errorf("load on agent %d: %v\n%s", i, err, stderr[i].String())
		}
	}
	row := Row{Agents: n, Linger: linger.String(), Offered: c.Rate}
	var d snapshot
	for i, a := range agents {
		d.add(after[i].minus(before[i]))
		d.conns += after[i].conns
		d.cpu += after[i].cpu - before[i].cpu
		row.RSSPerAgentMiB += float64(a.rssMiB()) / float64(n)
		var res load.Result
		b, err := os.ReadFile(reports[i])
		if err == nil {
			err = json.Unmarshal(b, &res)
		}
		if err != nil {
			return Row{}, fmt.Errorf("load report of agent %d: %v", i, err)
		}
		row.Failed += res.Failed
		row.P99MS = max(row.P99MS, res.P99MS)
	}
	hz := proc.ClkTck()
	row.Delivered = d.sent / el
	row.ProducePerSec = d.produce / el
	row.MetadataPerMin = d.metadata / el * 60
	if d.batches > 0 {
		row.RecordsPerBatch = d.batchRecords / d.batches
		row.BytesPerBatch = d.batchBytes / d.batches
	}
	if d.produce > 0 {
		row.BatchesPerReq = d.batches / d.produce
	}
	row.ConnsPerAgent = d.conns / float64(n)
	row.AgentCPU = d.cpu / hz / el * 100
	if len(brokerPIDs) > 0 {
		row.BrokerCPU = float64(b1-b0) / hz / el * 100
	}
	return row, nil
}

// ---- one agent ----

type agent struct {
	cmd   *exec.Cmd
	http  string
	admin string
}

func startAgent(c Config, work string, i int, linger Linger) (*agent, error) {
	base := 30000 + 10*i
	a := &agent{http: fmt.Sprintf("127.0.0.1:%d", base), admin: fmt.Sprintf("127.0.0.1:%d", base+1)}
	dir := filepath.Join(work, fmt.Sprintf("agent-%d-%d", i, time.Now().UnixNano()))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	args := []string{"run", "--set", "exporter.kafka.brokers=[" + c.Brokers + "]"}
	if !linger.Adaptive {
		// A fixed linger is the window every batch waits, the setting
		// fleets size their brokers with (docs/scaling.md).
		args = append(args, "--set", "exporter.kafka.linger_mode=fixed", "--set", "exporter.kafka.linger="+linger.Cap.String())
	} else if linger.Cap > 0 {
		args = append(args, "--set", "exporter.kafka.linger="+linger.Cap.String())
	}
	args = append(args,
		"--set", "receivers.http.listen="+a.http, "--set", "telemetry.admin.listen="+a.admin,
		"--set", fmt.Sprintf("receivers.otlp.http.listen=127.0.0.1:%d", base+2),
		"--set", fmt.Sprintf("receivers.otlp.grpc.listen=127.0.0.1:%d", base+3),
		"--set", fmt.Sprintf("receivers.local.listen=127.0.0.1:%d", base+4),
		"--set", "receivers.local.socket="+filepath.Join(dir, "ferry.sock"),
		"--set", "telemetry.report_interval=0s",
		"--set", "delivery.spool.dir="+filepath.Join(dir, "spool"),
		"--set", "delivery.dead_letter.file="+filepath.Join(dir, "dead.ndjson"))
	logf, err := os.Create(filepath.Join(dir, "agent.log"))
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	a.cmd = exec.Command(c.Ferry, args...)
	a.cmd.Stdout, a.cmd.Stderr = logf, logf
	if err := a.cmd.Start(); err != nil {
		return nil, err
	}
	if proc.WaitReady(a.admin, 30*time.Second) {
		return a, nil
	}
	a.stop()
	log, _ := os.ReadFile(logf.Name())
	return nil, fmt.Errorf("agent %d did not become ready:\n%s", i, log)
}

func (a *agent) stop() { proc.Stop(a.cmd, 30*time.Second) }

// rssMiB is the agent's peak resident set (VmHWM) so far.
func (a *agent) rssMiB() int64 { return proc.StatusKB(a.cmd.Process.Pid, "VmHWM") >> 10 }

// snapshot is what the agent's /metrics and /proc say at one moment.
type snapshot struct {
	produce, metadata, sent float64
	batches, batchRecords   float64
	batchBytes, conns, cpu  float64
}

func (s *snapshot) add(o snapshot) {
	s.produce += o.produce
	s.sent += o.sent
	s.metadata += o.metadata
	s.batches += o.batches
	s.batchRecords += o.batchRecords
	s.batchBytes += o.batchBytes
}

func (s snapshot) minus(o snapshot) snapshot {
	return snapshot{produce: s.produce - o.produce, sent: s.sent - o.sent, metadata: s.metadata - o.metadata, batches: s.batches - o.batches,
		batchRecords: s.batchRecords - o.batchRecords, batchBytes: s.batchBytes - o.batchBytes}
}

func (a *agent) snapshot() snapshot {
	s := snapshot{cpu: float64(proc.Ticks(a.cmd.Process.Pid))}
	res, err := http.Get("http://" + a.admin + "/metrics")
	if err != nil {
		return s
	}
	defer res.Body.Close()
	s.parse(res.Body)
	return s
}

// parse adds up the series of the agent's /metrics that size a fleet.
func (s *snapshot) parse(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseFloat(f[len(f)-1], 64)
		switch name := f[0]; {
		case strings.HasPrefix(name, "ferry_exporter_kafka_requests_total{") && strings.Contains(name, `api="Produce"`):
			s.produce += v
		case strings.HasPrefix(name, "ferry_exporter_kafka_requests_total{") && strings.Contains(name, `api="Metadata"`):
			s.metadata += v
		case strings.HasPrefix(name, "ferry_exporter_kafka_batch_records_count"):
			s.batches += v
		case strings.HasPrefix(name, "ferry_exporter_kafka_batch_records_sum"):
			s.batchRecords += v
		case strings.HasPrefix(name, "ferry_exporter_kafka_batch_compressed_bytes_sum"):
			s.batchBytes += v
		case strings.HasPrefix(name, "ferry_exporter_sent_records_total"):
			s.sent += v
		case strings.HasPrefix(name, "ferry_exporter_kafka_connections"):
			s.conns += v
		}
	}
}
