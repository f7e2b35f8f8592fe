// Package ingest is repeatrate's HTTP input: POST /v1/events takes CloudEvents in the binary,
// structured and batch modes of the CloudEvents HTTP binding (read with the CloudEvents SDK's HTTP
// protocol binding), validates every event with the decoder of the Kafka path (cloudevent.Decoder,
// on the very Kafka message it would write), checks that the bearer token may write each event's
// workspace, and writes the request's events to the input topics, keyed by aggregate as `produce`
// keys them and acknowledged by all in-sync replicas, before it answers 202 with a result per
// event.
//
// A request is all or nothing: when any of its events is invalid or forbidden, none is written and
// the answer (400 or 403) gives every event's result, with the dead-letter reasons of
// docs/semantics.md#validation for the invalid ones. A Kafka write that fails or is not answered
// in time answers 503, each event "failed" only when Kafka certainly did not take it, else
// "unknown"; sending the request again is safe either way, because the processor counts each
// opportunity and graded run once (docs/semantics.md#ingest). The bytes of writes not yet finished
// (also those the answer stopped waiting for: the Kafka client keeps trying them) are bounded by
// MaxInFlightBytes; a request past it is answered 503 before anything is sent.
//
// It counts nothing and stores nothing itself: the processor reads what it wrote like any other
// producer's events. Rate limits, connection caps and the server's body cap are the HTTP server's
// (package readside), around this handler.
package ingest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/binding/format"
	"github.com/cloudevents/sdk-go/v2/binding/spec"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/repeatrate/repeatrate/internal/auth"
	"github.com/repeatrate/repeatrate/internal/quota"
	"github.com/repeatrate/repeatrate/schemas"
	"github.com/repeatrate/repeatrate/schemas/cloudevent"
	"github.com/repeatrate/repeatrate/sink"
)

// Writer writes messages, each naming its topic, and returns once all in-sync replicas have them;
// a *kafka.Writer without a topic of its own and with RequiredAcks RequireAll is one.
type Writer interface {
	WriteMessages(ctx context.Context, msgs ...kafka.Message) error
}

var _ Writer = (*kafka.Writer)(nil)

// RetainedCounter counts the opportunities a workspace's aggregates retain; readside.Catalog is one.
type RetainedCounter interface {
	Retained(ctx context.Context, ws string) (int64, error)
}

// Config configures the handler.
type Config struct {
	// LiveTopic receives live attempts, EvalTopic eval results; both must be input topics of the
	// processor.
	LiveTopic, EvalTopic string
	// Tokens are the bearer tokens; an event is written only with a token that holds write
	// permission in its scope's workspace.
	Tokens *auth.Store
	// MaxBodyBytes caps a request's body (default 1 MiB); a longer one is answered 413.
	MaxBodyBytes int64
	// RecordLimit is the largest message, as sink.RecordSize counts it, the writer can send (its
	// BatchBytes); a larger valid event is refused as too_large instead of failing every retry.
	// Zero means no limit beyond the decoder's.
	RecordLimit int64
	// MaxEvents caps a batch's members (default MaxBodyBytes/MinEventBytes: more than any body of
	// valid events holds); a longer batch is answered 413 before any member is judged, since each
	// member costs a decode and a result in the answer (a body of a million tiny members was
	// answered with 50 MB of results).
	MaxEvents int
	// WriteTimeout bounds how long a request waits for its Kafka write (default 10 s); past it the
	// answer is 503 with every event "unknown", and the write goes on in the background within
	// MaxInFlightBytes until the writer ends it.
	WriteTimeout time.Duration
	// MaxInFlightBytes bounds the record bytes of writes not yet finished (default 64 MiB): a
	// request that would pass it is answered 503, nothing of it written, with Retry-After.
	MaxInFlightBytes int64
	// SingleAttempt says the writer makes one produce attempt per write (kafka.Writer with
	// MaxAttempts 1), so that a broker's refusal means the event was not written. A writer that
	// retries inside a write reports only its last attempt's error, and an earlier attempt may
	// have appended what a later one was refused: without SingleAttempt every error answers
	// "unknown".
	SingleAttempt bool
	// RetryRefusedFor is how long, with SingleAttempt, the handler sends again the events a broker
	// refused with a transient error (a partition whose leader is moving or still loading:
	// NOT_LEADER_OR_FOLLOWER, LEADER_NOT_AVAILABLE, NOT_ENOUGH_REPLICAS) before answering; only
	// the refused events are sent again, since a refusal means not written. Default half the
	// WriteTimeout; negative sends once.
	RetryRefusedFor time.Duration
	// WorkspaceRate is the events per second one workspace may write, in bursts of
	// WorkspaceBurst (default ten times the rate); zero sets no quota. A request with an event of
	// a workspace whose quota is spent is answered 429, nothing of it written, with Retry-After
	// the time until it is paid off. Events are charged once written or of unknown fate, so a
	// request may take its workspace past the quota by its own events; the next is refused. The
	// quota is this process's: N replicas behind a balancer let a workspace write N times it.
	WorkspaceRate  float64
	WorkspaceBurst float64
	// MaxRetained is the retained opportunities one workspace may hold (zero: no quota), as
	// Retained counts them: a request with an event of a workspace at its quota is answered 429,
	// nothing of it written, until the workspace's aggregates hold fewer (their opportunities age
	// out of the retention, or idle aggregates are dropped). Counts are looked up at most once per
	// RetainedRefresh (default 2 s) per workspace, so a workspace may pass its quota by what it
	// writes in that time; when the lookup fails the last count is used, and without one the
	// request is written (the quota protects Redis; it never stops the ingest on its own). The
	// last counts of up to 10 000 workspaces are kept, those not looked up within a refresh
	// forgotten first.
	MaxRetained     int64
	Retained        RetainedCounter
	RetainedRefresh time.Duration
	// Registerer takes the handler's metrics; nil keeps them private.
	Registerer prometheus.Registerer
}

