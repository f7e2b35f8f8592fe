package readside

import (
	"bytes"
	"fmt"
	"html/template"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/aggregator/suite"
)

// A time chart draws rolling-window rates over time with their 95 % Wilson intervals as bands,
// time and percent axes, and the moments alerts fired and resolved (README, Read side). It is
// server-rendered SVG: numbers only, nothing from input, so it is safe as template.HTML.

// Chart geometry, in pixels: the plot area is [chartLeft, chartW-chartRight] × [chartTop, chartH-chartBottom].
const (
	chartW, chartH = 460.0, 200.0
	chartLeft      = 46.0
	chartRight     = 12.0
	chartTop       = 30.0
	chartBottom    = 22.0
)

// ratePoint is one point of a rate series: the window's rate at a moment and its 95 % interval.
type ratePoint struct {
	At              time.Time
	Rate, Low, High float64
	Confirmed       int64
	Scored          int64
}

// rateSeries is one window's rate over time.
type rateSeries struct {
	Name   string // the window: 1h, 24h
	Colour string
	Points []ratePoint
}

// alertMark is the moment an alert fired or resolved, drawn as a vertical line.
type alertMark struct {
	At    time.Time
	Fired bool // fired, else resolved
	Rule  string
}

// minChartSpan is the shortest span a time chart shows: a history younger than its span is drawn
// over the time it covers (and its alert marks), not squeezed into the span's last pixels.
const minChartSpan = 10 * time.Minute

