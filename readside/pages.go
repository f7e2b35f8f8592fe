package readside

import (
	"bytes"
	"cmp"
	"embed"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/repeatrate/repeatrate/aggregator/suite"
	"github.com/repeatrate/repeatrate/internal/auth"
	"github.com/repeatrate/repeatrate/schemas"
)

//go:embed templates/pages.html
var templateFS embed.FS

// Width of an interval bar in pixels.
const barPx = 160

// A measured window whose evidence is thin is drawn as such (README, Read side): its rate muted,
// its interval hatched in amber across the bar, and a marker naming why.
const (
	// fewScored: below this many scored opportunities the window is marked "few scored". At 20 the
	// Wilson interval is still about 30 points wide at a 20 % rate (4/20: 8.1–41.6 %).
	fewScored = 20
	// wideInterval: a 95 % interval at least this wide (a fraction of the rate scale) is marked
	// "wide interval": 20 points spans at least two of the badge's colour bands (0, <5, <10, <20,
	// <35 %), so the rate cannot say which band the correction is in.
	wideInterval = 0.20
)

// narrowness says why a window's rate rests on thin evidence: "few scored", "wide interval", or
// "" when neither (or when it is not measured).
func narrowness(w schemas.Window) string {
	switch {
	case w.Status != schemas.StatusMeasured || w.CI95 == nil:
		return ""
	case w.Scored < fewScored:
		return "few scored"
	case w.CI95.High-w.CI95.Low >= wideInterval:
		return "wide interval"
	}
	return ""
}

var pages = template.Must(template.New("pages").Funcs(template.FuncMap{
	"pct": func(r *float64) string {
		if r == nil {
			return "—"
		}
		return strconv.FormatFloat(*r*100, 'f', 1, 64) + "%"
	},
	"pct1":     func(r float64) string { return strconv.FormatFloat(r*100, 'f', 1, 64) + "%" },
	"barpos":   func(r float64) string { return strconv.FormatFloat(r*barPx, 'f', 1, 64) },
	"barpos1":  func(r *float64) string { return strconv.FormatFloat(*r*barPx-1, 'f', 1, 64) },
	"barwidth": func(i *schemas.Interval) string { return strconv.FormatFloat(max(1, (i.High-i.Low)*barPx), 'f', 1, 64) },
	"stamp":    func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05Z") },
	"frac": func(r *float64) string {
		if r == nil {
			return "—"
		}
		return strconv.FormatFloat(*r, 'f', 3, 64)
	},
	"signed": func(f float64) string { return strconv.FormatFloat(f, 'f', 4, 64) },
	"win":    func(w schemas.Window) struct{ W schemas.Window } { return struct{ W schemas.Window }{w} },
	"passk":  func(s schemas.SuiteStability, k int) *float64 { return s.PassAtK[strconv.Itoa(k)] },
	"narrow": narrowness,
	"plural": func(n int, word string) string {
		if n == 1 {
			return "1 " + word
		}
		return strconv.Itoa(n) + " " + word + "s"
	},
	"gpass": func(s schemas.SuiteStability, k int) *float64 {
		return s.GPassAtK[strconv.Itoa(k)]["1"]
	},
}).ParseFS(templateFS, "templates/pages.html"))

// pageData is what every page template reads; each page fills its part.
type pageData struct {
	Title, Error string
	// index
	Workspace  string
	Workspaces []string
	Scopes     []scopeRow
	Suites     []string
	More       bool // the workspace has more corrections than the index lists
	// MoreWorkspaces: a token of every workspace sees the most recently active maxLimit only.
	MoreWorkspaces bool
	// login: the page to return to once signed in (a path of this server)
	ReturnTo string
	// outcomes
	Scope    schemas.Scope
	Outcomes []outcomeView
	Next     string
	// Range is the charts' span (24h or 7d); OtherRange links to the page with the other one.
	Range, OtherRange string
	// AlertsUnavailable: the alert store could not be read, so the page cannot say what fires.
	AlertsUnavailable bool
	// suite
	Suite    string
	D        schemas.SuiteDiscrimination
	Stab     []schemas.SuiteStability
	Ks       []int
	Versions []string
	From, To string
	Moved    *Moved
	Cases    CasesPage
	// SuiteChart draws each version's mean pass rate over the achievable range.
	SuiteChart template.HTML
}