// DefaultMaxBodyBytes is the default body limit: the decoder's default message limit, so one
// event of any valid size fits in a binary-mode body, and a batch holds up to that much.
const DefaultMaxBodyBytes = 1 << 20

// Validate checks the configuration.
func (c *Config) Validate() error {
	if c.LiveTopic == "" || c.EvalTopic == "" {
		return errors.New("ingest: live and eval topics are required")
	}
	if c.MaxRetained > 0 && c.Retained == nil {
		return errors.New("ingest: a quota of retained opportunities needs their counter")
	}
	if c.MaxBodyBytes < 0 || c.RecordLimit < 0 || c.WriteTimeout < 0 || c.MaxEvents < 0 || c.MaxInFlightBytes < 0 ||
		c.WorkspaceRate < 0 || c.WorkspaceBurst < 0 || c.MaxRetained < 0 || c.RetainedRefresh < 0 {
		return errors.New("ingest: limits must not be negative")
	}
	return nil
}

func (c *Config) defaults() {
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = 10 * time.Second
	}
	if c.RetryRefusedFor == 0 {
		c.RetryRefusedFor = c.WriteTimeout / 2
	}
	if c.MaxEvents == 0 {
		c.MaxEvents = int(max(1, c.MaxBodyBytes/MinEventBytes))
	}
	if c.MaxInFlightBytes == 0 {
		c.MaxInFlightBytes = DefaultMaxInFlightBytes
	}
	if c.WorkspaceBurst == 0 {
		c.WorkspaceBurst = 10 * c.WorkspaceRate
	}
	if c.RetainedRefresh == 0 {
		c.RetainedRefresh = 2 * time.Second
	}
}

// maxQuotaWorkspaces bounds the workspaces whose quota is kept at once (internal/quota forgets
// those whose budget is full again).
const maxQuotaWorkspaces = 10000

// DefaultMaxInFlightBytes is the default bound of the bytes of Kafka writes not yet finished.
const DefaultMaxInFlightBytes = 64 << 20

// MinEventBytes is below the size of the smallest valid structured event (about 250 bytes: the
// attributes, the five non-empty scope parts and the required data members), so a batch of valid
// events never holds more than MaxBodyBytes/MinEventBytes members.
const MinEventBytes = 128

// Handler serves POST /v1/events.
type Handler struct {
	cfg       Config
	dec       *cloudevent.Decoder
	w         Writer
	now       func() time.Time
	log       *zap.Logger
	events    *prometheus.CounterVec
	answers   *prometheus.CounterVec
	inflight  prometheus.Gauge
	overQuota *prometheus.CounterVec
	quota     *quota.Buckets // per workspace; nil without a quota
	retained  retainedCache

	mu      sync.Mutex
	bytes   int64               // record bytes of the writes not yet finished
	started map[int64]time.Time // start of each write not yet finished, by id
	late    map[int64]bool      // the writes among them that their request stopped waiting for
	nextID  int64
	writes  sync.WaitGroup // the write goroutines, waited for by Close
}

// New returns the handler: events are validated by dec at now() of their request and written
// through w.
func New(cfg Config, dec *cloudevent.Decoder, w Writer, now func() time.Time, log *zap.Logger) (*Handler, error) {
	cfg.defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	reg := cfg.Registerer
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	h := &Handler{cfg: cfg, dec: dec, w: w, now: now, log: log,
		events: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "repeatrate_ingest_events_total",
			Help: "Events posted to /v1/events by result: accepted (written), invalid, forbidden, not_written (another event of the request was refused, or the in-flight budget was full), failed (Kafka certainly did not take it), unknown (Kafka's answer did not come in time, or may have come after a write)."},
			[]string{"result"}),
		answers: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "repeatrate_ingest_requests_total",
			Help: "Requests to /v1/events by answer status."}, []string{"code"}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{Name: "repeatrate_ingest_inflight_bytes",
			Help: "Record bytes of ingest writes to Kafka not yet finished, those answered unknown included (bounded by the ingest's in-flight budget)."}),
		overQuota: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "repeatrate_ingest_over_quota_total",
			Help: "Requests to /v1/events answered 429 because a workspace was over a quota, by workspace (those a token names; others as *) and quota: events (its events per second were spent) or retained (it holds its quota of retained opportunities)."},
			[]string{"workspace", "quota"}),
		started: map[int64]time.Time{}, late: map[int64]bool{},
	}
	if cfg.WorkspaceRate > 0 {
		h.quota = quota.New(cfg.WorkspaceRate, cfg.WorkspaceBurst, maxQuotaWorkspaces, time.Now)
	}
	reg.MustRegister(h.events, h.answers, h.inflight, h.overQuota)
	return h, nil
}

