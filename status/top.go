package status

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Frame renders a report as the lines of one `ferry top` screen of width
// columns and height rows (plain text, no escapes; every line at most
// width runes). At 80x24 it fits the essentials; a wider terminal gets
// wider name columns and more of them, a taller one more rows per table.
// addr is the admin address the report came from.
func Frame(r *Report, addr string, width, height int) []string {
	width, height = max(width, 40), max(height, 10)
	f := &frame{w: width}
	ready := "READY"
	if !r.Ready {
		ready = "NOT READY"
		for _, k := range sortedKeys(r.NotReady) {
			ready += " " + k + ": " + r.NotReady[k]
			break
		}
	}
	f.line(fmt.Sprintf("ferry %s  %s  up %s  %s  %s", r.Version, addr, dur(r.UptimeSeconds), r.Time.Local().Format("15:04:05"), ready))
	k := r.Kafka
	kafka := "Kafka n/a"
	if k.Up != nil {
		kafka = "Kafka DOWN"
		if *k.Up {
			kafka = "Kafka up"
		}
		kafka += fmt.Sprintf(" %s conns  produce p50 %s p99 %s (%s req, %ss)  inflight %s",
			num(k.Connections), optMs(k.ProduceP50Ms), optMs(k.ProduceP99Ms), num(k.ProduceRequests),
			num(k.LatencyWindowSeconds), num(k.InflightRecords))
		for i, e := range k.Errors {
			if i == 0 {
				kafka += "  errors"
			}
			if i == 2 {
				break
			}
			kafka += " " + e.Reason + " " + num(e.Count.Total)
		}
	}
	f.line(kafka)
	t := r.Totals
	var inHist, outHist []float64
	if h := r.History; h != nil {
		inHist, outHist = h.Series["in_records_per_sec"], h.Series["out_records_per_sec"]
	}
	// The rates' recent history fills what the line leaves, up to two
	// minutes of samples: a wider terminal shows more of it.
	f.withSpark(fmt.Sprintf("in  %7s rec/s %10s/s  total %-8s", rate(t.ReceivedRecords.PerSec), size(t.ReceivedBytes.PerSec),
		num(t.ReceivedRecords.Total)), inHist)
	f.withSpark(fmt.Sprintf("out %7s rec/s %10s/s  total %-8s", rate(t.SentRecords.PerSec), size(t.SentBytes.PerSec),
		num(t.SentRecords.Total)), outHist)
	f.line(fmt.Sprintf("refused %s (%s/s)  rate-limited %s  sampled out %s  dropped %s  dead letters %s",
		num(t.RefusedRequests.Total), rate(t.RefusedRequests.PerSec), num(t.RateLimited.Total), num(t.SampledOut.Total),
		num(t.DroppedRecords.Total), num(t.DeadLetters.Total)))
	q := r.Queue
	buf := fmt.Sprintf("queue %s %s of %s", bar(q.Fill, 10), size(q.Bytes), size(q.LimitBytes))
	if s := r.Spool; s != nil {
		buf += fmt.Sprintf("   spool %s %s of %s, backlog %s", bar(s.Fill, 10), size(s.Bytes), size(s.LimitBytes), size(s.BacklogBytes))
		if s.SpillActive {
			buf += " SPILLING"
		}
	}
	f.line(buf)

	// The tables share what rows are left, the footer keeps one.
	tables := []*table{f.receivers(r), f.topics(r), f.refusals(r), f.apps(r), f.deadLetters(r)}
	if r.Files != nil {
		tables = append(tables, f.files(r))
	}
	left := height - len(f.out) - 1
	give(tables, left)
	for _, tb := range tables {
		tb.render(f)
	}
	f.line("q quit · refreshes every second · ferry top --once prints one frame")
	return f.out
}

type frame struct {
	w   int
	out []string
}

func (f *frame) line(s string) { f.out = append(f.out, clip(s, f.w)) }

func (f *frame) withSpark(s string, hist []float64) {
	n := min(f.w-utf8.RuneCountInString(s)-1, 120)
	if len(hist) > 1 && n >= 10 {
		s += " " + spark(tail(hist, n))
	}
	f.line(s)
}

func clip(s string, w int) string {
	// Label values reach the terminal: an application's name is whatever
	// the token issuer chose, and an escape sequence in it must not
	// reach the operator's terminal (nor a tab or CR shift the columns).
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r >= 0x7f && r < 0xa0 {
			return '?'
		}
		return r
	}, s)
	if utf8.RuneCountInString(s) <= w {
		return s
	}
	r := []rune(s)
	return string(r[:w-1]) + "…"
}

// column of a table: a title, a width (the first column takes what is
// left), right-aligned numbers; columns of higher drop are left out first
// when the terminal is narrow.
type column struct {
	title string
	width int
	drop  int
}

