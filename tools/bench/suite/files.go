package suite

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/tools/bench/fileload"
	"github.com/ferryhq/ferry/tools/bench/proc"
	"github.com/ferryhq/ferry/tools/bench/report"
)

// Log files into Kafka (issue 33): ferry's files receiver beside the
// OpenTelemetry Collector's filelog receiver → kafka exporter and rsyslog's
// imfile → omkafka, on the same files (tools/bench/fileload) and the same
// broker. Throughput: a backlog of lines written before the agent starts,
// read from the start; the run ends when the topic holds every line (or
// stops growing), so lines/s and CPU per line cover the whole delivery.
// Loss: lines written at a fixed rate while the files rotate (both ways)
// and while the agent is killed with SIGKILL and started again; the topic
// read back and every line counted by its id.

// filesSystem is one agent setup.
type filesSystem struct {
	name  string
	kind  string // ferry, otelcol, rsyslog
	tuned bool   // the peers: set alike to ferry (lz4, acks all, batching, checkpoints)
}

var filesSystems = []filesSystem{
	{"ferry", "ferry", false},
	{"OpenTelemetry Collector filelog, defaults", "otelcol", false},
	{"OpenTelemetry Collector filelog, tuned", "otelcol", true},
	{"rsyslog imfile → omkafka, defaults", "rsyslog", false},
	{"rsyslog imfile → omkafka, tuned", "rsyslog", true},
}

type filesRow struct {
	system    filesSystem
	size      int
	files     int
	written   int64
	delivered int64
	lost      int64
	dups      int64
	seconds   float64 // first line in Kafka → last
	cpuSec    float64 // the agent's CPU from its start until the last line was in Kafka
	rssMiB    float64
	// loss rows
	loss       string // "", "rename", "copytruncate", "kill"
	window     int64  // copytruncate: lines written between copy and truncate
	rotations  int64
	kills      int
	note       string
	incomplete bool // the run ended before every line was in Kafka
}

func (r filesRow) linesPerSec() float64 { return float64(r.delivered) / max(r.seconds, 1e-9) }
func (r filesRow) usPerLine() float64   { return r.cpuSec * 1e6 / max(float64(r.delivered), 1) }

// filesAgent starts one system tailing glob into topic, its state in dir.
func (s *suite) filesAgent(sys filesSystem, glob, topic, dir string) (*benchAgent, error) {
	switch sys.kind {
	case "ferry":
		return s.agent("receivers.files.enabled=true", "receivers.files.include=["+glob+"]", "receivers.files.topic="+topic,
			"receivers.files.checkpoint_dir="+filepath.Join(dir, "ferry-files"), "receivers.files.start_at=beginning")
	case "otelcol":
		return s.startPeer(sys, s.otelcol, []string{"--config", s.writeConf(dir, "otelcol.yaml", filelogConfig(s.brokers, topic, glob, dir, sys.tuned))})
	case "rsyslog":
		conf := s.writeConf(dir, "rsyslog.conf", rsyslogConfig(s.brokers, topic, glob, dir, sys.tuned))
		return s.startPeer(sys, s.rsyslogd, []string{"-n", "-f", conf, "-i", filepath.Join(dir, "rsyslogd.pid")})
	}
	return nil, fmt.Errorf("unknown system %q", sys.kind)
}

func (s *suite) writeConf(dir, name, body string) string {
	p := filepath.Join(dir, name)
	_ = os.WriteFile(p, []byte(body), 0o644)
	return p
}