// MaxBodyBytes is the body limit the server in front must allow for this route.
func (h *Handler) MaxBodyBytes() int64 { return h.cfg.MaxBodyBytes }

// Result statuses of one event.
const (
	StatusAccepted   = "accepted"    // written and acknowledged by all in-sync replicas
	StatusInvalid    = "invalid"     // refused with a dead-letter reason: fix it and send again
	StatusForbidden  = "forbidden"   // the token may not write the event's workspace
	StatusNotWritten = "not_written" // valid, but another event of the request was refused
	StatusFailed     = "failed"      // Kafka refused it: certainly not written; send the request again
	StatusUnknown    = "unknown"     // no answer in time, or a timeout: may be written; send the request again
)

// Result is what happened to one event of a request.
type Result struct {
	// Index is the event's position in the request (0 for a single event).
	Index  int    `json:"index"`
	ID     string `json:"id,omitempty"`
	Source string `json:"source,omitempty"`
	Status string `json:"status"`
	// Reason is the dead-letter reason of an invalid event.
	Reason schemas.Reason `json:"reason,omitempty"`
	Detail string         `json:"detail,omitempty"`
	// Topic and Key say where an accepted event was written (Key: its aggregate ID, or for an eval
	// result that is no correction check its case, workspace|suite|case_id escaped, absent when
	// that key would take the message past the processor's limit).
	Topic string `json:"topic,omitempty"`
	Key   string `json:"key,omitempty"`
}

// Answer is the body of every answer that concerns events.
type Answer struct {
	Accepted int      `json:"accepted"`
	Refused  int      `json:"refused"`
	Events   []Result `json:"events"`
	// Error says in one sentence why nothing, or not everything, was written.
	Error string `json:"error,omitempty"`
}

// pending is one event of a request: the Kafka message it would be, and its result so far.
type pending struct {
	msg kafka.Message
	res Result
	ws  string // the workspace of a valid event
	// refused, when set, judged the event invalid before it was decoded (an OTLP record whose
	// attributes cannot make an event).
	refused *schemas.InvalidError
}

// ServeHTTP answers one POST of events.
func (h *Handler) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	code := h.serve(w, req, h.read)
	h.answers.WithLabelValues(strconv.Itoa(code)).Inc()
}

