package status

import (
	"math"
	"sort"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// Report is one sample's view of the agent, as GET /status serves it
// (docs/operating.md lists the fields). Counts are totals since the start
// with their rate over the last interval.
type Report struct {
	Version         string            `json:"version"`
	Time            time.Time         `json:"time"`
	UptimeSeconds   float64           `json:"uptime_seconds"`
	IntervalSeconds float64           `json:"interval_seconds"`
	Ready           bool              `json:"ready"`
	NotReady        map[string]string `json:"not_ready"`
	Totals          Totals            `json:"totals"`
	Receivers       []ReceiverRow     `json:"receivers"`
	Topics          []TopicRow        `json:"topics"`
	Refusals        []RefusalRow      `json:"refusals"`
	Apps            []AppRow          `json:"apps"`
	Queue           Queue             `json:"queue"`
	Spool           *Spool            `json:"spool,omitempty"`
	Kafka           Kafka             `json:"kafka"`
	DeadLetters     []DeadLetterRow   `json:"dead_letters"`
	Files           *Files            `json:"files,omitempty"`
	// Omitted is, per table, how many rows beyond MaxRows were left out.
	Omitted map[string]int `json:"omitted,omitempty"`
	History *History       `json:"history,omitempty"`
}

// Count is a counter's total and its rate over the last interval.
type Count struct {
	Total  float64 `json:"total"`
	PerSec float64 `json:"per_sec"`
}

// Totals are the agent's sums.
type Totals struct {
	ReceivedRecords Count `json:"received_records"`
	ReceivedBytes   Count `json:"received_bytes"`
	SentRecords     Count `json:"sent_records"`
	SentBytes       Count `json:"sent_bytes"`
	// RefusedRequests: requests refused or failed by a receiver, any reason.
	RefusedRequests Count `json:"refused_requests"`
	// DroppedRecords left ferry without reaching Kafka (the exporter's drops).
	DroppedRecords Count `json:"dropped_records"`
	DeadLetters    Count `json:"dead_letters"`
	// SampledOut and Filtered are items dropped by policy.
	SampledOut  Count `json:"sampled_out"`
	Filtered    Count `json:"filtered"`
	RateLimited Count `json:"rate_limited_records"`
}

// ReceiverRow is one receiver.
type ReceiverRow struct {
	Receiver    string  `json:"receiver"`
	Records     Count   `json:"records"`
	Bytes       Count   `json:"bytes"`
	Requests    Count   `json:"requests"`
	Refused     Count   `json:"refused"`
	Connections float64 `json:"connections"`
}

// TopicRow is one topic: in from the receivers, out acknowledged by Kafka.
type TopicRow struct {
	Topic    string `json:"topic"`
	In       Count  `json:"in_records"`
	InBytes  Count  `json:"in_bytes"`
	Out      Count  `json:"out_records"`
	OutBytes Count  `json:"out_bytes"`
	Dropped  Count  `json:"dropped_records"`
}

// RefusalRow is requests refused by one receiver for one reason
// (ferry_receiver_errors_total); receiver "auth" lists why tokens were
// refused (ferry_auth_refused_total), which the receivers count as
// unauthenticated or forbidden.
type RefusalRow struct {
	Receiver string `json:"receiver"`
	Reason   string `json:"reason"`
	Count    Count  `json:"count"`
}

// AppRow is one token application ("" for requests without a token).
type AppRow struct {
	App         string  `json:"app"`
	Records     Count   `json:"records"`
	Bytes       Count   `json:"bytes"`
	RateLimited Count   `json:"rate_limited_records"`
	SampledOut  Count   `json:"sampled_out"`
	Filtered    Count   `json:"filtered"`
	DebtSeconds float64 `json:"debt_seconds"`
}

// Queue is the memory queue.
type Queue struct {
	Bytes      float64 `json:"bytes"`
	Records    float64 `json:"records"`
	LimitBytes float64 `json:"limit_bytes"`
	Fill       float64 `json:"fill"`
	Refused    Count   `json:"refused_records"`
}

// Spool is the disk spool (delivery modes spool and spill).
type Spool struct {
	Bytes        float64 `json:"bytes"`
	LimitBytes   float64 `json:"limit_bytes"`
	BacklogBytes float64 `json:"backlog_bytes"`
	Fill         float64 `json:"fill"`
	Refused      Count   `json:"refused_records"`
	SpillActive  bool    `json:"spill_active"`
}

// Kafka is the exporter's view of the cluster.
type Kafka struct {
	// Up is nil for an exporter that has no broker (blackhole).
	Up              *bool    `json:"up"`
	Connections     float64  `json:"connections"`
	InflightRecords float64  `json:"inflight_records"`
	ProduceP50Ms    *float64 `json:"produce_p50_ms"`
	ProduceP99Ms    *float64 `json:"produce_p99_ms"`
	// ProduceRequests is how many produce round trips the quantiles are
	// over (the last LatencyWindowSeconds); none: the quantiles are null.
	ProduceRequests      float64    `json:"produce_requests"`
	LatencyWindowSeconds float64    `json:"latency_window_seconds"`
	Errors               []ErrorRow `json:"errors"`
}

// ErrorRow is broker errors of one kind (retried).
type ErrorRow struct {
	Reason string `json:"reason"`
	Count  Count  `json:"count"`
}

// DeadLetterRow is dead letters by where they went and why.
type DeadLetterRow struct {
	Sink   string `json:"sink"`
	Reason string `json:"reason"`
	Count  Count  `json:"count"`
}

// Files is the files receiver.
type Files struct {
	OpenFiles     float64    `json:"open_files"`
	InflightBytes float64    `json:"inflight_bytes"`
	Groups        []FileRow  `json:"groups"`
	Dropped       []ErrorRow `json:"dropped"`
}

// FileRow is one include pattern.
type FileRow struct {
	Group    string  `json:"group"`
	Watched  float64 `json:"watched_files"`
	LagBytes float64 `json:"lag_bytes"`
	Lines    Count   `json:"lines"`
	Bytes    Count   `json:"bytes"`
}

// History is the charts' samples, oldest first, one every
// IntervalSeconds up to End.
type History struct {
	IntervalSeconds float64              `json:"interval_seconds"`
	End             time.Time            `json:"end"`
	Series          map[string][]float64 `json:"series"`
}

// The ring's series, in sample order.
const (
	seriesIn = iota
	seriesOut
	seriesRefused
	seriesLost
	seriesQueue
	seriesSpoolBacklog
	seriesP99
	seriesKafkaUp
	numSeries
)

var seriesNames = [numSeries]string{"in_records_per_sec", "out_records_per_sec", "refused_per_sec",
	"dropped_per_sec", "queue_bytes", "spool_backlog_bytes", "produce_p99_ms", "kafka_up"}

type sample [numSeries]float64

// builder turns one gather into a report; next holds the totals the next
// sample's rates are computed from.
type builder struct {
	fam  map[string][]*dto.Metric
	prev map[string]float64
	next map[string]float64
	dt   float64
	omit map[string]int
}

func newBuilder(mfs []*dto.MetricFamily, prev map[string]float64, dt float64) *builder {
	b := &builder{fam: make(map[string][]*dto.Metric, len(mfs)), prev: prev, next: make(map[string]float64, len(prev)), dt: dt}
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), "ferry_") {
			b.fam[mf.GetName()] = mf.GetMetric()
		}
	}
	return b
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func value(m *dto.Metric) float64 {
	switch {
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	case m.GetUntyped() != nil:
		return m.GetUntyped().GetValue()
	}
	return 0
}

