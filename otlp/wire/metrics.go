package wire

import (
	"google.golang.org/protobuf/encoding/protowire"
)

// MetricType is the data kind of a metric.
type MetricType uint8

// Metric types (the OTLP oneof data).
const (
	MetricEmpty MetricType = iota
	MetricGauge
	MetricSum
	MetricHistogram
	MetricExponentialHistogram
	MetricSummary
)

// MetricTypeNames name the types as flat_json writes them.
var MetricTypeNames = [...]string{"empty", "gauge", "sum", "histogram", "exponential_histogram", "summary"}

// Metric is a view of a metric (without its data points).
type Metric struct {
	Raw         []byte
	Name        []byte
	Description []byte
	Unit        []byte
	Type        MetricType
	Temporality int32 // sum, histogram, exponential histogram
	Monotonic   bool  // sum
	data        []byte
}

// DataPoint is a view of one data point of any type. Fields that its type
// does not have are zero.
type DataPoint struct {
	Raw           []byte
	Start         uint64
	Time          uint64
	Flags         uint32
	IsInt         bool // number point: Int, else Double
	Int           int64
	Double        float64
	Count         uint64
	Sum           float64
	HasSum        bool
	Min, Max      float64
	HasMin        bool
	HasMax        bool
	Scale         int32  // exponential histogram
	ZeroCount     uint64 // exponential histogram
	ZeroThreshold float64
	attrField     protowire.Number
}

// Attributes iterates the point's attributes.
func (d *DataPoint) Attributes() Attrs { return Attrs{Repeated{msg: d.Raw, num: d.attrField}} }

// BucketCounts iterates a histogram's bucket counts.
func (d *DataPoint) BucketCounts() Packed { return Packed{field(d.Raw, 6), true} }

// ExplicitBounds iterates a histogram's bounds.
func (d *DataPoint) ExplicitBounds() Packed { return Packed{field(d.Raw, 7), true} }

// Positive and Negative are an exponential histogram's bucket ranges.
func (d *DataPoint) Positive() (offset int32, counts Packed) { return expBuckets(field(d.Raw, 8)) }

// Negative is the negative bucket range of an exponential histogram.
func (d *DataPoint) Negative() (offset int32, counts Packed) { return expBuckets(field(d.Raw, 9)) }

// Quantiles iterates a summary's (quantile, value) pairs.
func (d *DataPoint) Quantiles() Repeated { return Repeated{msg: d.Raw, num: 6} }

// DecodeQuantile decodes a ValueAtQuantile.
func DecodeQuantile(b []byte) (q, v float64) {
	c := cursor{rest: b}
	for len(c.rest) > 0 && c.next() {
		if c.typ == protowire.Fixed64Type {
			if c.num == 1 {
				q = f64(c.u)
			} else if c.num == 2 {
				v = f64(c.u)
			}
		}
	}
	return q, v
}

func expBuckets(b []byte) (offset int32, counts Packed) {
	c := cursor{rest: b}
	for len(c.rest) > 0 && c.next() {
		switch {
		case c.num == 1 && c.typ == protowire.VarintType:
			offset = int32(protowire.DecodeZigZag(c.u))
		case c.num == 2 && c.typ == protowire.BytesType:
			counts = Packed{b: c.b, fixed: false}
		}
	}
	return offset, counts
}

// field returns the (last) bytes of length-delimited field num.
func field(msg []byte, num protowire.Number) []byte {
	var out []byte
	c := cursor{rest: msg}
	for len(c.rest) > 0 && c.next() {
		if c.num == num && c.typ == protowire.BytesType {
			out = c.b
		}
	}
	return out
}

// Packed iterates a packed repeated fixed64 (or, if !fixed, varint) field.
type Packed struct {
	b     []byte
	fixed bool
}

// Next returns the next value's bits (use math.Float64frombits for doubles).
func (p *Packed) Next() (uint64, bool) {
	if p.fixed {
		if len(p.b) < 8 {
			return 0, false
		}
		v := uint64(p.b[0]) | uint64(p.b[1])<<8 | uint64(p.b[2])<<16 | uint64(p.b[3])<<24 |
			uint64(p.b[4])<<32 | uint64(p.b[5])<<40 | uint64(p.b[6])<<48 | uint64(p.b[7])<<56
		p.b = p.b[8:]
		return v, true
	}
	v, n := uvarint(p.b)
	if n <= 0 {
		return 0, false
	}
	p.b = p.b[n:]
	return v, true
}

// Metrics iterates the data points of a MetricsData /
// ExportMetricsServiceRequest, each with its metric, scope and resource.
type Metrics struct {
	w      walker
	m      Metric
	points Repeated
	dp     DataPoint
}

// NewMetrics starts iterating data.
func NewMetrics(data []byte) Metrics { return Metrics{w: newWalker(data, &metricsPaths)} }

// Next decodes the next data point; false at the end or on error (see Err).
func (m *Metrics) Next() bool {
	for {
		if pb, ok := m.points.Next(); ok {
			if err := decodePoint(pb, m.m.Type, &m.dp); err != nil {
				m.w.err = err
				return false
			}
			return true
		}
		item, ok := m.w.nextItem()
		if !ok {
			return false
		}
		if err := decodeMetric(item, &m.m); err != nil {
			m.w.err = err
			return false
		}
		m.points = Repeated{msg: m.m.data, num: 1}
	}
}

