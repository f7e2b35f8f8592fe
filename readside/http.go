package readside

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"math"
	"net"
	"net/http"
	"net/http/pprof"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/aggregator/suite"
	"github.com/repeatrate/repeatrate/internal/auth"
	"github.com/repeatrate/repeatrate/internal/quota"
	"github.com/repeatrate/repeatrate/schemas"
)

// TallyReader reads the current state of one aggregate; aggregator.Redis is one.
type TallyReader interface {
	Tally(ctx context.Context, k aggregator.Key, at time.Time) (aggregator.Tally, error)
}

// SuiteReader reads suites; suite.Redis is one.
type SuiteReader interface {
	Read(ctx context.Context, k suite.Key, at time.Time) (*suite.Summary, error)
	Cases(ctx context.Context, k suite.Key) (*suite.CaseTable, error)
	Config() suite.Config
}

// HTTPConfig configures the HTTP server (README, Read side). The zero value serves health and
// readiness only to everyone, and every read to nobody: tokens must be configured.
type HTTPConfig struct {
	Addr string
	// ProbeAddr, when set, serves /healthz and /readyz also on a listener of their own, outside
	// the connection caps of Addr: a client holding every connection slot of the API (the caps
	// count connections before any request authenticates) cannot take the probes down, nor have
	// the liveness probe restart the processor with them.
	ProbeAddr string
	// Ready reports whether the processor can serve; nil means always ready.
	Ready func(ctx context.Context) error
	// Degraded names the parts that are retrying while the processor still serves and consumes
	// (alerting's Kafka subscription, say): /readyz stays ready and lists them, one line each.
	// The names are answered to anyone, so they never carry an address or a secret.
	Degraded func() []string
	// Pprof serves Go's profiler under /debug/pprof/. Off by default: it exposes internals.
	Pprof bool
	// Tokens are the bearer tokens of the read API and pages; nil accepts none.
	Tokens *auth.Store
	// PublicBadges lists workspaces whose badge anyone may read without a token.
	PublicBadges []string
	// Metrics serves /metrics; AdminTokenSHA256, when set, is the hex SHA-256 of the bearer token
	// that /metrics and /debug/pprof/ then require (workspace tokens are not enough).
	Metrics          bool
	AdminTokenSHA256 string
	// RateLimit is the requests per second each token (or, without one, each client address)
	// may make, with bursts of RateBurst; defaults 20 and 40.
	RateLimit float64
	RateBurst int
	// ReadBudget is the Redis commands per second the reads of each token (or, without one, each
	// client address) may send, in bursts of ReadBurst; defaults 200 and 2000. A read is charged
	// the commands it sends as it sends them (ReadCost, a hook on the Redis client), so a page of
	// 200 outcomes costs about 100 times a snapshot; a token whose budget is spent is answered 429
	// until it is paid off. MaxReadsInFlight caps the reads one token runs at once (default 4;
	// live streams and the ingest aside, which have limits of their own).
	ReadBudget       float64
	ReadBurst        int
	MaxReadsInFlight int
	// EarlyRetryHold is the longest a refusal (429) is held back when its token (or client
	// address) was refused before and sends again within the Retry-After it was given (default
	// 2 s; negative holds none): a client that ignores Retry-After is paced, not refused as fast
	// as it sends. Requests the limits admit are never held.
	EarlyRetryHold time.Duration
	// MaxConns caps open connections (default 256), MaxConnsPerIP those of one client address
	// (default 32), MaxStreams open event streams (default 64; 8 per token).
	MaxConns, MaxConnsPerIP, MaxStreams int
	// Registerer takes the server's metrics; nil keeps them private.
	Registerer prometheus.Registerer
	// Catalog lists aggregates and suites and holds history and the live feed; nil serves no
	// listing, history or stream (503).
	Catalog *Catalog
	// Suites reads suites; nil answers suite routes 503.
	Suites SuiteReader
	// Alerts lists a workspace's current alerts (alert.Redis is one); nil answers /v1/alerts 503.
	Alerts AlertLister
	// Ingest serves POST /v1/events (package ingest), with bodies up to IngestMaxBodyBytes (other
	// routes keep their 4 KiB); nil answers that route 404.
	Ingest             http.Handler
	IngestMaxBodyBytes int64
	// OTLPLogs serves POST /v1/logs, OTLP/HTTP logs mapped to events (ingest.Handler.ServeOTLP),
	// with the ingest's body limit; nil answers that route 404.
	OTLPLogs http.Handler
}