// has says whether a metric is registered (a component exists).
func (b *builder) has(name string) bool { _, ok := b.fam[name]; return ok }

// sum adds every series of name whose labels match (label, value pairs).
func (b *builder) sum(name string, match ...string) float64 {
	var t float64
	for _, m := range b.fam[name] {
		if matches(m, match) {
			t += value(m)
		}
	}
	return t
}

func matches(m *dto.Metric, match []string) bool {
	for i := 0; i+1 < len(match); i += 2 {
		if label(m, match[i]) != match[i+1] {
			return false
		}
	}
	return true
}

// by sums name's series by the values of labels (joined by \x1f), over the
// series that match.
func (b *builder) by(name string, labels []string, match ...string) map[string]float64 {
	out := map[string]float64{}
	var key strings.Builder
	for _, m := range b.fam[name] {
		if !matches(m, match) {
			continue
		}
		key.Reset()
		for i, l := range labels {
			if i > 0 {
				key.WriteByte('\x1f')
			}
			key.WriteString(label(m, l))
		}
		out[key.String()] += value(m)
	}
	return out
}

// count is the total and its rate over the interval; id names the counter
// among the sample's (a metric and a row).
func (b *builder) count(id string, total float64) Count {
	b.next[id] = total
	c := Count{Total: total}
	if p, ok := b.prev[id]; ok && b.dt > 0 && total >= p {
		c.PerSec = round((total-p)/b.dt, 2)
	} else if !ok && b.dt > 0 {
		// A row that appeared during the interval: all of it is new.
		c.PerSec = round(total/b.dt, 2)
	}
	return c
}

