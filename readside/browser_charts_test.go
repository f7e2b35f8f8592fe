package readside_test

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/repeatrate/repeatrate/readside"
	"github.com/repeatrate/repeatrate/schemas"
)

// alertList is a fixed alert store: the alerts of workspace acme.
type alertList []readside.CurrentAlert

func (l alertList) CurrentAlerts(_ context.Context, ws string, _ int) ([]readside.CurrentAlert, error) {
	if ws != "acme" {
		return nil, nil
	}
	return l, nil
}

func fieldsOf(corr, source string) map[string]string {
	f := map[string]string{"correction_id": corr}
	for k, v := range browserScope {
		f[k] = v
	}
	if source != "" {
		f["source"] = source
	}
	return f
}

func ptr[T any](v T) *T { return &v }

// browserAlerts: correction-regressed-fast firing on fix-solid's live rate since fired, with the
// evidence it fired on; repeat-rate-high on fix-solid's badge (which read live), fired and
// resolved earlier; and a firing alert of another scope, which the page must not show.
func browserAlerts(fired, firedBefore, resolved time.Time) alertList {
	other := fieldsOf("fix-solid", "live")
	other["model"] = "another-bot"
	return alertList{
		{Rule: "correction-regressed-fast", Kind: "change", Subject: "a|…", Fields: fieldsOf("fix-solid", "live"),
			Labels: map[string]string{"severity": "page"}, Annotations: map[string]string{"summary": "a corrected mistake came back within the hour"},
			State: "firing", ActiveAt: fired.Add(-time.Minute), FiredAt: &fired,
			Evidence: &schemas.AlertEvidence{EvaluatedAt: fired, Source: "live", Windows: []schemas.AlertWindow{
				{Name: "1h", ConfirmedRepeats: 6, Scored: 200, Rate: ptr(0.03)},
				{Name: "24h-1h", ConfirmedRepeats: 4, Scored: 200, Rate: ptr(0.02)},
			}, Test: &schemas.AlertTest{LowerDifference: 0.004}}},
		{Rule: "repeat-rate-high", Kind: "threshold", Subject: "b|…", Fields: fieldsOf("fix-solid", ""),
			Labels: map[string]string{"severity": "ticket"}, Annotations: map[string]string{}, State: "resolved",
			ActiveAt: firedBefore, FiredAt: &firedBefore, ResolvedAt: &resolved,
			Evidence: &schemas.AlertEvidence{EvaluatedAt: firedBefore, Source: "live"}},
		{Rule: "correction-regressed-fast", Kind: "change", Subject: "a|other", Fields: other, Labels: map[string]string{},
			Annotations: map[string]string{}, State: "firing", ActiveAt: fired, FiredAt: &fired},
	}
}

// checkAlertsListed: fix-solid lists its one active alert above its charts, with the evidence in
// words and when it fired; the resolved one and another scope's are not listed; fix-wide lists none.
func checkAlertsListed(t *testing.T, p outcomesPage, fired time.Time) {
	t.Helper()
	for _, c := range p.Corrections {
		switch c.ID {
		case "fix-solid":
			if len(c.Alerts) != 1 {
				t.Fatalf("fix-solid lists alerts %+v, want the one firing", c.Alerts)
			}
			a := c.Alerts[0]
			want := "firing correction-regressed-fast (page): a corrected mistake came back within the hour " +
				"last hour 3.0% of 200 scored vs the 23 h before 2.0% of 200 scored; the increase is at least 0.4 points at the test's confidence; " +
				"fired " + fired.UTC().Format("2006-01-02 15:04:05Z")
			if a.Rule != "correction-regressed-fast" || a.State != "firing" || a.Text != want {
				t.Errorf("fix-solid's alert reads\n %q, want\n %q", a.Text, want)
			}
			if live := c.Sides["live"]; live == nil || a.Top >= live.Top {
				t.Errorf("fix-solid's alert is not above its charts (alert at %.0f px)", a.Top)
			}
		default:
			if len(c.Alerts) != 0 {
				t.Errorf("%s lists alerts %+v, want none", c.ID, c.Alerts)
			}
		}
	}
}