// IngestPath is the route of the HTTP ingest (README, Ingest over HTTP).
const IngestPath = "/v1/events"

// OTLPLogsPath is the route of OTLP/HTTP logs (docs/feeding.md#opentelemetry): the path every
// OTLP exporter appends to its endpoint.
const OTLPLogsPath = "/v1/logs"

// isIngest reports whether path writes events: the ingest's routes take its body limit and
// spend no read budget.
func isIngest(path string) bool { return path == IngestPath || path == OTLPLogsPath }

func (c *HTTPConfig) defaults() {
	if c.RateLimit <= 0 {
		c.RateLimit = 20
	}
	if c.RateBurst <= 0 {
		c.RateBurst = 2 * int(c.RateLimit)
	}
	if c.ReadBudget <= 0 {
		c.ReadBudget = 200
	}
	if c.ReadBurst <= 0 {
		c.ReadBurst = 10 * int(c.ReadBudget)
	}
	if c.MaxReadsInFlight <= 0 {
		c.MaxReadsInFlight = 4
	}
	if c.EarlyRetryHold == 0 {
		c.EarlyRetryHold = 2 * time.Second
	}
	if c.MaxConns <= 0 {
		c.MaxConns = 256
	}
	if c.MaxConnsPerIP <= 0 {
		c.MaxConnsPerIP = 32
	}
	if c.MaxStreams <= 0 {
		c.MaxStreams = 64
	}
	if c.IngestMaxBodyBytes <= 0 {
		c.IngestMaxBodyBytes = 1 << 20
	}
}

// HTTP serves /healthz, /readyz, /metrics, the read API, the badge, live streams and pages.
type HTTP struct {
	srv     *http.Server
	log     *zap.Logger
	cfg     HTTPConfig
	metrics *httpMetrics
	hub     *hub
	conns   atomic.Pointer[capListener] // the listener Serve caps, for tests
	probes  *http.Server                // /healthz and /readyz on ProbeAddr
}

// Limits of a request: its query, its body (only the login form has one) and its headers.
const (
	maxQueryBytes  = 8 << 10
	maxBodyBytes   = 4 << 10
	maxHeaderBytes = 16 << 10
)