func round(v float64, places int) float64 {
	p := math.Pow10(places)
	return math.Round(v*p) / p
}

func fill(used, limit float64) float64 {
	if limit <= 0 {
		return 0
	}
	return round(used/limit, 4)
}

func (b *builder) report() *Report {
	r := &Report{}
	t := &r.Totals
	t.ReceivedRecords = b.count("in", b.sum("ferry_receiver_received_records_total"))
	t.ReceivedBytes = b.count("inb", b.sum("ferry_receiver_received_bytes_total"))
	t.SentRecords = b.count("out", b.sum("ferry_exporter_sent_records_total"))
	t.SentBytes = b.count("outb", b.sum("ferry_exporter_sent_bytes_total"))
	t.RefusedRequests = b.count("refused", b.sum("ferry_receiver_errors_total"))
	t.DroppedRecords = b.count("dropped", b.sum("ferry_exporter_dropped_records_total"))
	t.DeadLetters = b.count("dead", b.sum("ferry_dead_letter_records_total"))
	t.SampledOut = b.count("sampled", b.sum("ferry_processor_dropped_items_total", "processor", "sampler"))
	t.Filtered = b.count("filtered", b.sum("ferry_processor_dropped_items_total", "processor", "filter"))
	t.RateLimited = b.count("limited", b.sum("ferry_ratelimit_refused_records_total"))

	r.Receivers = b.receivers()
	r.Topics = b.topics()
	r.Refusals = b.refusals()
	r.Apps = b.apps()

	q := &r.Queue
	q.Bytes, q.Records, q.LimitBytes = b.sum("ferry_queue_bytes"), b.sum("ferry_queue_records"), b.sum("ferry_queue_limit_bytes")
	q.Fill = fill(q.Bytes, q.LimitBytes)
	q.Refused = b.count("queue_refused", b.sum("ferry_queue_refused_records_total"))
	if b.has("ferry_spool_limit_bytes") {
		sp := &Spool{Bytes: b.sum("ferry_spool_bytes"), LimitBytes: b.sum("ferry_spool_limit_bytes"),
			BacklogBytes: b.sum("ferry_spool_backlog_bytes"), SpillActive: b.sum("ferry_spill_active") > 0}
		sp.Fill = fill(sp.Bytes, sp.LimitBytes)
		sp.Refused = b.count("spool_refused", b.sum("ferry_spool_refused_records_total"))
		r.Spool = sp
	}

	k := &r.Kafka
	if b.has("ferry_exporter_kafka_up") {
		up := b.sum("ferry_exporter_kafka_up") > 0
		k.Up = &up
	}
	k.Connections, k.InflightRecords = b.sum("ferry_exporter_kafka_connections"), b.sum("ferry_exporter_inflight_records")
	k.Errors = []ErrorRow{}
	for reason, v := range b.by("ferry_exporter_errors_total", []string{"reason"}) {
		k.Errors = append(k.Errors, ErrorRow{Reason: reason, Count: b.count("kerr\x1f"+reason, v)})
	}
	k.Errors = top(b, "kafka_errors", k.Errors, func(e ErrorRow) (Count, string) { return e.Count, e.Reason })

	r.DeadLetters = []DeadLetterRow{}
	for key, v := range b.by("ferry_dead_letter_records_total", []string{"sink", "reason"}) {
		sink, reason, _ := strings.Cut(key, "\x1f")
		r.DeadLetters = append(r.DeadLetters, DeadLetterRow{Sink: sink, Reason: reason, Count: b.count("dl\x1f"+key, v)})
	}
	r.DeadLetters = top(b, "dead_letters", r.DeadLetters, func(d DeadLetterRow) (Count, string) { return d.Count, d.Sink + d.Reason })

	if b.has("ferry_files_open_files") {
		r.Files = b.files()
	}
	r.Omitted = b.omit
	return r
}

