package readside

import (
	"context"
	_ "embed"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/aggregator/suite"
	"github.com/repeatrate/repeatrate/schemas"
)

//go:embed openapi.json
var openAPI []byte

// OpenAPI is the read API's OpenAPI 3.1 document, served at /v1/openapi.json.
func OpenAPI() []byte { return openAPI }

// Page sizes of listing endpoints.
const (
	defaultLimit = 50
	maxLimit     = 200
)

// route is one endpoint of the read API (the OpenAPI test walks them).
type route struct {
	pattern string
	handler http.HandlerFunc
}

func (a *api) apiRoutes() []route {
	return []route{
		{"GET /v1/openapi.json", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Write(openAPI)
		}},
		{"GET /v1/snapshots", a.snapshots},
		{"GET /v1/badge.svg", a.badge},
		{"GET /v1/corrections", a.corrections},
		{"GET /v1/outcomes", a.outcomes},
		{"GET /v1/history", a.history},
		{"GET /v1/suites", a.suiteList},
		{"GET /v1/suites/discrimination", a.discrimination},
		{"GET /v1/suites/stability", a.stability},
		{"GET /v1/suites/cases", a.suiteCases},
		{"GET /v1/suites/moved", a.moved},
		{"GET /v1/stream", a.stream},
		{"GET /v1/alerts", a.alerts},
	}
}

// AlertLister lists the alerts of a workspace that are pending, firing, or resolved within the
// last day, ordered by rule and subject, at most limit of them; alert.Redis is one. The
// read side declares it so that it imports nothing of alerting.
type AlertLister interface {
	CurrentAlerts(ctx context.Context, workspace string, limit int) ([]CurrentAlert, error)
}