// Metric is the current point's metric.
func (m *Metrics) Metric() *Metric { return &m.m }

// Point is the current data point.
func (m *Metrics) Point() *DataPoint { return &m.dp }

// Resource is the current point's resource.
func (m *Metrics) Resource() *Resource { return &m.w.res }

// Scope is the current point's scope.
func (m *Metrics) Scope() *Scope { return &m.w.sc }

// Err is the decode error that ended the iteration, if any.
func (m *Metrics) Err() error { return m.w.err }

func decodeMetric(b []byte, m *Metric) error {
	*m = Metric{Raw: b}
	c := cursor{rest: b}
	for len(c.rest) > 0 {
		if !c.next() {
			return errAt("metric", errTruncated.Error())
		}
		f := &c
		switch f.num {
		case 1, 2, 3:
			if err := wantType("metric", f, protowire.BytesType); err != nil {
				return err
			}
			switch f.num {
			case 1:
				m.Name = f.b
			case 2:
				m.Description = f.b
			case 3:
				m.Unit = f.b
			}
		case 5, 7, 9, 10, 11:
			if err := wantType("metric.data", f, protowire.BytesType); err != nil {
				return err
			}
			m.data = f.b
			switch f.num {
			case 5:
				m.Type = MetricGauge
			case 7:
				m.Type = MetricSum
			case 9:
				m.Type = MetricHistogram
			case 10:
				m.Type = MetricExponentialHistogram
			case 11:
				m.Type = MetricSummary
			}
			d := cursor{rest: f.b}
			for len(d.rest) > 0 {
				if !d.next() {
					return errAt("metric.data", errTruncated.Error())
				}
				switch {
				case d.num == 1 && d.typ != protowire.BytesType:
					return typeErr("metric.data.data_points", &d, protowire.BytesType)
				case d.num == 2 && d.typ == protowire.VarintType:
					m.Temporality = int32(d.u)
				case d.num == 3 && d.typ == protowire.VarintType:
					m.Monotonic = d.u != 0
				}
			}
		}
	}
	return nil
}

// Data point field numbers differ by type: attributes are 7 for number and
// summary points, 9 for histograms, 1 for exponential histograms.
func decodePoint(b []byte, t MetricType, d *DataPoint) error {
	*d = DataPoint{Raw: b}
	switch t {
	case MetricHistogram:
		d.attrField = 9
	case MetricExponentialHistogram:
		d.attrField = 1
	default:
		d.attrField = 7
	}
	c := cursor{rest: b}
	for len(c.rest) > 0 {
		if !c.next() {
			return errAt("data_point", errTruncated.Error())
		}
		f := &c
		if f.num == d.attrField {
			if err := wantType("data_point.attributes", f, protowire.BytesType); err != nil {
				return err
			}
			if err := validKV(f.b); err != nil {
				return errAt("data_point.attributes", err.Error())
			}
			continue
		}
		switch f.num {
		case 2, 3:
			if err := wantType("data_point.time", f, protowire.Fixed64Type); err != nil {
				return err
			}
			if f.num == 2 {
				d.Start = f.u
			} else {
				d.Time = f.u
			}
		}
		switch t {
		case MetricGauge, MetricSum:
			switch f.num {
			case 4:
				if err := wantType("data_point.as_double", f, protowire.Fixed64Type); err != nil {
					return err
				}
				d.Double, d.IsInt = f64(f.u), false
			case 6:
				if err := wantType("data_point.as_int", f, protowire.Fixed64Type); err != nil {
					return err
				}
				d.Int, d.IsInt = int64(f.u), true
			case 8:
				d.Flags = uint32(f.u)
			}
		case MetricHistogram, MetricExponentialHistogram, MetricSummary:
			switch {
			case f.num == 4 && f.typ == protowire.Fixed64Type:
				d.Count = f.u
			case f.num == 5 && f.typ == protowire.Fixed64Type:
				d.Sum, d.HasSum = f64(f.u), true
			case t == MetricHistogram && (f.num == 6 || f.num == 7):
				if err := wantType("data_point.buckets", f, protowire.BytesType); err != nil {
					return err
				}
				if len(f.b)%8 != 0 {
					return errAt("data_point.buckets", "packed fixed64 of a length not a multiple of 8")
				}
			case t == MetricHistogram && f.num == 11 || t == MetricExponentialHistogram && f.num == 12:
				d.Min, d.HasMin = f64(f.u), true
			case t == MetricHistogram && f.num == 12 || t == MetricExponentialHistogram && f.num == 13:
				d.Max, d.HasMax = f64(f.u), true
			case t == MetricExponentialHistogram && f.num == 6:
				d.Scale = int32(protowire.DecodeZigZag(f.u))
			case t == MetricExponentialHistogram && f.num == 7:
				d.ZeroCount = f.u
			case t == MetricExponentialHistogram && f.num == 14:
				d.ZeroThreshold = f64(f.u)
			case f.num == 10 || (t == MetricSummary && f.num == 8):
				d.Flags = uint32(f.u)
			}
		}
	}
	return nil
}