type table struct {
	title  string
	cols   []column
	rows   [][]string
	empty  string // said in one line when there are no rows
	show   int    // rows given by give
	hidden int    // rows the agent left out (omitted)
}

// give shares n lines among the tables: each has a title line (and a
// blank before it); rows are handed out one a table at a time, so a long
// table cannot push the others off the screen.
func give(ts []*table, n int) {
	for _, t := range ts {
		n-- // title (or the one-line "none")
		if len(t.rows) > 0 {
			n-- // column header
		}
	}
	for n > 0 {
		gave := false
		for _, t := range ts {
			if n > 0 && t.show < len(t.rows) {
				t.show++
				n--
				gave = true
			}
		}
		if !gave {
			return
		}
	}
}

func (t *table) render(f *frame) {
	if len(t.rows) == 0 {
		f.line(t.title + ": " + t.empty)
		return
	}
	// Drop columns until they fit with a name column of at least 12.
	cols := append([]column(nil), t.cols...)
	for {
		used := 0
		for _, c := range cols[1:] {
			used += c.width + 1
		}
		if f.w-used >= 12 || len(cols) <= 2 {
			break
		}
		worst := 1
		for i := range cols {
			if cols[i].drop > cols[worst].drop {
				worst = i
			}
		}
		if cols[worst].drop == 0 {
			break // the essentials stay; the names are clipped instead
		}
		cols = append(cols[:worst], cols[worst+1:]...)
	}
	keep := make([]int, len(cols))
	for i, c := range cols {
		for j, o := range t.cols {
			if o.title == c.title {
				keep[i] = j
			}
		}
	}
	used := 0
	for _, c := range cols[1:] {
		used += c.width + 1
	}
	nameW := min(max(f.w-used, 12), 48)
	more := ""
	if hidden := len(t.rows) - t.show + t.hidden; hidden > 0 {
		more = fmt.Sprintf("  (%d more)", hidden)
	}
	f.line(t.title + more)
	row := func(cells []string) string {
		var b strings.Builder
		b.WriteString(pad(cells[keep[0]], nameW))
		for i := 1; i < len(cols); i++ {
			b.WriteByte(' ')
			b.WriteString(lpad(cells[keep[i]], cols[i].width))
		}
		return strings.TrimRight(b.String(), " ")
	}
	hdr := make([]string, len(t.cols))
	for i, c := range t.cols {
		hdr[i] = c.title
	}
	f.line(row(hdr))
	for _, cells := range t.rows[:t.show] {
		f.line(row(cells))
	}
}

func pad(s string, w int) string {
	s = clip(s, w)
	return s + strings.Repeat(" ", w-utf8.RuneCountInString(s))
}

func lpad(s string, w int) string {
	s = clip(s, w)
	return strings.Repeat(" ", w-utf8.RuneCountInString(s)) + s
}

func (f *frame) receivers(r *Report) *table {
	t := &table{title: "RECEIVERS", empty: "none yet", hidden: r.Omitted["receivers"], cols: []column{
		{"receiver", 0, 0}, {"rec/s", 8, 0}, {"bytes/s", 10, 2}, {"records", 9, 0}, {"req/s", 8, 3}, {"refused", 8, 0}, {"conns", 6, 4}}}
	for _, x := range r.Receivers {
		t.rows = append(t.rows, []string{x.Receiver, rate(x.Records.PerSec), size(x.Bytes.PerSec), num(x.Records.Total),
			rate(x.Requests.PerSec), num(x.Refused.Total), num(x.Connections)})
	}
	return t
}

func (f *frame) topics(r *Report) *table {
	t := &table{title: "TOPICS", empty: "none yet", hidden: r.Omitted["topics"], cols: []column{
		{"topic", 0, 0}, {"in/s", 8, 0}, {"out/s", 8, 0}, {"in", 9, 0}, {"out", 9, 0}, {"out bytes/s", 12, 3}, {"dropped", 8, 0}}}
	for _, x := range r.Topics {
		t.rows = append(t.rows, []string{x.Topic, rate(x.In.PerSec), rate(x.Out.PerSec), num(x.In.Total), num(x.Out.Total),
			size(x.OutBytes.PerSec), num(x.Dropped.Total)})
	}
	return t
}

func (f *frame) refusals(r *Report) *table {
	t := &table{title: "REFUSALS", empty: "none", hidden: r.Omitted["refusals"], cols: []column{
		{"reason", 0, 0}, {"receiver", 12, 0}, {"/s", 8, 0}, {"total", 9, 0}}}
	for _, x := range r.Refusals {
		t.rows = append(t.rows, []string{x.Reason, x.Receiver, rate(x.Count.PerSec), num(x.Count.Total)})
	}
	return t
}

