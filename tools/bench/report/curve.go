package report

import (
	"fmt"
	"html"
	"math"
	"strconv"
	"strings"
)

// Panel is one plot of a CurveChart: lines of the same unit over the
// chart's shared x values.
type Panel struct {
	Unit  string
	Lines []Series // Values one per x; NaN = not measured
}

// CurveChart draws how figures grow with a count a user multiplies: the
// panels side by side, each with its own value axis from zero, over a
// shared logarithmic x axis (the counts, 1 … 10,000), points joined by
// lines. A flat line is a cost that does not grow with the count.
func CurveChart(title, xLabel string, xs []float64, panels []Panel) string {
	const w, h, top, bottom, gap, left = 860, 360, 50, 80, 70, 70
	pw := (float64(w) - left - 20 - gap*float64(len(panels)-1)) / float64(max(1, len(panels)))
	ph := float64(h - top - bottom)
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, x := range xs {
		lo, hi = min(lo, math.Log10(x)), max(hi, math.Log10(x))
	}
	if !(hi > lo) {
		lo, hi = lo-1, lo+1
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", w, h, w, h)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", w, h)
	fmt.Fprintf(&b, `<text x="%d" y="24" font-size="16" font-weight="bold">%s</text>`+"\n", left, html.EscapeString(title))
	legend := map[string]string{}
	var names []string
	ci := 0
	for pi, p := range panels {
		x0 := float64(left) + float64(pi)*(pw+gap)
		maxV := 0.0
		for _, l := range p.Lines {
			for _, v := range l.Values {
				if !math.IsNaN(v) && !math.IsInf(v, 0) {
					maxV = max(maxV, v)
				}
			}
		}
		if maxV <= 0 {
			maxV = 1
		}
		step := niceStep(maxV / 4)
		topV := math.Ceil(maxV/step) * step
		y := func(v float64) float64 { return float64(top) + ph*(1-v/topV) }
		x := func(v float64) float64 { return x0 + pw*(math.Log10(v)-lo)/(hi-lo) }
		for v := 0.0; v <= topV+step/2; v += step {
			fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", x0, x0+pw, y(v), y(v))
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end" dy="4">%s</text>`+"\n", x0-6, y(v), axisLabel(v))
		}
		for _, xv := range xs {
			fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#eee"/>`+"\n", x(xv), x(xv), float64(top), float64(top)+ph)
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", x(xv), float64(top)+ph+16, html.EscapeString(Count(xv)))
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle" font-weight="bold">%s</text>`+"\n", x0+pw/2, top-8, html.EscapeString(p.Unit))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s (log scale)</text>`+"\n", x0+pw/2, float64(top)+ph+34, html.EscapeString(xLabel))
		for _, l := range p.Lines {
			c, ok := legend[l.Name]
			if !ok {
				c = palette[ci%len(palette)]
				ci++
				legend[l.Name] = c
				names = append(names, l.Name)
			}
			var pts []string
			for i, v := range l.Values {
				if i >= len(xs) || math.IsNaN(v) || math.IsInf(v, 0) {
					continue
				}
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(xs[i]), y(v)))
				fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s"><title>%s at %s: %s</title></circle>`+"\n",
					x(xs[i]), y(v), c, html.EscapeString(l.Name), Count(xs[i]), axisLabel(v))
			}
			if len(pts) > 1 {
				fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"/>`+"\n", strings.Join(pts, " "), c)
			}
		}
	}
	lx := left
	for _, n := range names {
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="12" height="12" fill="%s"/><text x="%d" y="%d">%s</text>`+"\n",
			lx, h-22, legend[n], lx+16, h-12, html.EscapeString(n))
		lx += 28 + 7*len(n)
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// CurveChartFile writes a CurveChart as Charts/name and returns the
// Markdown that shows it ("" if it could not be written).
func (d *Doc) CurveChartFile(name, title, xLabel string, xs []float64, panels []Panel) string {
	return d.writeChart(name, title, CurveChart(title, xLabel, xs, panels))
}

// Count is a count for an axis or a table: 1, 10, 100, 1k, 10k, 100k,
// 1M, 2.5k.
func Count(v float64) string {
	for _, u := range []struct {
		div    float64
		suffix string
	}{{1e6, "M"}, {1e3, "k"}} {
		if v >= u.div {
			return strconv.FormatFloat(v/u.div, 'f', -1, 64) + u.suffix
		}
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}

// axisLabel is a value tick: small values keep their decimals.
func axisLabel(v float64) string {
	switch {
	case v >= 1000:
		return Count(v)
	case v >= 10 || v == math.Trunc(v):
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(math.Round(v*1000)/1000, 'f', -1, 64) // steps add up to 0.30000000000000004
}