// top sorts rows by rate, then total, then name, and keeps MaxRows,
// counting the rest in omitted[table].
func top[T any](b *builder, table string, rows []T, key func(T) (Count, string)) []T {
	sort.Slice(rows, func(i, j int) bool {
		ci, ni := key(rows[i])
		cj, nj := key(rows[j])
		if ci.PerSec != cj.PerSec {
			return ci.PerSec > cj.PerSec
		}
		if ci.Total != cj.Total {
			return ci.Total > cj.Total
		}
		return ni < nj
	})
	if len(rows) > MaxRows {
		if b.omit == nil {
			b.omit = map[string]int{}
		}
		b.omit[table] = len(rows) - MaxRows
		rows = rows[:MaxRows]
	}
	return rows
}

func (b *builder) receivers() []ReceiverRow {
	recs := b.by("ferry_receiver_received_records_total", []string{"receiver"})
	byts := b.by("ferry_receiver_received_bytes_total", []string{"receiver"})
	reqs := b.by("ferry_receiver_requests_total", []string{"receiver"})
	errs := b.by("ferry_receiver_errors_total", []string{"receiver"})
	names := map[string]bool{}
	for _, m := range []map[string]float64{recs, reqs, errs} {
		for n := range m {
			names[n] = true
		}
	}
	// Listeners are named after their receiver (local_socket and local_tcp
	// are the local receiver's); the admin listener's are not shown.
	conns := map[string]float64{}
	for l, v := range b.by("ferry_receiver_connections", []string{"receiver"}) {
		if names[l] {
			conns[l] += v
		} else if base, _, ok := strings.Cut(l, "_"); ok && names[base] {
			conns[base] += v
		}
	}
	rows := make([]ReceiverRow, 0, len(names))
	for n := range names {
		rows = append(rows, ReceiverRow{Receiver: n, Records: b.count("r\x1f"+n, recs[n]), Bytes: b.count("rb\x1f"+n, byts[n]),
			Requests: b.count("rq\x1f"+n, reqs[n]), Refused: b.count("re\x1f"+n, errs[n]), Connections: conns[n]})
	}
	return top(b, "receivers", rows, func(r ReceiverRow) (Count, string) { return r.Records, r.Receiver })
}

func (b *builder) topics() []TopicRow {
	in := b.by("ferry_receiver_received_records_total", []string{"topic"})
	inB := b.by("ferry_receiver_received_bytes_total", []string{"topic"})
	out := b.by("ferry_exporter_sent_records_total", []string{"topic"})
	outB := b.by("ferry_exporter_sent_bytes_total", []string{"topic"})
	drop := b.by("ferry_exporter_dropped_records_total", []string{"topic"})
	names := map[string]bool{}
	for _, m := range []map[string]float64{in, out, drop} {
		for n := range m {
			if n != "" {
				names[n] = true
			}
		}
	}
	rows := make([]TopicRow, 0, len(names))
	for n := range names {
		rows = append(rows, TopicRow{Topic: n, In: b.count("ti\x1f"+n, in[n]), InBytes: b.count("tib\x1f"+n, inB[n]),
			Out: b.count("to\x1f"+n, out[n]), OutBytes: b.count("tob\x1f"+n, outB[n]), Dropped: b.count("td\x1f"+n, drop[n])})
	}
	return top(b, "topics", rows, func(r TopicRow) (Count, string) { return r.In, r.Topic })
}

func (b *builder) refusals() []RefusalRow {
	rows := []RefusalRow{}
	for key, v := range b.by("ferry_receiver_errors_total", []string{"receiver", "reason"}) {
		rc, reason, _ := strings.Cut(key, "\x1f")
		rows = append(rows, RefusalRow{Receiver: rc, Reason: reason, Count: b.count("rf\x1f"+key, v)})
	}
	for reason, v := range b.by("ferry_auth_refused_total", []string{"reason"}) {
		rows = append(rows, RefusalRow{Receiver: "auth", Reason: reason, Count: b.count("ra\x1f"+reason, v)})
	}
	return top(b, "refusals", rows, func(r RefusalRow) (Count, string) { return r.Count, r.Receiver + "\x1f" + r.Reason })
}