// serve judges and writes the events read turns the request into (CloudEvents, or OTLP log
// records mapped to them).
func (h *Handler) serve(w http.ResponseWriter, req *http.Request, read func(http.ResponseWriter, *http.Request) ([]pending, int, string)) int {
	// Only the Authorization header: a cookie set by the pages' login must not let a page post.
	p := h.cfg.Tokens.Lookup(auth.Bearer(req))
	if p == nil {
		w.Header().Set("WWW-Authenticate", `Bearer realm="repeatrate"`)
		return writeError(w, http.StatusUnauthorized, "a bearer token with write permission is required (Authorization: Bearer <token>)")
	}
	if len(p.Workspaces(auth.Write)) == 0 {
		return writeError(w, http.StatusForbidden, "this token may not write any workspace")
	}
	// A token whose every workspace is over a quota is refused before its body is read: judging
	// a megabyte of events only to refuse them cost more than the writes the quota holds back.
	if refusal, wait, over := h.overQuotaAlready(req.Context(), p); over {
		if wait > 0 { // a workspace's events per second will be paid off; retained ones never by waiting
			w.Header().Set("Retry-After", strconv.Itoa(int(wait/time.Second)+1))
		}
		return writeError(w, http.StatusTooManyRequests, refusal)
	}
	now := h.now()
	events, status, msg := read(w, req)
	if status != 0 {
		return writeError(w, status, msg)
	}
	for i := range events {
		e := &events[i]
		e.res.Index = i
		if e.refused != nil {
			e.res.Status, e.res.Reason, e.res.Detail = StatusInvalid, e.refused.Reason, e.refused.Detail
			continue
		}
		ev, err := h.dec.Decode(&e.msg, now)
		if err != nil {
			var ie *schemas.InvalidError
			if !errors.As(err, &ie) {
				ie = schemas.Invalid(schemas.ReasonUndecodable, "%v", err)
			}
			e.res.Status, e.res.Reason, e.res.Detail = StatusInvalid, ie.Reason, ie.Detail
			continue
		}
		e.res.ID, e.res.Source = ev.ID, ev.Source
		ws, topic := "", h.cfg.LiveTopic
		switch {
		case ev.Live != nil:
			ws = ev.Live.Scope.Workspace
		case ev.Eval != nil:
			ws, topic = ev.Eval.Scope.Workspace, h.cfg.EvalTopic
		}
		e.ws = ws
		if !p.Can(ws, auth.Write) {
			e.res.Status, e.res.Detail = StatusForbidden, fmt.Sprintf("this token may not write workspace %q", ws)
			continue
		}
		// Keyed as produce and loadgen key events (Decoder.MessageKey): by aggregate, so one
		// aggregate's events keep their order on one partition, or by case for an eval result that
		// is no correction check, unless that key would not fit.
		if k := h.dec.MessageKey(ev, &e.msg); k != nil {
			e.msg.Key = k
			e.res.Key = string(e.msg.Key)
			// The processor's decoder counts the key in the message's size: an observation that
			// fit only without it would be dead-lettered as too_large after a 202. RecordSize is
			// never below the decoder's count, so only an event near the limit is decoded again.
			if sink.RecordSize(&e.msg) > h.dec.MaxMessageBytes() {
				if _, err := h.dec.Decode(&e.msg, now); err != nil {
					var ie *schemas.InvalidError
					if !errors.As(err, &ie) {
						ie = schemas.Invalid(schemas.ReasonUndecodable, "%v", err)
					}
					e.res.Status, e.res.Reason, e.res.Detail = StatusInvalid, ie.Reason, ie.Detail+" (with its key)"
					e.res.Key = ""
					continue
				}
			}
		}
		e.msg.Topic, e.res.Topic = topic, topic
		// Stamped with the receipt time it was judged against: rebuild judges each record against
		// its timestamp, and the writer's own stamp (the wall clock, possibly stepped back since the
		// receipt clock last moved) would have it dead-letter, as from the future, an event this
		// answer accepted.
		e.msg.Time = now
		if lim := h.cfg.RecordLimit; lim > 0 && int64(sink.RecordSize(&e.msg)) > lim {
			e.res.Status, e.res.Reason = StatusInvalid, schemas.ReasonTooLarge
			e.res.Detail = fmt.Sprintf("the Kafka record would be %d bytes, the input topic takes %d", sink.RecordSize(&e.msg), lim)
			e.res.Topic, e.res.Key = "", ""
			continue
		}
		e.res.Status = StatusAccepted
	}
	// Nothing of a request is written unless all of it may be: 400 when an event is invalid
	// (the caller's to fix), else 403 when one is forbidden.
	refusal := 0
	switch {
	case hasStatus(events, StatusInvalid):
		refusal = http.StatusBadRequest
	case hasStatus(events, StatusForbidden):
		refusal = http.StatusForbidden
	}
	if refusal != 0 {
		for i := range events {
			r := &events[i].res
			if r.Status == StatusAccepted {
				r.Status, r.Detail, r.Topic, r.Key = StatusNotWritten, "valid, not written: another event of this request was refused", "", ""
			}
		}
		return h.answer(w, refusal, events, "nothing was written: fix or remove the refused events and send the request again")
	}
	perWorkspace := h.workspaces(events)
	if full, held := h.atRetainedQuota(req.Context(), perWorkspace); full != "" {
		h.countOverQuota(p, full, "retained")
		for i := range events {
			events[i].res.Status, events[i].res.Detail, events[i].res.Topic, events[i].res.Key =
				StatusNotWritten, "not sent: a workspace of this request holds its quota of retained opportunities", "", ""
		}
		return h.answer(w, http.StatusTooManyRequests, events, h.retainedRefusal(full, held))
	}
	if h.quota != nil {
		// Charged ahead, under one lock with the check, so that requests running at once each
		// count the others' events; what is certainly not written is given back (refund).
		amounts := map[string]float64{}
		for ws, n := range perWorkspace {
			amounts[ws] = float64(n)
		}
		if ok, wait := h.quota.Take(amounts); !ok {
			spent := h.spent(perWorkspace)
			for _, ws := range spent {
				h.countOverQuota(p, ws, "events")
			}
			for i := range events {
				events[i].res.Status, events[i].res.Detail, events[i].res.Topic, events[i].res.Key =
					StatusNotWritten, "not sent: a workspace of this request is over its quota; send the request again after Retry-After", "", ""
			}
			w.Header().Set("Retry-After", strconv.Itoa(int(wait/time.Second)+1))
			return h.answer(w, http.StatusTooManyRequests, events, fmt.Sprintf(
				"nothing was written: workspace %q wrote more than its quota of %g events per second (bursts of %g); send the request again after Retry-After",
				spent[0], h.cfg.WorkspaceRate, h.cfg.WorkspaceBurst))
		}
	}
	msgs := make([]kafka.Message, len(events))
	size := int64(0)
	for i := range events {
		msgs[i] = events[i].msg
		size += int64(sink.RecordSize(&msgs[i]))
	}
	id, wait, ok := h.reserve(size)
	if !ok {
		h.refund(events, true)
		for i := range events {
			events[i].res.Status, events[i].res.Detail, events[i].res.Topic, events[i].res.Key =
				StatusNotWritten, "not sent: Kafka writes are backed up; send the request again after Retry-After", "", ""
		}
		w.Header().Set("Retry-After", retryAfter(wait))
		return h.answer(w, http.StatusServiceUnavailable, events,
			"nothing was written: the writes to Kafka in flight fill the ingest's budget; send the request again after Retry-After")
	}
	// The write runs on its own goroutine, not cancelled with the request: kafka-go keeps a
	// cancelled write queued and sends it later anyway, so the bytes stay reserved until the
	// writer itself ends it (WriteTimeout × attempts of the writer).
	done := make(chan error, 1)
	h.writes.Add(1)
	go func() {
		defer h.writes.Done()
		err := h.write(context.WithoutCancel(req.Context()), msgs)
		h.release(id, size)
		done <- err
	}()
	timer := time.NewTimer(h.cfg.WriteTimeout)
	defer timer.Stop()
	var err error
	select {
	case err = <-done:
	case <-timer.C:
		err = errNotAnswered
	case <-req.Context().Done():
		err = errNotAnswered
	}
	if errors.Is(err, errNotAnswered) {
		h.abandon(id)
	}
	if err != nil {
		// Events of unknown fate may have reached Kafka: the processor counts them once however
		// often they are sent, so the whole request can be sent again.
		h.log.Warn("write events", zap.Int("events", len(msgs)), zap.Error(err))
		var werrs kafka.WriteErrors
		isWriteErrors := errors.As(err, &werrs) && len(werrs) == len(events)
		for i := range events {
			r := &events[i].res
			e := err
			if isWriteErrors {
				e = werrs[i]
			}
			switch {
			case e == nil:
			case h.cfg.SingleAttempt && refused(e):
				r.Status, r.Detail, r.Topic, r.Key = StatusFailed, "refused by Kafka, not written: send the request again", "", ""
			default:
				r.Status, r.Detail, r.Topic, r.Key = StatusUnknown, "Kafka did not answer in time: it may or may not be written; send the request again (it is counted once)", "", ""
			}
		}
		h.refund(events, false)
		w.Header().Set("Retry-After", retryAfter(h.oldestWrite()))
		return h.answer(w, http.StatusServiceUnavailable, events,
			"Kafka did not acknowledge every event: send the request again (events already written are counted once)")
	}
	return h.answer(w, http.StatusAccepted, events, "")
}