// chartFrom is where a chart of span up to now starts: now − span, or later when everything to
// draw (the earliest of first, the oldest point or mark) is younger, a minute before it and at
// least minChartSpan before now. A zero first is nothing to draw.
func chartFrom(now time.Time, span time.Duration, first time.Time) time.Time {
	from := now.Add(-span)
	if first.IsZero() {
		return from
	}
	return maxTime(from, minTime(first.Add(-time.Minute), now.Add(-minChartSpan)))
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// seriesOf turns history points into a rate series of one window (pick selects its counts),
// skipping the points at which nothing of the window was scored.
func seriesOf(name, colour string, pts []Point, pick func(*Point) [3]int64) rateSeries {
	s := rateSeries{Name: name, Colour: colour}
	for i := range pts {
		c := pick(&pts[i])
		n := c[0] + c[1]
		if n <= 0 {
			continue
		}
		ci := aggregator.Wilson(c[0], n)
		s.Points = append(s.Points, ratePoint{At: pts[i].ObservedAt, Rate: float64(c[0]) / float64(n),
			Low: ci.Low, High: ci.High, Confirmed: c[0], Scored: n})
	}
	return s
}

// chartScale maps times and rates to pixels.
type chartScale struct {
	from, to time.Time
	yMax     float64 // the rate at the top of the plot area
}

func (s chartScale) x(t time.Time) float64 {
	span := s.to.Sub(s.from).Seconds()
	return chartLeft + t.Sub(s.from).Seconds()/span*(chartW-chartLeft-chartRight)
}

func (s chartScale) y(r float64) float64 {
	return chartH - chartBottom - r/s.yMax*(chartH-chartTop-chartBottom)
}

// rateStep picks the percent axis: the smallest step of a 1-2-5 ladder that reaches top within
// five ticks, and the axis maximum, a whole number of steps.
func rateStep(top float64) (step, yMax float64) {
	for _, step = range []float64{0.01, 0.02, 0.05, 0.1, 0.2, 0.25} {
		if n := math.Ceil(top/step - 1e-9); n <= 5 {
			return step, max(1, n) * step
		}
	}
	return 0.25, 1
}

// timeChart draws series over [from, to] with marks. Points farther apart than gap are not
// joined (the aggregate received nothing in between). Every line and band carries its numbers as
// data attributes, and the svg its scale, so that a test can check what is drawn against them.
func timeChart(from, to time.Time, gap time.Duration, series []rateSeries, marks []alertMark) template.HTML {
	top := 0.0
	for _, s := range series {
		for _, p := range s.Points {
			if !p.At.Before(from) && !p.At.After(to) {
				top = max(top, p.High)
			}
		}
	}
	step, yMax := rateStep(top)
	sc := chartScale{from: from, to: to, yMax: yMax}
	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" role="img" class="chart" data-testid="chart"`+
		` data-t0="%d" data-t1="%d" data-x0="%.1f" data-x1="%.1f" data-y0="%.1f" data-y1="%.1f" data-ymax="%g">`,
		chartW, chartH, chartW, chartH, from.Unix(), to.Unix(), sc.x(from), sc.x(to), sc.y(0), sc.y(yMax), yMax)
	fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#fcfcfc" stroke="#ccc"/>`,
		chartLeft, chartTop, chartW-chartLeft-chartRight, chartH-chartTop-chartBottom)
	// Percent axis.
	for i := 0; float64(i)*step <= yMax+1e-9; i++ {
		v := float64(i) * step
		y := sc.y(v)
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#e4e4e4"/>`, chartLeft, chartW-chartRight, y, y)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end" font-size="10" fill="#555" data-testid="y-tick" data-value="%g">%s%%</text>`,
			chartLeft-4, y+3.5, v, strconv.FormatFloat(math.Round(v*1000)/10, 'f', -1, 64))
	}
	// Time axis, in UTC: the shortest step of the ladder that gives at most eight ticks, each
	// label unique (tickLayout).
	tick := 24 * time.Hour
	for _, step := range []time.Duration{time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute, 15 * time.Minute,
		30 * time.Minute, time.Hour, 2 * time.Hour, 3 * time.Hour, 6 * time.Hour, 12 * time.Hour, 24 * time.Hour} {
		if float64(to.Sub(from))/float64(step) <= 8 {
			tick = step
			break
		}
	}
	layout := tickLayout(from, to, tick)
	for t := from.UTC().Truncate(tick).Add(tick); !t.After(to); t = t.Add(tick) {
		x := sc.x(t)
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#e4e4e4"/>`, x, x, chartTop, chartH-chartBottom)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" font-size="10" fill="#555" data-testid="x-tick" data-t="%d">%s</text>`,
			x, chartH-chartBottom+13, t.Unix(), t.Format(layout))
	}
	if top == 0 {
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" font-size="12" fill="#888" data-testid="chart-empty">nothing scored in this span</text>`,
			(chartLeft+chartW-chartRight)/2, (chartTop+chartH-chartBottom)/2)
	}
	// Bands first, then lines over them.
	for _, s := range series {
		for _, run := range runsOf(s.Points, from, to, gap) {
			var pts strings.Builder
			for _, p := range run {
				fmt.Fprintf(&pts, "%.1f,%.1f ", sc.x(p.At), sc.y(p.High))
			}
			for i := len(run) - 1; i >= 0; i-- {
				fmt.Fprintf(&pts, "%.1f,%.1f ", sc.x(run[i].At), sc.y(run[i].Low))
			}
			fmt.Fprintf(&b, `<polygon points="%s" fill="%s" fill-opacity="0.16" data-testid="band" data-series="%s"/>`,
				strings.TrimSpace(pts.String()), s.Colour, s.Name)
		}
	}
	for _, s := range series {
		for _, run := range runsOf(s.Points, from, to, gap) {
			var pts, ts, rs strings.Builder
			for _, p := range run {
				fmt.Fprintf(&pts, "%.1f,%.1f ", sc.x(p.At), sc.y(p.Rate))
				fmt.Fprintf(&ts, "%d ", p.At.Unix())
				fmt.Fprintf(&rs, "%d/%d ", p.Confirmed, p.Scored)
			}
			fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="1.6" data-testid="line" data-series="%s" data-t="%s" data-counts="%s"/>`,
				strings.TrimSpace(pts.String()), s.Colour, s.Name, strings.TrimSpace(ts.String()), strings.TrimSpace(rs.String()))
			if len(run) == 1 { // a lone point draws no line
				fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="2" fill="%s"/>`, sc.x(run[0].At), sc.y(run[0].Rate), s.Colour)
			}
		}
	}
	fired, resolved := false, false
	for _, m := range marks {
		if m.At.Before(from) || m.At.After(to) {
			continue
		}
		x, colour, what := sc.x(m.At), "#b00", "fired"
		if !m.Fired {
			colour, what = "#2a7", "resolved"
		}
		fmt.Fprintf(&b, `<g data-testid="alert-%s" data-t="%d"><title>%s %s at %s</title>`, what, m.At.Unix(),
			template.HTMLEscapeString(m.Rule), what, m.At.UTC().Format("2006-01-02 15:04:05Z"))
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="%s" stroke-width="1.5" stroke-dasharray="4 3"/>`,
			x, x, chartTop, chartH-chartBottom, colour)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" font-size="10" fill="%s">%s</text></g>`, x, chartTop-3, colour,
			map[bool]string{true: "▼", false: "▲"}[m.Fired])
		fired, resolved = fired || m.Fired, resolved || !m.Fired
	}
	// Legend, top left above the plot.
	lx := chartLeft
	for _, s := range series {
		fmt.Fprintf(&b, `<rect x="%.1f" y="4" width="14" height="8" fill="%s" fill-opacity="0.16"/><line x1="%.1f" x2="%.1f" y1="8" y2="8" stroke="%s" stroke-width="1.6"/>`,
			lx, s.Colour, lx, lx+14, s.Colour)
		fmt.Fprintf(&b, `<text x="%.1f" y="12" font-size="10" fill="#333">%s rate, 95%% interval</text>`, lx+18, s.Name)
		lx += 136
	}
	if fired || resolved {
		b.WriteString(fmt.Sprintf(`<text x="%.1f" y="12" font-size="10">`, lx))
		if fired {
			b.WriteString(`<tspan fill="#b00">▼ alert fired</tspan> `)
		}
		if resolved {
			b.WriteString(`<tspan fill="#2a7">▲ resolved</tspan>`)
		}
		b.WriteString(`</text>`)
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) // numbers, fixed words and escaped rule names only
}

