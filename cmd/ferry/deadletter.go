package main

// ferry deadletter replay: the dead-letter file sent to Kafka again once
// the cause is fixed. Package deadletter does the replay (and says why the
// file is safe); this file wires it to the agent's own Kafka exporter,
// built from the configuration as the agent builds it, and prints.

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/ferryhq/ferry/buffer/spool"
	"github.com/ferryhq/ferry/config"
	"github.com/ferryhq/ferry/deadletter"
	"github.com/ferryhq/ferry/exporter"
	"github.com/ferryhq/ferry/telemetry"
)

const deadletterUsage = `ferry deadletter — records Kafka refused after their client was answered

  ferry deadletter replay [-c FILE] [--set ...] [--file PATH] --rate N [--topic T] [--dry-run]
        send the dead letters again, at most N records a second (only those
        of topic T with --topic), through the Kafka exporter of the
        configuration (its brokers, TLS, SASL, compression, partitioner)

The file is delivery.dead_letter.file, or --file. It is never edited in
place: when the replay ends, it is replaced (atomically) by the lines Kafka
did not take — refused again, of other topics, not dead letters, or not
sent because the replay was interrupted (Ctrl-C) — each as it was, in
order; it is removed if none is left. A line leaves the file only after
Kafka acknowledged its record, so a replay can duplicate (a crash between
Kafka's acknowledgement and the rename) but never lose a dead letter.
The agent must be stopped: it appends to the file through an open
descriptor, which a replaced file would not reach (the replay refuses while
the agent holds delivery.spool.dir, and holds it meanwhile).

--dry-run reads the file and counts what would be sent, per topic.
Exit status: 0 if every record sent was acknowledged, 1 if some were
refused again or the replay was interrupted (they are still in the file),
2 for bad usage or a file that could not be read or replaced.
`

func deadletterCmd(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] != "replay" {
		if len(args) > 0 && (args[0] == "help" || args[0] == "-h" || args[0] == "--help") {
			fmt.Fprint(stdout, deadletterUsage)
			return 0
		}
		fmt.Fprint(stderr, deadletterUsage)
		return 2
	}
	fs := flag.NewFlagSet("deadletter replay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, deadletterUsage) }
	var file, dlFile, topic string
	var s sets
	fs.StringVar(&file, "c", "", "configuration file (YAML)")
	fs.StringVar(&file, "config", "", "configuration file (YAML)")
	fs.Var(&s, "set", "override one key: key.path=value (repeatable)")
	fs.StringVar(&dlFile, "file", "", "dead-letter file (default: delivery.dead_letter.file)")
	fs.StringVar(&topic, "topic", "", "only the dead letters of this topic")
	rate := fs.Int("rate", 0, "at most this many records a second (required)")
	dry := fs.Bool("dry-run", false, "count what would be sent; send and change nothing")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	if fs.NArg() != 0 || *rate <= 0 {
		fmt.Fprintln(stderr, "ferry: deadletter replay needs --rate N (records a second, at least 1)")
		return 2
	}
	cfg, err := config.Load(file, s)
	if err != nil {
		fmt.Fprintln(stderr, "ferry:", err)
		return 2
	}
	if dlFile == "" {
		dlFile = cfg.Delivery.DeadLetter.File
	}
	// A line holds a record the exporter took, in base64 (4/3 of it), and
	// its error: a longer one is not read, only kept.
	o := deadletter.ReplayOptions{File: dlFile, Topic: topic, Rate: *rate, DryRun: *dry,
		MaxLineBytes: int(max(deadletter.DefaultMaxLineBytes, 2*cfg.SpoolRecordBytes()+1<<20))}
	if *dry {
		sum, err := deadletter.Replay(context.Background(), o, nil)
		if err != nil {
			fmt.Fprintln(stderr, "ferry:", err)
			return 2
		}
		printReplay(stdout, sum, true)
		return 0
	}
	if _, err := os.Stat(dlFile); err != nil {
		fmt.Fprintln(stderr, "ferry:", err)
		return 2
	}
	// Only the modes with a spool write dead letters, and only their
	// agents lock the spool directory: in kafka mode there is nothing to
	// hold (and nothing to create in a directory the agent never uses).
	release, herr := func() {}, error(nil)
	if cfg.Delivery.Mode == "spool" || cfg.Delivery.Mode == "spill" {
		release, herr = spool.Hold(cfg.Delivery.Spool.Dir)
	}
	if herr != nil {
		fmt.Fprintf(stderr, "ferry: %v: stop the agent before replaying its dead letters (it appends to %s through an open descriptor, which the replaced file would not reach)\n", herr, dlFile)
		return 2
	}
	defer release()
	exp, err := replayExporter(cfg, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "ferry:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := exp.Start(ctx); err != nil {
		fmt.Fprintln(stderr, "ferry:", err)
		return 2
	}
	pr := newProgress(stderr, exp.Up)
	o.Progress = pr.show
	sum, rerr := deadletter.Replay(ctx, o, exp)
	pr.done()
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_ = exp.Shutdown(sctx)
	cancel()
	if sum != nil {
		printReplay(stdout, sum, false)
	}
	if rerr != nil {
		fmt.Fprintln(stderr, "ferry:", rerr)
		return 2
	}
	if sum.FailedTotal() > 0 || sum.Interrupted || sum.Unanswered > 0 {
		return 1
	}
	return 0
}

