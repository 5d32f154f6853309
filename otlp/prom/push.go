package prom

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/ferryhq/ferry/otlp/door"
)

// PushAmplify bounds the OTLP bytes per body byte of a push (the worst
// case measured: one-letter untyped samples "a 1\n", each a metric).
const PushAmplify = 24

// MaxPushSamples bounds the samples (lines, or protobuf metrics) of one
// push, counted before the exposition is parsed: the parsed form costs a
// few hundred bytes a sample.
var MaxPushSamples = 65536

// MaxPushLabelWork bounds Σ (labels + 1)² over a text push's sample lines,
// counted before the parser runs: expfmt's text parser rebuilds a map of a
// line's labels at each label, so a line costs the square of its labels
// (~160 ns a unit here: 250 labels a line, 10 ms). 2²¹ lets 20,000 lines of
// 10 labels through and holds the worst request to about a third of a
// second of CPU.
var MaxPushLabelWork = 1 << 21

// pushElemBytes: a delimited protobuf push must hold at least this many
// body bytes per message it decodes into (a family, a metric, a label
// pair, a bucket, a quantile, a span, an exemplar), counted before
// proto.Unmarshal: each costs a Go struct of 50–100 bytes, so the decoded
// form stays within about 12× the body. The smallest real elements (a
// bucket, a gauge's metric) take 11–13 bytes; 2-byte empty label pairs
// would make 50×.
const pushElemBytes = 8

// PushPatterns are the pushgateway's paths.
var PushPatterns = []string{"/metrics/job/", "/metrics/job@base64/"}

// now is the time of samples pushed without one (tests set it).
var now = time.Now

// Push converts a pushgateway push (PUT or POST of /metrics/job/<job>{/<label>/<value>},
// text exposition or delimited protobuf by Content-Type) into an OTLP
// ExportMetricsServiceRequest, within lim (otlp/door): the grouping labels
// are the resource.
func Push(q *http.Request, body, dst []byte, lim door.Limits, st *door.Stats) ([]byte, error) {
	max := lim.MaxBytes
	grouping, err := ParseGrouping(q.URL.EscapedPath())
	if err != nil {
		return nil, err
	}
	fams, err := decodeExposition(q.Header, body, lim)
	if err != nil {
		return nil, err
	}
	// Each metric of a family is one data point (gauge histograms none):
	// counted before anything is written.
	points := 0
	for _, f := range fams {
		if f.GetType() != dto.MetricType_GAUGE_HISTOGRAM {
			points += len(f.Metric)
		}
	}
	if lim.Over(points) {
		return nil, tooManyPoints(lim.MaxItems)
	}
	w := &pbw{b: dst, max: max}
	rm := w.open(fReqResourceMetrics)
	res := w.open(fRMResource)
	for _, l := range grouping {
		switch l[0] {
		case "job":
			job := l[1]
			if i := strings.IndexByte(job, '/'); i > 0 && strings.Count(job, "/") == 1 && i < len(job)-1 {
				w.kv(fResAttributes, []byte("service.namespace"), []byte(job[:i]))
				job = job[i+1:]
			}
			w.kv(fResAttributes, []byte("service.name"), []byte(job))
		case "instance":
			w.kv(fResAttributes, []byte("service.instance.id"), []byte(l[1]))
		default:
			w.kv(fResAttributes, []byte(l[0]), []byte(l[1]))
		}
	}
	w.close(res)
	sm := w.open(fRMScopeMetrics)
	sc := w.open(fSMScope)
	w.str(fScopeName, "prometheus_push")
	w.close(sc)
	nowMs := now().UnixMilli()
	for _, f := range fams {
		writeFamily(w, f, grouping, nowMs, st)
	}
	w.close(sm)
	w.close(rm)
	if w.err != nil {
		return nil, w.err
	}
	return w.b, nil
}