// tickLayout labels ticks tick apart over [from, to]: by date for whole days, by time of day
// within one day, by date and time when sub-day ticks span several days.
func tickLayout(from, to time.Time, tick time.Duration) string {
	switch {
	case tick >= 24*time.Hour:
		return "Jan 2"
	case from.UTC().Truncate(24 * time.Hour).Equal(to.UTC().Truncate(24 * time.Hour)):
		return "15:04"
	}
	return "Jan 2 15:04"
}

// runsOf splits the points within [from, to] into runs whose consecutive points are at most gap apart.
func runsOf(pts []ratePoint, from, to time.Time, gap time.Duration) [][]ratePoint {
	var runs [][]ratePoint
	var cur []ratePoint
	for _, p := range pts {
		if p.At.Before(from) || p.At.After(to) {
			continue
		}
		if len(cur) > 0 && p.At.Sub(cur[len(cur)-1].At) > gap {
			runs = append(runs, cur)
			cur = nil
		}
		cur = append(cur, p)
	}
	if len(cur) > 0 {
		runs = append(runs, cur)
	}
	return runs
}

// versionRate is one version's pass rate as the discrimination snapshot counts the latest's: over
// the judged cases with an outcome in it, the share that passed (a case passes a version when
// every scored run of it passed).
type versionRate struct {
	Version        string
	Pass, Outcomes int
}

// versionRates computes each version's versionRate from the case table.
func versionRates(t *suite.CaseTable) []versionRate {
	out := make([]versionRate, len(t.Versions))
	for i, v := range t.Versions {
		out[i].Version = v
	}
	for _, c := range t.Cases {
		switch c.Class {
		case suite.ClassAlwaysPass, suite.ClassAlwaysFail, suite.ClassDiscriminating:
		default:
			continue // not judged
		}
		for i, o := range c.Outcomes {
			if i < len(out) && o != suite.OutcomeNone {
				out[i].Outcomes++
				if o == suite.OutcomePass {
					out[i].Pass++
				}
			}
		}
	}
	return out
}

// suiteChartRight is the suite chart's right margin: floor and ceiling are labelled there.
const suiteChartRight = 96.0

