package prom

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/otlp/door"
)

// TestPushTypeAnyCase: the text parser takes a TYPE in any case, and
// gauge_histogram beside gaugehistogram; the push door's count of sample
// lines before parsing took only "histogram", "summary" and
// "gaugehistogram" as merging lines into points, so a push within
// max_items_per_request (two histogram points, or gauge histograms, which
// are no points) was refused as too_many_items.
func TestPushTypeAnyCase(t *testing.T) {
	lim := door.Limits{MaxBytes: 1 << 30, MaxItems: 2}
	for _, typ := range []string{"HISTOGRAM", "Histogram", "histogram"} {
		hist := []byte("# TYPE h " + typ + "\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 3\nh_count 2\n" +
			"h_bucket{le=\"1\",a=\"b\"} 1\nh_bucket{le=\"+Inf\",a=\"b\"} 2\nh_sum{a=\"b\"} 3\nh_count{a=\"b\"} 2\n")
		if pb, err := pushLim("text/plain", hist, lim, nil); err != nil || points(t, pb) != 2 {
			t.Fatalf("TYPE %s: 2 histogram points (8 lines) of 2: %v", typ, err)
		}
	}
	for _, typ := range []string{"gauge_histogram", "GAUGEHISTOGRAM"} { // no points
		b := []byte("# TYPE g " + typ + "\n")
		for i := range 4 {
			b = append(b, []byte("g_bucket{le=\"+Inf\",i=\""+string(rune('a'+i))+"\"} 1\n")...)
		}
		if _, err := pushLim("text/plain", b, lim, nil); err != nil {
			t.Fatalf("TYPE %s: 4 lines: %v", typ, err)
		}
	}
	b := []byte("# TYPE s SUMMARY\ns{quantile=\"0.5\"} 1\ns{quantile=\"0.9\"} 2\ns_sum 3\ns_count 4\n")
	if pb, err := pushLim("text/plain", b, lim, nil); err != nil || points(t, pb) != 1 {
		t.Fatalf("TYPE SUMMARY: 1 point (4 lines) of 2: %v", err)
	}
}

// TestPushLineLabelsBounded: a text line's labels are bounded before the
// parser reads them: expfmt's TextParser rebuilds a map of the line's
// labels at each label (quadratic), and validate's MaxLabelsPerSeries was
// applied only once parsed: one line of 5,000 labels (30 KB) took seconds
// and hundreds of MB; quoted '=' and escaped quotes are not labels.
func TestPushLineLabelsBounded(t *testing.T) {
	var b bytes.Buffer
	b.WriteString("m{")
	for j := range 5000 {
		fmt.Fprintf(&b, "l%d=\"\",", j)
	}
	b.WriteString("} 1\n")
	var err error
	n := allocated(func() {
		_, err = pushLim("text/plain", b.Bytes(), door.Limits{MaxBytes: 8 << 20, MaxItems: 100000}, nil)
	})
	if err == nil || !strings.Contains(err.Error(), "labels") || n > 1<<20 {
		t.Fatalf("a line of 5,000 labels: %v, %d bytes allocated", err, n)
	}
	// within the bound, with '=' and escaped quotes in values
	b.Reset()
	b.WriteString("m{")
	for j := range MaxLabelsPerSeries {
		fmt.Fprintf(&b, "l%d=\"a=\\\"=b\",", j)
	}
	b.WriteString("} 1\n")
	if pb, err := pushLim("text/plain", b.Bytes(), door.Limits{MaxBytes: 8 << 20, MaxItems: 10}, nil); err != nil || points(t, pb) != 1 {
		t.Fatalf("a line of %d labels: %v", MaxLabelsPerSeries, err)
	}
}
