// Package prom holds ferry's Prometheus doors: remote write (v1 and v2,
// snappy protobuf, /api/v1/write) and the pushgateway push format
// (/metrics/job/<job>{/<label>/<value>}), each converted into an OTLP
// ExportMetricsServiceRequest in protobuf (docs/prometheus.md has the
// mapping). Remote write is decoded by a protowire walk that keeps offsets
// into the body (no copy of a label), after a first walk that counts
// series, labels and points against the bounds, so nothing is allocated
// for a request that is refused. Both doors count the data points against
// Limits.MaxItems as early as the count is sure (door.ErrTooManyItems),
// and what the mapping drops (gauge histograms, points without _count,
// exemplars …) in door.Stats.
package prom

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/ferryhq/ferry/otlp/door"
)

func protowireNum(i int) protowire.Number { return protowire.Number(i) }

// ErrTooLarge: the converted request would pass its reservation (the
// receiver answers 413). It says TooLarge() to receiver/otlpreceiver.
var ErrTooLarge = tooLarge{}

type tooLarge struct{}

func (tooLarge) Error() string  { return "the request converted to OTLP exceeds its bound" }
func (tooLarge) TooLarge() bool { return true }

// Bounds checked before allocation (the tests lower them). A request past
// one is refused whole: 400 for a label bound (resending cannot help),
// ErrTooLarge (413) for counts.
var (
	MaxLabelsPerSeries = 256
	MaxLabelNameBytes  = 1024
	MaxLabelValueBytes = 16 << 10
	MaxBucketsPerPoint = 1024 // classic buckets of one histogram point, native buckets of one side
	// MaxSeriesPerRequest bounds the series of one request (Prometheus
	// sends 2,000; the decoding state is ~100 bytes a series).
	MaxSeriesPerRequest = 200_000
	// MaxSymbols bounds remote write 2.0's symbol table (8 bytes each).
	MaxSymbols = 1 << 20
	// minPointBytes: no OTLP data point is smaller (tag, length, a
	// timestamp and a value: 20 bytes), so a request whose series or
	// points pass max/minPointBytes cannot fit its reservation.
	minPointBytes = 20
)

// kind is Prometheus's metric type (the values of remote write's enums).
type kind uint8

const (
	kUnknown kind = iota
	kCounter
	kGauge
	kHistogram
	kGaugeHistogram
	kSummary
	kInfo
	kStateset
)

var kindNames = [...]string{"unknown", "counter", "gauge", "histogram", "gaugehistogram", "summary", "info", "stateset"}

func (k kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "unknown"
}

// span is a string of the body: offset and length.
type span struct{ o, n uint32 }

func (s span) of(src []byte) []byte { return src[s.o : s.o+s.n] }

// part: what a series is of its family.
type part uint8

const (
	pPlain  part = iota // gauge or sum point
	pBucket             // classic histogram _bucket (le)
	pSum                // _sum
	pCount              // _count
	pQuantile
	pNative // native histogram samples
)

// series is one decoded time series: its name, job and instance, the raw
// message to walk again for its other labels and its samples (labels are
// not copied: a request's decoding state is this struct a series, at most
// MaxSeriesPerRequest), its family.
type series struct {
	nLabels    int32 // kept (less __name__, job, instance and empty values)
	le, quant  bool  // has an le or quantile label
	name       span
	job, inst  span
	hasJob     bool
	hasInst    bool
	kind       kind
	help, unit span
	msg        span // the TimeSeries message
	lab        span // the stretch of msg holding its labels (labelRegion)
	nSamples   int32
	nHists     int32
	fam        int32
	part       part
	nhcb       bool // native histograms with custom buckets (schema -53)
	info       bool // target_info: resource attributes
	// v2: the symbols of __name__, job and instance (canonical: canon)
	nameRef, jobRef, instRef int32
}