// suiteChart draws a suite's versions in order against pass rate (0–100 %): each version's pass
// rate over the judged cases (versionRates, the same count as the page's latest pass rate) over the
// band between the suite's floor and ceiling — the achievable range: with the cases that always
// pass and always fail, no judged version can score outside it. Like timeChart it carries its
// numbers and scale as data attributes.
func suiteChart(rates []versionRate, floor, ceiling *float64) template.HTML {
	if len(rates) == 0 {
		return ""
	}
	sc := chartScale{yMax: 1}
	plotW := chartW - chartLeft - suiteChartRight
	step := plotW / float64(len(rates))
	x := func(i int) float64 { return chartLeft + step*(float64(i)+0.5) }
	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" role="img" class="chart" data-testid="suite-chart" data-y0="%.1f" data-y1="%.1f">`,
		chartW, chartH, chartW, chartH, sc.y(0), sc.y(1))
	fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#fcfcfc" stroke="#ccc"/>`,
		chartLeft, chartTop, plotW, chartH-chartTop-chartBottom)
	for i := 0; i <= 4; i++ {
		y := sc.y(float64(i) / 4)
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#e4e4e4"/>`, chartLeft, chartLeft+plotW, y, y)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end" font-size="10" fill="#555">%d%%</text>`, chartLeft-4, y+3.5, i*25)
	}
	if floor != nil && ceiling != nil {
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#2a7" fill-opacity="0.14" data-testid="achievable" data-floor="%g" data-ceiling="%g"/>`,
			chartLeft, sc.y(*ceiling), plotW, max(1, sc.y(*floor)-sc.y(*ceiling)), *floor, *ceiling)
		for _, l := range []struct {
			name string
			v    float64
		}{{"ceiling", *ceiling}, {"floor", *floor}} {
			fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#2a7" stroke-dasharray="5 3" data-testid="%s-line"/>`,
				chartLeft, chartLeft+plotW, sc.y(l.v), sc.y(l.v), l.name)
		}
		// Labels in the right margin, apart even when floor and ceiling are close or equal.
		cy, fy := sc.y(*ceiling)+3.5, sc.y(*floor)+3.5
		if fy-cy < 12 {
			mid := (cy + fy) / 2
			cy, fy = mid-6, mid+6
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" font-size="10" fill="#1d6b4f">ceiling %.1f%%</text>`, chartLeft+plotW+4, cy, *ceiling*100)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" font-size="10" fill="#1d6b4f">floor %.1f%%</text>`, chartLeft+plotW+4, fy, *floor*100)
	}
	// Label every version while they fit, else every k-th (and the last); long labels are cut.
	every := max(1, int(math.Ceil(float64(len(rates))*48/plotW)))
	var pts strings.Builder
	for i, r := range rates {
		if i%every == 0 || i == len(rates)-1 {
			label := r.Version
			if rs := []rune(label); len(rs) > 8 {
				label = string(rs[:7]) + "…"
			}
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" font-size="10" fill="#555"><title>%s</title>%s</text>`,
				x(i), chartH-chartBottom+13, template.HTMLEscapeString(r.Version), template.HTMLEscapeString(label))
		}
		if r.Outcomes == 0 {
			continue
		}
		rate := float64(r.Pass) / float64(r.Outcomes)
		fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="#36c" data-testid="version-rate" data-version="%s" data-rate="%g"><title>%s: %d of %d judged cases passed</title></circle>`,
			x(i), sc.y(rate), template.HTMLEscapeString(r.Version), rate, template.HTMLEscapeString(r.Version), r.Pass, r.Outcomes)
		fmt.Fprintf(&pts, "%.1f,%.1f ", x(i), sc.y(rate))
	}
	fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="#36c" stroke-width="1.4"/>`, strings.TrimSpace(pts.String()))
	fmt.Fprintf(&b, `<rect x="%.1f" y="4" width="14" height="8" fill="#2a7" fill-opacity="0.14"/><text x="%.1f" y="12" font-size="10" fill="#333">achievable range (floor to ceiling)</text>`,
		chartLeft, chartLeft+18)
	fmt.Fprintf(&b, `<circle cx="%.1f" cy="8" r="3" fill="#36c"/><text x="%.1f" y="12" font-size="10" fill="#333">pass rate over judged cases</text>`,
		chartLeft+200, chartLeft+208)
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) // numbers, fixed words and escaped version labels only
}
