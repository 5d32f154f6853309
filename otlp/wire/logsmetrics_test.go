package wire

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/plog/plogotlp"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"

	"github.com/ferryhq/ferry/tools/otlpgen"
)

func TestLogsMatchPdata(t *testing.T) {
	ld := otlpgen.New(3).Logs(4, 100)
	lr := ld.ResourceLogs().At(0).ScopeLogs().AppendEmpty().LogRecords().AppendEmpty()
	lr.Body().SetEmptyMap().PutStr("msg", "structured")
	lr.SetObservedTimestamp(99)
	lr.SetEventName("login")
	lr.SetFlags(1)
	raw, _ := plogotlp.NewExportRequestFromLogs(ld).MarshalProto()
	var want []plog.LogRecord
	sls := ld.ResourceLogs().At(0).ScopeLogs()
	for i := 0; i < sls.Len(); i++ {
		for j := 0; j < sls.At(i).LogRecords().Len(); j++ {
			want = append(want, sls.At(i).LogRecords().At(j))
		}
	}
	it := NewLogs(raw)
	n := 0
	for it.Next() {
		got, w := it.Record(), want[n]
		tid := w.TraceID()
		if got.Time != uint64(w.Timestamp()) || got.ObservedTime != uint64(w.ObservedTimestamp()) ||
			got.SeverityNumber != int32(w.SeverityNumber()) || string(got.SeverityText) != w.SeverityText() ||
			string(got.EventName) != w.EventName() || got.Flags != uint32(w.Flags()) ||
			(!w.TraceID().IsEmpty() && !bytes.Equal(got.TraceID, tid[:])) {
			t.Fatalf("record %d differs: %+v", n, got)
		}
		if !reflect.DeepEqual(rawValue(got.Body), w.Body().AsRaw()) {
			t.Fatalf("record %d body %v, want %v", n, rawValue(got.Body), w.Body().AsRaw())
		}
		if !reflect.DeepEqual(rawAttrs(got.Attributes()), w.Attributes().AsRaw()) {
			t.Fatalf("record %d attributes differ", n)
		}
		n++
	}
	if it.Err() != nil || n != len(want) {
		t.Fatalf("err %v, %d of %d records", it.Err(), n, len(want))
	}
}