type scopeRow struct {
	Model, Run, Checkpoint, Artifact string
	N                                int
	Link                             string
	Corrections                      []indexCorrection // the first indexCorrections of the workspace
	// FiringElsewhere counts firing alerts of its corrections past those shown; Partial says the
	// listing stopped within this scope, so N counts only the corrections listed.
	FiringElsewhere int
	Partial         bool
}

// indexCorrection is a correction as the index shows it: its badge, the 24h window of the source
// the badge shows, and the rules firing on it.
type indexCorrection struct {
	ID, BadgeURL, Badge string
	Day                 schemas.Window
	Firing              []string
}

// indexCorrections bounds the corrections whose snapshots the index reads; past it, scopes show
// only their count.
const indexCorrections = 50

type sideView struct {
	Name       string
	S          *schemas.Snapshot
	Chart      template.HTML
	Points     int
	Resolution string // of the chart's points: "a minute" or "an hour"
}

type outcomeView struct {
	Outcome
	Alerts   []alertView // pending and firing, with their evidence in words
	BadgeURL string
	LiveSide sideView
	EvalSide sideView
}

func (a *api) pageRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /{$}", a.indexPage)
	mux.HandleFunc("GET /login", func(w http.ResponseWriter, req *http.Request) {
		a.renderPage(w, http.StatusOK, "login", pageData{Title: "Sign in", ReturnTo: localPath(req.URL.Query().Get("next"))})
	})
	mux.HandleFunc("POST /login", a.login)
	mux.HandleFunc("POST /logout", a.logout)
	mux.HandleFunc("GET /ui/outcomes", a.outcomesPage)
	mux.HandleFunc("GET /ui/suite", a.suitePage)
}