// CurrentAlert is one alert of GET /v1/alerts, as the alert store holds it: the rule, the kind,
// labels and annotations it fired with, its subject's fields, its state and its times.
type CurrentAlert struct {
	Rule        string            `json:"rule"`
	Kind        string            `json:"kind"`
	Subject     string            `json:"subject"`
	Fields      map[string]string `json:"fields"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	State       string            `json:"state"` // pending, firing or resolved
	ActiveAt    time.Time         `json:"active_at"`
	FiredAt     *time.Time        `json:"fired_at"`
	ResolvedAt  *time.Time        `json:"resolved_at"`
	// Evidence is what the rule saw when the alert fired.
	Evidence *schemas.AlertEvidence `json:"evidence"`
}

// AlertsPage is the answer of /v1/alerts.
type AlertsPage struct {
	Items []CurrentAlert `json:"items"`
}

// maxAlerts bounds one answer of /v1/alerts (and the records it reads).
const maxAlerts = 1000

func (a *api) alerts(w http.ResponseWriter, req *http.Request) {
	v, ok := a.begin(w, req, nil, nil)
	if !ok {
		return
	}
	if a.cfg.Alerts == nil {
		writeError(w, http.StatusServiceUnavailable, "alerting state unavailable", false)
		return
	}
	items, err := a.cfg.Alerts.CurrentAlerts(req.Context(), v.Get("workspace"), maxAlerts)
	if err != nil {
		a.unavailable(w, req, err)
		return
	}
	if items == nil {
		items = []CurrentAlert{}
	}
	writeJSON(w, AlertsPage{Items: items})
}

func (a *api) routes(mux *http.ServeMux) {
	for _, r := range a.apiRoutes() {
		mux.HandleFunc(r.pattern, r.handler)
	}
	a.pageRoutes(mux)
}

// params reads a query: every name in names at most once, those in required non-empty. Its error
// names the offending parameters, never their values.
func params(raw string, names, required []string) (url.Values, error) {
	v, err := url.ParseQuery(raw)
	if err != nil {
		return nil, fmt.Errorf("the query is malformed (a bad percent-escape, or ; for &)")
	}
	var twice, missing []string
	for _, n := range names {
		if len(v[n]) > 1 {
			twice = append(twice, n)
		}
	}
	for _, n := range required {
		if v.Get(n) == "" {
			missing = append(missing, n)
		}
	}
	var problems []string
	if len(twice) > 0 {
		problems = append(problems, plural(twice, "is given more than once", "are given more than once"))
	}
	if len(missing) > 0 {
		problems = append(problems, plural(missing, "is missing or empty", "are missing or empty"))
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("%s", strings.Join(problems, "; "))
	}
	return v, nil
}

// paging reads cursor and limit.
func paging(v url.Values) (after string, limit int, err error) {
	limit = defaultLimit
	if s := v.Get("limit"); s != "" {
		if limit, err = strconv.Atoi(s); err != nil || limit < 1 || limit > maxLimit {
			return "", 0, fmt.Errorf("query parameter limit must be an integer in 1..%d", maxLimit)
		}
	}
	if c := v.Get("cursor"); c != "" {
		b, err := base64.RawURLEncoding.DecodeString(c)
		if err != nil {
			return "", 0, fmt.Errorf("query parameter cursor is not one this API returned")
		}
		after = string(b)
	}
	return after, limit, nil
}

func cursor(next string) *string {
	if next == "" {
		return nil
	}
	c := base64.RawURLEncoding.EncodeToString([]byte(next))
	return &c
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	json.NewEncoder(w).Encode(v)
}

// unavailable logs a backend error and answers 503 without it.
func (a *api) unavailable(w http.ResponseWriter, req *http.Request, err error) {
	a.readFailed(req, err)
	writeError(w, http.StatusServiceUnavailable, "state unavailable", false)
}

// readFailed logs a failed read of the state as a warning, unless its client went away mid-read:
// then nothing is wrong with the state, and a client that hangs up on every read must not fill
// the log.
func (a *api) readFailed(req *http.Request, err error) {
	if req.Context().Err() != nil {
		a.log.Debug("read abandoned by its client", zap.String("path", req.URL.Path))
		return
	}
	a.log.Warn("read state", zap.String("path", req.URL.Path), zap.Error(err))
}

// begin parses a request's query and checks its token against the workspace parameter; ok is
// false when it already answered. Authentication comes first, so an anonymous request learns
// nothing, not even which parameters it lacks.
func (a *api) begin(w http.ResponseWriter, req *http.Request, names, required []string) (url.Values, bool) {
	if a.principal(req) == nil {
		a.allow(w, req, "", false)
		return nil, false
	}
	v, err := params(req.URL.RawQuery, append([]string{"workspace", "cursor", "limit"}, names...), append([]string{"workspace"}, required...))
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error(), false)
		return nil, false
	}
	if !a.allow(w, req, v.Get("workspace"), false) {
		return nil, false
	}
	return v, true
}

// CorrectionRef names a scope and correction.
type CorrectionRef struct {
	Workspace    string `json:"workspace"`
	Model        string `json:"model"`
	Run          string `json:"run"`
	Checkpoint   string `json:"checkpoint"`
	Artifact     string `json:"artifact"`
	CorrectionID string `json:"correction_id"`
}

func (c CorrectionRef) scope() schemas.Scope {
	return schemas.Scope{Workspace: c.Workspace, Model: c.Model, Run: c.Run, Checkpoint: c.Checkpoint, Artifact: c.Artifact}
}

// scopeFields are the scope parts in aggregate-ID order.
var scopeFields = []string{"workspace", "model", "run", "checkpoint", "artifact", "correction_id"}

// idPrefix is the aggregate-ID prefix of the leading scope parts v gives (workspace first, then
// model, … as long as each is given).
func idPrefix(v url.Values) string {
	var parts []string
	for _, f := range scopeFields {
		s := v.Get(f)
		if s == "" {
			break
		}
		parts = append(parts, s)
	}
	return schemas.JoinEscaped(parts...) + "|"
}

// listCorrections pages through the corrections of the index whose ID starts with prefix. Both
// sources of a correction are adjacent in ID order; the cursor skips past both.
// beginPage is begin for a paginated route: it also reads the page's cursor and size, answering
// 400 when they are bad.
func (a *api) beginPage(w http.ResponseWriter, req *http.Request, names, required []string) (v url.Values, after string, limit int, ok bool) {
	if v, ok = a.begin(w, req, names, required); !ok {
		return nil, "", 0, false
	}
	after, limit, err := paging(v)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error(), false)
		return nil, "", 0, false
	}
	return v, after, limit, true
}

func (a *api) listCorrections(ctx context.Context, ws, prefix, after string, limit int) ([]CorrectionRef, string, error) {
	var out []CorrectionRef
	for len(out) < limit {
		pg, err := a.catalog.Aggregates(ctx, ws, prefix, after, limit)
		if err != nil {
			return nil, "", err
		}
		for _, id := range pg.Items {
			parts, err := schemas.SplitEscaped(id)
			if err != nil || len(parts) != 7 {
				continue
			}
			ref := CorrectionRef{parts[0], parts[1], parts[2], parts[3], parts[4], parts[5]}
			if n := len(out); n > 0 && out[n-1] == ref {
				continue
			}
			if len(out) == limit {
				return out, after, nil
			}
			out = append(out, ref)
			// Past every source of this correction: escaping leaves no 0x7f in an ID.
			after = schemas.JoinEscaped(parts[:6]...) + "|\x7f"
		}
		if pg.Next == "" {
			return out, "", nil
		}
	}
	return out, after, nil
}

// CorrectionsPage is the answer of /v1/corrections.
type CorrectionsPage struct {
	Items []CorrectionRef `json:"items"`
	Next  *string         `json:"next_cursor"`
}

func (a *api) corrections(w http.ResponseWriter, req *http.Request) {
	v, after, limit, ok := a.beginPage(w, req, scopeFields[1:], nil)
	if !ok {
		return
	}
	if a.catalog == nil {
		writeError(w, http.StatusServiceUnavailable, "state unavailable", false)
		return
	}
	items, next, err := a.listCorrections(req.Context(), v.Get("workspace"), idPrefix(v), after, limit)
	if err != nil {
		a.unavailable(w, req, err)
		return
	}
	if items == nil {
		items = []CorrectionRef{}
	}
	writeJSON(w, CorrectionsPage{Items: items, Next: cursor(next)})
}

// BadgeJSON is the badge of a correction as data.
type BadgeJSON struct {
	Value  string `json:"value"`
	Source string `json:"source"`
	Colour string `json:"colour"`
}

// Outcome is one correction with both sources' snapshots, never pooled, and its badge.
type Outcome struct {
	CorrectionRef
	Live       *schemas.Snapshot `json:"live"`
	Evaluation *schemas.Snapshot `json:"evaluation"`
	Badge      BadgeJSON         `json:"badge"`
}

// OutcomesPage is the answer of /v1/outcomes.
type OutcomesPage struct {
	Items []Outcome `json:"items"`
	Next  *string   `json:"next_cursor"`
}

func badgeOf(live, eval *schemas.Snapshot) BadgeJSON {
	var lw, ew schemas.Window
	if live != nil {
		lw = live.Windows.All
	}
	if eval != nil {
		ew = eval.Windows.All
	}
	b := aggregator.ChooseBadge(lw, ew)
	return BadgeJSON{Value: b.Value, Source: b.Source, Colour: string(b.Colour)}
}

// outcomesOf reads the outcomes of a page of corrections of the scope v names.
func (a *api) outcomesOf(ctx context.Context, v url.Values, after string, limit int) ([]Outcome, string, error) {
	refs, next, err := a.listCorrections(ctx, v.Get("workspace"), idPrefix(v), after, limit)
	if err != nil {
		return nil, "", err
	}
	out := []Outcome{}
	for _, ref := range refs {
		live, eval, err := a.current(ctx, ref.scope(), ref.CorrectionID)
		if err != nil {
			return nil, "", err
		}
		if live == nil && eval == nil {
			continue // gone idle since it was indexed
		}
		out = append(out, Outcome{CorrectionRef: ref, Live: live, Evaluation: eval, Badge: badgeOf(live, eval)})
	}
	return out, next, nil
}

func (a *api) outcomes(w http.ResponseWriter, req *http.Request) {
	v, after, limit, ok := a.beginPage(w, req, scopeFields[1:], scopeFields[1:5])
	if !ok {
		return
	}
	if a.catalog == nil {
		writeError(w, http.StatusServiceUnavailable, "state unavailable", false)
		return
	}
	items, next, err := a.outcomesOf(req.Context(), v, after, limit)
	if err != nil {
		a.unavailable(w, req, err)
		return
	}
	writeJSON(w, OutcomesPage{Items: items, Next: cursor(next)})
}

// History is the answer of /v1/history.
type History struct {
	Aggregate schemas.Aggregate `json:"aggregate"`
	// Points are the last snapshot of each minute (or hour), oldest first, at most MaxPoints of them.
	Points    []Point `json:"points"`
	MaxPoints int     `json:"max_points"`
	// Resolution is minute (the last snapshot of each minute, 24 h) or hour (of each hour, 7 d).
	Resolution string `json:"resolution"`
}

func (a *api) history(w http.ResponseWriter, req *http.Request) {
	v, ok := a.begin(w, req, append(scopeFields[1:], "source", "resolution"), append(scopeFields[1:], "source"))
	if !ok {
		return
	}
	src, known := aggregator.ParseSource(v.Get("source"))
	if !known {
		writeError(w, http.StatusBadRequest, "query parameter source must be live or evaluation", false)
		return
	}
	res := v.Get("resolution")
	if res == "" {
		res = "minute"
	}
	if res != "minute" && res != "hour" {
		writeError(w, http.StatusBadRequest, "query parameter resolution must be minute or hour", false)
		return
	}
	if a.catalog == nil {
		writeError(w, http.StatusServiceUnavailable, "state unavailable", false)
		return
	}
	k := aggregator.Key{Scope: schemas.Scope{Workspace: v.Get("workspace"), Model: v.Get("model"), Run: v.Get("run"),
		Checkpoint: v.Get("checkpoint"), Artifact: v.Get("artifact")}, CorrectionID: v.Get("correction_id"), Source: src}
	pts, err := a.catalog.History(req.Context(), k.String(), res == "hour")
	if err != nil {
		a.unavailable(w, req, err)
		return
	}
	if len(pts) == 0 {
		writeError(w, http.StatusNotFound, "no history for this aggregate", false)
		return
	}
	n := HistoryPoints
	if res == "hour" {
		n = HourlyPoints
	}
	writeJSON(w, History{Aggregate: k.Aggregate(), Points: pts, MaxPoints: n, Resolution: res})
}

// SuitesPage is the answer of /v1/suites.
type SuitesPage struct {
	Items []string `json:"items"`
	Next  *string  `json:"next_cursor"`
}

func (a *api) suiteList(w http.ResponseWriter, req *http.Request) {
	v, after, limit, ok := a.beginPage(w, req, nil, nil)
	if !ok {
		return
	}
	if a.catalog == nil {
		writeError(w, http.StatusServiceUnavailable, "state unavailable", false)
		return
	}
	pg, err := a.catalog.Suites(req.Context(), v.Get("workspace"), after, limit)
	if err != nil {
		a.unavailable(w, req, err)
		return
	}
	if pg.Items == nil {
		pg.Items = []string{}
	}
	writeJSON(w, SuitesPage{Items: pg.Items, Next: cursor(pg.Next)})
}

const errUnknownSuite = "no suite of this name: no result for it was counted within the retention, or the name is misspelt"

// suiteSummary reads a suite for a request; ok is false when it already answered.
func (a *api) suiteSummary(w http.ResponseWriter, req *http.Request, v url.Values) (suite.Key, *suite.Summary, bool) {
	k := suite.Key{Workspace: v.Get("workspace"), Suite: v.Get("suite")}
	if a.suites == nil {
		writeError(w, http.StatusServiceUnavailable, "state unavailable", false)
		return k, nil, false
	}
	s, err := a.suites.Read(req.Context(), k, a.now())
	if err != nil {
		a.unavailable(w, req, err)
		return k, nil, false
	}
	if s == nil || s.Discrimination.VersionsSeen == 0 {
		writeError(w, http.StatusNotFound, errUnknownSuite, false)
		return k, nil, false
	}
	return k, s, true
}

func (a *api) discrimination(w http.ResponseWriter, req *http.Request) {
	v, ok := a.begin(w, req, []string{"suite"}, []string{"suite"})
	if !ok {
		return
	}
	k, s, ok := a.suiteSummary(w, req, v)
	if !ok {
		return
	}
	writeJSON(w, s.DiscriminationSnapshot(k, a.suites.Config(), a.now()))
}

// StabilityPage is the answer of /v1/suites/stability: versions in suite order.
type StabilityPage struct {
	Items []schemas.SuiteStability `json:"items"`
	Next  *string                  `json:"next_cursor"`
}

// versionOrder returns the suite's versions in its order (version_seq, then label).
func (a *api) caseTable(ctx context.Context, k suite.Key) (*suite.CaseTable, error) {
	return a.cases.get(ctx, k, a.suites.Cases)
}

func (a *api) stability(w http.ResponseWriter, req *http.Request) {
	v, after, limit, ok := a.beginPage(w, req, []string{"suite", "version"}, []string{"suite"})
	if !ok {
		return
	}
	k, s, ok := a.suiteSummary(w, req, v)
	if !ok {
		return
	}
	t, err := a.caseTable(req.Context(), k)
	if err != nil {
		a.unavailable(w, req, err)
		return
	}
	byLabel := map[string]*suite.VersionSummary{}
	for i := range s.Versions {
		byLabel[s.Versions[i].Version] = &s.Versions[i]
	}
	page := StabilityPage{Items: []schemas.SuiteStability{}}
	want := v.Get("version")
	started := after == ""
	for _, label := range t.Versions {
		if !started {
			started = label == after
			continue
		}
		vs := byLabel[label]
		if vs == nil || (want != "" && label != want) {
			continue
		}
		if len(page.Items) == limit {
			page.Next = cursor(page.Items[limit-1].Version)
			break
		}
		st := suite.StabilityOf(k, vs, a.suites.Config(), a.now())
		st.SnapshotVersion = s.SnapshotVersion
		page.Items = append(page.Items, st)
	}
	if want != "" && len(page.Items) == 0 {
		writeError(w, http.StatusNotFound, "no version of this label in the suite", false)
		return
	}
	writeJSON(w, page)
}

// Tiers suggested per case: discriminating and always-failing cases belong in the reporting
// run, always-passing ones in a nightly run, and cases too new to judge stay where they are.
const (
	TierReport    = "report"
	TierNightly   = "nightly"
	TierUnchanged = "unchanged"
)

func tierOf(class string) string {
	switch class {
	case suite.ClassDiscriminating, suite.ClassAlwaysFail:
		return TierReport
	case suite.ClassAlwaysPass:
		return TierNightly
	}
	return TierUnchanged
}

// CaseJSON is one case of /v1/suites/cases.
type CaseJSON struct {
	CaseID   string       `json:"case_id"`
	Class    string       `json:"class"`
	Tier     string       `json:"tier"`
	Latest   string       `json:"latest"`
	Outcomes []string     `json:"outcomes"`
	Revived  *RevivedJSON `json:"revived"`
}

// RevivedJSON is the flip of a revived case.
type RevivedJSON struct {
	Version string `json:"version"`
	From    string `json:"from"`
	To      string `json:"to"`
}

// CasesPage is the answer of /v1/suites/cases.
type CasesPage struct {
	Versions []string       `json:"versions"`
	Classes  map[string]int `json:"classes"`
	Tiers    map[string]int `json:"tiers"`
	Items    []CaseJSON     `json:"items"`
	Next     *string        `json:"next_cursor"`
}

func caseJSON(t *suite.CaseTable, r *suite.CaseRow) CaseJSON {
	c := CaseJSON{CaseID: r.Case, Class: r.Class, Tier: tierOf(r.Class), Outcomes: make([]string, len(r.Outcomes)), Latest: "none"}
	for i, o := range r.Outcomes {
		c.Outcomes[i] = o.String()
	}
	if n := len(r.Outcomes); n > 0 {
		c.Latest = r.Outcomes[n-1].String()
	}
	if r.Revived != "" {
		to := suite.OutcomePass
		if r.RevivedFrom == suite.OutcomePass {
			to = suite.OutcomeFail
		}
		c.Revived = &RevivedJSON{Version: r.Revived, From: r.RevivedFrom.String(), To: to.String()}
	}
	return c
}

func (a *api) casesPage(ctx context.Context, k suite.Key, class, tier, after string, limit int) (CasesPage, error) {
	t, err := a.caseTable(ctx, k)
	if err != nil {
		return CasesPage{}, err
	}
	p := CasesPage{Versions: t.Versions, Classes: map[string]int{}, Tiers: map[string]int{}, Items: []CaseJSON{}}
	if p.Versions == nil {
		p.Versions = []string{}
	}
	for i := range t.Cases {
		r := &t.Cases[i]
		p.Classes[r.Class]++
		p.Tiers[tierOf(r.Class)]++
		if r.Case <= after && after != "" || (class != "" && r.Class != class) || (tier != "" && tierOf(r.Class) != tier) {
			continue
		}
		if len(p.Items) == limit {
			if p.Next == nil {
				p.Next = cursor(p.Items[limit-1].CaseID)
			}
			continue
		}
		p.Items = append(p.Items, caseJSON(t, r))
	}
	return p, nil
}

func (a *api) suiteCases(w http.ResponseWriter, req *http.Request) {
	v, after, limit, ok := a.beginPage(w, req, []string{"suite", "class", "tier"}, []string{"suite"})
	if !ok {
		return
	}
	k, _, ok := a.suiteSummary(w, req, v)
	if !ok {
		return
	}
	p, err := a.casesPage(req.Context(), k, v.Get("class"), v.Get("tier"), after, limit)
	if err != nil {
		a.unavailable(w, req, err)
		return
	}
	writeJSON(w, p)
}

// MovedCase is a case whose outcome differs between two versions.
type MovedCase struct {
	CaseID    string `json:"case_id"`
	From      string `json:"from"`
	To        string `json:"to"`
	Direction string `json:"direction"` // "fixed" (fail → pass) or "regressed" (pass → fail)
	// Effect is the case's share of the change in pass rate over the cases judged in both
	// versions: +1/n for a fix, −1/n for a regression.
	Effect float64 `json:"effect"`
}

// Moved is the answer of /v1/suites/moved: which cases flipped between from and to.
type Moved struct {
	Workspace string `json:"workspace"`
	Suite     string `json:"suite"`
	From      string `json:"from"`
	To        string `json:"to"`
	// Pass rates over the cases with an outcome in each version; null with none.
	PassRateFrom *float64 `json:"pass_rate_from"`
	PassRateTo   *float64 `json:"pass_rate_to"`
	// Over the cases with an outcome in both versions: how many, their pass rates, and the flips.
	Common         int         `json:"common"`
	CommonRateFrom *float64    `json:"common_pass_rate_from"`
	CommonRateTo   *float64    `json:"common_pass_rate_to"`
	Fixed          int         `json:"fixed"`
	Regressed      int         `json:"regressed"`
	OnlyFrom       int         `json:"only_from"`
	OnlyTo         int         `json:"only_to"`
	Items          []MovedCase `json:"items"`
	Next           *string     `json:"next_cursor"`
}

func rate(pass, n int) *float64 {
	if n == 0 {
		return nil
	}
	r := float64(pass) / float64(n)
	return &r
}

// movedBetween compares two versions of a case table; ok is false when either is unknown.
func movedBetween(t *suite.CaseTable, from, to, after string, limit int) (Moved, bool) {
	fi, ti := slices.Index(t.Versions, from), slices.Index(t.Versions, to)
	m := Moved{From: from, To: to, Items: []MovedCase{}}
	if fi < 0 || ti < 0 {
		return m, false
	}
	var nf, pf, nt, pt, cpf, cpt int
	var flips []MovedCase
	for i := range t.Cases {
		a, b := t.Cases[i].Outcomes[fi], t.Cases[i].Outcomes[ti]
		if a != suite.OutcomeNone {
			nf++
			pf += b2int(a == suite.OutcomePass)
		}
		if b != suite.OutcomeNone {
			nt++
			pt += b2int(b == suite.OutcomePass)
		}
		switch {
		case a != suite.OutcomeNone && b != suite.OutcomeNone:
			m.Common++
			cpf += b2int(a == suite.OutcomePass)
			cpt += b2int(b == suite.OutcomePass)
			if a != b {
				mc := MovedCase{CaseID: t.Cases[i].Case, From: a.String(), To: b.String(), Direction: "fixed"}
				if a == suite.OutcomePass {
					mc.Direction = "regressed"
					m.Regressed++
				} else {
					m.Fixed++
				}
				flips = append(flips, mc)
			}
		case a != suite.OutcomeNone:
			m.OnlyFrom++
		case b != suite.OutcomeNone:
			m.OnlyTo++
		}
	}
	m.PassRateFrom, m.PassRateTo = rate(pf, nf), rate(pt, nt)
	m.CommonRateFrom, m.CommonRateTo = rate(cpf, m.Common), rate(cpt, m.Common)
	for _, f := range flips {
		if after != "" && f.CaseID <= after {
			continue
		}
		if len(m.Items) == limit {
			m.Next = cursor(m.Items[limit-1].CaseID)
			break
		}
		f.Effect = 1 / float64(m.Common)
		if f.Direction == "regressed" {
			f.Effect = -f.Effect
		}
		m.Items = append(m.Items, f)
	}
	return m, true
}

func b2int(b bool) int {
	if b {
		return 1
	}
	return 0
}

func (a *api) moved(w http.ResponseWriter, req *http.Request) {
	v, after, limit, ok := a.beginPage(w, req, []string{"suite", "from", "to"}, []string{"suite", "from", "to"})
	if !ok {
		return
	}
	k, _, ok := a.suiteSummary(w, req, v)
	if !ok {
		return
	}
	t, err := a.caseTable(req.Context(), k)
	if err != nil {
		a.unavailable(w, req, err)
		return
	}
	m, ok := movedBetween(t, v.Get("from"), v.Get("to"), after, limit)
	if !ok {
		writeError(w, http.StatusNotFound, "from or to is not a version of the suite", false)
		return
	}
	m.Workspace, m.Suite = k.Workspace, k.Suite
	writeJSON(w, m)
}

// caseCache keeps each suite's case table for ttl, so that paging through a large suite and
// rendering its page read Redis once; at most maxCachedSuites suites are kept.
type caseCache struct {
	ttl time.Duration
	mu  sync.Mutex
	m   map[suite.Key]cachedCases
}

type cachedCases struct {
	t  *suite.CaseTable
	at time.Time
}

const maxCachedSuites = 64

func newCaseCache(ttl time.Duration) *caseCache {
	return &caseCache{ttl: ttl, m: map[suite.Key]cachedCases{}}
}

func (c *caseCache) get(ctx context.Context, k suite.Key, read func(context.Context, suite.Key) (*suite.CaseTable, error)) (*suite.CaseTable, error) {
	c.mu.Lock()
	e, ok := c.m[k]
	c.mu.Unlock()
	if ok && time.Since(e.at) < c.ttl {
		return e.t, nil
	}
	t, err := read(ctx, k)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if len(c.m) >= maxCachedSuites {
		for old := range c.m {
			delete(c.m, old)
			break
		}
	}
	c.m[k] = cachedCases{t, time.Now()}
	c.mu.Unlock()
	return t, nil
}