// fam is one OTLP metric: a family of one resource.
type fam struct {
	res        int32
	name       []byte
	kind       kind
	native     bool // exponential (or custom-bucket) histograms
	nhcb       bool
	help, unit span
	series     []int32
}

type resource struct {
	job, inst       span
	hasJob, hasInst bool
	info            int32 // target_info series, -1
	fams            []int32
}

// conv is one conversion's state.
type conv struct {
	src    []byte
	door   string
	series []series
	v2     bool
	syms   []span // v2's symbols
	fams   []fam
	res    []resource
	resIdx map[string]int32
	famIdx map[string]int32
	key    []byte
	w      pbw
	lim    door.Limits
	// st counts what the mapping leaves out (gauge histograms, histogram
	// points without _count, exemplars …), for the caller.
	st *door.Stats
	// points: data points counted against lim.MaxItems (while decoding,
	// those sure to be written; while writing, every one).
	points int
	// v2: a symbol's canonical index (1+ the first symbol of its bytes; 0
	// not yet known) and the index by bytes, so that what keys series by
	// their strings (resources, families, classic points) keys them by
	// index: every series may reference the same 16 KiB symbols, and
	// hashing or copying their bytes once a series costs what the body
	// does not hold.
	canonOf  []int32
	canonIdx map[string]int32
	fnames   map[[2]int32]int32 // v2: a family name (canonical symbol, length) → its index in fnameIdx
	fnameIdx map[string]int32
}

// canon is v2 symbol r's canonical index: the first symbol of its bytes
// the conversion met.
func (c *conv) canon(r int32) int32 {
	if v := c.canonOf[r]; v != 0 {
		return v - 1
	}
	id, ok := c.canonIdx[string(c.str(c.syms[r]))]
	if !ok {
		id = r
		c.canonIdx[string(c.str(c.syms[r]))] = id
	}
	c.canonOf[r] = id + 1
	return id
}

// fnameID is v2's index of a family name, a prefix of symbol r's bytes.
func (c *conv) fnameID(r int32, fname []byte) int32 {
	k := [2]int32{c.canon(r), int32(len(fname))}
	if id, ok := c.fnames[k]; ok {
		return id
	}
	id, ok := c.fnameIdx[string(fname)]
	if !ok {
		id = int32(len(c.fnameIdx))
		c.fnameIdx[string(fname)] = id
	}
	c.fnames[k] = id
	return id
}

func appendInt32(b []byte, v int32) []byte {
	return append(b, byte(v), byte(v>>8), byte(v>>16), byte(v>>24))
}

func (c *conv) str(s span) []byte { return s.of(c.src) }

// point counts a data point about to be written; past lim.MaxItems it
// stops the writer with the refusal and says false.
func (c *conv) point() bool {
	if c.w.err != nil {
		return false
	}
	c.points++
	if c.lim.Over(c.points) {
		c.w.err = tooManyPoints(c.lim.MaxItems)
		return false
	}
	return true
}