// overQuotaAlready reports whether every workspace p may write is over a quota, and then the
// refusal naming each with its quota, and the shortest wait until one of them takes events again
// (zero when every one is at its retained quota, which waiting does not free). A token that may
// write every workspace ("*") is judged by its events' workspaces, once they are read.
func (h *Handler) overQuotaAlready(ctx context.Context, p *auth.Principal) (refusal string, wait time.Duration, over bool) {
	names := p.Workspaces(auth.Write)
	if len(names) == 0 || slices.Contains(names, auth.AllWorkspaces) || (h.quota == nil && h.cfg.MaxRetained <= 0) {
		return "", 0, false
	}
	var reasons []string
	var counted [][2]string // workspace, quota: counted once the request is refused
	for _, name := range names {
		if h.cfg.MaxRetained > 0 {
			if n := h.retainedOf(ctx, name); n >= h.cfg.MaxRetained {
				counted = append(counted, [2]string{name, "retained"})
				reasons = append(reasons, fmt.Sprintf("%q retains %d opportunities, its quota is %d (waiting does not free room: an operator raises --http-ingest-workspace-retained, or its aggregates are left idle)",
					name, n, h.cfg.MaxRetained))
				continue
			}
		}
		if h.quota == nil {
			return "", 0, false
		}
		ok, w := h.quota.Admit(name)
		if ok {
			return "", 0, false
		}
		counted = append(counted, [2]string{name, "events"})
		reasons = append(reasons, fmt.Sprintf("%q wrote more than its quota of %g events per second (bursts of %g)", name, h.cfg.WorkspaceRate, h.cfg.WorkspaceBurst))
		if wait == 0 || w < wait {
			wait = w
		}
	}
	for _, c := range counted {
		h.countOverQuota(p, c[0], c[1])
	}
	msg := "nothing was written: workspace " + reasons[0]
	if len(reasons) > 1 {
		msg = "nothing was written: every workspace this token writes is over a quota: " + strings.Join(reasons, "; ")
	}
	if wait > 0 {
		msg += "; send the request again after Retry-After"
	}
	return msg, wait, true
}

// countOverQuota counts a request refused for workspace ws's quota: by ws when the token names it,
// else as "*", so that the series stay as few as the configured grants.
func (h *Handler) countOverQuota(p *auth.Principal, ws, which string) {
	label := auth.AllWorkspaces
	if slices.Contains(p.Workspaces(auth.Write), ws) {
		label = ws
	}
	h.overQuota.WithLabelValues(label, which).Inc()
}

// retainedRefusal says why a workspace at its quota of retained opportunities is refused, and
// what frees room. It comes without Retry-After: waiting alone frees nothing, since an
// aggregate's opportunities are dropped only behind its newer events, which the quota refuses, or
// with the aggregate itself a retention after its last event.
func (h *Handler) retainedRefusal(ws string, held int64) string {
	return fmt.Sprintf("nothing was written: workspace %q retains %d opportunities, its quota is %d; waiting does not free room "+
		"(an aggregate's opportunities are dropped behind its newer events, or with the aggregate a retention after its last one): "+
		"an operator raises the quota (--http-ingest-workspace-retained), or the workspace's aggregates are left idle", ws, held, h.cfg.MaxRetained)
}

// retainedCache holds each workspace's last looked-up count of retained opportunities.
type retainedCache struct {
	mu     sync.Mutex
	counts map[string]retainedCount
}

type retainedCount struct {
	n  int64
	at time.Time
}

// atRetainedQuota returns the first workspace of n (in name order) that holds its quota of
// retained opportunities, and its count, or "".
func (h *Handler) atRetainedQuota(ctx context.Context, n map[string]int) (string, int64) {
	if h.cfg.MaxRetained <= 0 {
		return "", 0
	}
	for _, ws := range slices.Sorted(maps.Keys(n)) {
		if held := h.retainedOf(ctx, ws); held >= h.cfg.MaxRetained {
			return ws, held
		}
	}
	return "", 0
}