func TestMetricsMatchPdata(t *testing.T) {
	md := otlpgen.New(5).Metrics(2, 2, 2)
	sm := md.ResourceMetrics().At(0).ScopeMetrics().AppendEmpty()
	e := sm.Metrics().AppendEmpty()
	e.SetName("exp")
	eh := e.SetEmptyExponentialHistogram()
	edp := eh.DataPoints().AppendEmpty()
	edp.SetScale(-2)
	edp.SetCount(7)
	edp.SetZeroCount(1)
	edp.Positive().SetOffset(-3)
	edp.Positive().BucketCounts().FromRaw([]uint64{1, 2, 300})
	edp.SetMin(0.5)
	s := sm.Metrics().AppendEmpty()
	s.SetName("sum")
	sdp := s.SetEmptySummary().DataPoints().AppendEmpty()
	sdp.SetCount(3)
	sdp.SetSum(9)
	q := sdp.QuantileValues().AppendEmpty()
	q.SetQuantile(0.99)
	q.SetValue(8)
	raw, _ := pmetricotlp.NewExportRequestFromMetrics(md).MarshalProto()

	type point struct {
		name  string
		typ   MetricType
		attrs map[string]any
		val   any
	}
	var want []point
	sms := md.ResourceMetrics().At(0).ScopeMetrics()
	for i := 0; i < sms.Len(); i++ {
		ms := sms.At(i).Metrics()
		for j := 0; j < ms.Len(); j++ {
			m := ms.At(j)
			switch m.Type() {
			case pmetric.MetricTypeGauge:
				dp := m.Gauge().DataPoints().At(0)
				want = append(want, point{m.Name(), MetricGauge, dp.Attributes().AsRaw(), dp.DoubleValue()})
			case pmetric.MetricTypeSum:
				dp := m.Sum().DataPoints().At(0)
				want = append(want, point{m.Name(), MetricSum, dp.Attributes().AsRaw(), dp.IntValue()})
			case pmetric.MetricTypeHistogram:
				dp := m.Histogram().DataPoints().At(0)
				want = append(want, point{m.Name(), MetricHistogram, dp.Attributes().AsRaw(),
					[]any{dp.Count(), dp.Sum(), dp.BucketCounts().AsRaw(), dp.ExplicitBounds().AsRaw()}})
			case pmetric.MetricTypeExponentialHistogram:
				dp := m.ExponentialHistogram().DataPoints().At(0)
				want = append(want, point{m.Name(), MetricExponentialHistogram, dp.Attributes().AsRaw(),
					[]any{dp.Count(), dp.Scale(), dp.Positive().Offset(), dp.Positive().BucketCounts().AsRaw(), dp.Min()}})
			case pmetric.MetricTypeSummary:
				dp := m.Summary().DataPoints().At(0)
				want = append(want, point{m.Name(), MetricSummary, dp.Attributes().AsRaw(), []any{dp.Count(), dp.Sum(), 0.99, 8.0}})
			}
		}
	}
	it := NewMetrics(raw)
	n := 0
	for it.Next() {
		m, dp, w := it.Metric(), it.Point(), want[n]
		var val any
		switch m.Type {
		case MetricGauge:
			val = dp.Double
		case MetricSum:
			val = dp.Int
		case MetricHistogram:
			var counts []uint64
			var bounds []float64
			for p := dp.BucketCounts(); ; {
				v, ok := p.Next()
				if !ok {
					break
				}
				counts = append(counts, v)
			}
			for p := dp.ExplicitBounds(); ; {
				v, ok := p.Next()
				if !ok {
					break
				}
				bounds = append(bounds, math.Float64frombits(v))
			}
			val = []any{dp.Count, dp.Sum, counts, bounds}
		case MetricExponentialHistogram:
			off, p := dp.Positive()
			var counts []uint64
			for {
				v, ok := p.Next()
				if !ok {
					break
				}
				counts = append(counts, v)
			}
			val = []any{dp.Count, dp.Scale, off, counts, dp.Min}
		case MetricSummary:
			qs := dp.Quantiles()
			qb, _ := qs.Next()
			qq, qv := DecodeQuantile(qb)
			val = []any{dp.Count, dp.Sum, qq, qv}
		}
		if string(m.Name) != w.name || m.Type != w.typ || !reflect.DeepEqual(val, w.val) ||
			!reflect.DeepEqual(rawAttrs(dp.Attributes()), w.attrs) {
			t.Fatalf("point %d (%s): got %v %v, want %v %v", n, m.Name, val, rawAttrs(dp.Attributes()), w.val, w.attrs)
		}
		n++
	}
	if it.Err() != nil || n != len(want) {
		t.Fatalf("err %v, %d of %d points", it.Err(), n, len(want))
	}
	_ = pcommon.NewMap
}