// checkCharts: every side's chart spans the last span up to now, and draws exactly the catalog's
// history points (minute or hourly) of its 1h and 24h windows that scored anything, each at the
// pixel its time and rate map to on the chart's axes, with a band per line; the percent axis
// starts at 0 and reaches every interval's upper bound; the time axis has ticks at whole hours
// (or days); alert marks sit at the times marks names ("fired 1700000000"), and nowhere else.
func checkCharts(t *testing.T, cat *readside.Catalog, p outcomesPage, now time.Time, span time.Duration, hourly bool, marks map[string][]string) {
	t.Helper()
	// Where each correction's charts start: the span before now, or, when all there is to draw
	// (both sources' history points and their alert marks) is younger, a minute before the
	// earliest of it, and at least 10 minutes before now.
	wantFrom := map[string]int64{}
	for _, c := range p.Corrections {
		first := int64(math.MaxInt64)
		for src := range c.Sides {
			agg := schemas.Aggregate{Workspace: browserScope["workspace"], Model: browserScope["model"], Run: browserScope["run"],
				Checkpoint: browserScope["checkpoint"], Artifact: browserScope["artifact"], CorrectionID: c.ID, Source: src}
			pts, err := cat.History(context.Background(), agg.ID(), hourly)
			if err != nil {
				t.Fatal(err)
			}
			if len(pts) > 0 {
				first = min(first, pts[0].ObservedAt.Unix())
			}
			for _, m := range marks[c.ID+" "+src] {
				var at int64
				fmt.Sscanf(m[strings.Index(m, " ")+1:], "%d", &at)
				first = min(first, at)
			}
		}
		wantFrom[c.ID] = max(now.Unix()-int64(span.Seconds()), min(first-60, now.Unix()-600))
	}
	for _, c := range p.Corrections {
		for src, s := range c.Sides {
			where := c.ID + " " + src
			ch := s.C
			if ch == nil {
				t.Errorf("%s: no chart", where)
				continue
			}
			if want := wantFrom[c.ID]; int64(ch.T1) != now.Unix() || int64(ch.T0) != want || ch.Width < 300 {
				t.Errorf("%s: chart spans %v–%v (%.0f px wide), want %v–%v", where, ch.T0, ch.T1, ch.Width, want, now.Unix())
			}
			xOf := func(at int64) float64 { return ch.X0 + (float64(at)-ch.T0)/(ch.T1-ch.T0)*(ch.X1-ch.X0) }
			yOf := func(r float64) float64 { return ch.Y0 + r/ch.YMax*(ch.Y1-ch.Y0) }
			// Times are carried in whole seconds and drawn exactly: allow a second's pixels.
			tol := 0.2 + (ch.X1-ch.X0)/(ch.T1-ch.T0)
			agg := schemas.Aggregate{Workspace: browserScope["workspace"], Model: browserScope["model"], Run: browserScope["run"],
				Checkpoint: browserScope["checkpoint"], Artifact: browserScope["artifact"], CorrectionID: c.ID, Source: src}
			pts, err := cat.History(context.Background(), agg.ID(), hourly)
			if err != nil {
				t.Fatal(err)
			}
			top := 0.0
			for _, series := range []string{"1h", "24h"} {
				var want, got []string
				for _, pt := range pts {
					w := pt.Hour
					if series == "24h" {
						w = pt.Day
					}
					if n := w[0] + w[1]; n > 0 && pt.ObservedAt.Unix() >= int64(ch.T0) {
						want = append(want, fmt.Sprintf("%d %d/%d", pt.ObservedAt.Unix(), w[0], n))
						top = max(top, wilsonHigh(w[0], n))
					}
				}
				drawn := false
				for _, l := range ch.Lines {
					if l.Series != series {
						continue
					}
					drawn = true
					for i, at := range l.T {
						got = append(got, fmt.Sprintf("%d %s", at, l.Counts[i]))
						var k, n float64
						fmt.Sscanf(l.Counts[i], "%g/%g", &k, &n)
						if px := l.Points[i]; math.Abs(px[0]-xOf(at)) > tol || math.Abs(px[1]-yOf(k/n)) > 0.2 {
							t.Errorf("%s %s: point %d (%d, %s) drawn at %v, want (%.1f, %.1f)", where, series, i, at, l.Counts[i], px, xOf(at), yOf(k/n))
						}
					}
				}
				if !slices.Equal(got, want) {
					t.Errorf("%s %s: the chart draws %v, the history holds %v", where, series, got, want)
				}
				if drawn != slices.Contains(ch.Bands, series) {
					t.Errorf("%s %s: line drawn %v but band %v", where, series, drawn, ch.Bands)
				}
			}
			if (top == 0) != ch.Empty {
				t.Errorf("%s: 'nothing scored' shown %v with points up to %.3f", where, ch.Empty, top)
			}
			n := len(ch.YTicks)
			if n < 2 || ch.YTicks[0].V != 0 || ch.YTicks[n-1].V != ch.YMax || ch.YMax < top || ch.YMax > 1 {
				t.Errorf("%s: percent axis %+v (max %g) does not run from 0 to at least %.3f", where, ch.YTicks, ch.YMax, top)
			}
			for _, tk := range ch.YTicks {
				if math.Abs(tk.Y-yOf(tk.V)) > 0.2 || tk.Text != fmt.Sprintf("%g%%", math.Round(tk.V*1000)/10) {
					t.Errorf("%s: percent tick %+v, want %q at %.1f", where, tk, fmt.Sprintf("%g%%", tk.V*100), yOf(tk.V))
				}
			}
			// Ticks: 4 to 8, each at its time and labelled uniquely — by time of day within one
			// day, by date for whole days, by both for sub-day ticks across days.
			if len(ch.XTicks) < 4 || len(ch.XTicks) > 8 {
				t.Errorf("%s: time axis has %d ticks", where, len(ch.XTicks))
			}
			layout := "15:04"
			from, to := time.Unix(int64(ch.T0), 0).UTC(), time.Unix(int64(ch.T1), 0).UTC()
			switch {
			case len(ch.XTicks) > 1 && ch.XTicks[1].T-ch.XTicks[0].T >= 86400:
				layout = "Jan 2"
			case !from.Truncate(24 * time.Hour).Equal(to.Truncate(24 * time.Hour)):
				layout = "Jan 2 15:04"
			}
			labels := map[string]bool{}
			for _, tk := range ch.XTicks {
				if math.Abs(tk.X-xOf(tk.T)) > 0.2 || time.Unix(tk.T, 0).UTC().Format(layout) != tk.Text || labels[tk.Text] {
					t.Errorf("%s: time tick %+v misplaced, mislabelled or repeated (layout %q)", where, tk, layout)
				}
				labels[tk.Text] = true
			}
			var gotMarks []string
			for _, m := range ch.Marks {
				gotMarks = append(gotMarks, fmt.Sprint(m.Kind, " ", m.T))
				if math.Abs(m.X-xOf(m.T)) > tol {
					t.Errorf("%s: %s mark at x %.1f, want %.1f (its time on the axis)", where, m.Kind, m.X, xOf(m.T))
				}
			}
			slices.Sort(gotMarks)
			want := slices.Clone(marks[where])
			slices.Sort(want)
			if !slices.Equal(gotMarks, want) {
				t.Errorf("%s: alert marks %v, want %v", where, gotMarks, want)
			}
		}
		if l, e := c.Sides["live"], c.Sides["evaluation"]; l != nil && e != nil && (math.Abs(l.Top-e.Top) > 1 || e.Left <= l.Left) {
			t.Errorf("%s: live and evaluation are not side by side (tops %.0f and %.0f)", c.ID, l.Top, e.Top)
		}
	}
	if !strings.Contains(fmt.Sprint(marks), "fired") {
		t.Fatal("checkCharts was given no mark to find: it tests nothing about marks")
	}
}

// wilsonHigh is the upper bound of the 95 % Wilson interval of k in n (docs/semantics.md#wilson).
func wilsonHigh(k, n int64) float64 {
	const z = 1.959964
	p, nf := float64(k)/float64(n), float64(n)
	return math.Min(1, (p+z*z/(2*nf)+z*math.Sqrt(p*(1-p)/nf+z*z/(4*nf*nf)))/(1+z*z/nf))
}
