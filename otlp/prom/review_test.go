package prom

import (
	"errors"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	writev2 "github.com/prometheus/client_golang/exp/api/remote/genproto/v2"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/ferryhq/ferry/otlp/door"
)

// v2 request helpers: symbols, then one series of raw fields.
func encV2(syms []string, series ...[]byte) []byte {
	var b []byte
	for _, s := range syms {
		b = protowire.AppendTag(b, 4, protowire.BytesType)
		b = protowire.AppendString(b, s)
	}
	for _, s := range series {
		b = protowire.AppendTag(b, 5, protowire.BytesType)
		b = protowire.AppendBytes(b, s)
	}
	return b
}

func v2Sample(m []byte, v float64, ts int64) []byte {
	var x []byte
	x = protowire.AppendTag(x, 1, protowire.Fixed64Type)
	x = protowire.AppendFixed64(x, math.Float64bits(v))
	x = protowire.AppendTag(x, 2, protowire.VarintType)
	x = protowire.AppendVarint(x, uint64(ts))
	m = protowire.AppendTag(m, 2, protowire.BytesType)
	return protowire.AppendBytes(m, x)
}

// TestV2LabelRefsCountedPerSeries: MaxLabelsPerSeries bounds a v2 series'
// label references in all its field-1 entries together, not each entry
// alone: one reference a field (unpacked, as protobuf allows) passed any
// number, and every point of the series walked them all again (eachLabel),
// so a series of n references and m samples cost n×m — labels that are
// not kept (__name__ again, empty values) did not even meet the kept
// labels' bound in addLabel. 200,000 references and 20,000 samples (a
// 700 KB body) took minutes.
func TestV2LabelRefsCountedPerSeries(t *testing.T) {
	syms := []string{"", "__name__", "g"}
	var m []byte
	for range MaxLabelsPerSeries + 1 {
		for _, r := range []uint64{1, 2} { // __name__="g", one ref a field
			m = protowire.AppendTag(m, 1, protowire.VarintType)
			m = protowire.AppendVarint(m, r)
		}
	}
	m = v2Sample(m, 1, 1)
	_, err := rwLim(true, encV2(syms, m), door.Limits{MaxBytes: 1 << 20}, nil)
	if err == nil || !strings.Contains(err.Error(), "labels") {
		t.Fatalf("a series of %d label pairs, one reference a field: %v", MaxLabelsPerSeries+1, err)
	}
	// within the bound, unpacked references still label the series
	m = m[:0]
	for _, r := range []uint64{1, 2, 2, 2} { // __name__="g", g="g"
		m = protowire.AppendTag(m, 1, protowire.VarintType)
		m = protowire.AppendVarint(m, r)
	}
	m = v2Sample(m, 1, 1)
	pb, err := rwLim(true, encV2(syms, m), door.Limits{MaxBytes: 1 << 20}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if p := decode(t, pb).ResourceMetrics().At(0).ScopeMetrics().At(0).Metrics().At(0).Gauge().DataPoints(); p.Len() != 1 || attrs(p.At(0).Attributes()) != "g=g" {
		t.Fatalf("%d points", p.Len())
	}
}

// TestLabelRegionWalkBounded: a point's attributes are read by walking its
// series' label region (labelRegion) once a point, so that walk must cost
// the labels, not what a sender can hide in it: a group field between two
// labels (one "other" field, however many fields it nests), or a Label
// message of a million unknown fields, made every point of the series walk
// them all: n×m again.
func TestLabelRegionWalkBounded(t *testing.T) {
	label := func(m []byte, lb []byte) []byte {
		m = protowire.AppendTag(m, 1, protowire.BytesType)
		return protowire.AppendBytes(m, lb)
	}
	kv := func(k, v string) []byte {
		var lb []byte
		lb = protowire.AppendTag(lb, 1, protowire.BytesType)
		lb = protowire.AppendString(lb, k)
		lb = protowire.AppendTag(lb, 2, protowire.BytesType)
		return protowire.AppendString(lb, v)
	}
	sample := []byte{0x09, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f, 0x10, 0x01}
	series := func(m []byte, samples int) []byte {
		for i := range samples {
			x := append([]byte(nil), sample...)
			x[len(x)-1] = byte(i%100 + 1)
			m = protowire.AppendTag(m, 2, protowire.BytesType)
			m = protowire.AppendBytes(m, x)
		}
		return protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), m)
	}
	const junk = 100_000
	// a group of junk fields between two labels
	var m []byte
	m = label(m, kv("__name__", "g"))
	m = protowire.AppendTag(m, 9, protowire.StartGroupType)
	for range junk {
		m = protowire.AppendTag(m, 1, protowire.VarintType)
		m = protowire.AppendVarint(m, 0)
	}
	m = protowire.AppendTag(m, 9, protowire.EndGroupType)
	m = label(m, kv("a", "b"))
	body := series(m, 2000)
	t0 := time.Now()
	_, err := rwLim(false, body, door.Limits{MaxBytes: 1 << 26}, nil)
	if err == nil || errors.Is(err, door.ErrTooManyItems) {
		t.Fatalf("a group of %d fields among the labels: %v (%v)", junk, err, time.Since(t0))
	}
	// a label of junk fields
	lb := kv("a", "b")
	for range junk {
		lb = protowire.AppendTag(lb, 3, protowire.VarintType)
		lb = protowire.AppendVarint(lb, 0)
	}
	m = label(label(nil, kv("__name__", "g")), lb)
	body = series(m, 2000)
	t0 = time.Now()
	_, err = rwLim(false, body, door.Limits{MaxBytes: 1 << 26}, nil)
	if err == nil || errors.Is(err, door.ErrTooManyItems) {
		t.Fatalf("a label of %d fields: %v (%v)", junk, err, time.Since(t0))
	}
}