// group assigns every series its resource and family.
func (c *conv) group() {
	c.resIdx = make(map[string]int32)
	c.famIdx = make(map[string]int32)
	if c.v2 {
		c.fnames, c.fnameIdx = make(map[[2]int32]int32), make(map[string]int32)
	}
	for i := range c.series {
		s := &c.series[i]
		if c.v2 {
			// a job or instance absent or empty is no bytes, as below
			job, inst := int32(-1), int32(-1)
			if s.job.n > 0 {
				job = c.canon(s.jobRef)
			}
			if s.inst.n > 0 {
				inst = c.canon(s.instRef)
			}
			c.key = appendInt32(appendInt32(c.key[:0], job), inst)
		} else {
			c.key = append(c.key[:0], c.str(s.job)...)
			c.key = append(c.key, 0xff)
			c.key = append(c.key, c.str(s.inst)...)
		}
		ri, ok := c.resIdx[string(c.key)]
		if !ok {
			ri = int32(len(c.res))
			c.res = append(c.res, resource{job: s.job, inst: s.inst, hasJob: s.hasJob, hasInst: s.hasInst, info: -1})
			c.resIdx[string(c.key)] = ri
		}
		name := c.str(s.name)
		if bytes.Equal(name, []byte("target_info")) && s.nHists == 0 {
			s.info = true
			if c.res[ri].info < 0 {
				c.res[ri].info = int32(i)
			} else {
				c.st.Drop(door.TargetInfo, 1) // one a resource: its labels are the attributes
			}
			continue
		}
		fname, p := familyOf(name, s.kind, s.le, s.quant)
		if s.nHists > 0 {
			fname, p = name, pNative
		}
		if s.kind == kGaugeHistogram {
			c.st.Drop(door.GaugeHistogram, int(s.nSamples+s.nHists))
			s.fam = -1
			continue
		}
		if p == pNative {
			c.st.Drop(door.MixedSeries, int(s.nSamples)) // the series is of native histograms
		}
		k := s.kind
		if p == pPlain && (k == kHistogram || k == kSummary) {
			k = kUnknown // a histogram's or summary's series we cannot place: a gauge of its own name
		}
		nhcb := p == pNative && s.nhcb
		c.key = append(c.key[:0], byte(ri), byte(ri>>8), byte(ri>>16), byte(ri>>24), byte(k), byte(p/pNative), b2i(nhcb))
		if c.v2 {
			c.key = appendInt32(c.key, c.fnameID(s.nameRef, fname))
		} else {
			c.key = append(c.key, fname...)
		}
		fi, ok := c.famIdx[string(c.key)]
		if !ok {
			fi = int32(len(c.fams))
			c.fams = append(c.fams, fam{res: ri, name: fname, kind: k, native: p == pNative, nhcb: nhcb, help: s.help, unit: s.unit})
			c.famIdx[string(c.key)] = fi
			c.res[ri].fams = append(c.res[ri].fams, fi)
		}
		f := &c.fams[fi]
		if f.help.n == 0 {
			f.help = s.help
		}
		if f.unit.n == 0 {
			f.unit = s.unit
		}
		f.series = append(f.series, int32(i))
		s.fam, s.part = fi, p
	}
}

// familyOf: the family name and the part a series is of it, by its type.
func familyOf(name []byte, k kind, le, quantile bool) ([]byte, part) {
	switch k {
	case kHistogram, kGaugeHistogram:
		switch {
		case le && bytes.HasSuffix(name, []byte("_bucket")):
			return name[:len(name)-7], pBucket
		case bytes.HasSuffix(name, []byte("_sum")):
			return name[:len(name)-4], pSum
		case bytes.HasSuffix(name, []byte("_count")):
			return name[:len(name)-6], pCount
		}
	case kSummary:
		switch {
		case quantile:
			return name, pQuantile
		case bytes.HasSuffix(name, []byte("_sum")):
			return name[:len(name)-4], pSum
		case bytes.HasSuffix(name, []byte("_count")):
			return name[:len(name)-6], pCount
		}
	}
	return name, pPlain
}