// renderPage renders into a buffer first, so that a template error answers 500 instead of half a page.
func (a *api) renderPage(w http.ResponseWriter, status int, name string, d pageData) {
	var b bytes.Buffer
	if err := pages.ExecuteTemplate(&b, name, d); err != nil {
		a.log.Error("render page", zap.String("page", name), zap.Error(err))
		http.Error(w, "page error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; form-action 'self'; frame-ancestors 'none'")
	w.WriteHeader(status)
	w.Write(b.Bytes())
}

// pageBegin authenticates a page request: without a token it goes to the login form, with one
// that may not read the workspace it answers 403.
func (a *api) pageBegin(w http.ResponseWriter, req *http.Request, names, required []string) (url.Values, *auth.Principal, bool) {
	p := a.principal(req)
	if p == nil {
		a.metrics.denied.WithLabelValues("401").Inc()
		// Signed in, the reader comes back to the page that asked.
		http.Redirect(w, req, "/login?next="+url.QueryEscape(req.URL.RequestURI()), http.StatusSeeOther)
		return nil, nil, false
	}
	v, err := params(req.URL.RawQuery, append([]string{"workspace"}, names...), required)
	if err != nil {
		a.renderPage(w, http.StatusBadRequest, "error", pageData{Title: "Bad request", Error: err.Error()})
		return nil, nil, false
	}
	if ws := v.Get("workspace"); ws != "" && !p.Can(ws, auth.Read) {
		a.metrics.denied.WithLabelValues("403").Inc()
		a.renderPage(w, http.StatusForbidden, "error", pageData{Title: "Forbidden", Error: "this token may not read the workspace"})
		return nil, nil, false
	}
	return v, p, true
}

func (a *api) pageUnavailable(w http.ResponseWriter, req *http.Request, err error) {
	a.readFailed(req, err)
	a.renderPage(w, http.StatusServiceUnavailable, "error", pageData{Title: "Unavailable", Error: "state unavailable"})
}

func (a *api) indexPage(w http.ResponseWriter, req *http.Request) {
	v, p, ok := a.pageBegin(w, req, nil, nil)
	if !ok {
		return
	}
	d := pageData{Title: "repeatrate", Workspace: v.Get("workspace")}
	for _, ws := range p.Workspaces(auth.Read) {
		if ws != auth.AllWorkspaces {
			d.Workspaces = append(d.Workspaces, ws)
		} else if a.catalog != nil {
			// A token of every workspace is offered those the read side holds anything of.
			all, err := a.catalog.Workspaces(req.Context(), maxLimit+1)
			if err != nil {
				a.pageUnavailable(w, req, err)
				return
			}
			if len(all) > maxLimit {
				all, d.MoreWorkspaces = all[:maxLimit], true
			}
			d.Workspaces = append(d.Workspaces, all...)
		}
	}
	slices.Sort(d.Workspaces)
	d.Workspaces = slices.Compact(d.Workspaces)
	if d.Workspace == "" && len(d.Workspaces) == 1 {
		d.Workspace = d.Workspaces[0]
	}
	if d.Workspace != "" && a.catalog != nil {
		refs, next, err := a.listCorrections(req.Context(), d.Workspace, schemas.JoinEscaped(d.Workspace)+"|", "", maxLimit)
		if err != nil {
			a.pageUnavailable(w, req, err)
			return
		}
		d.More = next != ""
		var alerts []CurrentAlert
		if a.cfg.Alerts != nil {
			if alerts, err = a.cfg.Alerts.CurrentAlerts(req.Context(), d.Workspace, maxAlerts); err != nil {
				a.readFailed(req, err)
				d.AlertsUnavailable = true
			}
		}
		for i, r := range refs {
			n := len(d.Scopes)
			if n == 0 || d.Scopes[n-1].Model != r.Model || d.Scopes[n-1].Run != r.Run || d.Scopes[n-1].Checkpoint != r.Checkpoint || d.Scopes[n-1].Artifact != r.Artifact {
				q := url.Values{"workspace": {r.Workspace}, "model": {r.Model}, "run": {r.Run}, "checkpoint": {r.Checkpoint}, "artifact": {r.Artifact}}
				d.Scopes = append(d.Scopes, scopeRow{Model: r.Model, Run: r.Run, Checkpoint: r.Checkpoint, Artifact: r.Artifact,
					Link: "/ui/outcomes?" + q.Encode()})
				n++
			}
			row := &d.Scopes[n-1]
			row.N++
			if i >= indexCorrections {
				// Counted, not read (the index stays a bounded read), yet an alert firing on it
				// is shown: the alerts are read already.
				for _, al := range alertsOf(alerts, r) {
					if al.State == "firing" {
						row.FiringElsewhere++
					}
				}
				continue
			}
			live, eval, err := a.current(req.Context(), r.scope(), r.CorrectionID)
			if err != nil {
				a.pageUnavailable(w, req, err)
				return
			}
			if live == nil && eval == nil {
				row.N--
				continue // gone idle since it was indexed
			}
			q := url.Values{"workspace": {r.Workspace}, "model": {r.Model}, "run": {r.Run}, "checkpoint": {r.Checkpoint},
				"artifact": {r.Artifact}, "correction_id": {r.CorrectionID}}
			c := indexCorrection{ID: r.CorrectionID, BadgeURL: "/v1/badge.svg?" + q.Encode(), Badge: badgeOf(live, eval).Value}
			// The 24h rate of the source the badge shows.
			if s := live; s != nil && s.Windows.All.Scored > 0 || eval == nil {
				c.Day = live.Windows.Day
			} else {
				c.Day = eval.Windows.Day
			}
			for _, al := range alertsOf(alerts, r) {
				if al.State == "firing" {
					c.Firing = append(c.Firing, al.Rule)
				}
			}
			row.Corrections = append(row.Corrections, c)
		}
		if d.More && len(d.Scopes) > 0 {
			d.Scopes[len(d.Scopes)-1].Partial = true // its count stops where the listing did
		}
		pg, err := a.catalog.Suites(req.Context(), d.Workspace, "", maxLimit)
		if err != nil {
			a.pageUnavailable(w, req, err)
			return
		}
		d.Suites = pg.Items
	}
	a.renderPage(w, http.StatusOK, "index", d)
}

// Chart spans of the outcomes page: a day by default (minute points), a week on request (hourly).
var chartSpans = map[string]struct {
	span, gap time.Duration
	hourly    bool
}{
	"24h": {24 * time.Hour, 5 * time.Minute, false},
	"7d":  {7 * 24 * time.Hour, 2 * time.Hour, true},
}

func (a *api) outcomesPage(w http.ResponseWriter, req *http.Request) {
	names := append(scopeFields[1:], "cursor", "limit", "range")
	v, _, ok := a.pageBegin(w, req, names, scopeFields[:5])
	if !ok {
		return
	}
	after, limit, err := paging(v)
	if err != nil {
		a.renderPage(w, http.StatusBadRequest, "error", pageData{Title: "Bad request", Error: err.Error()})
		return
	}
	span, known := chartSpans[cmp.Or(v.Get("range"), "24h")]
	if !known {
		a.renderPage(w, http.StatusBadRequest, "error", pageData{Title: "Bad request", Error: "query parameter range must be 24h or 7d"})
		return
	}
	if a.catalog == nil {
		a.pageUnavailable(w, req, fmt.Errorf("no catalog"))
		return
	}
	outs, next, err := a.outcomesOf(req.Context(), v, after, min(limit, 20))
	if err != nil {
		a.pageUnavailable(w, req, err)
		return
	}
	d := pageData{Title: "Correction outcomes", Scope: schemas.Scope{Workspace: v.Get("workspace"), Model: v.Get("model"),
		Run: v.Get("run"), Checkpoint: v.Get("checkpoint"), Artifact: v.Get("artifact")}, Range: cmp.Or(v.Get("range"), "24h")}
	var alerts []CurrentAlert
	if a.cfg.Alerts != nil {
		if alerts, err = a.cfg.Alerts.CurrentAlerts(req.Context(), d.Scope.Workspace, maxAlerts); err != nil {
			// The page still shows the rates; it says that it cannot say which alerts fire.
			a.readFailed(req, err)
			d.AlertsUnavailable = true
		}
	}
	now := a.now()
	for _, o := range outs {
		q := url.Values{"workspace": {o.Workspace}, "model": {o.Model}, "run": {o.Run}, "checkpoint": {o.Checkpoint},
			"artifact": {o.Artifact}, "correction_id": {o.CorrectionID}}
		ov := outcomeView{Outcome: o, BadgeURL: "/v1/badge.svg?" + q.Encode(),
			LiveSide: sideView{Name: "live", S: o.Live}, EvalSide: sideView{Name: "evaluation", S: o.Evaluation}}
		mine := alertsOf(alerts, o.CorrectionRef)
		for _, al := range mine {
			if al.State != "resolved" {
				ov.Alerts = append(ov.Alerts, alertView{CurrentAlert: al, Evidence: evidenceWords(al.Kind, al.Evidence)})
			}
		}
		// Both sources' charts share their time axis: from the earliest thing either draws.
		hist := map[*sideView][]Point{}
		marks := map[*sideView][]alertMark{}
		var first time.Time
		earliest := func(t time.Time) {
			if first.IsZero() || t.Before(first) {
				first = t
			}
		}
		for _, side := range []*sideView{&ov.LiveSide, &ov.EvalSide} {
			if side.S == nil {
				continue
			}
			pts, err := a.catalog.History(req.Context(), side.S.Aggregate.ID(), span.hourly)
			if err != nil {
				a.pageUnavailable(w, req, err)
				return
			}
			hist[side], marks[side] = pts, marksOf(mine, side.Name)
			if len(pts) > 0 {
				earliest(pts[0].ObservedAt)
			}
			for _, m := range marks[side] {
				earliest(m.At)
			}
		}
		// A chart ends now, or at its newest point or mark when the processor's clock (which
		// stamps them) is ahead of this server's: a point is never cut for being "in the future".
		to := now
		for side, pts := range hist {
			if n := len(pts); n > 0 && pts[n-1].ObservedAt.After(to) {
				to = pts[n-1].ObservedAt
			}
			for _, m := range marks[side] {
				if m.At.After(to) {
					to = m.At
				}
			}
		}
		from := chartFrom(to, span.span, first)
		for side, pts := range hist {
			series := []rateSeries{
				seriesOf("1h", "#c0392b", pts, func(p *Point) [3]int64 { return p.Hour }),
				seriesOf("24h", "#2e6da4", pts, func(p *Point) [3]int64 { return p.Day }),
			}
			side.Chart, side.Points = timeChart(from, to, span.gap, series, marks[side]), len(pts)
			side.Resolution = map[bool]string{false: "a minute", true: "an hour"}[span.hourly]
		}
		d.Outcomes = append(d.Outcomes, ov)
	}
	if c := cursor(next); c != nil {
		v.Set("cursor", *c)
		d.Next = "/ui/outcomes?" + v.Encode()
	}
	rv := url.Values{}
	for _, f := range scopeFields[:5] {
		rv.Set(f, v.Get(f))
	}
	rv.Set("range", map[string]string{"24h": "7d", "7d": "24h"}[d.Range])
	d.OtherRange = "/ui/outcomes?" + rv.Encode()
	a.renderPage(w, http.StatusOK, "outcomes", d)
}

// alertsOf picks the alerts whose subject is the correction of ref (either source, or its badge).
func alertsOf(all []CurrentAlert, ref CorrectionRef) []CurrentAlert {
	var out []CurrentAlert
	for _, al := range all {
		f := al.Fields
		if f["workspace"] == ref.Workspace && f["model"] == ref.Model && f["run"] == ref.Run && f["checkpoint"] == ref.Checkpoint &&
			f["artifact"] == ref.Artifact && f["correction_id"] == ref.CorrectionID {
			out = append(out, al)
		}
	}
	return out
}

// marksOf is where the alerts of one source fired and resolved: an alert on an aggregate marks
// its source's chart, one on the badge the chart of the source its evidence read.
func marksOf(alerts []CurrentAlert, source string) []alertMark {
	var out []alertMark
	for _, al := range alerts {
		src := al.Fields["source"]
		if src == "" && al.Evidence != nil {
			src = al.Evidence.Source
		}
		if src != source {
			continue
		}
		if al.FiredAt != nil {
			out = append(out, alertMark{At: *al.FiredAt, Fired: true, Rule: al.Rule})
		}
		if al.ResolvedAt != nil {
			out = append(out, alertMark{At: *al.ResolvedAt, Rule: al.Rule})
		}
	}
	return out
}

func (a *api) suitePage(w http.ResponseWriter, req *http.Request) {
	v, _, ok := a.pageBegin(w, req, []string{"suite", "from", "to"}, []string{"workspace", "suite"})
	if !ok {
		return
	}
	k := suite.Key{Workspace: v.Get("workspace"), Suite: v.Get("suite")}
	if a.suites == nil {
		a.pageUnavailable(w, req, fmt.Errorf("no suite reader"))
		return
	}
	now := a.now()
	s, err := a.suites.Read(req.Context(), k, now)
	if err != nil {
		a.pageUnavailable(w, req, err)
		return
	}
	if s == nil || s.Discrimination.VersionsSeen == 0 {
		a.renderPage(w, http.StatusNotFound, "error", pageData{Title: "Not found", Error: errUnknownSuite})
		return
	}
	t, err := a.caseTable(req.Context(), k)
	if err != nil {
		a.pageUnavailable(w, req, err)
		return
	}
	cfg := a.suites.Config()
	d := pageData{Title: "Suite " + k.Suite, Workspace: k.Workspace, Suite: k.Suite, Ks: cfg.Ks, Versions: t.Versions,
		D: suite.DiscriminationOf(k, &s.Discrimination, cfg, now)}
	byLabel := map[string]*suite.VersionSummary{}
	for i := range s.Versions {
		byLabel[s.Versions[i].Version] = &s.Versions[i]
	}
	for _, l := range t.Versions {
		if vs := byLabel[l]; vs != nil {
			d.Stab = append(d.Stab, suite.StabilityOf(k, vs, cfg, now))
		}
	}
	d.SuiteChart = suiteChart(versionRates(t), d.D.Floor, d.D.Ceiling)
	d.From, d.To = v.Get("from"), v.Get("to")
	if n := len(t.Versions); n >= 2 && d.From == "" && d.To == "" {
		d.From, d.To = t.Versions[n-2], t.Versions[n-1]
	}
	if d.From != "" && d.To != "" {
		if m, ok := movedBetween(t, d.From, d.To, "", maxLimit); ok {
			d.Moved = &m
		}
	}
	if d.Cases, err = a.casesPage(req.Context(), k, "", "", "", maxLimit); err != nil {
		a.pageUnavailable(w, req, err)
		return
	}
	a.renderPage(w, http.StatusOK, "suite", d)
}