// retainedOf is ws's count of retained opportunities, looked up again when older than
// RetainedRefresh. A failed lookup keeps the last count (zero without one).
func (h *Handler) retainedOf(ctx context.Context, ws string) int64 {
	now := time.Now()
	c := &h.retained
	c.mu.Lock()
	last, ok := c.counts[ws]
	c.mu.Unlock()
	if ok && now.Sub(last.at) < h.cfg.RetainedRefresh {
		return last.n
	}
	lctx, cancel := context.WithTimeout(ctx, time.Second)
	n, err := h.cfg.Retained.Retained(lctx, ws)
	cancel()
	if err != nil {
		h.log.Warn("look up retained opportunities; the last count stands", zap.String("workspace", ws), zap.Error(err))
		n = last.n
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.counts == nil {
		c.counts = map[string]retainedCount{}
	}
	if _, kept := c.counts[ws]; !kept && len(c.counts) >= maxQuotaWorkspaces {
		// Full: the counts not looked up within a refresh go first (they would be looked up
		// again anyway), the oldest half when none is that old. A failed lookup of a count
		// forgotten here has no last count to keep: that request is written.
		for name, rc := range c.counts {
			if now.Sub(rc.at) >= h.cfg.RetainedRefresh {
				delete(c.counts, name)
			}
		}
		if len(c.counts) >= maxQuotaWorkspaces {
			ats := make([]time.Time, 0, len(c.counts))
			for _, rc := range c.counts {
				ats = append(ats, rc.at)
			}
			slices.SortFunc(ats, time.Time.Compare)
			cut := ats[len(ats)/2]
			for name, rc := range c.counts {
				if !rc.at.After(cut) {
					delete(c.counts, name)
				}
			}
		}
	}
	c.counts[ws] = retainedCount{n: n, at: now}
	return n
}

// workspaces counts the events of each workspace.
func (h *Handler) workspaces(events []pending) map[string]int {
	n := map[string]int{}
	for _, e := range events {
		n[e.ws]++
	}
	return n
}

// spent lists, sorted, the workspaces of n whose quota is spent.
func (h *Handler) spent(n map[string]int) []string {
	var out []string
	for ws := range n {
		if ok, _ := h.quota.Admit(ws); !ok {
			out = append(out, ws)
		}
	}
	slices.Sort(out)
	if len(out) == 0 { // paid off between the two looks
		out = append(out, slices.Sorted(maps.Keys(n))[0])
	}
	return out
}

// refund gives back to each workspace's quota the events charged ahead that were certainly not
// written: all of them when none was sent, else those Kafka refused (failed). Events of unknown
// fate stay charged: they may be written.
func (h *Handler) refund(events []pending, none bool) {
	if h.quota == nil {
		return
	}
	n := map[string]int{}
	for _, e := range events {
		if none || e.res.Status == StatusFailed {
			n[e.ws]++
		}
	}
	for ws, c := range n {
		h.quota.Charge(ws, -float64(c))
	}
}

// write writes msgs. With SingleAttempt, the events a broker refused with a transient error are
// sent again, alone, until RetryRefusedFor has passed: a leader election or a partition still
// loading after its topic was created refuses for a moment, and the retry spares every client the
// 503. The result is per message as kafka.WriteErrors whenever any attempt reported per message.
func (h *Handler) write(ctx context.Context, msgs []kafka.Message) error {
	err := h.w.WriteMessages(ctx, msgs...)
	if err == nil || !h.cfg.SingleAttempt {
		return err
	}
	deadline := time.Now().Add(h.cfg.RetryRefusedFor)
	backoff := 50 * time.Millisecond
	for {
		werrs, again := retriable(err, len(msgs))
		if len(again) == 0 || time.Now().Add(backoff).After(deadline) {
			return err
		}
		time.Sleep(backoff)
		backoff = min(2*backoff, time.Second)
		resend := make([]kafka.Message, len(again))
		for j, i := range again {
			resend[j] = msgs[i]
		}
		rerr := h.w.WriteMessages(ctx, resend...)
		var rerrs kafka.WriteErrors
		perMessage := errors.As(rerr, &rerrs) && len(rerrs) == len(resend)
		for j, i := range again {
			switch {
			case perMessage:
				werrs[i] = rerrs[j]
			default:
				werrs[i] = rerr
			}
		}
		err = werrs
		if werrs.Count() == 0 {
			return nil
		}
	}
}

// retriable splits a write's error per message and lists the messages a broker refused with a
// transient error; any message whose fate is unknown stops the retries (nothing is listed).
func retriable(err error, n int) (kafka.WriteErrors, []int) {
	var werrs kafka.WriteErrors
	if !errors.As(err, &werrs) || len(werrs) != n {
		werrs = make(kafka.WriteErrors, n)
		for i := range werrs {
			werrs[i] = err
		}
	}
	var again []int
	for i, e := range werrs {
		if e == nil {
			continue
		}
		var ke kafka.Error
		if !refused(e) || !errors.As(e, &ke) || !ke.Temporary() {
			return werrs, nil
		}
		again = append(again, i)
	}
	return werrs, again
}

// errNotAnswered stands for a write the request stopped waiting for.
var errNotAnswered = errors.New("kafka did not answer within the write timeout")

// refused reports whether the error of a write's only attempt certainly means the message was not
// written: the broker answered the produce request of its partition with an error. A timeout, an
// acknowledgement that did not come, or a broker that wrote but could not replicate in time may
// have written it.
func refused(err error) bool {
	var ke kafka.Error
	if !errors.As(err, &ke) {
		return false
	}
	switch ke {
	case kafka.RequestTimedOut, kafka.NotEnoughReplicasAfterAppend:
		return false
	}
	return true
}

// reserve takes size bytes of the in-flight budget for a write and returns its id; when they do
// not fit it returns how long the oldest write in flight has run instead. A write larger than the
// whole budget goes through only when nothing else is in flight (the configuration of `run`
// keeps the budget at least twice the largest body, so that does not happen).
func (h *Handler) reserve(size int64) (id int64, oldest time.Duration, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.bytes > 0 && h.bytes+size > h.cfg.MaxInFlightBytes {
		return 0, h.oldestLocked(), false
	}
	h.nextID++
	h.bytes += size
	h.started[h.nextID] = time.Now()
	h.inflight.Set(float64(h.bytes))
	return h.nextID, 0, true
}

// release gives back a finished write's bytes.
func (h *Handler) release(id, size int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.bytes -= size
	delete(h.started, id)
	delete(h.late, id)
	h.inflight.Set(float64(h.bytes))
}

// abandon marks a write its request stopped waiting for, unless it has finished meanwhile.
func (h *Handler) abandon(id int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.started[id]; ok {
		h.late[id] = true
	}
}

func (h *Handler) oldestWrite() time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.oldestLocked()
}