// NewHTTP returns a server on cfg.Addr reading state through r and metrics from g.
func NewHTTP(cfg HTTPConfig, r TallyReader, g prometheus.Gatherer, now func() time.Time, log *zap.Logger) *HTTP {
	cfg.defaults()
	reg := cfg.Registerer
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m := newHTTPMetrics(reg)
	h := &HTTP{log: log, cfg: cfg, metrics: m}
	if cfg.Catalog != nil {
		h.hub = newHub(cfg.Catalog, m, log)
	}
	a := &api{r: r, now: now, log: log, cfg: &h.cfg, suites: cfg.Suites, catalog: cfg.Catalog, hub: h.hub,
		metrics: m, cases: newCaseCache(5 * time.Second)}
	public := map[string]bool{}
	for _, ws := range cfg.PublicBadges {
		public[ws] = true
	}
	a.publicBadge = public
	mux := http.NewServeMux()
	probes := http.NewServeMux()
	healthz := func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") }
	readyz := func(w http.ResponseWriter, req *http.Request) {
		if cfg.Ready != nil {
			if err := cfg.Ready(req.Context()); err != nil {
				// The reason is logged, never answered: it names addresses.
				log.Info("not ready", zap.Error(err))
				writeError(w, http.StatusServiceUnavailable, "not ready", false)
				return
			}
		}
		fmt.Fprintln(w, "ready")
		if cfg.Degraded != nil {
			for _, d := range cfg.Degraded() {
				fmt.Fprintln(w, "degraded:", d)
			}
		}
	}
	for _, m := range []*http.ServeMux{mux, probes} {
		m.HandleFunc("GET /healthz", healthz)
		m.HandleFunc("GET /readyz", readyz)
	}
	h.probes = &http.Server{Addr: cfg.ProbeAddr, Handler: probes, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 10 * time.Second, IdleTimeout: 30 * time.Second, MaxHeaderBytes: maxHeaderBytes,
		ErrorLog: zap.NewStdLog(log.Named("probes"))}
	admin := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if cfg.AdminTokenSHA256 != "" && !auth.MatchHash(auth.Bearer(req), cfg.AdminTokenSHA256) {
				w.Header().Set("WWW-Authenticate", `Bearer realm="repeatrate-admin"`)
				writeError(w, http.StatusUnauthorized, "this endpoint needs the admin token", false)
				return
			}
			next.ServeHTTP(w, req)
		})
	}
	if cfg.Metrics {
		mux.Handle("GET /metrics", admin(promhttp.HandlerFor(g, promhttp.HandlerOpts{})))
	}
	a.routes(mux)
	// The routes that write events; any other method gets a JSON error like every answer of the
	// API, not the mux's plain text.
	for _, r := range []struct {
		path, what, doc string
		h               http.Handler
	}{
		{IngestPath, "events", "README, Ingest over HTTP", cfg.Ingest},
		{OTLPLogsPath, "OTLP logs", "docs/feeding.md#opentelemetry", cfg.OTLPLogs},
	} {
		mux.HandleFunc(r.path, func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Allow", http.MethodPost)
			writeError(w, http.StatusMethodNotAllowed, r.what+" are sent with POST ("+r.doc+")", false)
		})
		mux.HandleFunc("POST "+r.path, func(w http.ResponseWriter, req *http.Request) {
			if r.h == nil {
				writeError(w, http.StatusNotFound, "ingest of "+r.what+" is not enabled on this server", false)
				return
			}
			r.h.ServeHTTP(w, req)
		})
	}
	if cfg.Pprof {
		mux.Handle("/debug/pprof/", admin(http.HandlerFunc(pprof.Index)))
		mux.Handle("/debug/pprof/profile", admin(http.HandlerFunc(pprof.Profile)))
		mux.Handle("/debug/pprof/symbol", admin(http.HandlerFunc(pprof.Symbol)))
		mux.Handle("/debug/pprof/trace", admin(http.HandlerFunc(pprof.Trace)))
	}
	lim := newLimiter(cfg.RateLimit, cfg.RateBurst, time.Now)
	budget := quota.New(cfg.ReadBudget, float64(cfg.ReadBurst), maxLimiterKeys, time.Now)
	running := &inFlight{max: cfg.MaxReadsInFlight, runs: map[string]int{}}
	early := newEarlyRetries(cfg.EarlyRetryHold, cfg.MaxConnsPerIP, time.Now, m.held.Inc)
	limited := http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("X-Frame-Options", "DENY")
		w.Header().Set("Referrer-Policy", "no-referrer")
		// The badge answers every error as a badge: its reader is an <img>.
		badge := strings.HasSuffix(req.URL.Path, ".svg")
		if len(req.URL.RawQuery) > maxQueryBytes {
			writeError(w, http.StatusRequestURITooLong, fmt.Sprintf("query is longer than %d bytes", maxQueryBytes), badge)
			return
		}
		bodyLimit := int64(maxBodyBytes)
		if isIngest(req.URL.Path) && cfg.Ingest != nil {
			bodyLimit = cfg.IngestMaxBodyBytes
		}
		if req.ContentLength > bodyLimit {
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("body is longer than %d bytes", bodyLimit), badge)
			return
		}
		req.Body = http.MaxBytesReader(w, req.Body, bodyLimit)
		if req.URL.Path != "/healthz" && req.URL.Path != "/readyz" {
			key := "addr " + clientIP(req)
			if p := a.principal(req); p != nil {
				key = "token " + p.Name
			}
			sw := &statusWriter{ResponseWriter: w, key: key, limit: "route", early: early}
			if isIngest(req.URL.Path) {
				sw.limit = "ingest"
			}
			w = sw
			if ok, wait := lim.allow(key); !ok {
				sw.limit = "rate"
				m.limited.Inc()
				w.Header().Set("Retry-After", strconv.Itoa(int(wait/time.Second)+1))
				writeError(w, http.StatusTooManyRequests, "rate limit exceeded", badge)
				return
			}
			if !isIngest(req.URL.Path) {
				if ok, wait := budget.Admit(key); !ok {
					sw.limit = "budget"
					m.readRefused.WithLabelValues("budget").Inc()
					w.Header().Set("Retry-After", strconv.Itoa(int(wait/time.Second)+1))
					writeError(w, http.StatusTooManyRequests, fmt.Sprintf(
						"read budget spent: reads may send %g Redis commands per second (bursts of %d), and this token's recent reads sent more; send again after Retry-After",
						cfg.ReadBudget, cfg.ReadBurst), badge)
					return
				}
				// A live stream runs for as long as its client reads: it holds a stream slot
				// (MaxStreams), not a read's. Without a token only a public badge reads Redis:
				// other such requests (the sign-in form's, whose body may trickle in for the read
				// timeout) hold no slot, so they cannot lock an address's readers out.
				if req.URL.Path != "/v1/stream" && (strings.HasPrefix(key, "token ") || badge) {
					if !running.enter(key) {
						sw.limit = "in_flight"
						m.readRefused.WithLabelValues("in_flight").Inc()
						w.Header().Set("Retry-After", "1")
						writeError(w, http.StatusTooManyRequests, fmt.Sprintf(
							"this token already runs %d reads at once; send again when one has been answered", cfg.MaxReadsInFlight), badge)
						return
					}
					defer running.leave(key)
				}
				req = req.WithContext(withReadMeter(req.Context(), &readMeter{budget: budget, key: key, sent: m.readCommands}))
			}
		}
		mux.ServeHTTP(w, req)
	})
	h.srv = &http.Server{
		Addr: cfg.Addr, Handler: limited,
		ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		// Streams extend their own write deadline per event.
		WriteTimeout: 30 * time.Second, IdleTimeout: 60 * time.Second, MaxHeaderBytes: maxHeaderBytes,
		ErrorLog: zap.NewStdLog(log.Named("server")),
	}
	return h
}