// ParseGrouping reads the pushgateway's path: /metrics/job/<job>{/<label>/<value>},
// a label name suffixed @base64 carrying its value in base64url (a lone
// "=" is the empty value).
func ParseGrouping(path string) ([][2]string, error) {
	rest, ok := strings.CutPrefix(path, "/metrics/")
	if !ok {
		return nil, errors.New("the path is not /metrics/job/<job>{/<label>/<value>}")
	}
	parts := strings.Split(strings.TrimSuffix(rest, "/"), "/")
	if len(parts)%2 != 0 {
		return nil, fmt.Errorf("path %q: a label without a value", path)
	}
	if len(parts)/2 > MaxLabelsPerSeries {
		return nil, fmt.Errorf("more than %d grouping labels", MaxLabelsPerSeries)
	}
	var out [][2]string
	for i := 0; i < len(parts); i += 2 {
		name, val := parts[i], parts[i+1]
		var err error
		if name, err = unescape(name); err != nil {
			return nil, err
		}
		if val, err = unescape(val); err != nil {
			return nil, err
		}
		if n, ok := strings.CutSuffix(name, "@base64"); ok {
			name = n
			if val == "=" {
				val = ""
			} else {
				b, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(val, "="))
				if err != nil {
					return nil, fmt.Errorf("label %q: invalid base64 value", name)
				}
				val = string(b)
			}
		}
		if i == 0 && name != "job" {
			return nil, errors.New("the path is not /metrics/job/<job>...")
		}
		if err := checkLabel([]byte(name), []byte(val)); err != nil {
			return nil, err
		}
		if !model.UTF8Validation.IsValidLabelName(name) || strings.HasPrefix(name, "__") {
			return nil, fmt.Errorf("invalid label name %q", name)
		}
		if name == "job" && val == "" {
			return nil, errors.New("job is empty")
		}
		for _, g := range out {
			if g[0] == name {
				return nil, fmt.Errorf("label %q twice in the path", name)
			}
		}
		out = append(out, [2]string{name, val})
	}
	return out, nil
}

func unescape(s string) (string, error) {
	if !strings.Contains(s, "%") {
		return s, nil
	}
	u, err := urlUnescape(s)
	if err != nil {
		return "", fmt.Errorf("path segment %q: %v", s, err)
	}
	return u, nil
}