func (h *Handler) oldestLocked() time.Duration {
	var oldest time.Duration
	for _, t := range h.started {
		oldest = max(oldest, time.Since(t))
	}
	return oldest
}

// retryAfter is the Retry-After of a 503: how long the oldest write in flight has run (Kafka is
// that far behind), between 1 and 60 seconds.
func retryAfter(oldest time.Duration) string {
	return strconv.Itoa(int(min(60, max(1, oldest.Round(time.Second)/time.Second))))
}

// Backlog says why Kafka writes are backed up, or nil: a write its request stopped waiting for is
// still running, or the writes in flight hold most of the budget. The server's /readyz is not
// ready meanwhile.
func (h *Handler) Backlog() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case len(h.late) > 0:
		return fmt.Errorf("ingest: %d kafka writes outlived their requests' %s and are still running", len(h.late), h.cfg.WriteTimeout)
	case h.bytes > h.cfg.MaxInFlightBytes*9/10:
		return fmt.Errorf("ingest: kafka writes in flight hold %d of %d bytes", h.bytes, h.cfg.MaxInFlightBytes)
	}
	return nil
}

// Close waits for the writes still in flight, or until ctx ends.
func (h *Handler) Close(ctx context.Context) error {
	done := make(chan struct{})
	go func() { h.writes.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("ingest: writes still in flight: %w", ctx.Err())
	}
}

func hasStatus(events []pending, status string) bool {
	return slices.ContainsFunc(events, func(e pending) bool { return e.res.Status == status })
}