// startPeer runs a peer's binary; it is up when its process is (both read
// files, nothing to probe), so a short grace for its start.
func (s *suite) startPeer(sys filesSystem, bin string, args []string) (*benchAgent, error) {
	// Appended, a line per start: the log of a run that lost lines is
	// still there after the next one.
	logf, err := os.OpenFile(filepath.Join(s.work, sys.kind+"-files.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(logf, "==== %s %s\n", time.Now().Format(time.RFC3339), sys.name)
	a := &benchAgent{s: s, done: make(chan struct{})}
	a.cmd = exec.Command(bin, args...)
	a.cmd.Stdout, a.cmd.Stderr = logf, logf
	if err := a.cmd.Start(); err != nil {
		return nil, err
	}
	go a.sample()
	time.Sleep(300 * time.Millisecond)
	if proc.StatusKB(a.cmd.Process.Pid, "VmRSS") == 0 {
		a.stop()
		log, _ := os.ReadFile(logf.Name())
		return nil, fmt.Errorf("%s exited at start:\n%s", sys.name, log)
	}
	return a, nil
}

// kill ends an agent with SIGKILL, as a crash would.
func (a *benchAgent) kill() {
	a.stopped.Do(func() {
		close(a.done)
		_ = a.cmd.Process.Signal(syscall.SIGKILL)
		_ = a.cmd.Wait()
	})
}

// filelogConfig: filelog → kafka. Defaults: what a user writes first
// (the exporter's own producer settings: no compression, acks from the
// leader; no checkpoint storage, so a restart reads from start_at again).
// Tuned alike to ferry: checkpoints in file_storage, the batch processor,
// lz4 and acks from all replicas.
func filelogConfig(brokers, topic, glob, dir string, tuned bool) string {
	ext, storage, procs, producer := "", "", "", ""
	if tuned {
		ext = fmt.Sprintf("extensions:\n  file_storage: {directory: %s}\n", dir)
		storage = ", storage: file_storage"
		procs = "\nprocessors:\n  batch: {send_batch_size: 8192, send_batch_max_size: 8192, timeout: 200ms}"
		producer = "\n    producer: {compression: lz4, required_acks: all, max_message_bytes: 1000000}"
	}
	pipeline := "{receivers: [file_log], exporters: [kafka]}"
	service := ""
	if tuned {
		pipeline = "{receivers: [file_log], processors: [batch], exporters: [kafka]}"
		service = "\n  extensions: [file_storage]"
	}
	return fmt.Sprintf(`%sreceivers:
  file_log: {include: [%s], start_at: beginning%s}%s
exporters:
  kafka:
    brokers: [%s]
    logs: {topic: %s, encoding: raw}%s
service:%s
  telemetry:
    metrics: {level: none}
    logs: {level: warn}
  pipelines:
    logs: %s
`, ext, glob, storage, procs, brokers, topic, producer, service, pipeline)
}

// rsyslogConfig: imfile → omkafka, rsyslogd in the foreground with its own
// work directory (never /etc/rsyslog.conf). Defaults: imfile writes its
// position only when it closes a file (persistStateInterval 0), omkafka
// librdkafka's defaults (no compression). Tuned alike to ferry: the
// position written every 1,000 lines, copytruncate followed
// (reopenOnTruncate), lz4, acks from all replicas, a 5 ms linger.
func rsyslogConfig(brokers, topic, glob, dir string, tuned bool) string {
	input, action := "", ""
	if tuned {
		input = ` persistStateInterval="1000" reopenOnTruncate="on"`
		action = ` confParam=["compression.codec=lz4", "queue.buffering.max.ms=5", "batch.num.messages=10000"] topicConfParam=["request.required.acks=-1"]`
	}
	return fmt.Sprintf(`global(workDirectory="%s" maxMessageSize="64k")
module(load="imfile")
module(load="omkafka")
template(name="line" type="string" string="%%msg%%")
input(type="imfile" file="%s" tag="files"%s)
action(type="omkafka" broker=["%s"] topic="%s" template="line"%s)
`, dir, glob, input, brokers, topic, action)
}

// filesBench runs the throughput cases and the loss cases for every system.
func (s *suite) filesBench() ([]filesRow, error) {
	s.stepf("log files into Kafka: ferry beside the Collector's filelog and rsyslog's imfile (issue 33)")
	bin, err := s.exec("scripts/otelcol-local", "build")
	if err != nil {
		return nil, err
	}
	s.otelcol = strings.TrimSpace(bin)
	// rsyslog comes from the distribution's packages (apt-get, root or
	// sudo): where it cannot be installed its rows are left out and the
	// report says so, rather than the whole suite failing.
	s.rsyslogd, s.filesNote = "", ""
	if bin, err = s.exec("scripts/rsyslog-local", "install"); err != nil {
		s.filesNote = "rsyslog could not be installed on this machine (`scripts/rsyslog-local install`): its rows are missing."
		s.logf("%s", s.filesNote)
	} else {
		s.rsyslogd = strings.TrimSpace(bin)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.brokers))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	var rows []filesRow
	type tcase struct {
		size, files int
		lines       int64 // over all files
	}
	cases := []tcase{{100, 1, 500_000}, {100, 100, 500_000}, {1000, 1, 200_000}, {1000, 100, 200_000}}
	if s.quick {
		cases = []tcase{{100, 1, 20_000}, {1000, 10, 5_000}}
	}
	systems := filesSystems
	if s.rsyslogd == "" {
		systems = nil
		for _, sys := range filesSystems {
			if sys.kind != "rsyslog" {
				systems = append(systems, sys)
			}
		}
	}
	for _, c := range cases {
		for _, sys := range systems {
			r, err := s.filesThroughput(adm, sys, c.size, c.files, c.lines)
			if err != nil {
				return nil, err
			}
			rows = append(rows, r)
		}
	}
	losses := []string{"rename", "copytruncate", "kill"}
	if s.quick {
		losses = []string{"kill"} // rotation by rename on the way; copytruncate's writer is unit-tested
	}
	for _, loss := range losses {
		for _, sys := range systems {
			if sys.kind != "ferry" && !sys.tuned && (loss != "kill" || s.quick) {
				continue // rotation: the tuned peers (reopenOnTruncate); kill: both, checkpoints differ
			}
			r, err := s.filesLoss(sys, loss)
			if err != nil {
				return nil, err
			}
			rows = append(rows, r)
		}
	}
	return rows, nil
}

// filesThroughput: a backlog of lines in files, then the agent.
func (s *suite) filesThroughput(adm *kadm.Client, sys filesSystem, size, files int, lines int64) (filesRow, error) {
	row := filesRow{system: sys, size: size, files: files}
	topic, err := s.topic("files", 3)
	if err != nil {
		return row, err
	}
	defer s.deleteTopic(topic)
	dir, err := os.MkdirTemp(s.work, "files")
	if err != nil {
		return row, err
	}
	defer os.RemoveAll(dir)
	spec := fileload.Spec{Dir: filepath.Join(dir, "logs"), Files: files, Lines: lines / int64(files), LineSize: size}
	w, err := fileload.Start(context.Background(), spec)
	if err != nil {
		return row, err
	}
	<-w.Done()
	if err := w.Stop(); err != nil {
		return row, err
	}
	row.written = w.Total()
	a, err := s.filesAgent(sys, spec.Glob(), topic, dir)
	if err != nil {
		return row, err
	}
	defer a.stop()
	c0 := a.cpuTicks()
	limit := 120 * time.Second
	settle := 5 * time.Second
	if s.quick {
		limit, settle = 30*time.Second, 2*time.Second
	}
	var first time.Time
	last, lastAt, lastTicks := int64(0), time.Now(), c0
	for start := time.Now(); time.Since(start) < limit; {
		time.Sleep(100 * time.Millisecond)
		n := endOffsets(adm, topic)
		if n > last {
			if first.IsZero() {
				first = time.Now()
			}
			last, lastAt, lastTicks = n, time.Now(), a.cpuTicks()
		}
		if n >= row.written || (!first.IsZero() && time.Since(lastAt) > settle) || (first.IsZero() && time.Since(start) > 30*time.Second) {
			break
		}
	}
	row.cpuSec = float64(lastTicks-c0) / clkTck()
	if !first.IsZero() {
		row.seconds = lastAt.Sub(first).Seconds()
	}
	row.rssMiB = float64(a.rssPeak.Load()) / (1 << 20)
	a.stop()
	res, err := s.filesCount(topic, w)
	if err != nil {
		return row, err
	}
	row.delivered, row.lost, row.dups = res.Delivered, res.Lost, res.Duplicated
	row.incomplete = row.lost > 0
	s.logf("%d × %d B lines in %d files, %s: %s lines/s, %.2f µs CPU per line, %.0f MiB peak; %s", row.written, size, files, sys.name,
		report.F0(row.linesPerSec()), row.usPerLine(), row.rssMiB, res)
	return row, nil
}

// filesCount reads topic back and counts w's lines in it.
func (s *suite) filesCount(topic string, w *fileload.Writer) (fileload.Result, error) {
	c := fileload.NewCounter(w.Spec().Run, w.Written(), w.Windows())
	quiet := 5 * time.Second
	if s.quick {
		quiet = 2 * time.Second
	}
	return fileload.Check(context.Background(), s.brokers, topic, c, quiet, 5*time.Minute, func(r fileload.Result) { s.logf("reading back: %s", r) })
}

// filesLoss: lines at a fixed rate into 10 files rotated every 2 s (rename
// and create, or copytruncate), or rotated by rename every second while the
// agent is killed (SIGKILL) and started again three times; then the topic
// is read back.
func (s *suite) filesLoss(sys filesSystem, loss string) (filesRow, error) {
	row := filesRow{system: sys, size: 100, files: 10, loss: loss}
	topic, err := s.topic("files-loss", 3)
	if err != nil {
		return row, err
	}
	defer s.deleteTopic(topic)
	dir, err := os.MkdirTemp(s.work, "files")
	if err != nil {
		return row, err
	}
	defer os.RemoveAll(dir)
	total, kills := 20*time.Second, 3
	rate := 5000
	if s.quick {
		total, kills, rate = 5*time.Second, 1, 2000
	}
	spec := fileload.Spec{Dir: filepath.Join(dir, "logs"), Files: row.files, Rate: rate, LineSize: row.size,
		Rotate: fileload.Rename, RotateEvery: 2 * time.Second}
	switch loss {
	case "copytruncate":
		spec.Rotate = fileload.CopyTruncate
	case "kill":
		spec.RotateEvery = time.Second
	}
	if err := os.MkdirAll(spec.Dir, 0o755); err != nil {
		return row, err
	}
	// The files exist before the agent starts, so start_at is moot.
	ctx, cancel := context.WithTimeout(context.Background(), total)
	defer cancel()
	w, err := fileload.Start(ctx, spec)
	if err != nil {
		return row, err
	}
	a, err := s.filesAgent(sys, spec.Glob(), topic, dir)
	if err != nil {
		w.Stop()
		return row, err
	}
	if loss == "kill" {
		row.kills = kills
		for k := 0; k < kills; k++ {
			time.Sleep(total/time.Duration(kills+1) - time.Second)
			for n := w.Rotations(); w.Rotations() == n; {
				time.Sleep(time.Millisecond)
			}
			a.kill()
			time.Sleep(500 * time.Millisecond)
			if a, err = s.filesAgent(sys, spec.Glob(), topic, dir); err != nil {
				w.Stop()
				return row, err
			}
		}
	}
	<-w.Done()
	if err := w.Stop(); err != nil {
		a.stop()
		return row, err
	}
	// Let the agent finish (rsyslog and the Collector have no lag to ask).
	settle := 5 * time.Second
	if s.quick {
		settle = 2 * time.Second
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.brokers))
	if err != nil {
		a.stop()
		return row, err
	}
	adm := kadm.NewClient(cl)
	last, lastAt := endOffsets(adm, topic), time.Now()
	for time.Since(lastAt) < settle && time.Since(lastAt) < 2*time.Minute {
		time.Sleep(250 * time.Millisecond)
		if n := endOffsets(adm, topic); n != last {
			last, lastAt = n, time.Now()
		}
	}
	cl.Close()
	a.stop()
	res, err := s.filesCount(topic, w)
	if err != nil {
		return row, err
	}
	row.written, row.delivered, row.lost, row.dups = res.Written, res.Delivered, res.Lost, res.Duplicated
	row.window, row.rotations = res.LostInWindow, w.Rotations()
	row.note = spec.Describe()
	s.logf("%s, %s: %s", loss, sys.name, res)
	return row, nil
}

