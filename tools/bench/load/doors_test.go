package load

import (
	"encoding/json"
	"testing"

	"github.com/klauspost/compress/snappy"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"

	"github.com/ferryhq/ferry/tools/otlpgen"
)

func TestOTLPPointsCountsEveryKindOfMetric(t *testing.T) {
	md := otlpgen.New(1).Metrics(3, 4, 5) // gauges, sums, histograms: points each
	s := md.ResourceMetrics().AppendEmpty().ScopeMetrics().AppendEmpty().Metrics()
	s.AppendEmpty().SetEmptySummary().DataPoints().AppendEmpty()
	eh := s.AppendEmpty().SetEmptyExponentialHistogram().DataPoints()
	eh.AppendEmpty()
	eh.AppendEmpty()
	want := int64(0)
	for i := 0; i < md.ResourceMetrics().Len(); i++ {
		sm := md.ResourceMetrics().At(i).ScopeMetrics()
		for j := 0; j < sm.Len(); j++ {
			ms := sm.At(j).Metrics()
			for k := 0; k < ms.Len(); k++ {
				switch m := ms.At(k); m.Type() {
				case pmetric.MetricTypeGauge:
					want += int64(m.Gauge().DataPoints().Len())
				case pmetric.MetricTypeSum:
					want += int64(m.Sum().DataPoints().Len())
				case pmetric.MetricTypeHistogram:
					want += int64(m.Histogram().DataPoints().Len())
				case pmetric.MetricTypeExponentialHistogram:
					want += int64(m.ExponentialHistogram().DataPoints().Len())
				case pmetric.MetricTypeSummary:
					want += int64(m.Summary().DataPoints().Len())
				}
			}
		}
	}
	b, err := pmetricotlp.NewExportRequestFromMetrics(md).MarshalProto()
	if err != nil {
		t.Fatal(err)
	}
	if n, ok := OTLPPoints(b); !ok || n != want || want < 15 {
		t.Fatalf("points: %d, %v; want %d", n, ok, want)
	}
}

// The remote write body is n samples, and ferry's door makes n points of
// it: the two rows of the table carry the same samples.
func TestRemoteWriteBodiesCarryCountSamples(t *testing.T) {
	rw, err := doorBody(FormatRemoteWrite, 3, 250)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := snappy.Decode(nil, rw)
	if err != nil || len(raw) < 250*100 {
		t.Fatalf("snappy: %d bytes, %v", len(raw), err)
	}
	pb, err := doorBody(FormatRemoteWriteOTLP, 3, 250)
	if err != nil {
		t.Fatal(err)
	}
	if n, ok := OTLPPoints(pb); !ok || n != 250 {
		t.Fatalf("OTLP of the remote write: %d points, %v; want 250", n, ok)
	}
}

func TestZipkinBodiesCarryCountSpans(t *testing.T) {
	b, err := doorBody(FormatZipkin, 1, 40)
	if err != nil {
		t.Fatal(err)
	}
	var spans []map[string]any
	if err := json.Unmarshal(b, &spans); err != nil || len(spans) != 40 {
		t.Fatalf("%d spans, %v", len(spans), err)
	}
	if spans[0]["traceId"] == "" || spans[0]["localEndpoint"] == nil {
		t.Fatalf("not a Zipkin v2 span: %v", spans[0])
	}
}
