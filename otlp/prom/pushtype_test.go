package prom

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"

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

// TestPushLabelWorkBounded: within the per-line label bound, a text push
// of many long lines still costs the parser the square of each line's
// labels (250 labels: ~10 ms a line); Σ (labels+1)² over the lines is
// bounded before the parser runs, so such a push is refused (413) at the
// cost of a scan, while ordinary pushes (thousands of lines of a few
// labels) pass.
func TestPushLabelWorkBounded(t *testing.T) {
	var b bytes.Buffer
	for i := range 64 {
		fmt.Fprintf(&b, "m%d{", i)
		for j := range 250 {
			fmt.Fprintf(&b, "l%d=\"v\",", j)
		}
		b.WriteString("} 1\n")
	}
	var err error
	n := allocated(func() {
		_, err = pushLim("text/plain", b.Bytes(), door.Limits{MaxBytes: 8 << 20, MaxItems: 100000}, nil)
	})
	if !errors.Is(err, ErrTooLarge) || n > 1<<20 {
		t.Fatalf("64 lines of 250 labels: %v, %d bytes allocated; want ErrTooLarge before parsing", err, n)
	}
	b.Reset()
	for i := range 10000 {
		fmt.Fprintf(&b, "m_%d{a=\"1\",b=\"2\",c=\"3\",d=\"4\",e=\"5\",f=\"6\",g=\"7\",h=\"8\",i=\"9\",j=\"10\"} %d\n", i%50, i)
	}
	if pb, err := pushLim("text/plain", b.Bytes(), door.Limits{MaxBytes: 8 << 20, MaxItems: 100000}, nil); err != nil || points(t, pb) != 10000 {
		t.Fatalf("10,000 lines of 10 labels: %v", err)
	}
}

// TestPushProtoElementsBounded: a delimited protobuf push of empty label
// pairs (2 bytes each, a Go struct of ~50 bytes decoded) is refused before
// proto.Unmarshal, not decoded into 50× its size.
func TestPushProtoElementsBounded(t *testing.T) {
	var metric []byte
	for range 200000 {
		metric = protowire.AppendTag(metric, 1, protowire.BytesType)
		metric = protowire.AppendBytes(metric, nil)
	}
	g := protowire.AppendTag(nil, 1, protowire.Fixed64Type)
	g = protowire.AppendFixed64(g, 0)
	metric = protowire.AppendTag(metric, 2, protowire.BytesType)
	metric = protowire.AppendBytes(metric, g)
	fam := protowire.AppendTag(nil, 1, protowire.BytesType)
	fam = protowire.AppendString(fam, "m")
	fam = protowire.AppendTag(fam, 4, protowire.BytesType)
	fam = protowire.AppendBytes(fam, metric)
	body := protowire.AppendBytes(nil, fam)
	var err error
	n := allocated(func() {
		_, err = pushLim(delimited, body, door.Limits{MaxBytes: 8 << 20, MaxItems: 100000}, nil)
	})
	if !errors.Is(err, ErrTooLarge) || n > 1<<20 {
		t.Fatalf("%d bytes of empty label pairs: %v, %d bytes allocated; want ErrTooLarge before decoding", len(body), err, n)
	}
}
