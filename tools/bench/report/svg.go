// Package report owns how ferry-bench shows its figures: Markdown tables and
// number formats, SVG bar charts, the machine description, the reference
// figures of the systems ferry is compared with (reference.json, from their
// published reports), and the demo's result table.
package report

import (
	"fmt"
	"html"
	"math"
	"strings"

	"github.com/ferryhq/ferry/tools/bench/load"
)

// Series is one coloured set of bars in a grouped bar chart.
type Series struct {
	Name   string
	Values []float64 // one per category; NaN = not measured
}

var palette = []string{"#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#b07aa1"}

// BarChart draws a grouped bar chart as a standalone SVG: one group per
// category, one bar per series, a value axis with round ticks, a legend.
func BarChart(title, unit string, categories []string, ss []Series) string {
	const w, h, left, right, top, bottom = 860, 420, 80, 20, 50, 70
	maxV := 0.0
	for _, s := range ss {
		for _, v := range s.Values {
			if !math.IsNaN(v) {
				maxV = max(maxV, v)
			}
		}
	}
	if maxV <= 0 {
		maxV = 1
	}
	step := niceStep(maxV / 5)
	top5 := math.Ceil(maxV/step) * step
	plotW, plotH := float64(w-left-right), float64(h-top-bottom)
	y := func(v float64) float64 { return float64(top) + plotH*(1-v/top5) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", w, h, w, h)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", w, h)
	fmt.Fprintf(&b, `<text x="%d" y="24" font-size="16" font-weight="bold">%s</text>`+"\n", left, html.EscapeString(title))
	for v := 0.0; v <= top5+step/2; v += step {
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", left, w-right, y(v), y(v))
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end" dy="4">%s</text>`+"\n", left-6, y(v), load.Human(v))
	}
	fmt.Fprintf(&b, `<text x="16" y="%d" transform="rotate(-90 16 %d)" text-anchor="middle">%s</text>`+"\n", top+int(plotH/2), top+int(plotH/2), html.EscapeString(unit))
	group := plotW / float64(max(1, len(categories)))
	barW := group * 0.8 / float64(max(1, len(ss)))
	for ci, c := range categories {
		x0 := float64(left) + group*float64(ci) + group*0.1
		for si, s := range ss {
			if ci >= len(s.Values) || math.IsNaN(s.Values[ci]) {
				continue
			}
			v := s.Values[ci]
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s, %s: %s</title></rect>`+"\n",
				x0+barW*float64(si), y(v), barW*0.92, float64(top)+plotH-y(v), palette[si%len(palette)],
				html.EscapeString(s.Name), html.EscapeString(c), load.Human(v))
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x0+group*0.4, h-bottom+18, html.EscapeString(c))
	}
	lx := left
	for si, s := range ss {
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="12" height="12" fill="%s"/><text x="%d" y="%d">%s</text>`+"\n",
			lx, h-28, palette[si%len(palette)], lx+16, h-18, html.EscapeString(s.Name))
		lx += 24 + 7*len(s.Name)
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// niceStep rounds a raw tick step to 1, 2 or 5 times a power of ten.
func niceStep(raw float64) float64 {
	if raw <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if raw <= m*p {
			return m * p
		}
	}
	return 10 * p
}
