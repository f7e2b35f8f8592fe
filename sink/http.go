package sink

import (
	"context"
	"encoding/json"
	"fmt"
	"html"
	"net/http"
	"net/http/pprof"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/schemas"
)

// TallyReader reads the current state of one aggregate; aggregator.Redis is one.
type TallyReader interface {
	Tally(ctx context.Context, k aggregator.Key, at time.Time) (aggregator.Tally, error)
}

// HTTPConfig configures the HTTP server.
type HTTPConfig struct {
	Addr string
	// Ready reports whether the processor can serve; nil means always ready.
	Ready func(ctx context.Context) error
	// Pprof serves Go's profiler under /debug/pprof/. Off by default: it exposes internals.
	Pprof bool
}

// HTTP serves /healthz, /readyz, /metrics, the snapshot read API and the R badge.
type HTTP struct {
	srv *http.Server
	log *zap.Logger
}

// maxQueryBytes bounds a request's query: six scope parts are far below it.
const maxQueryBytes = 8 << 10

// NewHTTP returns a server on cfg.Addr reading state through r and metrics from g.
func NewHTTP(cfg HTTPConfig, r TallyReader, g prometheus.Gatherer, now func() time.Time, log *zap.Logger) *HTTP {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, req *http.Request) {
		if cfg.Ready != nil {
			if err := cfg.Ready(req.Context()); err != nil {
				log.Info("not ready", zap.Error(err))
				writeError(w, http.StatusServiceUnavailable, "not ready", false)
				return
			}
		}
		fmt.Fprintln(w, "ready")
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	api := &api{r: r, now: now, log: log}
	mux.HandleFunc("GET /v1/snapshots", api.snapshots)
	mux.HandleFunc("GET /v1/badge.svg", api.badge)
	if cfg.Pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	limited := http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if len(req.URL.RawQuery) > maxQueryBytes {
			writeError(w, http.StatusRequestURITooLong, fmt.Sprintf("query is longer than %d bytes", maxQueryBytes), false)
			return
		}
		mux.ServeHTTP(w, req)
	})
	return &HTTP{
		srv: &http.Server{
			Addr: cfg.Addr, Handler: limited,
			ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
			WriteTimeout: 30 * time.Second, MaxHeaderBytes: 16 << 10,
		},
		log: log,
	}
}

// Run serves until ctx ends, then shuts down within five seconds.
func (h *HTTP) Run(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- h.srv.ListenAndServe() }()
	select {
	case err := <-errc:
		return fmt.Errorf("http %s: %w", h.srv.Addr, err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := h.srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("http shutdown: %w", err)
	}
	<-errc
	return nil
}

type api struct {
	r   TallyReader
	now func() time.Time
	log *zap.Logger
}

// scopeParams are the query parameters naming a scope and correction, in the order errors name them.
var scopeParams = [...]string{"workspace", "model", "run", "checkpoint", "artifact", "correction_id"}

// scopeQuery reads scope and correction from the raw query; all six are required, each once. It
// parses the query itself because url.ParseQuery drops a pair with a malformed escape, which then
// reads as missing. Its error names every offending parameter, in scopeParams order: malformed
// escapes, parameters given more than once, then the missing ones. Other parameters are ignored
// (a cache-busting one on a badge URL, for example) unless they cannot be parsed at all.
func scopeQuery(raw string) (schemas.Scope, string, error) {
	var vals [len(scopeParams)]string
	var seen [len(scopeParams)]int
	var badEscape [len(scopeParams)]bool
	badName := false
	for raw != "" {
		var pair string
		pair, raw, _ = strings.Cut(raw, "&")
		if pair == "" {
			continue
		}
		key, value, _ := strings.Cut(pair, "=")
		name, err := url.QueryUnescape(key)
		if err != nil || strings.Contains(key, ";") {
			badName = true
			continue
		}
		i := slices.Index(scopeParams[:], name)
		if i < 0 {
			continue
		}
		seen[i]++
		if vals[i], err = url.QueryUnescape(value); err != nil {
			badEscape[i] = true
		}
	}
	var problems, escapes, twice, missing []string
	if badName {
		problems = append(problems, "a parameter name is malformed (a bad percent-escape, or ; for &)")
	}
	for i, name := range scopeParams {
		switch {
		case badEscape[i]:
			escapes = append(escapes, name)
		case seen[i] > 1:
			twice = append(twice, name)
		case vals[i] == "":
			missing = append(missing, name)
		}
	}
	if len(escapes) > 0 {
		problems = append(problems, plural(escapes, "has a malformed percent-escape (% must be followed by two hex digits)",
			"have a malformed percent-escape (% must be followed by two hex digits)"))
	}
	if len(twice) > 0 {
		problems = append(problems, plural(twice, "is given more than once", "are given more than once"))
	}
	if len(missing) > 0 {
		problems = append(problems, plural(missing, "is missing or empty", "are missing or empty"))
	}
	if len(problems) > 0 {
		return schemas.Scope{}, "", fmt.Errorf("%s; all of %s are required, each once", strings.Join(problems, "; "),
			strings.Join(scopeParams[:], ", "))
	}
	sc := schemas.Scope{Workspace: vals[0], Model: vals[1], Run: vals[2], Checkpoint: vals[3], Artifact: vals[4]}
	return sc, vals[5], nil
}