// Handler is the server's handler (tests).
func (h *HTTP) Handler() http.Handler { return h.srv.Handler }

// Run serves until ctx ends, then shuts down within five seconds; the probes too, on ProbeAddr.
func (h *HTTP) Run(ctx context.Context) error {
	l, err := net.Listen("tcp", h.srv.Addr)
	if err != nil {
		return fmt.Errorf("http %s: %w", h.srv.Addr, err)
	}
	if h.cfg.ProbeAddr == "" {
		return h.Serve(ctx, l)
	}
	pl, err := net.Listen("tcp", h.cfg.ProbeAddr)
	if err != nil {
		l.Close()
		return fmt.Errorf("http probes %s: %w", h.cfg.ProbeAddr, err)
	}
	return h.ServeWithProbes(ctx, l, pl)
}

// ServeWithProbes is Serve, with /healthz and /readyz served on probes as well, uncapped.
func (h *HTTP) ServeWithProbes(ctx context.Context, l, probes net.Listener) error {
	perr := make(chan error, 1)
	go func() { perr <- h.probes.Serve(probes) }()
	err := h.Serve(ctx, l)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	err = errors.Join(err, h.probes.Shutdown(sctx))
	if perr := <-perr; !errors.Is(perr, http.ErrServerClosed) {
		err = errors.Join(err, fmt.Errorf("http probes: %w", perr))
	}
	return err
}