// OTLP field numbers (opentelemetry/proto/metrics/v1).
const (
	fReqResourceMetrics = 1
	fRMResource         = 1
	fRMScopeMetrics     = 2
	fResAttributes      = 1
	fSMScope            = 1
	fSMMetrics          = 2
	fScopeName          = 1
	fMetricName         = 1
	fMetricDescription  = 2
	fMetricUnit         = 3
	fMetricGauge        = 5
	fMetricSum          = 7
	fMetricHistogram    = 9
	fMetricExpHistogram = 10
	fMetricSummary      = 11
	fMetricMetadata     = 12
	fDataPoints         = 1
	fTemporality        = 2
	fMonotonic          = 3
	cumulative          = 2
	// NumberDataPoint
	fNDPAttributes = 7
	fNDPStart      = 2
	fNDPTime       = 3
	fNDPDouble     = 4
	fNDPFlags      = 8
	// HistogramDataPoint
	fHDPAttributes = 9
	fHDPCount      = 4
	fHDPSum        = 5
	fHDPBuckets    = 6
	fHDPBounds     = 7
	fHDPFlags      = 10
	// ExponentialHistogramDataPoint
	fEDPAttributes = 1
	fEDPCount      = 4
	fEDPSum        = 5
	fEDPScale      = 6
	fEDPZeroCount  = 7
	fEDPPositive   = 8
	fEDPNegative   = 9
	fEDPFlags      = 10
	fEDPZeroThresh = 14
	// SummaryDataPoint
	fSDPAttributes  = 7
	fSDPCount       = 4
	fSDPSum         = 5
	fSDPQuantiles   = 6
	fSDPFlags       = 8
	noRecordedValue = 1
)

// staleNaN is Prometheus's staleness marker: the series ended.
const staleNaN = 0x7ff0000000000002

func isStale(v float64) bool { return math.Float64bits(v) == staleNaN }

const msToNs = 1e6

// emit writes the grouped request as OTLP; walk calls fn for each sample
// of series s (value, timestamp ms, start ms) and hist for each native
// histogram.
func (c *conv) emit(samples func(s *series, fn func(v float64, ts, start int64)) error, hists func(s *series, fn func(h *nhist)) error) error {
	w := &c.w
	for ri := range c.res {
		r := &c.res[ri]
		if len(r.fams) == 0 {
			continue
		}
		rm := w.open(fReqResourceMetrics)
		res := w.open(fRMResource)
		if r.hasJob {
			job := c.str(r.job)
			if i := bytes.IndexByte(job, '/'); i > 0 && bytes.Count(job, []byte("/")) == 1 && i < len(job)-1 {
				w.kv(fResAttributes, []byte("service.namespace"), job[:i])
				job = job[i+1:]
			}
			w.kv(fResAttributes, []byte("service.name"), job)
		}
		if r.hasInst {
			w.kv(fResAttributes, []byte("service.instance.id"), c.str(r.inst))
		}
		if r.info >= 0 {
			s := &c.series[r.info]
			c.eachLabel(s, func(name, value []byte) { w.kv(fResAttributes, name, value) })
		}
		w.close(res)
		sm := w.open(fRMScopeMetrics)
		sc := w.open(fSMScope)
		w.str(fScopeName, c.door)
		w.close(sc)
		for _, fi := range r.fams {
			if err := c.emitFam(&c.fams[fi], samples, hists); err != nil {
				return err
			}
		}
		w.close(sm)
		w.close(rm)
	}
	return w.err
}

func (c *conv) attrs(field int, s *series, skip string) {
	c.eachLabel(s, func(name, value []byte) {
		if skip == "" || string(name) != skip {
			c.w.kv(protowireNum(field), name, value)
		}
	})
}

func (c *conv) emitFam(f *fam, samples func(s *series, fn func(v float64, ts, start int64)) error, hists func(s *series, fn func(h *nhist)) error) error {
	w := &c.w
	m := w.open(fSMMetrics)
	w.bytes(fMetricName, f.name)
	if f.help.n > 0 {
		w.bytes(fMetricDescription, c.str(f.help))
	}
	if f.unit.n > 0 {
		w.bytes(fMetricUnit, c.str(f.unit))
	}
	var err error
	switch {
	case f.native:
		err = c.emitNative(f, hists)
	case f.kind == kHistogram || f.kind == kSummary:
		err = c.emitClassic(f, samples)
	default:
		field, sum := fMetricGauge, false
		switch f.kind {
		case kCounter, kInfo, kStateset:
			field, sum = fMetricSum, true
		}
		g := w.open(protowireNum(field))
		for _, si := range f.series {
			s := &c.series[si]
			err = samples(s, func(v float64, ts, start int64) {
				if !c.point() {
					return
				}
				p := w.open(fDataPoints)
				c.attrs(fNDPAttributes, s, "")
				if start != 0 {
					w.fixed64(fNDPStart, uint64(start*msToNs))
				}
				w.fixed64(fNDPTime, uint64(ts*msToNs))
				w.double(fNDPDouble, v)
				if isStale(v) {
					w.varint(fNDPFlags, noRecordedValue)
				}
				w.close(p)
			})
			if err != nil {
				break
			}
		}
		if sum {
			w.varint(fTemporality, cumulative)
			if f.kind == kCounter {
				w.varint(fMonotonic, 1)
			}
		}
		w.close(g)
	}
	if err != nil {
		return err
	}
	md := w.open(fMetricMetadata)
	w.bytes(1, []byte("prometheus.type"))
	a := w.open(2)
	w.str(1, f.kind.String())
	w.close(a)
	w.close(md)
	w.close(m)
	return w.err
}