// ---- the report ----

const (
	filesBegin = "<!-- files:begin -->"
	filesEnd   = "<!-- files:end -->"
)

func (s *suite) writeFiles(rows []filesRow) {
	s.doc.P("%s", filesBegin)
	s.doc.H("10. Log files into Kafka: ferry beside the Collector's filelog and rsyslog's imfile (issue 33)")
	s.doc.P("The same files (`tools/bench/fileload`: lines of 100 B or 1 KB, each with a writer and a sequence id, padded with")
	s.doc.P("log-like text) read by each agent in turn into a fresh 3-partition topic of the same broker. **ferry**: `receivers.files` at its")
	s.doc.P("defaults (lz4, acks all, adaptive linger of at most 50 ms, a checkpoint a second). **The Collector** (v0.155.0, `scripts/otelcol-local`): filelog →")
	s.doc.P("kafka (`encoding: raw`, a message per line); at its *defaults* the exporter's own producer settings (no compression, acks from")
	s.doc.P("the leader) and no checkpoint storage; *tuned* alike to ferry: `file_storage` checkpoints, the batch processor (8,192), lz4,")
	s.doc.P("acks all. **rsyslog** (Debian's 8.2302 with `rsyslog-kafka`, `scripts/rsyslog-local`; `rsyslogd -n` with its own config and")
	s.doc.P("work directory): imfile → omkafka (`template %%msg%%`); at its *defaults* librdkafka's producer (no compression) and imfile's")
	s.doc.P("position written only when a file is closed; *tuned*: the position every 1,000 lines, `reopenOnTruncate`, lz4, acks all,")
	s.doc.P("5 ms linger. Every agent reads from the files' first byte.")
	s.doc.P("")
	if s.filesNote != "" {
		s.doc.P("> %s", s.filesNote)
		s.doc.P("")
	}
	s.doc.P("**Throughput**: the lines are written before the agent starts (the writer's CPU is not in the figures); the run ends when")
	s.doc.P("the topic holds every line (or stops growing for 5 s). **lines/s** counts from the first line in Kafka to the last, **CPU µs")
	s.doc.P("per line** the agent's CPU from its start to the last line over the lines in Kafka; then the topic is read back.")
	s.doc.P("")
	var out [][]string
	cats := []string{}
	series := map[string][]float64{}
	var names []string
	for _, r := range rows {
		if r.loss != "" {
			continue
		}
		cat := fmt.Sprintf("%s, %d file%s", sizeName(r.size), r.files, plural(r.files))
		if len(cats) == 0 || cats[len(cats)-1] != cat {
			cats = append(cats, cat)
		}
		if _, ok := series[r.system.name]; !ok {
			names = append(names, r.system.name)
		}
		series[r.system.name] = append(series[r.system.name], r.usPerLine())
		vs := "–"
		if b, ok := filesBase(rows, r); ok && b.system != r.system {
			vs = report.Ratio(r.usPerLine(), b.usPerLine()) + " CPU, " + report.Ratio(r.linesPerSec(), b.linesPerSec()) + " lines/s"
		}
		lost := report.Commas(r.lost)
		if r.lost > 0 {
			lost = "**" + lost + "** (not in Kafka when the run ended)"
		}
		out = append(out, []string{cat, r.system.name, report.F0(r.linesPerSec()), fmt.Sprintf("%.2f", r.usPerLine()), vs,
			fmt.Sprintf("%.0f%%", r.cpuSec/max(r.seconds, 1e-9)*100), fmt.Sprintf("%.0f MiB", r.rssMiB),
			report.Commas(r.written), report.Commas(r.delivered), lost, report.Commas(r.dups)})
	}
	s.doc.Table([]string{"lines", "agent", "lines/s into Kafka", "CPU µs per line", "vs the Collector (defaults)", "agent CPU", "peak RSS",
		"lines written", "in Kafka", "lost", "duplicated"}, out)
	var ss []report.Series
	for _, n := range names {
		ss = append(ss, report.Series{Name: n, Values: series[n]})
	}
	if md := s.doc.Chart("files-cpu.svg", "Log files into Kafka: agent CPU per line (lower is better)", "µs", cats, ss); md != "" {
		s.doc.P("%s", md)
		s.doc.P("")
	}
	s.doc.P("**Loss**: 10 files written at a fixed rate (100 B lines), rotated every 2 s by rename and create or by copytruncate;")
	s.doc.P("and rotated by rename every second while the agent is killed with SIGKILL just after a rotation and started again 0.5 s")
	s.doc.P("later. Then the topic is read back and every line counted by its id. copytruncate's **window** is the lines written")
	s.doc.P("between the copy and the truncation, gone from the disk before any reader could be sure to have them; lines not yet read")
	s.doc.P("when the file was truncated are in the copy, which no agent reads (it is outside the include glob). The peers run tuned")
	s.doc.P("for the rotations; killed at both settings, since their checkpoints differ.")
	s.doc.P("")
	out = nil
	for _, r := range rows {
		if r.loss == "" {
			continue
		}
		what := map[string]string{"rename": "rotated by rename and create every 2 s", "copytruncate": "rotated by copytruncate every 2 s",
			"kill": fmt.Sprintf("SIGKILL ×%d just after a rotation (rename every 1 s)", r.kills)}[r.loss]
		lost := report.Commas(r.lost)
		if r.lost > 0 {
			lost = "**" + lost + "**"
			if r.loss == "copytruncate" {
				lost += fmt.Sprintf(" (%s in the window)", report.Commas(r.window))
			}
		}
		out = append(out, []string{what, r.system.name, r.note, report.Commas(r.written), report.Commas(r.delivered), lost, report.Commas(r.dups)})
	}
	s.doc.Table([]string{"case", "agent", "load", "lines written", "in Kafka", "lost", "duplicated"}, out)
	s.doc.P("Reproduce: `bin/ferry-bench suite --only files` (this section alone, rewritten in place in BENCHMARKS.md; Kafka on")
	s.doc.P("`--port`); `make faults` proves ferry's side of the loss cases against the real binary (docs/reliability.md).")
	s.doc.P("%s", filesEnd)
}