// decodeExposition parses the body per its Content-Type: delimited
// protobuf (client_golang's push default) or the text format. Its
// samples are counted first (MaxPushSamples, and what lim.MaxBytes can
// hold), and its data points against lim.MaxItems where the count is
// sure before parsing: delimited protobuf's metrics (but those of gauge
// histograms), text's sample lines when no line declares a histogram or
// summary (whose lines merge into points; Push counts those after).
func decodeExposition(h http.Header, body []byte, lim door.Limits) ([]*dto.MetricFamily, error) {
	limit := min(MaxPushSamples, lim.MaxBytes/minPointBytes)
	format := expfmt.ResponseFormat(h)
	if h.Get("Content-Type") == "" {
		format = expfmt.NewFormat(expfmt.TypeTextPlain)
	}
	switch format.FormatType() {
	case expfmt.TypeProtoDelim:
		// Counted before anything is decoded: every family counts as a
		// sample too, so that empty messages (a zero byte each) cannot
		// make ferry build millions of families from a small request.
		n, nfam, points, elems := 0, 0, 0, 0
		for b := body; len(b) > 0; {
			size, k := protowire.ConsumeVarint(b)
			if k < 0 || size > uint64(len(b)-k) {
				return nil, errors.New("truncated delimited protobuf")
			}
			msg := b[k : k+int(size)]
			b = b[k+int(size):]
			nfam++
			metrics, typ := 0, uint64(0)
			elems++
			_ = fields(msg, func(num protowire.Number, t protowire.Type, v uint64, m []byte) error {
				switch {
				case num == 4:
					metrics++
					elems += 1 + pushElems(m)
				case num == 3 && t == protowire.VarintType:
					typ = v
				}
				return nil
			})

			n += metrics
			if typ != uint64(dto.MetricType_GAUGE_HISTOGRAM) {
				points += metrics
				if lim.Over(points) {
					return nil, tooManyPoints(lim.MaxItems)
				}
			}
			if n+nfam > limit {
				return nil, fmt.Errorf("%w: more than %d samples and families in a push", ErrTooLarge, limit)
			}
			if elems*pushElemBytes > len(body)+4096 {
				return nil, fmt.Errorf("%w: %d messages in a push of %d bytes (at most one a %d bytes: decoded, each costs a Go struct)", ErrTooLarge, elems, len(body), pushElemBytes)
			}
		}
		fams := make([]*dto.MetricFamily, 0, nfam)
		for b := body; len(b) > 0; {
			size, k := protowire.ConsumeVarint(b)
			msg := b[k : k+int(size)]
			b = b[k+int(size):]
			mf := &dto.MetricFamily{}
			if err := proto.Unmarshal(msg, mf); err != nil {
				return nil, err
			}
			fams = append(fams, mf)
		}
		return fams, validate(fams)
	case expfmt.TypeTextPlain, expfmt.TypeUnknown:
		// Every non-empty line counts, comments too: a # TYPE line makes a
		// family in the parser.
		lines, samples, merge, work := 0, 0, false, 0
		for l := range bytes.SplitSeq(body, []byte("\n")) {
			l = bytes.TrimSpace(l)
			if len(l) == 0 {
				continue
			}
			lines++
			if l[0] != '#' {
				samples++
				// expfmt's parser checks a line's labels for duplicates by
				// building a map of all the labels so far at each label:
				// quadratic in a line's labels, which validate bounds only
				// once parsed (a line of 5,000 labels: 2.5 s, 900 MB).
				k := labelsIn(l)
				if k > MaxLabelsPerSeries+1 { // +1: an le or quantile
					return nil, fmt.Errorf("a series with more than %d labels", MaxLabelsPerSeries)
				}
				if work += (k + 1) * (k + 1); work > MaxPushLabelWork {
					return nil, fmt.Errorf("%w: too many labels on its lines to parse (Σ (labels+1)² over the lines past %d; a line's cost in the text parser grows with the square of its labels)", ErrTooLarge, MaxPushLabelWork)
				}
				continue
			}
			if c := bytes.TrimLeft(l[1:], " \t"); bytes.HasPrefix(c, []byte("TYPE")) {
				// as the parser reads it: any case, gauge_histogram too
				w := c[bytes.LastIndexAny(c, " \t")+1:]
				for _, m := range mergingTypes { // no string made a line
					if bytes.EqualFold(w, m) {
						merge = true
					}
				}
			}
		}
		if !merge && lim.Over(samples) {
			return nil, tooManyPoints(lim.MaxItems) // each sample line is a point
		}
		if lines > limit {
			return nil, fmt.Errorf("%w: more than %d samples in a push", ErrTooLarge, limit)
		}
		p := expfmt.NewTextParser(model.UTF8Validation)
		m, err := p.TextToMetricFamilies(bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		fams := make([]*dto.MetricFamily, 0, len(m))
		for _, f := range m {
			fams = append(fams, f)
		}
		slices.SortFunc(fams, func(a, b *dto.MetricFamily) int { return strings.Compare(a.GetName(), b.GetName()) })
		return fams, validate(fams)
	}
	return nil, fmt.Errorf("content type %q: the push format is text/plain;version=0.0.4 or delimited protobuf", h.Get("Content-Type"))
}

// pushElems counts the messages proto.Unmarshal makes of a dto.Metric
// beneath it: a label pair each; its gauge, counter, summary, untyped or
// histogram, and what that holds — buckets, quantiles, spans, packed
// deltas and counts (a slice each), exemplars and timestamps — walked down
// to an exemplar's labels. Strings are not walked (only label pairs and a
// family's name, help and unit have them).
func pushElems(m []byte) int {
	n := 0
	_ = fields(m, func(num protowire.Number, t protowire.Type, _ uint64, b []byte) error {
		if t != protowire.BytesType {
			return nil
		}
		n++
		switch num {
		case 2, 3, 4, 5, 7: // gauge, counter, summary, untyped, histogram
			n += pushSubElems(b, 0)
		}
		return nil
	})
	return n
}

// pushSubElems counts the messages in a metric's value (depth 0: its
// buckets, quantiles, spans, exemplars …) and in what they hold (depth 1:
// a bucket's exemplar, an exemplar's labels and timestamp), a message or a
// packed slice per length-delimited field.
func pushSubElems(m []byte, depth int) int {
	n := 0
	_ = fields(m, func(num protowire.Number, t protowire.Type, _ uint64, b []byte) error {
		if t != protowire.BytesType {
			return nil
		}
		n++
		if depth < 2 && (num == 3 || num == 2 || num == 16 || depth == 1 && num == 1) {
			n += pushSubElems(b, depth+1)
		}
		return nil
	})
	return n
}

// mergingTypes are the # TYPE words (any case, as the parser reads them)
// whose sample lines merge into fewer points.
var mergingTypes = [][]byte{[]byte("histogram"), []byte("summary"), []byte("gaugehistogram"), []byte("gauge_histogram")}

// labelsIn counts a text sample line's labels: its '=' outside quotes
// (only a label's name and value are separated by one; a line with more is
// not valid anyway).
func labelsIn(l []byte) int {
	n, quoted := 0, false
	for i := 0; i < len(l); i++ {
		switch l[i] {
		case '\\':
			if quoted {
				i++
			}
		case '"':
			quoted = !quoted
		case '=':
			if !quoted {
				n++
			}
		}
	}
	return n
}

func validate(fams []*dto.MetricFamily) error {
	for _, f := range fams {
		if !model.UTF8Validation.IsValidMetricName(f.GetName()) {
			return fmt.Errorf("invalid metric name %q", f.GetName())
		}
		for _, m := range f.Metric {
			if len(m.Label) > MaxLabelsPerSeries {
				return fmt.Errorf("a series with more than %d labels", MaxLabelsPerSeries)
			}
			for _, l := range m.Label {
				if err := checkLabel([]byte(l.GetName()), []byte(l.GetValue())); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func writeAttrs(w *pbw, field int, m *dto.Metric, grouping [][2]string, skip string) {
	for _, l := range m.Label {
		n := l.GetName()
		if l.GetValue() == "" || n == skip || n == "job" || n == "instance" || slices.ContainsFunc(grouping, func(g [2]string) bool { return g[0] == n }) {
			continue
		}
		w.kv(protowireNum(field), []byte(n), []byte(l.GetValue()))
	}
}

func times(w *pbw, m *dto.Metric, created interface{ AsTime() time.Time }, nowMs int64) {
	if created != nil && !created.AsTime().IsZero() && created.AsTime().UnixNano() > 0 {
		w.fixed64(fNDPStart, uint64(created.AsTime().UnixNano()))
	}
	ts := nowMs
	if m.TimestampMs != nil {
		ts = m.GetTimestampMs()
	}
	w.fixed64(fNDPTime, uint64(ts*msToNs))
}

// writeFamily writes f, counting in st what it leaves out: a gauge
// histogram (the spec drops it), exemplars, a histogram's native buckets.
func writeFamily(w *pbw, f *dto.MetricFamily, grouping [][2]string, nowMs int64, st *door.Stats) {
	typ := f.GetType()
	if typ == dto.MetricType_GAUGE_HISTOGRAM {
		st.Drop(door.GaugeHistogram, len(f.Metric)) // the spec: dropped
		return
	}
	for _, x := range f.Metric {
		if x.Counter.GetExemplar() != nil {
			st.Drop(door.Exemplar, 1)
		}
		if h := x.Histogram; h != nil {
			st.Drop(door.Exemplar, len(h.Exemplars))
			for _, b := range h.Bucket {
				if b.Exemplar != nil {
					st.Drop(door.Exemplar, 1)
				}
			}
			if typ == dto.MetricType_HISTOGRAM && (h.Schema != nil || len(h.PositiveSpan)+len(h.NegativeSpan) > 0) {
				st.Drop(door.NativeBuckets, 1)
			}
		}
	}
	m := w.open(fSMMetrics)
	w.str(fMetricName, f.GetName())
	if f.GetHelp() != "" {
		w.str(fMetricDescription, f.GetHelp())
	}
	if f.GetUnit() != "" {
		w.str(fMetricUnit, f.GetUnit())
	}
	ptype := "unknown"
	switch typ {
	case dto.MetricType_COUNTER, dto.MetricType_GAUGE, dto.MetricType_UNTYPED:
		field, sum := fMetricGauge, false
		ptype = strings.ToLower(typ.String())
		if typ == dto.MetricType_UNTYPED {
			ptype = "unknown"
		}
		if typ == dto.MetricType_COUNTER {
			field, sum = fMetricSum, true
		}
		g := w.open(protowireNum(field))
		for _, x := range f.Metric {
			p := w.open(fDataPoints)
			writeAttrs(w, fNDPAttributes, x, grouping, "")
			var v float64
			switch {
			case x.Counter != nil:
				v = x.Counter.GetValue()
				times(w, x, x.Counter.CreatedTimestamp, nowMs)
			case x.Gauge != nil:
				v = x.Gauge.GetValue()
				times(w, x, nil, nowMs)
			default:
				v = x.GetUntyped().GetValue()
				times(w, x, nil, nowMs)
			}
			w.double(fNDPDouble, v)
			if isStale(v) {
				w.varint(fNDPFlags, noRecordedValue)
			}
			w.close(p)
		}
		if sum {
			w.varint(fTemporality, cumulative)
			w.varint(fMonotonic, 1)
		}
		w.close(g)
	case dto.MetricType_SUMMARY:
		ptype = "summary"
		g := w.open(fMetricSummary)
		for _, x := range f.Metric {
			s := x.GetSummary()
			p := w.open(fDataPoints)
			writeAttrs(w, fSDPAttributes, x, grouping, "quantile")
			times(w, x, s.CreatedTimestamp, nowMs)
			w.fixed64(fSDPCount, s.GetSampleCount())
			w.double(fSDPSum, s.GetSampleSum())
			for _, qv := range s.Quantile {
				e := w.open(fSDPQuantiles)
				w.double(1, qv.GetQuantile())
				w.double(2, qv.GetValue())
				w.close(e)
			}
			w.close(p)
		}
		w.close(g)
	case dto.MetricType_HISTOGRAM:
		ptype = "histogram"
		g := w.open(fMetricHistogram)
		for _, x := range f.Metric {
			h := x.GetHistogram()
			p := w.open(fDataPoints)
			writeAttrs(w, fHDPAttributes, x, grouping, "le")
			times(w, x, h.CreatedTimestamp, nowMs)
			count := h.GetSampleCount()
			if h.SampleCountFloat != nil {
				count = f2u(h.GetSampleCountFloat())
			}
			w.fixed64(fHDPCount, count)
			w.double(fHDPSum, h.GetSampleSum())
			bs := h.Bucket
			inf := float64(count)
			if len(bs) > 0 && math.IsInf(bs[len(bs)-1].GetUpperBound(), 1) {
				inf = cum(bs[len(bs)-1])
				bs = bs[:len(bs)-1]
			}
			bc := w.open(fHDPBuckets)
			prev := 0.0
			for _, b := range bs {
				w.appendFixed(uint64(max(0, cum(b)-prev)))
				prev = cum(b)
			}
			w.appendFixed(uint64(max(0, inf-prev)))
			w.close(bc)
			if len(bs) > 0 {
				eb := w.open(fHDPBounds)
				for _, b := range bs {
					w.appendFixed(math.Float64bits(b.GetUpperBound()))
				}
				w.close(eb)
			}
			w.close(p)
		}
		w.varint(fTemporality, cumulative)
		w.close(g)
	default: // info, stateset (OpenMetrics): non-monotonic sums
		ptype = strings.ToLower(typ.String())
		g := w.open(fMetricSum)
		for _, x := range f.Metric {
			p := w.open(fDataPoints)
			writeAttrs(w, fNDPAttributes, x, grouping, "")
			times(w, x, nil, nowMs)
			v := x.GetGauge().GetValue()
			if x.Untyped != nil {
				v = x.GetUntyped().GetValue()
			}
			w.double(fNDPDouble, v)
			w.close(p)
		}
		w.varint(fTemporality, cumulative)
		w.close(g)
	}
	md := w.open(fMetricMetadata)
	w.str(1, "prometheus.type")
	a := w.open(2)
	w.str(1, ptype)
	w.close(a)
	w.close(md)
	w.close(m)
}

func cum(b *dto.Bucket) float64 {
	if b.CumulativeCountFloat != nil {
		return b.GetCumulativeCountFloat()
	}
	return float64(b.GetCumulativeCount())
}

func urlUnescape(s string) (string, error) { return url.PathUnescape(s) }