// FuzzLogsAndMetrics: arbitrary bytes never panic either iterator, and
// each half is held to pdata as FuzzTraces holds spans: whatever pdata
// decodes, its canonical re-encoding decodes here too (unless our bound on
// value nesting, which pdata lacks, refuses it), and where we accept the
// raw bytes, or else pdata's re-encoding, we yield the same log records
// (times, severity, event name, trace id) and the same data points
// (metric name and type, times, flags, a number point's int or double
// bits, a histogram or summary point's count), in the same order.
func FuzzLogsAndMetrics(f *testing.F) {
	l, _ := plogotlp.NewExportRequestFromLogs(otlpgen.New(1).Logs(3, 10)).MarshalProto()
	m, _ := pmetricotlp.NewExportRequestFromMetrics(otlpgen.New(1).Metrics(1, 1, 1)).MarshalProto()
	f.Add(l)
	f.Add(m)
	// Every metric type, and the points pdata and we could disagree on: a
	// number point with no value, one with both (the last wins), an
	// exponential histogram, a summary.
	md := otlpgen.New(5).Metrics(2, 2, 2)
	sm := md.ResourceMetrics().At(0).ScopeMetrics().AppendEmpty()
	e := sm.Metrics().AppendEmpty()
	e.SetName("exp")
	edp := e.SetEmptyExponentialHistogram().DataPoints().AppendEmpty()
	edp.SetCount(7)
	edp.Positive().BucketCounts().FromRaw([]uint64{1, 2})
	s := sm.Metrics().AppendEmpty()
	s.SetName("sum")
	s.SetEmptySummary().DataPoints().AppendEmpty().SetCount(3)
	g := sm.Metrics().AppendEmpty()
	g.SetName("empty-point")
	g.SetEmptyGauge().DataPoints().AppendEmpty().SetTimestamp(5)
	all, _ := pmetricotlp.NewExportRequestFromMetrics(md).MarshalProto()
	f.Add(all)
	// as_double then as_int in one point (fields 4 and 6): the last wins.
	pt := []byte{0x21, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f, 0x31, 2, 0, 0, 0, 0, 0, 0, 0}
	gauge := append([]byte{0x0a, byte(len(pt))}, pt...)
	metric := append([]byte{0x0a, 1, 'g', 0x2a, byte(len(gauge))}, gauge...)
	scope := append([]byte{0x12, byte(len(metric))}, metric...)
	res := append([]byte{0x12, byte(len(scope))}, scope...)
	f.Add(append([]byte{0x0a, byte(len(res))}, res...))
	ld := otlpgen.New(2).Logs(2, 8)
	lr := ld.ResourceLogs().At(0).ScopeLogs().At(0).LogRecords().AppendEmpty()
	lr.SetEventName("login")
	lr.SetSeverityText("WARN")
	lr.SetObservedTimestamp(99)
	lr.SetTraceID([16]byte{1, 2})
	lr.Body().SetEmptyMap().PutEmptySlice("a").AppendEmpty().SetInt(1)
	l2, _ := plogotlp.NewExportRequestFromLogs(ld).MarshalProto()
	f.Add(l2)
	f.Fuzz(func(t *testing.T, raw []byte) {
		ours, ourErr := logsOf(raw)
		lreq := plogotlp.NewExportRequest()
		if lreq.UnmarshalProto(raw) == nil {
			want := pdataLogs(lreq.Logs())
			if ourErr != nil {
				canon, err := lreq.MarshalProto()
				if err != nil {
					t.Fatal(err)
				}
				if ours, ourErr = logsOf(canon); ourErr != nil && !tooDeep(ourErr) {
					t.Fatalf("pdata's own encoding of the logs is refused: %v", ourErr)
				}
			}
			if ourErr == nil {
				sameItems(t, "log record", ours, want)
			}
		}

		ourPts, ourErr := pointsOf(raw)
		mreq := pmetricotlp.NewExportRequest()
		if mreq.UnmarshalProto(raw) == nil {
			want := pdataPoints(mreq.Metrics())
			if ourErr != nil {
				canon, err := mreq.MarshalProto()
				if err != nil {
					t.Fatal(err)
				}
				if ourPts, ourErr = pointsOf(canon); ourErr != nil && !tooDeep(ourErr) {
					t.Fatalf("pdata's own encoding of the metrics is refused: %v", ourErr)
				}
			}
			if ourErr == nil {
				if mreq.Metrics().DataPointCount() != len(want) {
					t.Fatalf("pdata counts %d data points and lists %d", mreq.Metrics().DataPointCount(), len(want))
				}
				sameItems(t, "data point", ourPts, want)
			}
		}
	})
}

// tooDeep: the error is our bound on value nesting, which pdata has not.
func tooDeep(err error) bool { return strings.Contains(err.Error(), "nested too deeply") }

// sameItems fails unless got and want are the same items in order.
func sameItems(t *testing.T, what string, got, want []string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d %ss, pdata %d:\n%q\n%q", len(got), what, len(want), got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("%s %d: %s, pdata %s", what, i, got[i], want[i])
		}
	}
}

// logsOf describes every log record the iterator yields (attributes and
// body walked too), and its error.
func logsOf(raw []byte) ([]string, error) {
	var out []string
	it := NewLogs(raw)
	for it.Next() {
		r := it.Record()
		_ = rawAttrs(r.Attributes())
		_ = rawValue(r.Body)
		tid := ""
		if len(r.TraceID) > 0 {
			tid = hex.EncodeToString(r.TraceID)
		}
		out = append(out, fmt.Sprintf("t=%d o=%d sev=%d/%q ev=%q flags=%d trace=%s",
			r.Time, r.ObservedTime, r.SeverityNumber, r.SeverityText, r.EventName, r.Flags, tid))
	}
	return out, it.Err()
}

