package main

// ferry spool inspect|verify|dump: the disk spool of a stopped agent, read
// without changing it (package spool's Inspect and Scan do the reading and
// the predicting; this file only prints).

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/ferryhq/ferry/buffer/spool"
	"github.com/ferryhq/ferry/config"
)

const spoolUsage = `ferry spool — the disk spool of a stopped agent, read without changing it

  ferry spool inspect [-c FILE] [--dir DIR] [--json] [--force]
        segments (size, frames, records, first and last frame, acknowledged or
        pending), records per topic, damage, and what a restart would replay
  ferry spool verify  [-c FILE] [--dir DIR] [--json] [--force]
        every damaged stretch (segment, offset, kind) and what recovery does
        with it; exit status 1 if there is any, 0 if none
  ferry spool dump    [-c FILE] [--dir DIR] [--force] [--pending] [--topic T]
                      [--limit N] [--format text|base64]
        the records as NDJSON, in the order the agent sends them

The directory is delivery.spool.dir of the configuration (-c, --set), or
--dir. A running agent holds the spool locked: the tools refuse it, and
--force reads it anyway (its files are changing: the newest segment's last
frame may be a write in progress). While a tool reads, an agent cannot open
the spool. Exit status 2: bad usage, or the spool could not be read.
`

// spoolFlags are the flags every spool subcommand takes.
type spoolFlags struct {
	fs    *flag.FlagSet
	file  string
	sets  sets
	dir   string
	force bool
	json  bool
}

func newSpoolFlags(name string) *spoolFlags {
	f := &spoolFlags{fs: flag.NewFlagSet("spool "+name, flag.ContinueOnError)}
	f.fs.StringVar(&f.file, "c", "", "configuration file (YAML): its delivery.spool.dir")
	f.fs.StringVar(&f.file, "config", "", "configuration file (YAML): its delivery.spool.dir")
	f.fs.Var(&f.sets, "set", "override one key: key.path=value (repeatable)")
	f.fs.StringVar(&f.dir, "dir", "", "spool directory (instead of the configuration's)")
	f.fs.BoolVar(&f.force, "force", false, "read a spool a running agent holds")
	f.fs.SetOutput(os.Stderr)
	f.fs.Usage = func() { fmt.Fprint(os.Stderr, spoolUsage) }
	return f
}

// options resolves the directory and the read options from the flags.
func (f *spoolFlags) options() (string, spool.ReadOptions, error) {
	cfg, err := config.Load(f.file, f.sets)
	if err != nil {
		return "", spool.ReadOptions{}, err
	}
	dir := f.dir
	if dir == "" {
		dir = cfg.Delivery.Spool.Dir
	}
	return dir, spool.ReadOptions{Force: f.force, MaxRecordBytes: int(cfg.SpoolRecordBytes())}, nil
}

func spoolCmd(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, spoolUsage)
		return 2
	}
	f := newSpoolFlags(args[0])
	var pending bool
	var topic, format string
	var limit int
	switch args[0] {
	case "inspect", "verify":
		f.fs.BoolVar(&f.json, "json", false, "print the report as JSON")
	case "dump":
		f.fs.BoolVar(&pending, "pending", false, "only the records a restart would send to Kafka")
		f.fs.StringVar(&topic, "topic", "", "only the records of this topic")
		f.fs.IntVar(&limit, "limit", 0, "at most this many records (0: all)")
		f.fs.StringVar(&format, "format", "text", "text: key, value and header values as JSON strings (base64 in key_base64, value_base64 if not UTF-8); base64: all base64")
	case "help", "-h", "--help":
		fmt.Fprint(stdout, spoolUsage)
		return 0
	default:
		fmt.Fprintf(stderr, "ferry spool: unknown command %q\n\n%s", args[0], spoolUsage)
		return 2
	}
	if err := f.fs.Parse(args[1:]); err != nil {
		return 2
	}
	if f.fs.NArg() != 0 || format != "" && format != "text" && format != "base64" || limit < 0 {
		fmt.Fprint(stderr, spoolUsage)
		return 2
	}
	dir, o, err := f.options()
	if err != nil {
		fmt.Fprintln(stderr, "ferry:", err)
		return 2
	}
	if args[0] == "dump" {
		o.PendingOnly = pending
		return spoolDump(dir, o, topic, limit, format == "base64", stdout, stderr)
	}
	rep, err := spool.Inspect(dir, o)
	if err != nil {
		fmt.Fprintln(stderr, "ferry:", spoolErr(err, dir))
		return 2
	}
	if rep.Live {
		fmt.Fprintln(stderr, "ferry: warning: a running agent holds this spool (--force): what was read may already have changed")
	}
	if f.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(rep)
	} else if args[0] == "inspect" {
		printInspect(stdout, rep)
	} else {
		printVerify(stdout, rep)
	}
	if args[0] == "verify" && rep.Damaged() {
		return 1
	}
	return 0
}