func (f *frame) apps(r *Report) *table {
	t := &table{title: "APPLICATIONS (tokens)", empty: "none yet", hidden: r.Omitted["apps"], cols: []column{
		{"app", 0, 0}, {"rec/s", 8, 0}, {"records", 9, 0}, {"limited/s", 9, 2}, {"limited", 8, 0}, {"sampled", 8, 0},
		{"filtered", 8, 3}, {"debt", 7, 1}}}
	for _, x := range r.Apps {
		name := x.App
		if name == "" {
			name = "(no token)"
		}
		debt := "-"
		if x.DebtSeconds > 0 {
			debt = strconv.FormatFloat(x.DebtSeconds, 'f', 1, 64) + "s"
		}
		t.rows = append(t.rows, []string{name, rate(x.Records.PerSec), num(x.Records.Total), rate(x.RateLimited.PerSec),
			num(x.RateLimited.Total), num(x.SampledOut.Total), num(x.Filtered.Total), debt})
	}
	return t
}

func (f *frame) deadLetters(r *Report) *table {
	t := &table{title: "DEAD LETTERS", empty: "none", hidden: r.Omitted["dead_letters"], cols: []column{
		{"reason", 0, 0}, {"sink", 8, 0}, {"/s", 8, 0}, {"total", 9, 0}}}
	for _, x := range r.DeadLetters {
		t.rows = append(t.rows, []string{x.Reason, x.Sink, rate(x.Count.PerSec), num(x.Count.Total)})
	}
	return t
}

func (f *frame) files(r *Report) *table {
	fl := r.Files
	t := &table{title: fmt.Sprintf("FILES %s open, %s read not yet durable", num(fl.OpenFiles), size(fl.InflightBytes)),
		empty: "no include pattern matched yet", hidden: r.Omitted["file_groups"], cols: []column{
			{"include", 0, 0}, {"files", 6, 0}, {"lag", 10, 0}, {"lines/s", 8, 0}, {"bytes/s", 10, 2}}}
	for _, x := range fl.Groups {
		t.rows = append(t.rows, []string{x.Group, num(x.Watched), size(x.LagBytes), rate(x.Lines.PerSec), size(x.Bytes.PerSec)})
	}
	return t
}

// num is a count: exact below 100000 (what an operator checks against a
// test or a client's log), then k, M, G.
func num(v float64) string {
	a := math.Abs(v)
	switch {
	case a < 100000:
		if v == math.Trunc(v) {
			return strconv.FormatFloat(v, 'f', 0, 64)
		}
		return strconv.FormatFloat(v, 'f', 1, 64)
	case a < 1e6:
		return strconv.FormatFloat(v/1e3, 'f', 1, 64) + "k"
	case a < 1e9:
		return strconv.FormatFloat(v/1e6, 'f', 2, 64) + "M"
	}
	return strconv.FormatFloat(v/1e9, 'f', 2, 64) + "G"
}

// rate is a per-second rate: one decimal while small.
func rate(v float64) string {
	if v < 100 && v != math.Trunc(v) {
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return num(math.Round(v))
}

// size is bytes in IEC units.
func size(v float64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	i := 0
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	if i == 0 {
		return strconv.FormatFloat(v, 'f', 0, 64) + " B"
	}
	return strconv.FormatFloat(v, 'f', 1, 64) + " " + units[i]
}

func optMs(v *float64) string {
	if v == nil {
		return "-"
	}
	if *v < 10 {
		return strconv.FormatFloat(*v, 'f', 2, 64) + "ms"
	}
	return strconv.FormatFloat(*v, 'f', 0, 64) + "ms"
}

func dur(sec float64) string {
	d := time.Duration(sec) * time.Second
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd%02dh", int(d.Hours())/24, int(d.Hours())%24)
}

func bar(fill float64, n int) string {
	k := int(math.Round(math.Min(math.Max(fill, 0), 1) * float64(n)))
	return "[" + strings.Repeat("#", k) + strings.Repeat(".", n-k) + "] " + strconv.FormatFloat(fill*100, 'f', 0, 64) + "%"
}

func tail(v []float64, n int) []float64 {
	if n < 0 || len(v) <= n {
		return v
	}
	return v[len(v)-n:]
}

var ticks = []rune("▁▂▃▄▅▆▇█")

// spark draws values as a line of block characters scaled to their max.
func spark(v []float64) string {
	hi := 0.0
	for _, x := range v {
		hi = math.Max(hi, x)
	}
	var b strings.Builder
	for _, x := range v {
		i := 0
		if hi > 0 {
			i = int(math.Round(x / hi * float64(len(ticks)-1)))
		}
		b.WriteRune(ticks[i])
	}
	return b.String()
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j] < out[j-1]; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}
