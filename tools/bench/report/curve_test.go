package report

import (
	"math"
	"strings"
	"testing"
)

// A curve chart puts its points on a log x axis (1, 10, 100 evenly
// spaced), skips what was not measured, and labels counts as the tables do.
func TestCurveChart(t *testing.T) {
	svg := CurveChart("cost", "topics", []float64{1, 10, 100}, []Panel{
		{Unit: "CPU µs per record", Lines: []Series{{Name: "local", Values: []float64{1.5, 1.6, math.NaN()}}}},
		{Unit: "RSS MiB", Lines: []Series{{Name: "peak", Values: []float64{30, 31, 40}}}},
	})
	if n := strings.Count(svg, "<circle"); n != 5 {
		t.Fatalf("%d points drawn, want 5 (one not measured)", n)
	}
	for _, want := range []string{">1<", ">10<", ">100<", "topics (log scale)", "CPU µs per record", "RSS MiB", "local at 10: 1.6"} {
		if !strings.Contains(svg, want) {
			t.Errorf("no %q in the chart", want)
		}
	}
	if Count(10000) != "10k" || Count(1e6) != "1M" || Count(2500) != "2.5k" || Count(7) != "7" {
		t.Errorf("Count: %s %s %s %s", Count(10000), Count(1e6), Count(2500), Count(7))
	}
	if axisLabel(0.1+0.2) != "0.3" || axisLabel(12.4) != "12" {
		t.Errorf("axisLabel: %s %s", axisLabel(0.1+0.2), axisLabel(12.4))
	}
}