// filesBase is the Collector's row (at its defaults) of r's case.
func filesBase(rows []filesRow, r filesRow) (filesRow, bool) {
	for _, b := range rows {
		if b.loss == "" && b.size == r.size && b.files == r.files && b.system.kind == "otelcol" && !b.system.tuned {
			return b, true
		}
	}
	return filesRow{}, false
}

// filesSummary: the summary's line, ferry's CPU per line against the
// Collector's (goal ≤ 0.5×), at 100 B and 100 files.
func filesSummary(rows []filesRow) [][]string {
	var out [][]string
	for _, r := range rows {
		if r.loss != "" || r.system.kind != "ferry" {
			continue
		}
		b, ok := filesBase(rows, r)
		if !ok {
			continue
		}
		out = append(out, []string{fmt.Sprintf("log files → Kafka, %s lines, %d file%s: CPU per line vs the Collector's filelog (issue 33: ≤ 0.5×)", sizeName(r.size), r.files, plural(r.files)),
			"–", fmt.Sprintf("%.2f µs vs %.2f µs per line; %s vs %s lines/s", r.usPerLine(), b.usPerLine(), report.F0(r.linesPerSec()), report.F0(b.linesPerSec())),
			report.Ratio(r.usPerLine(), b.usPerLine())})
	}
	return out
}

func sizeName(n int) string {
	if n >= 1000 {
		return strconv.Itoa(n/1000) + " KB"
	}
	return strconv.Itoa(n) + " B"
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// replaceSection puts a section of the report (between its markers begin
// and end, which section holds) into path in place, or before Reproduce
// if the markers are not there yet: how --only rewrites one section.
func replaceSection(path, begin, end, section string) error {
	old, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	doc := string(old)
	section = strings.TrimPrefix(section, "\n")
	i, j := strings.Index(doc, begin), strings.Index(doc, end)
	if i >= 0 && j > i {
		doc = doc[:i] + strings.TrimSuffix(section, "\n") + doc[j+len(end):]
	} else if k := strings.Index(doc, "\n## Reproduce"); k >= 0 {
		doc = doc[:k] + "\n" + section + doc[k:]
	} else {
		doc += "\n" + section
	}
	return os.WriteFile(path, []byte(doc), 0o644)
}