func pdataLogs(ld plog.Logs) []string {
	var out []string
	rls := ld.ResourceLogs()
	for i := 0; i < rls.Len(); i++ {
		sls := rls.At(i).ScopeLogs()
		for j := 0; j < sls.Len(); j++ {
			lrs := sls.At(j).LogRecords()
			for k := 0; k < lrs.Len(); k++ {
				r := lrs.At(k)
				tid := ""
				if id := r.TraceID(); !id.IsEmpty() {
					tid = hex.EncodeToString(id[:])
				}
				out = append(out, fmt.Sprintf("t=%d o=%d sev=%d/%q ev=%q flags=%d trace=%s",
					r.Timestamp(), r.ObservedTimestamp(), r.SeverityNumber(), r.SeverityText(), r.EventName(), r.Flags(), tid))
			}
		}
	}
	return out
}

// pointsOf describes every data point the iterator yields (attributes and
// buckets walked too), and its error.
func pointsOf(raw []byte) ([]string, error) {
	var out []string
	it := NewMetrics(raw)
	for it.Next() {
		m, dp := it.Metric(), it.Point()
		_ = rawAttrs(dp.Attributes())
		for p := dp.BucketCounts(); ; {
			if _, ok := p.Next(); !ok {
				break
			}
		}
		var val string
		switch m.Type {
		case MetricGauge, MetricSum:
			if dp.IsInt {
				val = fmt.Sprintf("int %d", dp.Int)
			} else {
				val = fmt.Sprintf("double %#x", math.Float64bits(dp.Double))
			}
		default:
			val = fmt.Sprintf("count %d", dp.Count)
		}
		out = append(out, fmt.Sprintf("%q type=%d start=%d t=%d flags=%d %s", m.Name, m.Type, dp.Start, dp.Time, dp.Flags, val))
	}
	return out, it.Err()
}

func pdataPoints(md pmetric.Metrics) []string {
	var out []string
	types := map[pmetric.MetricType]MetricType{pmetric.MetricTypeGauge: MetricGauge, pmetric.MetricTypeSum: MetricSum,
		pmetric.MetricTypeHistogram: MetricHistogram, pmetric.MetricTypeExponentialHistogram: MetricExponentialHistogram,
		pmetric.MetricTypeSummary: MetricSummary}
	number := func(name string, typ MetricType, dps pmetric.NumberDataPointSlice) {
		for i := 0; i < dps.Len(); i++ {
			dp := dps.At(i)
			val := fmt.Sprintf("double %#x", math.Float64bits(dp.DoubleValue()))
			if dp.ValueType() == pmetric.NumberDataPointValueTypeInt {
				val = fmt.Sprintf("int %d", dp.IntValue())
			}
			out = append(out, fmt.Sprintf("%q type=%d start=%d t=%d flags=%d %s", name, typ, dp.StartTimestamp(), dp.Timestamp(), dp.Flags(), val))
		}
	}
	type counted interface {
		StartTimestamp() pcommon.Timestamp
		Timestamp() pcommon.Timestamp
		Flags() pmetric.DataPointFlags
		Count() uint64
	}
	add := func(name string, typ MetricType, dp counted) {
		out = append(out, fmt.Sprintf("%q type=%d start=%d t=%d flags=%d count %d", name, typ, dp.StartTimestamp(), dp.Timestamp(), dp.Flags(), dp.Count()))
	}
	rms := md.ResourceMetrics()
	for i := 0; i < rms.Len(); i++ {
		sms := rms.At(i).ScopeMetrics()
		for j := 0; j < sms.Len(); j++ {
			ms := sms.At(j).Metrics()
			for k := 0; k < ms.Len(); k++ {
				m := ms.At(k)
				name, typ := m.Name(), types[m.Type()]
				switch m.Type() {
				case pmetric.MetricTypeGauge:
					number(name, typ, m.Gauge().DataPoints())
				case pmetric.MetricTypeSum:
					number(name, typ, m.Sum().DataPoints())
				case pmetric.MetricTypeHistogram:
					for p := 0; p < m.Histogram().DataPoints().Len(); p++ {
						add(name, typ, m.Histogram().DataPoints().At(p))
					}
				case pmetric.MetricTypeExponentialHistogram:
					for p := 0; p < m.ExponentialHistogram().DataPoints().Len(); p++ {
						add(name, typ, m.ExponentialHistogram().DataPoints().At(p))
					}
				case pmetric.MetricTypeSummary:
					for p := 0; p < m.Summary().DataPoints().Len(); p++ {
						add(name, typ, m.Summary().DataPoints().At(p))
					}
				}
			}
		}
	}
	return out
}