// replayExporter builds the configuration's exporter as the agent does
// (exporter.kafka: brokers, TLS, SASL, acks, idempotence, compression,
// partitioner), creating no topic. It logs at warn and above: the progress
// line says the rest.
func replayExporter(cfg *config.Config, stderr io.Writer) (exporter.Exporter, error) {
	if cfg.Exporter.Type != "kafka" {
		return nil, fmt.Errorf("exporter.type is %q: dead letters are replayed to Kafka only (a blackhole would discard them and empty the file)", cfg.Exporter.Type)
	}
	tc := cfg.Telemetry.Config
	if l := strings.ToLower(tc.Log.Level); l == "info" || l == "" {
		tc.Log.Level = "warn"
	}
	set := telemetry.NewSettings(tc, stderr)
	f := cfg.Exporter.Factory()
	exp, err := f.Create(cfg.Exporter.Config(cfg.Exporter.Type), exporter.Env{Set: set, BufferedBytes: int64(cfg.Queue.MemoryLimit)})
	if err != nil {
		return nil, fmt.Errorf("exporter.%s: %w", cfg.Exporter.Type, err)
	}
	return exp, nil
}

func printReplay(w io.Writer, s *deadletter.ReplaySummary, dry bool) {
	verb := "sent"
	if dry {
		verb = "would send"
	}
	fmt.Fprintf(w, "%s: %d lines; %s %d", s.File, s.Lines, verb, s.Sent)
	if len(s.Topics) > 0 {
		fmt.Fprintf(w, " (%s)", counts(s.Topics))
	}
	fmt.Fprintln(w)
	if n := s.FailedTotal(); n > 0 {
		fmt.Fprintf(w, "refused again: %d (%s)\n", n, counts(s.Failed))
	}
	if s.Skipped > 0 {
		fmt.Fprintf(w, "skipped: %d of other topics\n", s.Skipped)
	}
	if s.Unreadable > 0 {
		fmt.Fprintf(w, "not dead letters: %d lines\n", s.Unreadable)
	}
	if s.TooLong > 0 {
		fmt.Fprintf(w, "too long to be dead letters: %d lines, not read (left in the file)\n", s.TooLong)
	}
	if s.Interrupted {
		fmt.Fprintf(w, "interrupted: %d not sent, %d sent without an answer from Kafka (a later replay may duplicate those)\n", s.NotSent, s.Unanswered)
	}
	switch {
	case dry:
	case s.Removed:
		fmt.Fprintf(w, "every dead letter is in Kafka: %s removed\n", s.File)
	case s.Kept > 0:
		fmt.Fprintf(w, "%d lines left in %s\n", s.Kept, s.File)
	}
}

// counts is "a=3, b=1", sorted by name.
func counts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s=%d", k, m[k])
	}
	return b.String()
}

// progress shows a replay's progress on stderr: a bar redrawn in place on
// a terminal, else a line each second.
type progress struct {
	w   io.Writer
	tty bool
	up  func() bool
	// last: the bar last drawn (a terminal), or what the last line said
	// (else).
	last string
}

func newProgress(w io.Writer, up func() bool) *progress {
	p := &progress{w: w, up: up}
	if f, ok := w.(*os.File); ok {
		p.tty = isTTY(f)
	}
	return p
}

// isTTY reports whether f is a terminal.
func isTTY(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

func (p *progress) show(r deadletter.ReplayProgress) {
	done := r.Sent + r.Failed + r.Skipped
	rate := 0.0
	if s := r.Elapsed.Seconds(); s > 0 {
		rate = float64(r.Sent+r.Failed) / s
	}
	kafka := ""
	if !p.up() {
		kafka = "  kafka unreachable"
	}
	stats := fmt.Sprintf("%d/%d  sent %d  failed %d  skipped %d  in flight %d  %.0f/s  %s%s",
		done, r.Lines, r.Sent, r.Failed, r.Skipped, r.InFlight, rate, r.Elapsed.Round(time.Second), kafka)
	if !p.tty {
		// A line a second, none that says nothing new.
		key := fmt.Sprint(done, r.Sent, r.Failed, r.InFlight, kafka)
		if key != p.last {
			p.last = key
			fmt.Fprintln(p.w, "replay:", stats)
		}
		return
	}
	const width = 24
	filled := 0
	if r.Lines > 0 {
		filled = min(width, done*width/r.Lines)
	}
	line := fmt.Sprintf("\r[%s%s] %s", bytes.Repeat([]byte("#"), filled), bytes.Repeat([]byte("."), width-filled), stats)
	// Blank what a longer previous line left.
	if pad := len(p.last) - len(line); pad > 0 {
		line += strings.Repeat(" ", pad)
	}
	p.last = line
	fmt.Fprint(p.w, line)
}

func (p *progress) done() {
	if p.tty && p.last != "" {
		fmt.Fprintln(p.w)
	}
}