// TestClassicPointKeyPerSeries: a classic histogram's or summary's points
// are keyed by their series' labels (less le or quantile) and timestamp;
// the key was the labels' bytes copied and hashed once a sample, and kept
// once a point: one 64 KB-labelled _sum series of 2,000 samples at distinct
// timestamps (a 150 KB body) allocated 128 MB before the writer refused
// the first oversized point; 8 MiB bodies allocated hundreds of GB.
func TestClassicPointKeyPerSeries(t *testing.T) {
	big := strings.Repeat("x", 16<<10)
	labels := []string{"__name__", "h_sum", "a", big, "b", big, "c", big, "d", big}
	samples := make([][2]float64, 2000)
	for i := range samples {
		samples[i] = [2]float64{1, float64(i)}
	}
	body := encV1([]v1series{{labels, samples}}, [3]any{kHistogram, "h", "h"})
	var err error
	n := allocated(func() { _, err = rwLim(false, body, door.Limits{MaxBytes: 32 * len(body)}, nil) })
	if n > 32<<20 {
		t.Fatalf("a %d-byte body allocated %d MB (%v)", len(body), n>>20, err)
	}
	// the points are still merged by labels and timestamp
	h := encV1([]v1series{
		{[]string{"__name__", "h_bucket", "a", "1", "le", "1"}, [][2]float64{{1, 10}, {2, 20}}},
		{[]string{"__name__", "h_bucket", "a", "1", "le", "+Inf"}, [][2]float64{{3, 10}, {4, 20}}},
		{[]string{"__name__", "h_count", "a", "1"}, [][2]float64{{3, 10}, {4, 20}}},
		{[]string{"__name__", "h_count", "a", "2"}, [][2]float64{{5, 10}}},
	}, [3]any{kHistogram, "h", "h"})
	pb, err := rwLim(false, h, door.Limits{MaxBytes: 1 << 20}, nil)
	if err != nil {
		t.Fatal(err)
	}
	p := decode(t, pb).ResourceMetrics().At(0).ScopeMetrics().At(0).Metrics().At(0).Histogram().DataPoints()
	if p.Len() != 3 || p.At(0).Count() != 3 || p.At(0).BucketCounts().Len() != 2 || p.At(1).Count() != 4 || p.At(2).Count() != 5 {
		t.Fatalf("%d points", p.Len())
	}
}

// TestV2SymbolsCheckedOnce: a v2 label's bounds (UTF-8 above all) are
// checked once a symbol, not once a reference: 2,000 series of 256 labels
// each referencing the same 16 KiB value (a 6.6 MB body) made ferry
// validate 42 GB of UTF-8 (1.8 s) before the writer refused the first
// point.
func TestV2SymbolsCheckedOnce(t *testing.T) {
	syms := []string{"", "__name__", "g", strings.Repeat("v", MaxLabelValueBytes)}
	for i := range MaxLabelsPerSeries - 1 {
		syms = append(syms, "l"+name(i))
	}
	var series [][]byte
	for i := range 10000 {
		var refs []byte
		refs = protowire.AppendVarint(refs, 1)
		refs = protowire.AppendVarint(refs, 2)
		for j := range MaxLabelsPerSeries - 1 {
			refs = protowire.AppendVarint(refs, uint64(4+j))
			refs = protowire.AppendVarint(refs, 3)
		}
		m := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), refs)
		series = append(series, v2Sample(m, 1, int64(i)))
	}
	body := encV2(syms, series...)
	checks := 0
	onSymbolCheck = func() { checks++ }
	defer func() { onSymbolCheck = nil }()
	_, err := rwLim(true, body, door.Limits{MaxBytes: 8 << 20}, nil) // max_request_bytes' default
	// Each (name, value) pair of symbols is checked once: 2 + 255, not
	// once a reference (10,000 series × 256 labels, 1.8 s of UTF-8 checks
	// of the same 16 KiB value before the fix).
	if checks > len(syms) {
		t.Fatalf("a %d-byte body: %d label checks for %d symbols (%v)", len(body), checks, len(syms), err)
	}
	if err == nil {
		t.Fatal("converted")
	}
}