// plural names the query parameters names with the verb phrase for one or for several.
func plural(names []string, one, several string) string {
	if len(names) == 1 {
		return "query parameter " + names[0] + " " + one
	}
	return "query parameters " + strings.Join(names, ", ") + " " + several
}

// current reads both sources' snapshots; a source never seen is nil.
func (a *api) current(ctx context.Context, sc schemas.Scope, corr string) (live, eval *schemas.Snapshot, err error) {
	at := a.now()
	read := func(src aggregator.Source) (*schemas.Snapshot, error) {
		k := aggregator.Key{Scope: sc, CorrectionID: corr, Source: src}
		t, err := a.r.Tally(ctx, k, at)
		if err != nil || t.Version == 0 {
			return nil, err
		}
		s := t.Snapshot(k, at)
		return &s, nil
	}
	if live, err = read(aggregator.Live); err != nil {
		return nil, nil, err
	}
	eval, err = read(aggregator.Evaluation)
	return live, eval, err
}

// errUnknownScope answers a scope and correction for which Redis holds no aggregate of either
// source: no event for it counted within the retention (or a misspelt part).
const errUnknownScope = "no aggregate for this scope and correction: no event for it was counted within the retention, or a part is misspelt"

// read answers a request's scope with both sources' snapshots; ok is false when it already
// answered with an error. A scope is known when Redis holds either source's aggregate (its state
// exists: some event for it was counted and the aggregate has not gone idle for the retention); an
// unknown one answers 404, while a known one with nothing scored answers its not_measured windows.
func (a *api) read(w http.ResponseWriter, req *http.Request, badge bool) (live, eval *schemas.Snapshot, ok bool) {
	sc, corr, err := scopeQuery(req.URL.RawQuery)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error(), badge)
		return nil, nil, false
	}
	live, eval, err = a.current(req.Context(), sc, corr)
	if err != nil {
		// The backend's error is logged, never shown: it may name addresses and keys.
		a.log.Warn("read state", zap.String("path", req.URL.Path), zap.Error(err))
		writeError(w, http.StatusServiceUnavailable, "state unavailable", badge)
		return nil, nil, false
	}
	if live == nil && eval == nil {
		writeError(w, http.StatusNotFound, errUnknownScope, badge)
		return nil, nil, false
	}
	return live, eval, true
}

// badgeErrors are the short texts of an error badge by status; the full message is its title.
var badgeErrors = map[int]string{
	http.StatusBadRequest:         "invalid query",
	http.StatusNotFound:           "unknown scope",
	http.StatusServiceUnavailable: "unavailable",
}

// writeError is the one error writer of the API: a JSON object {"error": msg} with the status or,
// for the badge endpoint (whose reader is an <img>), a grey badge with a short text and msg as
// its title, with the same status. msg is written by this package (a query complaint, or a fixed
// phrase for a backend failure); callers log a backend's own error and never pass it here.
func writeError(w http.ResponseWriter, status int, msg string, badge bool) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if badge {
		text, ok := badgeErrors[status]
		if !ok {
			text = "error"
		}
		w.Header().Set("Content-Type", "image/svg+xml")
		w.Header().Set("Cache-Control", "no-cache")
		w.WriteHeader(status)
		fmt.Fprint(w, badgeSVG("R", text, greyHex, msg))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(struct {
		Error string `json:"error"`
	}{msg})
}

func (a *api) snapshots(w http.ResponseWriter, req *http.Request) {
	live, eval, ok := a.read(w, req, false)
	if !ok {
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(struct {
		Live       *schemas.Snapshot `json:"live"`
		Evaluation *schemas.Snapshot `json:"evaluation"`
	}{live, eval})
}

func (a *api) badge(w http.ResponseWriter, req *http.Request) {
	live, eval, ok := a.read(w, req, true)
	if !ok {
		return
	}
	var lw, ew schemas.Window
	if live != nil {
		lw = live.Windows.All
	}
	if eval != nil {
		ew = eval.Windows.All
	}
	b := aggregator.ChooseBadge(lw, ew)
	w.Header().Set("Content-Type", "image/svg+xml")
	w.Header().Set("Cache-Control", "no-cache")
	fmt.Fprint(w, badgeSVG("R", b.Value, b.Colour.Hex(), ""))
}

// greyHex is the fill of a badge that shows no rate.
var greyHex = aggregator.LightGrey.Hex()

// badgeSVG draws a two-part flat badge with the value's part filled with colour (a hex fill) and,
// when title is not empty, a title a viewer shows on hover; text is escaped.
func badgeSVG(label, value, colour, title string) string {
	const charW = 7
	lw, vw := 10+charW*len(label), 10+charW*len([]rune(value))
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="20" role="img" aria-label="%s: %s">`,
		lw+vw, html.EscapeString(label), html.EscapeString(value))
	if title != "" {
		fmt.Fprintf(&b, `<title>%s</title>`, html.EscapeString(title))
	}
	fmt.Fprintf(&b, `<rect width="%d" height="20" fill="#555"/><rect x="%d" width="%d" height="20" fill="%s"/>`, lw, lw, vw, colour)
	fmt.Fprintf(&b, `<g fill="#fff" font-family="Verdana,DejaVu Sans,sans-serif" font-size="11">`)
	fmt.Fprintf(&b, `<text x="5" y="14">%s</text><text x="%d" y="14">%s</text></g></svg>`,
		html.EscapeString(label), lw+5, html.EscapeString(value))
	return b.String()
}
