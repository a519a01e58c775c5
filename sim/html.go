package sim

import (
	"bufio"
	"fmt"
	"html"
	"io"
	"math"
	"strconv"
	"strings"
)

// WriteHTML writes a self-contained HTML report: no scripts, no external
// resources, charts as inline SVG. It opens with the trade-off — UA
// against control messages per key·region·s for every strategy × interval,
// OA_budget named where it is not 0 — then the cells table, admitted vs
// oracle vs budget over time and each region's share (by name) for the
// top keys of the recommended (else the first) cell's first run, the
// warm-up shaded, and UA and OA against the interval per strategy.
func (rep *Report) WriteHTML(w io.Writer) error {
	bw := bufio.NewWriter(w)
	p := func(format string, a ...any) { fmt.Fprintf(bw, format, a...) }
	esc := html.EscapeString
	p(`<!DOCTYPE html><html><head><meta charset="utf-8"><title>Meridian simulation: %s</title>
<style>body{font:14px system-ui,sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse}
td,th{padding:2px 8px;text-align:right;border-bottom:1px solid #ddd}th{background:#f4f4f4}
td:first-child,th:first-child{text-align:left}.rec{font-weight:bold;margin:1em 0}svg{margin:.5em 0}</style></head><body>
`, esc(rep.Scenario))
	p("<h1>Scenario %s</h1><p>%s</p>\n", esc(rep.Scenario), esc(rep.Description))
	p(`<p class="rec">Recommendation (%s): %s</p>`+"\n", esc(rep.Bounds), esc(rep.Recommendation))
	p("%s", rep.tradeOff())
	p("<table><tr><th>strategy</th><th>interval</th><th>UA 1s</th><th>OA 1s</th><th>UA 10s</th><th>OA 10s</th><th>OA_budget</th><th>P 1s p99</th><th>fairness</th><th>converge s</th><th>disagree</th><th>msg/key·region/s</th><th>bytes/key·region/s</th></tr>\n")
	for _, c := range rep.Cells {
		p("<tr><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td></tr>\n",
			esc(c.Strategy), c.Interval.D(), pct(c.UA1s), pct(c.OA1s), pct(c.UA10s), pct(c.OA10s), pct(c.OABudget),
			num(c.PeakP99, 2), num(c.Fairness, 2), rep.conv(c), pct(c.Disagreement), num(c.Messages, 3), num(c.Bytes, 1))
	}
	p("</table>\n")

	// The run whose keys are charted.
	var run *Result
	for _, r := range rep.Runs {
		if strings.Contains(rep.Recommendation, "use "+r.Strategy+" at "+r.Interval.D().String()+":") {
			run = r
			break
		}
	}
	if run == nil && len(rep.Runs) > 0 {
		run = rep.Runs[0]
	}
	if run != nil {
		p("<h2>Top keys under %s at %s (seed %d)</h2>\n", esc(run.Strategy), run.Interval.D(), run.Seed)
		if rep.Warmup > 0 {
			p("<p>The shaded start is the warm-up (%s), left out of every metric.</p>\n", rep.Warmup.D())
		}
		warm := rep.Warmup.D().Seconds()
		for _, k := range run.Top {
			xs := seq(len(k.Offered))
			budget := make([]float64, len(xs))
			for i := range budget {
				budget[i] = k.Rate
			}
			p("%s", svgChartShaded(k.Key+": cost per second", "s", xs, warm, []series{
				{"offered", "#bbb", ints(k.Offered)},
				{"oracle", "#1f77b4", ints(k.Oracle)},
				{"admitted", "#ff7f0e", ints(k.Admitted)},
				{"budget rate", "#2ca02c", budget},
			}))
			var ss []series
			colors := []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"}
			for ri, sh := range k.Shares {
				name := fmt.Sprintf("region %d", ri+1)
				if ri < len(rep.Regions) {
					name = rep.Regions[ri]
				}
				ss = append(ss, series{name, colors[ri%len(colors)], sh})
			}
			p("%s", svgChartShaded(k.Key+": share of the budget in force per region", "s", xs, warm, ss))
		}
	}
	// UA and OA against the interval, per strategy.
	byStrategy := map[string][]Cell{}
	var order []string
	for _, c := range rep.Cells {
		if _, ok := byStrategy[c.Strategy]; !ok {
			order = append(order, c.Strategy)
		}
		byStrategy[c.Strategy] = append(byStrategy[c.Strategy], c)
	}
	if len(order) == 0 {
		p("</body></html>\n")
		return bw.Flush()
	}
	if cs := byStrategy[order[0]]; len(cs) > 1 {
		var xs []float64
		for _, c := range cs {
			xs = append(xs, c.Interval.D().Seconds())
		}
		for _, metric := range []string{"UA 1s", "OA 1s"} {
			var ss []series
			colors := []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"}
			for i, st := range order {
				var ys []float64
				for _, c := range byStrategy[st] {
					v := c.UA1s.Mean
					if metric == "OA 1s" {
						v = c.OA1s.Mean
					}
					ys = append(ys, 100*v)
				}
				ss = append(ss, series{st, colors[i%len(colors)], ys})
			}
			p("<h2>%s against the interval</h2>%s", metric, svgChart(metric+" (%) by strategy", "interval s", xs, ss))
		}
	}
	p("</body></html>\n")
	return bw.Flush()
}

