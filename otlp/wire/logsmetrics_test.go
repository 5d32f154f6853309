package wire

import (
	"bytes"
	"math"
	"reflect"
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

func FuzzLogsAndMetrics(f *testing.F) {
	l, _ := plogotlp.NewExportRequestFromLogs(otlpgen.New(1).Logs(3, 10)).MarshalProto()
	m, _ := pmetricotlp.NewExportRequestFromMetrics(otlpgen.New(1).Metrics(1, 1, 1)).MarshalProto()
	f.Add(l)
	f.Add(m)
	f.Fuzz(func(t *testing.T, raw []byte) {
		li := NewLogs(raw)
		nl := 0
		for li.Next() {
			nl++
			_ = rawAttrs(li.Record().Attributes())
			_ = rawValue(li.Record().Body)
		}
		mi := NewMetrics(raw)
		for mi.Next() {
			_ = rawAttrs(mi.Point().Attributes())
			for p := mi.Point().BucketCounts(); ; {
				if _, ok := p.Next(); !ok {
					break
				}
			}
		}
		req := plogotlp.NewExportRequest()
		if req.UnmarshalProto(raw) == nil && li.Err() == nil && nl != req.Logs().LogRecordCount() {
			t.Fatalf("%d log records, pdata %d", nl, req.Logs().LogRecordCount())
		}
	})
}
