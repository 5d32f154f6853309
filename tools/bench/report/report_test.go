package report

import (
	"encoding/xml"
	"math"
	"strings"
	"testing"
)

// TestBarChart: the chart is well-formed SVG with a bar per measured value
// and none for a missing one.
func TestBarChart(t *testing.T) {
	svg := BarChart("t <&>", "MB/s", []string{"10 B", "100 B"}, []Series{{"a", []float64{1, 2}}, {"b", []float64{3, math.NaN()}}})
	if err := xml.Unmarshal([]byte(svg), new(struct{})); err != nil {
		t.Fatalf("not XML: %v", err)
	}
	if n := strings.Count(svg, "<rect x="); n != 3+2 { // 3 bars + 2 legend swatches
		t.Fatalf("%d rects", n)
	}
	if niceStep(0.7) != 1 || niceStep(130) != 200 || niceStep(4.1e6) != 5e6 {
		t.Fatal("niceStep")
	}
}

// TestReference: every reference figure the tables use is there.
func TestReference(t *testing.T) {
	r := Ref
	if r.Pan.PerSecBySize[100] == 0 || r.KafkaProducer.PerSecBySize[16] == 0 || r.KafkaConsumer.NMsgSec == 0 ||
		r.BKCollectorHTTP.ReqPerSec["10x1KB"] == 0 || r.PanClient.NsPerOp[100] == 0 || r.BKCollectorMicro.Rows["Aes256Decoder"][0] == 0 || r.JavaSDK.MBPerSec == 0 {
		t.Fatalf("reference.json is missing a figure: %+v", r)
	}
	for name, s := range map[string]string{"pan": r.Pan.Source, "producer": r.KafkaProducer.Source, "http": r.BKCollectorHTTP.Source,
		"micro": r.BKCollectorMicro.Source, "sdk": r.JavaSDK.Source} {
		if s == "" {
			t.Errorf("%s: no source", name)
		}
	}
}