// classic histogram and summary points, assembled from their series by
// labels (less le or quantile) and timestamp.
type cpoint struct {
	series     int32 // whose labels (less le/quantile) it carries
	ts, start  int64
	count, sum float64
	hasCount   bool
	hasSum     bool
	stale      bool
	buckets    []bound // le or quantile, value
}

type bound struct{ at, v float64 }

func (c *conv) emitClassic(f *fam, samples func(s *series, fn func(v float64, ts, start int64)) error) error {
	skip := "le"
	if f.kind == kSummary {
		skip = "quantile"
	}
	var pts []cpoint
	// A point is its series' labels (less skip) and a timestamp: the
	// labels are keyed once a series (group), the point by group and
	// timestamp, so that a sample costs neither its labels' bytes nor a
	// copy of them.
	type pkey struct {
		group int32
		ts    int64
	}
	groups := make(map[string]int32, len(f.series))
	var ats map[int32]float64 // v2: le or quantile values parsed
	if c.v2 {
		ats = make(map[int32]float64)
	}
	idx := make(map[pkey]int, len(f.series))
	var perr error
	for _, si := range f.series {
		s := &c.series[si]
		// the point's key: the labels less skip (sorted as sent: Prometheus
		// sends sorted labels; a sender that does not splits points).
		c.key = c.key[:0]
		at := math.NaN()
		var lerr error
		parse := func(value []byte) {
			v, err := strconv.ParseFloat(string(value), 64)
			if err != nil {
				lerr = fmt.Errorf("series %s: %s=%q is not a number", c.str(s.name), skip, value)
			}
			at = v
		}
		if c.v2 {
			// by canonical symbols (canon), each le or quantile value
			// parsed once
			c.eachRef(s, func(nr, vr int32) {
				if string(c.str(c.syms[nr])) == skip {
					id := c.canon(vr)
					v, ok := ats[id]
					if !ok {
						parse(c.str(c.syms[vr]))
						v = at
						if lerr == nil {
							ats[id] = v
						}
					}
					at = v
					return
				}
				c.key = appendInt32(appendInt32(c.key, c.canon(nr)), c.canon(vr))
			})
		} else {
			c.eachLabel(s, func(name, value []byte) {
				if string(name) == skip {
					parse(value)
					return
				}
				c.key = append(c.key, name...)
				c.key = append(c.key, 0xff)
				c.key = append(c.key, value...)
				c.key = append(c.key, 0xfe)
			})
		}
		if lerr != nil {
			return lerr
		}
		g, ok := groups[string(c.key)]
		if !ok {
			g = int32(len(groups))
			groups[string(c.key)] = g
		}
		err := samples(s, func(v float64, ts, start int64) {
			k := pkey{g, ts}
			pi, ok := idx[k]
			if !ok {
				pi = len(pts)
				idx[k] = pi
				pts = append(pts, cpoint{series: si, ts: ts})
			}
			p := &pts[pi]
			if start != 0 {
				p.start = start
			}
			if isStale(v) {
				p.stale = true
			}
			switch s.part {
			case pSum:
				p.sum, p.hasSum = v, true
			case pCount:
				p.count, p.hasCount = v, true
				p.series = si
			case pBucket, pQuantile:
				if len(p.buckets) >= MaxBucketsPerPoint {
					perr = fmt.Errorf("%s: more than %d buckets or quantiles in a point", f.name, MaxBucketsPerPoint)
					return
				}
				p.buckets = append(p.buckets, bound{at, v})
			}
		})
		if err != nil {
			return err
		}
		if perr != nil {
			return perr
		}
	}
	w := &c.w
	field := fMetricHistogram
	if f.kind == kSummary {
		field = fMetricSummary
	}
	h := w.open(protowireNum(field))
	for i := range pts {
		p := &pts[i]
		if !p.hasCount {
			c.st.Drop(door.NoCount, 1) // the spec: a histogram or summary without _count is dropped
			continue
		}
		if !c.point() {
			return w.err
		}
		slices.SortFunc(p.buckets, func(a, b bound) int {
			switch {
			case a.at < b.at:
				return -1
			case a.at > b.at:
				return 1
			}
			return 0
		})
		s := &c.series[p.series]
		dp := w.open(fDataPoints)
		if f.kind == kSummary {
			c.attrs(fSDPAttributes, s, skip)
			if p.start != 0 {
				w.fixed64(fNDPStart, uint64(p.start*msToNs))
			}
			w.fixed64(fNDPTime, uint64(p.ts*msToNs))
			w.fixed64(fSDPCount, uint64(p.count))
			w.double(fSDPSum, p.sum)
			for _, q := range p.buckets {
				qv := w.open(fSDPQuantiles)
				w.double(1, q.at)
				w.double(2, q.v)
				w.close(qv)
			}
			if p.stale {
				w.varint(fSDPFlags, noRecordedValue)
			}
		} else {
			c.attrs(fHDPAttributes, s, skip)
			if p.start != 0 {
				w.fixed64(fNDPStart, uint64(p.start*msToNs))
			}
			w.fixed64(fNDPTime, uint64(p.ts*msToNs))
			w.fixed64(fHDPCount, uint64(p.count))
			if p.hasSum {
				w.double(fHDPSum, p.sum)
			}
			// cumulative le buckets → per-bucket counts; +Inf is the last
			// bucket (no bound), or count when it is missing.
			bs := p.buckets
			inf := p.count
			if len(bs) > 0 && math.IsInf(bs[len(bs)-1].at, 1) {
				inf = bs[len(bs)-1].v
				bs = bs[:len(bs)-1]
			}
			if len(bs) > 0 || len(p.buckets) > 0 {
				bc := w.open(fHDPBuckets)
				prev := 0.0
				for _, b := range bs {
					w.appendFixed(uint64(max(0, b.v-prev)))
					prev = b.v
				}
				w.appendFixed(uint64(max(0, inf-prev)))
				w.close(bc)
				if len(bs) > 0 {
					eb := w.open(fHDPBounds)
					for _, b := range bs {
						w.appendFixed(math.Float64bits(b.at))
					}
					w.close(eb)
				}
			}
			if p.stale {
				w.varint(fHDPFlags, noRecordedValue)
			}
		}
		w.close(dp)
	}
	if field == fMetricHistogram {
		w.varint(fTemporality, cumulative)
	}
	w.close(h)
	return w.err
}

// appendFixed adds 8 bytes of a packed field.
func (w *pbw) appendFixed(v uint64) {
	if w.room(8) {
		w.b = append(w.b, byte(v), byte(v>>8), byte(v>>16), byte(v>>24), byte(v>>32), byte(v>>40), byte(v>>48), byte(v>>56))
	}
}

var errNoSeries = errors.New("no series")

func b2i(b bool) byte {
	if b {
		return 1
	}
	return 0
}