// Serve serves on l (capped to the configured connections) until ctx ends.
func (h *HTTP) Serve(ctx context.Context, l net.Listener) error {
	cl := newCapListener(l, h.cfg.MaxConns, h.cfg.MaxConnsPerIP, h.metrics)
	h.srv.ConnState = cl.state
	h.conns.Store(cl)
	l = cl
	hctx, stopHub := context.WithCancel(ctx)
	defer stopHub()
	if h.hub != nil {
		go h.hub.run(hctx)
	}
	errc := make(chan error, 1)
	go func() { errc <- h.srv.Serve(l) }()
	select {
	case err := <-errc:
		return fmt.Errorf("http %s: %w", h.srv.Addr, err)
	case <-ctx.Done():
	}
	stopHub() // ends the streams, which Shutdown does not wait for
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := h.srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("http shutdown: %w", err)
	}
	<-errc
	return nil
}

type api struct {
	r           TallyReader
	now         func() time.Time
	log         *zap.Logger
	cfg         *HTTPConfig
	suites      SuiteReader
	catalog     *Catalog
	hub         *hub
	metrics     *httpMetrics
	cases       *caseCache
	publicBadge map[string]bool
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
	if !(badge && a.publicBadge[sc.Workspace]) && !a.allow(w, req, sc.Workspace, badge) {
		return nil, nil, false
	}
	live, eval, err = a.current(req.Context(), sc, corr)
	if err != nil {
		// The backend's error is logged, never shown: it may name addresses and keys.
		a.readFailed(req, err)
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
	http.StatusBadRequest:            "invalid query",
	http.StatusUnauthorized:          "token required",
	http.StatusForbidden:             "forbidden",
	http.StatusTooManyRequests:       "rate limited",
	http.StatusRequestURITooLong:     "query too long",
	http.StatusRequestEntityTooLarge: "body too large",
	http.StatusNotFound:              "unknown scope",
	http.StatusServiceUnavailable:    "unavailable",
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
	text, fill := b.Value, b.Colour.Hex()
	title := badgeR
	if chosen := map[string]schemas.Window{"live": lw, "evaluation": ew}[b.Source]; b.Measured && chosen.CI95 != nil {
		title += fmt.Sprintf("; %s all time %d of %d scored, 95%% interval %.1f%%–%.1f%%", b.Source, chosen.ConfirmedRepeats,
			chosen.Scored, chosen.CI95.Low*100, chosen.CI95.High*100)
		if chosen.Scored < fewScored {
			// Thin evidence looks thin, as on the pages: a pale fill and the word.
			text, fill = text+" · few scored", paleHex(fill)
		}
	}
	w.Header().Set("Content-Type", "image/svg+xml")
	w.Header().Set("Cache-Control", "no-cache")
	fmt.Fprint(w, badgeSVG("R", text, fill, title))
}

// badgeR is what the badge's title says R is.
const badgeR = "R: the repeat rate, confirmed repeats of a corrected mistake ÷ scored opportunities (lower is better)"

// paleHex mixes a "#rgb" or "#rrggbb" fill half with white.
func paleHex(hex string) string {
	r, g, b := rgbOf(hex)
	return fmt.Sprintf("#%02x%02x%02x", (r+255)/2, (g+255)/2, (b+255)/2)
}

// rgbOf parses "#rgb" or "#rrggbb"; anything else is grey.
func rgbOf(hex string) (r, g, b int) {
	h := strings.TrimPrefix(hex, "#")
	if len(h) == 3 {
		h = string([]byte{h[0], h[0], h[1], h[1], h[2], h[2]})
	}
	if _, err := fmt.Sscanf(h, "%02x%02x%02x", &r, &g, &b); err != nil || len(h) != 6 {
		return 0x9f, 0x9f, 0x9f
	}
	return r, g, b
}

// luminance is a colour's relative luminance (WCAG 2).
func luminance(r, g, b int) float64 {
	lin := func(c int) float64 {
		v := float64(c) / 255
		if v <= 0.03928 {
			return v / 12.92
		}
		return math.Pow((v+0.055)/1.055, 2.4)
	}
	return 0.2126*lin(r) + 0.7152*lin(g) + 0.0722*lin(b)
}

// contrast is the WCAG contrast ratio of two fills.
func contrast(a, b string) float64 {
	la, lb := luminance(rgbOf(a)), luminance(rgbOf(b))
	return (max(la, lb) + 0.05) / (min(la, lb) + 0.05)
}

// textOn is the text colour with the higher contrast on fill, white or near-black: at least
// 4.5:1 (WCAG AA) on every badge fill.
func textOn(fill string) string {
	if contrast("#fff", fill) >= contrast("#111", fill) {
		return "#fff"
	}
	return "#111"
}

// verdana11 are the advance widths, in pixels, of the characters a badge writes in Verdana 11 px
// (others count as 7): the badge is as wide as its text, with no dead space after it.
var verdana11 = map[rune]float64{' ': 3.9, '.': 3.5, ',': 3.5, '%': 11.9, '(': 4.9, ')': 4.9, '/': 4.9, '·': 3.5, '–': 7,
	'a': 6.7, 'b': 6.9, 'c': 5.8, 'd': 6.9, 'e': 6.6, 'f': 3.9, 'g': 6.9, 'h': 7, 'i': 3, 'j': 3.8, 'k': 6.5, 'l': 3, 'm': 10.7,
	'n': 7, 'o': 6.7, 'p': 6.9, 'q': 6.9, 'r': 4.7, 's': 5.7, 't': 4.3, 'u': 7, 'v': 6.5, 'w': 9, 'x': 6.5, 'y': 6.5, 'z': 5.8,
	'R': 7.6, 'I': 4.6, 'M': 8.6, 'W': 11}

func textWidth(s string) float64 {
	w := 0.0
	for _, r := range s {
		if v, ok := verdana11[r]; ok {
			w += v
		} else {
			w += 7
		}
	}
	return w
}

// greyHex is the fill of a badge that shows no rate.
var greyHex = aggregator.LightGrey.Hex()

// badgeSVG draws a two-part flat badge with the value's part filled with colour (a hex fill) and,
// when title is not empty, a title a viewer shows on hover; text is escaped. Each part is as wide
// as its text (textLength holds the text to the width it was measured at), and the value's text
// is white or near-black, whichever contrasts more with its fill (at least 4.5:1).
func badgeSVG(label, value, colour, title string) string {
	lt, vt := textWidth(label), textWidth(value)
	lw, vw := 10+lt, 10+vt
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="20" role="img" aria-label="%s: %s">`,
		math.Ceil(lw+vw), html.EscapeString(label), html.EscapeString(value))
	if title != "" {
		fmt.Fprintf(&b, `<title>%s</title>`, html.EscapeString(title))
	}
	fmt.Fprintf(&b, `<rect width="%.1f" height="20" fill="#555"/><rect x="%.1f" width="%.1f" height="20" fill="%s"/>`, lw, lw, math.Ceil(lw+vw)-lw, colour)
	fmt.Fprintf(&b, `<g font-family="Verdana,DejaVu Sans,sans-serif" font-size="11">`)
	fmt.Fprintf(&b, `<text x="5" y="14" fill="#fff" textLength="%.1f" lengthAdjust="spacingAndGlyphs">%s</text>`, lt, html.EscapeString(label))
	fmt.Fprintf(&b, `<text x="%.1f" y="14" fill="%s" textLength="%.1f" lengthAdjust="spacingAndGlyphs">%s</text></g></svg>`,
		lw+5, textOn(colour), vt, html.EscapeString(value))
	return b.String()
}