type series struct {
	name, color string
	ys          []float64
}

func seq(n int) []float64 {
	xs := make([]float64, n)
	for i := range xs {
		xs[i] = float64(i)
	}
	return xs
}

func ints(v []int64) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

// tradeOff is the report's first chart: per cell, UA(1s) against the
// control messages per key·region·s on a log scale, one colour per
// strategy, each point labelled with its interval and, where it is not 0,
// its OA_budget.
func (rep *Report) tradeOff() string {
	const W, H, L, R, T, B = 960.0, 340.0, 60.0, 190.0, 24.0, 34.0
	if len(rep.Cells) == 0 {
		return ""
	}
	lo, hi, ymax := math.Inf(1), math.Inf(-1), 0.0
	for _, c := range rep.Cells {
		if m := c.Messages.Mean; m > 0 {
			lo, hi = min(lo, m), max(hi, m)
		}
		ymax = max(ymax, 100*c.UA1s.Mean)
	}
	if math.IsInf(lo, 1) {
		lo, hi = 0.001, 1
	}
	lx0, lx1 := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	if lx1 == lx0 {
		lx1++
	}
	ymax = max(1, ymax*1.1)
	x := func(m float64) float64 {
		m = max(m, math.Pow(10, lx0)) // a cell with no messages sits at the left edge
		return L + (math.Log10(m)-lx0)/(lx1-lx0)*(W-L-R)
	}
	y := func(v float64) float64 { return H - B - v/ymax*(H-T-B) }
	var b strings.Builder
	b.WriteString("<h2>Under-admission against control cost</h2>\n")
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f">`, W, H, W, H)
	fmt.Fprintf(&b, `<text x="%.0f" y="16" font-size="13">UA 1s (%%) against control messages per key·region·s (log scale); lower left is better</text>`, L)
	fmt.Fprintf(&b, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="#888"/>`, L, H-B, W-R, H-B)
	fmt.Fprintf(&b, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="#888"/>`, L, T, L, H-B)
	for e := lx0; e <= lx1; e++ {
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" font-size="10" text-anchor="middle">%s</text>`, x(math.Pow(10, e)), H-B+14, compact(math.Pow(10, e)))
	}
	for i := 0; i <= 4; i++ {
		v := ymax * float64(i) / 4
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" font-size="10" text-anchor="end">%s</text>`, L-4, y(v)+3, compact(v))
	}
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" font-size="10" text-anchor="end">msg/key·region/s</text>`, W-R, H-4)
	colors := []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"}
	color := map[string]string{}
	var order []string
	for _, c := range rep.Cells {
		if _, ok := color[c.Strategy]; !ok {
			color[c.Strategy] = colors[len(order)%len(colors)]
			order = append(order, c.Strategy)
		}
		px, py := x(c.Messages.Mean), y(100*c.UA1s.Mean)
		label := c.Interval.D().String()
		if c.OABudget.Mean > 0 {
			label += fmt.Sprintf(" OA_budget %.2f%%", 100*c.OABudget.Mean)
		}
		fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="4" fill="%s"><title>%s at %s: UA %.2f%%, %.4f msg, OA_budget %.2f%%</title></circle>`,
			px, py, color[c.Strategy], html.EscapeString(c.Strategy), c.Interval.D(), 100*c.UA1s.Mean, c.Messages.Mean, 100*c.OABudget.Mean)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" font-size="9">%s</text>`, px+6, py-4, html.EscapeString(label))
	}
	for i, st := range order {
		fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="10" height="10" fill="%s"/><text x="%.0f" y="%.0f" font-size="11">%s</text>`,
			W-R+10, T+float64(i)*16, color[st], W-R+24, T+float64(i)*16+9, html.EscapeString(st))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// svgChart draws series as polylines on shared axes, with a legend.
func svgChart(title, xlabel string, xs []float64, ss []series) string {
	return svgChartShaded(title, xlabel, xs, 0, ss)
}

// svgChartShaded is svgChart with x from the first point to shade
// (warm-up) shaded grey.
func svgChartShaded(title, xlabel string, xs []float64, shade float64, ss []series) string {
	const W, H, L, R, T, B = 960.0, 260.0, 60.0, 150.0, 24.0, 30.0
	if len(xs) == 0 {
		return ""
	}
	xmin, xmax := xs[0], xs[len(xs)-1]
	if xmax == xmin {
		xmax = xmin + 1
	}
	ymax := 0.0
	for _, s := range ss {
		for _, y := range s.ys {
			if !math.IsNaN(y) && !math.IsInf(y, 0) {
				ymax = max(ymax, y)
			}
		}
	}
	if ymax == 0 {
		ymax = 1
	}
	ymax *= 1.05
	x := func(v float64) float64 { return L + (v-xmin)/(xmax-xmin)*(W-L-R) }
	y := func(v float64) float64 { return H - B - v/ymax*(H-T-B) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f">`, W, H, W, H)
	fmt.Fprintf(&b, `<text x="%.0f" y="16" font-size="13">%s</text>`, L, html.EscapeString(title))
	if shade > xmin {
		fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="%.1f" height="%.0f" fill="#eee"/><text x="%.0f" y="%.0f" font-size="10" fill="#777">warm-up</text>`,
			L, T, x(min(shade, xmax))-L, H-T-B, L+4, T+12)
	}
	fmt.Fprintf(&b, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="#888"/>`, L, H-B, W-R, H-B)
	fmt.Fprintf(&b, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="#888"/>`, L, T, L, H-B)
	for i := 0; i <= 4; i++ {
		v := ymax * float64(i) / 4
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" font-size="10" text-anchor="end">%s</text>`, L-4, y(v)+3, compact(v))
		xv := xmin + (xmax-xmin)*float64(i)/4
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" font-size="10" text-anchor="middle">%s</text>`, x(xv), H-B+14, compact(xv))
	}
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" font-size="10" text-anchor="end">%s</text>`, W-R, H-4, html.EscapeString(xlabel))
	for i, s := range ss {
		var pts strings.Builder
		for j, v := range s.ys {
			if j >= len(xs) || math.IsNaN(v) || math.IsInf(v, 0) {
				continue
			}
			fmt.Fprintf(&pts, "%.1f,%.1f ", x(xs[j]), y(v))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.3" points="%s"/>`, s.color, strings.TrimSpace(pts.String()))
		fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="10" height="10" fill="%s"/><text x="%.0f" y="%.0f" font-size="11">%s</text>`,
			W-R+10, T+float64(i)*16, s.color, W-R+24, T+float64(i)*16+9, html.EscapeString(s.name))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

func compact(v float64) string {
	switch {
	case math.Abs(v) >= 1e6:
		return fmt.Sprintf("%.1fM", v/1e6)
	case math.Abs(v) >= 1e3:
		return fmt.Sprintf("%.1fk", v/1e3)
	case math.Abs(v) >= 10 || v == 0:
		return fmt.Sprintf("%.0f", v)
	case math.Abs(v) < 0.01:
		// A log axis's 0.001: two decimals would print it as 0.00.
		return strconv.FormatFloat(v, 'g', 2, 64)
	}
	return fmt.Sprintf("%.2f", v)
}