// TestV2KeysBySymbol: what v2 series are grouped by (their resource, their
// family, a classic point's labels) is keyed by symbol, not by the bytes
// the symbols hold: every series may reference the same 16 KiB symbols, so
// keys of their bytes cost what the body does not hold — 2,000 resources
// of one 16 KiB-named family (a 70 KB body) kept 32 MB of family keys, 50
// histogram series of 255 16 KiB labels (56 KB) 200 MB of point keys.
func TestV2KeysBySymbol(t *testing.T) {
	big := strings.Repeat("n", MaxLabelValueBytes)
	syms := []string{"", "__name__", big, "instance"}
	var series [][]byte
	for i := range 2000 {
		syms = append(syms, name(i))
		var refs []byte
		for _, r := range []uint64{1, 2, 3, uint64(len(syms) - 1)} {
			refs = protowire.AppendVarint(refs, r)
		}
		m := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), refs)
		series = append(series, v2Sample(m, 1, 1))
	}
	body := encV2(syms, series...)
	// into a buffer of the reservation, as the receiver does
	convert := func(body []byte) (err error) {
		q := httptest.NewRequest(http.MethodPost, "/api/v1/write", nil)
		q.Header.Set("Content-Type", "application/x-protobuf;proto=io.prometheus.write.v2.Request")
		dst := make([]byte, 0, 32*len(body))
		_, err = RemoteWrite(q, body, dst, door.Limits{MaxBytes: cap(dst)}, nil)
		return err
	}
	var err error
	if n := allocated(func() { err = convert(body) }); n > 8<<20 {
		t.Fatalf("families: a %d-byte body allocated %d MB (%v)", len(body), n>>20, err)
	}

	syms = []string{"", "__name__", "h_sum", big, "i"}
	for i := range MaxLabelsPerSeries - 2 {
		syms = append(syms, "l"+name(i))
	}
	series = series[:0]
	for i := range 50 {
		syms = append(syms, name(i))
		var refs []byte
		refs = protowire.AppendVarint(refs, 1)
		refs = protowire.AppendVarint(refs, 2)
		refs = protowire.AppendVarint(refs, 4)
		refs = protowire.AppendVarint(refs, uint64(len(syms)-1))
		for j := range MaxLabelsPerSeries - 2 {
			refs = protowire.AppendVarint(refs, uint64(5+j))
			refs = protowire.AppendVarint(refs, 3)
		}
		m := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), refs)
		m = v2Sample(m, 1, 1)
		m = protowire.AppendTag(m, 5, protowire.BytesType)
		m = protowire.AppendBytes(m, []byte{0x08, 3}) // metadata: histogram
		series = append(series, m)
	}
	body = encV2(syms, series...)
	if n := allocated(func() { err = convert(body) }); n > 16<<20 {
		t.Fatalf("points: a %d-byte body allocated %d MB (%v)", len(body), n>>20, err)
	}
}

// TestCustomBucketsWithoutSpans: a custom-bucket histogram (schema -53)
// with no positive spans, after a histogram that had some, converts (its
// buckets all zero) instead of panicking. The histograms of a request share
// one decoding struct, whose span slice stays allocated, empty, across
// them; the bound check read its first element when it was non-nil (found
// by CI's fuzz smoke, FuzzRemoteWrite).
func TestCustomBucketsWithoutSpans(t *testing.T) {
	st := writev2.NewSymbolTable()
	h := func(ts int64, spans ...*writev2.BucketSpan) *writev2.Histogram {
		var counts []float64
		for _, s := range spans {
			for range s.Length {
				counts = append(counts, 1)
			}
		}
		return &writev2.Histogram{Count: &writev2.Histogram_CountFloat{CountFloat: float64(len(counts))}, Schema: -53,
			CustomValues: []float64{1, 2}, PositiveSpans: spans, PositiveCounts: counts, Timestamp: ts}
	}
	s := &writev2.TimeSeries{LabelsRefs: st.SymbolizeLabels([]string{"__name__", "c"}, nil),
		Histograms: []*writev2.Histogram{h(1, &writev2.BucketSpan{Offset: 0, Length: 3}), h(2)}}
	body, err := (&writev2.Request{Symbols: st.Symbols(), Timeseries: []*writev2.TimeSeries{s}}).MarshalVT()
	if err != nil {
		t.Fatal(err)
	}
	q := httptest.NewRequest(http.MethodPost, "/api/v1/write", nil)
	q.Header.Set("Content-Type", "application/x-protobuf;proto=io.prometheus.write.v2.Request")
	out, err := RemoteWrite(q, body, nil, door.Limits{MaxBytes: 1 << 20}, &door.Stats{})
	if err != nil {
		t.Fatal(err)
	}
	dps := byName(decode(t, out))["/c"].Histogram().DataPoints()
	if dps.Len() != 2 || !eqU(dps.At(0).BucketCounts().AsRaw(), []uint64{1, 1, 1}) || !eqU(dps.At(1).BucketCounts().AsRaw(), []uint64{0, 0, 0}) {
		t.Fatalf("%d points", dps.Len())
	}
}