func (b *builder) apps() []AppRow {
	recs := b.by("ferry_ratelimit_admitted_records_total", []string{"app"})
	byts := b.by("ferry_ratelimit_admitted_bytes_total", []string{"app"})
	limited := b.by("ferry_ratelimit_refused_records_total", []string{"app"})
	sampled := b.by("ferry_processor_dropped_items_total", []string{"tenant"}, "processor", "sampler")
	filtered := b.by("ferry_processor_dropped_items_total", []string{"tenant"}, "processor", "filter")
	debt := b.by("ferry_ratelimit_debt_seconds", []string{"app"})
	names := map[string]bool{}
	for _, m := range []map[string]float64{recs, limited, sampled, filtered, debt} {
		for n := range m {
			names[n] = true
		}
	}
	rows := make([]AppRow, 0, len(names))
	for n := range names {
		rows = append(rows, AppRow{App: n, Records: b.count("a\x1f"+n, recs[n]), Bytes: b.count("ab\x1f"+n, byts[n]),
			RateLimited: b.count("al\x1f"+n, limited[n]), SampledOut: b.count("as\x1f"+n, sampled[n]),
			Filtered: b.count("af\x1f"+n, filtered[n]), DebtSeconds: round(debt[n], 3)})
	}
	// The busiest first; an app refused for its rate is busy too.
	return top(b, "apps", rows, func(r AppRow) (Count, string) {
		return Count{PerSec: r.Records.PerSec + r.RateLimited.PerSec, Total: r.Records.Total + r.RateLimited.Total}, r.App
	})
}

func (b *builder) files() *Files {
	f := &Files{OpenFiles: b.sum("ferry_files_open_files"), InflightBytes: b.sum("ferry_files_inflight_bytes"), Groups: []FileRow{}, Dropped: []ErrorRow{}}
	watched := b.by("ferry_files_watched_files", []string{"group"})
	lag := b.by("ferry_files_lag_bytes", []string{"group"})
	lines := b.by("ferry_files_lines_total", []string{"group"})
	byts := b.by("ferry_files_bytes_total", []string{"group"})
	names := map[string]bool{}
	for _, m := range []map[string]float64{watched, lag, lines} {
		for n := range m {
			names[n] = true
		}
	}
	for n := range names {
		f.Groups = append(f.Groups, FileRow{Group: n, Watched: watched[n], LagBytes: lag[n],
			Lines: b.count("fl\x1f"+n, lines[n]), Bytes: b.count("fb\x1f"+n, byts[n])})
	}
	f.Groups = top(b, "file_groups", f.Groups, func(r FileRow) (Count, string) {
		return Count{PerSec: r.Lines.PerSec, Total: r.LagBytes}, r.Group
	})
	for reason, v := range b.by("ferry_files_dropped_records_total", []string{"reason"}) {
		f.Dropped = append(f.Dropped, ErrorRow{Reason: reason, Count: b.count("fd\x1f"+reason, v)})
	}
	f.Dropped = top(b, "file_dropped", f.Dropped, func(e ErrorRow) (Count, string) { return e.Count, e.Reason })
	return f
}

// histSnap is a cumulative histogram: upper bounds and counts.
type histSnap struct {
	bounds []float64
	counts []float64 // cumulative, per bound
	count  float64
}

// histogram sums name's series (one per exporter) into one.
func (b *builder) histogram(name string) (histSnap, bool) {
	ms, ok := b.fam[name]
	if !ok || len(ms) == 0 {
		return histSnap{}, false
	}
	var h histSnap
	for _, m := range ms {
		hg := m.GetHistogram()
		if hg == nil {
			continue
		}
		if h.bounds == nil {
			for _, bk := range hg.GetBucket() {
				h.bounds = append(h.bounds, bk.GetUpperBound())
			}
			h.counts = make([]float64, len(h.bounds))
		}
		for i, bk := range hg.GetBucket() {
			if i < len(h.counts) {
				h.counts[i] += float64(bk.GetCumulativeCount())
			}
		}
		h.count += float64(hg.GetSampleCount())
	}
	return h, h.bounds != nil
}

// since is h minus an earlier snapshot of the same histogram.
func (h histSnap) since(old histSnap) histSnap {
	if len(old.counts) != len(h.counts) {
		return h
	}
	d := histSnap{bounds: h.bounds, counts: make([]float64, len(h.counts)), count: h.count - old.count}
	for i := range h.counts {
		d.counts[i] = h.counts[i] - old.counts[i]
	}
	return d
}

// quantile interpolates within the bucket the q-th observation falls in,
// as Prometheus' histogram_quantile does; above the last bound, the last
// bound (the histogram knows no more). 0 with no observations.
func (h histSnap) quantile(q float64) float64 {
	if h.count <= 0 {
		return 0
	}
	rank := q * h.count
	lower, below := 0.0, 0.0
	for i, ub := range h.bounds {
		if h.counts[i] >= rank {
			in := h.counts[i] - below
			if in <= 0 {
				return ub
			}
			return lower + (ub-lower)*(rank-below)/in
		}
		lower, below = ub, h.counts[i]
	}
	return lower
}
