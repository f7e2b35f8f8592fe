package sink

import (
	"context"
	"encoding/json"
	"fmt"
	"html"
	"net/http"
	"net/http/pprof"
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
				http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
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
			http.Error(w, "query too long", http.StatusRequestURITooLong)
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

// scopeQuery reads scope and correction from the query; all six are required.
func scopeQuery(req *http.Request) (schemas.Scope, string, error) {
	q := req.URL.Query()
	sc := schemas.Scope{Workspace: q.Get("workspace"), Model: q.Get("model"), Run: q.Get("run"),
		Checkpoint: q.Get("checkpoint"), Artifact: q.Get("artifact")}
	corr := q.Get("correction_id")
	for name, v := range map[string]string{"workspace": sc.Workspace, "model": sc.Model, "run": sc.Run,
		"checkpoint": sc.Checkpoint, "artifact": sc.Artifact, "correction_id": corr} {
		if v == "" {
			return schemas.Scope{}, "", fmt.Errorf("query parameter %s is required", name)
		}
	}
	return sc, corr, nil
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

// read answers a request's scope with both sources' snapshots; ok is false when it already
// answered with an error.
func (a *api) read(w http.ResponseWriter, req *http.Request) (live, eval *schemas.Snapshot, ok bool) {
	sc, corr, err := scopeQuery(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return nil, nil, false
	}
	live, eval, err = a.current(req.Context(), sc, corr)
	if err != nil {
		a.log.Warn("read state", zap.String("path", req.URL.Path), zap.Error(err))
		http.Error(w, "state unavailable", http.StatusServiceUnavailable)
		return nil, nil, false
	}
	return live, eval, true
}

func (a *api) snapshots(w http.ResponseWriter, req *http.Request) {
	live, eval, ok := a.read(w, req)
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
	live, eval, ok := a.read(w, req)
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
	fmt.Fprint(w, badgeSVG("R", b.Value, b.Measured))
}

// badgeSVG draws a two-part flat badge; text is escaped.
func badgeSVG(label, value string, measured bool) string {
	const charW = 7
	lw, vw := 10+charW*len(label), 10+charW*len([]rune(value))
	colour := "#9f9f9f"
	if measured {
		colour = "#007ec6"
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="20" role="img" aria-label="%s: %s">`,
		lw+vw, html.EscapeString(label), html.EscapeString(value))
	fmt.Fprintf(&b, `<rect width="%d" height="20" fill="#555"/><rect x="%d" width="%d" height="20" fill="%s"/>`, lw, lw, vw, colour)
	fmt.Fprintf(&b, `<g fill="#fff" font-family="Verdana,DejaVu Sans,sans-serif" font-size="11">`)
	fmt.Fprintf(&b, `<text x="5" y="14">%s</text><text x="%d" y="14">%s</text></g></svg>`,
		html.EscapeString(label), lw+5, html.EscapeString(value))
	return b.String()
}