// spoolErr says what to do about an error of the read-only tools.
func spoolErr(err error, dir string) error {
	switch {
	case errors.Is(err, spool.ErrInUse):
		return fmt.Errorf("%w: stop the agent first, or add --force to read it while it changes", err)
	case errors.Is(err, spool.ErrNoSpool):
		return fmt.Errorf("%w at %s (delivery.spool.dir; give -c FILE or --dir DIR)", spool.ErrNoSpool, dir)
	}
	return err
}

// human is n bytes in the largest binary unit below it, to one decimal.
func human(n int64) string {
	const units = "KMGTPE"
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	v, i := float64(n)/1024, 0
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	return fmt.Sprintf("%.1f %ciB", v, units[i])
}

func printInspect(w io.Writer, rep *spool.Report) {
	fmt.Fprintf(w, "spool %s\n", rep.Dir)
	switch {
	case rep.CheckpointError != "":
		fmt.Fprintf(w, "checkpoint  unreadable (%s): a restart replays every segment from its start\n", rep.CheckpointError)
	case rep.Checkpoint == nil:
		fmt.Fprintln(w, "checkpoint  none: a restart replays every segment from its start")
	default:
		fmt.Fprintf(w, "checkpoint  %s offset %d\n", rep.Checkpoint.Segment, rep.Checkpoint.Offset)
	}
	if rep.ReplayFrom != nil {
		fmt.Fprintf(w, "replay      %d records (%s) from %s offset %d\n", rep.ReplayRecords, human(rep.ReplayBytes), rep.ReplayFrom.Segment, rep.ReplayFrom.Offset)
	} else {
		fmt.Fprintln(w, "replay      nothing")
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SEGMENT\tSIZE\tFRAMES\tRECORDS\tFIRST\tLAST\tOLDEST\tNEWEST\tSTATE")
	ts := func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.Format(time.RFC3339)
	}
	off := func(o int64) string {
		if o < 0 {
			return "-"
		}
		return fmt.Sprint(o)
	}
	for _, s := range rep.Segments {
		state := s.State
		switch {
		case s.DeletedAtStart:
			state += " (deleted at start)"
		case s.State == spool.StatePartly:
			state = fmt.Sprintf("%s, %d pending", s.State, s.Pending)
		}
		if len(s.Damage) > 0 {
			state += fmt.Sprintf(", %d damaged", len(s.Damage))
		}
		if s.Recycled {
			state += ", recycled"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\n", s.Name, human(s.Size), s.Frames, s.Records, off(s.First), off(s.Last),
			ts(s.FirstTime), ts(s.LastTime), state)
	}
	if len(rep.Segments) == 0 {
		fmt.Fprintln(tw, "(none)")
	}
	_ = tw.Flush()
	if len(rep.Spares) > 0 {
		fmt.Fprintf(w, "spares (emptied segments kept to be written over): %s\n", strings.Join(rep.Spares, " "))
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TOPIC\tRECORDS\tBYTES\tPENDING\tPENDING BYTES")
	for _, t := range rep.Topics {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%s\n", t.Topic, t.Records, human(t.Bytes), t.Pending, human(t.PendingBytes))
	}
	if len(rep.Topics) == 0 {
		fmt.Fprintln(tw, "(none)")
	}
	_ = tw.Flush()
	fmt.Fprintln(w)
	if !rep.Damaged() {
		fmt.Fprintln(w, "damage      none")
		return
	}
	fmt.Fprintf(w, "damage      %s: ferry spool verify lists them\n", damageLine(rep))
}

// damageLine is "3 stretches; 2 of them (89 B) in records a restart reads".
func damageLine(rep *spool.Report) string {
	lost, n := rep.Lost()
	return fmt.Sprintf("%d damaged stretches; %d of them (%s) in records a restart reads, which are lost", len(rep.Damage), n, human(lost))
}

func printVerify(w io.Writer, rep *spool.Report) {
	records := 0
	for _, s := range rep.Segments {
		records += s.Records
	}
	if !rep.Damaged() {
		fmt.Fprintf(w, "spool %s: no damage (%d segments, %d records; a restart replays %d)\n", rep.Dir, len(rep.Segments), records, rep.ReplayRecords)
		return
	}
	fmt.Fprintf(w, "spool %s: %s\n", rep.Dir, damageLine(rep))
	for _, d := range rep.Damage {
		frames := ""
		switch {
		case d.Frames == 1:
			frames = ", 1 record"
		case d.Frames > 1:
			frames = fmt.Sprintf(", %d records", d.Frames)
		}
		where := "pending"
		if !d.Pending {
			where = "acknowledged: nothing lost"
		}
		fmt.Fprintf(w, "  %s offset %d: %s, %d bytes%s (%s): %s; %s\n", d.Segment, d.Offset, d.Kind, d.Bytes, frames, where, d.Detail, d.Action)
	}
	fmt.Fprintf(w, "a restart replays %d records\n", rep.ReplayRecords)
}

// dumpHeader and dumpLine are one record of ferry spool dump.
type dumpHeader struct {
	Key         string  `json:"key"`
	Value       *string `json:"value,omitempty"`
	ValueBase64 *string `json:"value_base64,omitempty"`
}

type dumpLine struct {
	Segment     string       `json:"segment"`
	Offset      int64        `json:"offset"`
	Pending     bool         `json:"pending"`
	Topic       string       `json:"topic"`
	Partition   *int32       `json:"partition,omitempty"`
	Timestamp   *time.Time   `json:"timestamp,omitempty"`
	Key         *string      `json:"key,omitempty"`
	KeyBase64   *string      `json:"key_base64,omitempty"`
	Headers     []dumpHeader `json:"headers,omitempty"`
	Value       *string      `json:"value,omitempty"`
	ValueBase64 *string      `json:"value_base64,omitempty"`
}

// encode is b for a dump line: in format text, b as a string when it is
// UTF-8 (else its base64 in the *_base64 field); in format base64, its
// base64 in the plain field. Nil gives neither.
func encode(b []byte, b64 bool) (plain, base *string) {
	if b == nil {
		return nil, nil
	}
	if !b64 && utf8.Valid(b) {
		s := string(b)
		return &s, nil
	}
	s := base64.StdEncoding.EncodeToString(b)
	if b64 {
		return &s, nil
	}
	return nil, &s
}

func spoolDump(dir string, o spool.ReadOptions, topic string, limit int, b64 bool, stdout, stderr io.Writer) int {
	enc := json.NewEncoder(stdout)
	n := 0
	var werr error
	err := spool.Scan(dir, o, func(e *spool.Entry) bool {
		r := e.Record
		if topic != "" && r.Topic != topic {
			return true
		}
		l := dumpLine{Segment: e.Segment, Offset: e.Offset, Pending: e.Pending, Topic: r.Topic}
		if p, ok := r.Partition(); ok {
			l.Partition = &p
		}
		if !r.Timestamp.IsZero() {
			ts := r.Timestamp.UTC()
			l.Timestamp = &ts
		}
		l.Key, l.KeyBase64 = encode(r.Key, b64)
		for _, h := range r.Headers {
			dh := dumpHeader{Key: h.Key}
			dh.Value, dh.ValueBase64 = encode(append([]byte{}, h.Value...), b64)
			l.Headers = append(l.Headers, dh)
		}
		l.Value, l.ValueBase64 = encode(append([]byte{}, r.Value...), b64)
		if werr = enc.Encode(&l); werr != nil {
			return false
		}
		n++
		return limit == 0 || n < limit
	})
	if err == nil {
		err = werr
	}
	if err != nil {
		fmt.Fprintln(stderr, "ferry:", spoolErr(err, dir))
		return 2
	}
	return 0
}