// answer writes the per-event results with status and counts them.
func (h *Handler) answer(w http.ResponseWriter, status int, events []pending, msg string) int {
	ans := Answer{Events: make([]Result, len(events)), Error: msg}
	for i, e := range events {
		ans.Events[i] = e.res
		h.events.WithLabelValues(e.res.Status).Inc()
		switch e.res.Status {
		case StatusAccepted:
			ans.Accepted++
		case StatusInvalid, StatusForbidden:
			ans.Refused++
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(ans)
	return status
}

// writeError answers a request that concerns no single event: {"error": msg}, as the read API.
func writeError(w http.ResponseWriter, status int, msg string) int {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(struct {
		Error string `json:"error"`
	}{msg})
	return status
}

// read turns the request into the Kafka messages its events would be, with the CloudEvents SDK's
// HTTP binding deciding the mode: binary (ce-* headers, data in the body) becomes a binary-mode
// Kafka message (ce_* headers, content-type, data as value); structured becomes a structured one
// with the body as value; each member of a batch becomes a structured one with the member's bytes
// as value. The decoder then judges exactly what the processor will read. status is non-zero, with
// msg, when the request as a whole cannot be read.
func (h *Handler) read(w http.ResponseWriter, req *http.Request) (events []pending, status int, msg string) {
	req.Body = http.MaxBytesReader(w, req.Body, h.cfg.MaxBodyBytes)
	m := cehttp.NewMessageFromHttpRequest(req)
	defer m.Finish(nil)
	ctx := req.Context()
	bodyErr := func(err error) (int, string) {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return http.StatusRequestEntityTooLarge, fmt.Sprintf("body is longer than %d bytes", h.cfg.MaxBodyBytes)
		}
		return http.StatusBadRequest, "the body could not be read"
	}
	switch m.ReadEncoding() {
	case binding.EncodingBinary:
		bw := &binaryWriter{}
		if err := m.ReadBinary(ctx, bw); err != nil {
			status, msg = bodyErr(err)
			return nil, status, msg
		}
		return []pending{{msg: bw.message()}}, 0, ""
	case binding.EncodingStructured:
		var body []byte
		err := m.ReadStructured(ctx, structuredFunc(func(_ context.Context, f format.Format, r io.Reader) error {
			if f != format.JSON {
				return errNotJSON
			}
			var err error
			body, err = io.ReadAll(r)
			return err
		}))
		if errors.Is(err, errNotJSON) {
			return nil, http.StatusUnsupportedMediaType, unsupported
		}
		if err != nil {
			status, msg = bodyErr(err)
			return nil, status, msg
		}
		return []pending{{msg: structured(body)}}, 0, ""
	case binding.EncodingBatch:
		body, err := io.ReadAll(m.BodyReader)
		if err != nil {
			status, msg = bodyErr(err)
			return nil, status, msg
		}
		var members []json.RawMessage
		if err := json.Unmarshal(body, &members); err != nil {
			return nil, http.StatusBadRequest, "a batch (" + cehttp.ContentType + ": application/cloudevents-batch+json) must be a JSON array of structured CloudEvents: " + err.Error()
		}
		if len(members) == 0 {
			return nil, http.StatusBadRequest, "the batch holds no event"
		}
		if len(members) > h.cfg.MaxEvents {
			return nil, http.StatusRequestEntityTooLarge, fmt.Sprintf("the batch holds %d events, at most %d are taken", len(members), h.cfg.MaxEvents)
		}
		// More members than the body's bytes could hold as valid events: some are invalid
		// whatever they say. Past a few dozen (whose results are small whatever they hold) such a
		// batch is refused whole, without a result each, so that an answer stays within a small
		// multiple of its request (16 KB of 8 192 members "{}" was answered with 810 KB).
		if fit := max(1, len(body)/MinEventBytes); len(members) > fit && len(members) > maxUnfitResults {
			return nil, http.StatusBadRequest, fmt.Sprintf("the batch holds %d members in %d bytes: a valid event takes at least %d bytes, so %d at most fit; "+
				"some members are not events", len(members), len(body), MinEventBytes, fit)
		}
		events = make([]pending, len(members))
		for i, b := range members {
			events[i] = pending{msg: structured(b)}
		}
		return events, 0, ""
	}
	if v := req.Header.Get("Ce-Specversion"); v != "" {
		// A binary-mode request of a version the SDK does not know: the decoder refuses it as
		// the Kafka path does (bad_cloudevent).
		return []pending{{msg: kafka.Message{Headers: []kafka.Header{{Key: "ce_specversion", Value: []byte(v)}}}}}, 0, ""
	}
	return nil, http.StatusUnsupportedMediaType, unsupported
}

// maxUnfitResults is how many members a batch too dense to hold valid events may have and still
// be answered with a result each.
const maxUnfitResults = 64

var errNotJSON = errors.New("structured event format is not JSON")

const unsupported = "send CloudEvents: binary mode (ce-specversion, ce-id, ce-source, ce-type headers and the data as body), " +
	"structured mode (Content-Type: application/cloudevents+json) or a batch (Content-Type: application/cloudevents-batch+json)"

// structured is the Kafka message of a structured-mode event, as produce writes it.
func structured(value []byte) kafka.Message {
	return kafka.Message{Value: value, Headers: []kafka.Header{{Key: "content-type", Value: []byte(sink.ContentType)}}}
}

type structuredFunc func(ctx context.Context, f format.Format, r io.Reader) error

func (f structuredFunc) SetStructuredEvent(ctx context.Context, fm format.Format, r io.Reader) error {
	return f(ctx, fm, r)
}

// binaryWriter collects a binary-mode HTTP event as the Kafka binary mode carries it: each
// attribute and extension in a ce_<name> header, datacontenttype in content-type, data as value
// (the mapping of the CloudEvents Kafka protocol binding).
type binaryWriter struct {
	headers []kafka.Header
	value   []byte
}

var _ binding.BinaryWriter = (*binaryWriter)(nil)

func (b *binaryWriter) Start(context.Context) error { return nil }
func (b *binaryWriter) End(context.Context) error   { return nil }

func (b *binaryWriter) SetAttribute(a spec.Attribute, v any) error {
	if a.Kind() == spec.DataContentType {
		return b.set("content-type", v)
	}
	return b.set("ce_"+a.Name(), v)
}

func (b *binaryWriter) SetExtension(name string, v any) error {
	return b.set("ce_"+strings.ToLower(name), v)
}

func (b *binaryWriter) set(key string, v any) error {
	s, ok := v.(string)
	if !ok {
		return fmt.Errorf("header %s is not text", key)
	}
	b.headers = append(b.headers, kafka.Header{Key: key, Value: []byte(s)})
	return nil
}

func (b *binaryWriter) SetData(r io.Reader) error {
	var err error
	b.value, err = io.ReadAll(r)
	return err
}

// message is the collected Kafka message; headers are sorted (the SDK visits a map).
func (b *binaryWriter) message() kafka.Message {
	slices.SortFunc(b.headers, func(x, y kafka.Header) int { return strings.Compare(x.Key, y.Key) })
	return kafka.Message{Headers: b.headers, Value: b.value}
}
