package readside

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/aggregator/suite"
	"github.com/repeatrate/repeatrate/schemas"
)

// Live streams (README, Read side). Each HTTP server subscribes once to the catalog's channel and
// fans events out to its streams. A stream's buffer holds streamBuffer events; a client that lets
// it fill is dropped (it reconnects with Last-Event-ID), so no client ever holds up another, the
// hub or the processor, which only publishes to Redis.
const (
	streamBuffer      = 256
	streamsPerToken   = 8
	streamHeartbeat   = 15 * time.Second
	streamWriteWindow = 30 * time.Second
	maxCatchUp        = 200
	// streamSubscribeWait bounds how long a new stream waits for the server's subscription to
	// the channel (Redis slow or down) before it is refused with 503.
	streamSubscribeWait = 5 * time.Second
)

// streamFields are the selector's parameters besides workspace.
var streamFields = []string{"model", "run", "checkpoint", "artifact", "correction_id", "source", "suite", "last_event_id"}

// selector picks the events of one stream: every event of the workspace, or the snapshots of the
// aggregates whose given parts match, or one suite's snapshots.
type selector struct {
	workspace string
	parts     [7]string // aggregate ID parts; "" matches anything
	any       bool      // some aggregate part is given
	suite     string
}

func newSelector(v url.Values) selector {
	s := selector{workspace: v.Get("workspace"), suite: v.Get("suite")}
	s.parts[0] = s.workspace
	for i, f := range []string{"model", "run", "checkpoint", "artifact", "correction_id", "source"} {
		s.parts[i+1] = v.Get(f)
		s.any = s.any || s.parts[i+1] != ""
	}
	return s
}

func (s selector) matchAggregate(id string) bool {
	parts, err := schemas.SplitEscaped(id)
	if err != nil || len(parts) != 7 {
		return false
	}
	for i, p := range s.parts {
		if p != "" && parts[i] != p {
			return false
		}
	}
	return true
}

// ordered reports whether one event id orders every event the stream carries, so that a
// Last-Event-ID says what the client already has: a stream of one aggregate (every part and the
// source given), whose ids are its versions, or of one suite, whose ids are observation times.
// Versions count per aggregate, so the id of one aggregate's event says nothing of another's; a
// stream of several answers a resume with every selected subject's current snapshot.
func (s selector) ordered() bool {
	if s.suite != "" {
		return true
	}
	for _, p := range s.parts {
		if p == "" {
			return false
		}
	}
	return true
}

func (s selector) match(ev *FeedEvent) bool {
	if ev.Workspace != s.workspace {
		return false
	}
	if ev.Kind == "snapshot" {
		return s.suite == "" && s.matchAggregate(ev.Subject)
	}
	if s.suite != "" {
		return ev.Subject == s.suite
	}
	return !s.any
}

type streamClient struct {
	sel  selector
	ch   chan *FeedEvent
	once sync.Once
}

func (c *streamClient) close() { c.once.Do(func() { close(c.ch) }) }

// hub fans the catalog's channel out to streams.
type hub struct {
	catalog *Catalog
	m       *httpMetrics
	log     *zap.Logger
	mu      sync.Mutex
	clients map[*streamClient]string // -> token name
	perTok  map[string]int
	closed  bool
	// subscribed is closed once Redis has confirmed the subscription: a stream goes live only
	// then, or an event published between its catch-up and the subscription would be lost.
	subscribed chan struct{}
	stopped    chan struct{} // closed when run ends: streams still waiting give up at once
}

func newHub(c *Catalog, m *httpMetrics, log *zap.Logger) *hub {
	return &hub{catalog: c, m: m, log: log, clients: map[*streamClient]string{}, perTok: map[string]int{},
		subscribed: make(chan struct{}), stopped: make(chan struct{})}
}

// subscribeTimeout bounds the wait for Redis to confirm a subscription: a connection that never
// answers is given up and made again.
const subscribeTimeout = 5 * time.Second

// run subscribes to the channel until ctx ends, then closes every stream. It confirms the
// subscription first, retrying while Redis refuses or does not answer. go-redis subscribes again
// after a lost connection; what was published meanwhile never reached the streams, so each
// confirmation after the first closes every stream, and its client resumes with Last-Event-ID
// (catching up what it missed).
func (h *hub) run(ctx context.Context) {
	defer close(h.stopped)
	ps := h.catalog.client.Subscribe(ctx, h.catalog.Channel())
	stop := context.AfterFunc(ctx, func() { ps.Close() }) // ends a read blocked on a silent Redis
	defer stop()
	defer func() {
		ps.Close()
		h.mu.Lock()
		h.closed = true
		for c := range h.clients {
			c.close()
		}
		h.mu.Unlock()
	}()
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, subscribeTimeout) {
		if _, err := ps.ReceiveTimeout(ctx, subscribeTimeout); err == nil {
			close(h.subscribed)
			break
		} else if ctx.Err() == nil {
			h.log.Warn("stream subscription not confirmed; retrying", zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
	ch := ps.ChannelWithSubscriptions(redis.WithChannelSize(1024))
	for {
		select {
		case <-ctx.Done():
			return
		case msg, ok := <-ch:
			if !ok {
				return
			}
			switch msg := msg.(type) {
			case *redis.Subscription:
				if msg.Kind == "subscribe" {
					h.log.Warn("stream subscription made again after a lost connection; closing the streams so that they catch up")
					h.closeAll()
				}
			case *redis.Message:
				ev := &FeedEvent{}
				if err := json.Unmarshal([]byte(msg.Payload), ev); err != nil {
					continue
				}
				h.broadcast(ev)
			}
		}
	}
}

// closeAll ends every stream (they reconnect and catch up).
func (h *hub) closeAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for c := range h.clients {
		h.removeLocked(c)
	}
}

func (h *hub) broadcast(ev *FeedEvent) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for c := range h.clients {
		if !c.sel.match(ev) {
			continue
		}
		select {
		case c.ch <- ev:
		default:
			// Too slow: drop the client rather than wait for it.
			h.m.streamDrops.Inc()
			h.removeLocked(c)
		}
	}
}

// add registers a stream, or refuses it when the server's or the token's streams are at their cap.
func (h *hub) add(sel selector, token string, max int) (*streamClient, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, fmt.Errorf("the server is stopping")
	}
	if len(h.clients) >= max {
		return nil, fmt.Errorf("too many open streams; try again later")
	}
	if h.perTok[token] >= streamsPerToken {
		return nil, fmt.Errorf("this token has %d open streams already", streamsPerToken)
	}
	c := &streamClient{sel: sel, ch: make(chan *FeedEvent, streamBuffer)}
	h.clients[c] = token
	h.perTok[token]++
	h.m.streams.Inc()
	return c, nil
}

func (h *hub) remove(c *streamClient) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.removeLocked(c)
}

func (h *hub) removeLocked(c *streamClient) {
	tok, ok := h.clients[c]
	if !ok {
		return
	}
	delete(h.clients, c)
	if h.perTok[tok]--; h.perTok[tok] <= 0 {
		delete(h.perTok, tok)
	}
	h.m.streams.Dec()
	c.close()
}

// stream serves GET /v1/stream as Server-Sent Events: first the current snapshot of every
// selected subject newer than Last-Event-ID (or every one, without it, or when the stream
// carries several aggregates: see selector.ordered), then each new one as it is published.
// Event ids are versions (suite snapshots: their observation time in µs); per subject they only
// grow, so a client that resumes with its last id misses no newer state.
func (a *api) stream(w http.ResponseWriter, req *http.Request) {
	v, ok := a.begin(w, req, streamFields, nil)
	if !ok {
		return
	}
	var last int64
	lastText := req.Header.Get("Last-Event-ID")
	if lastText == "" {
		lastText = v.Get("last_event_id")
	}
	if lastText != "" {
		var err error
		if last, err = strconv.ParseInt(lastText, 10, 64); err != nil || last < 0 {
			writeError(w, http.StatusBadRequest, "Last-Event-ID must be a version (a non-negative integer)", false)
			return
		}
	}
	if a.hub == nil {
		writeError(w, http.StatusServiceUnavailable, "streams are unavailable", false)
		return
	}
	sel := newSelector(v)
	if !sel.ordered() {
		last = 0
	}
	c, err := a.hub.add(sel, a.principal(req).Name, a.cfg.MaxStreams)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, err.Error(), false)
		return
	}
	defer a.hub.remove(c)
	// Registered, then subscribed, then caught up: whatever is published after the catch-up
	// read reaches this stream.
	select {
	case <-a.hub.subscribed:
	case <-req.Context().Done():
		return
	case <-a.hub.stopped:
		writeError(w, http.StatusServiceUnavailable, "the server is stopping", false)
		return
	case <-time.After(streamSubscribeWait):
		writeError(w, http.StatusServiceUnavailable, "streams are not ready (no subscription to Redis yet); try again later", false)
		return
	}
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	sent := map[string]int64{} // subject -> greatest id sent
	send := func(ev *FeedEvent) bool {
		key := ev.Kind + "\x00" + ev.Subject + "\x00" + ev.Version
		if ev.ID <= sent[key] || ev.ID <= last {
			return true
		}
		sent[key] = ev.ID
		rc.SetWriteDeadline(time.Now().Add(streamWriteWindow))
		if _, err := fmt.Fprintf(w, "id: %d\nevent: %s\ndata: %s\n\n", ev.ID, ev.Kind, ev.Data); err != nil {
			return false
		}
		a.metrics.streamEvents.Inc()
		return rc.Flush() == nil
	}
	for _, ev := range a.catchUp(req.Context(), sel, v) {
		if ev.ID > last && !send(ev) {
			return
		}
	}
	rc.SetWriteDeadline(time.Now().Add(streamWriteWindow))
	fmt.Fprint(w, ": live\n\n")
	rc.Flush()
	beat := time.NewTicker(streamHeartbeat)
	defer beat.Stop()
	for {
		select {
		case <-req.Context().Done():
			return
		case ev, ok := <-c.ch:
			if !ok {
				return
			}
			if !send(ev) {
				return
			}
		case <-beat.C:
			rc.SetWriteDeadline(time.Now().Add(streamWriteWindow))
			if _, err := fmt.Fprint(w, ": ping\n\n"); err != nil || rc.Flush() != nil {
				return
			}
		}
	}
}

// catchUp reads the current snapshots of what sel selects: at most maxCatchUp aggregates from
// the index, or the selected suite. Errors are logged and end the catch-up; the stream goes on.
// catchUpFailed logs a failed read of a catch-up, unless its client went away (ctx ended):
// then nothing is wrong with the state (as readFailed).
func (a *api) catchUpFailed(ctx context.Context, err error) {
	if ctx.Err() != nil {
		a.log.Debug("stream catch-up abandoned by its client")
		return
	}
	a.log.Warn("stream catch-up", zap.Error(err))
}

func (a *api) catchUp(ctx context.Context, sel selector, v url.Values) []*FeedEvent {
	var out []*FeedEvent
	at := a.now()
	if sel.suite != "" || !sel.any {
		if sel.suite != "" && a.suites != nil {
			k := suite.Key{Workspace: sel.workspace, Suite: sel.suite}
			s, err := a.suites.Read(ctx, k, at)
			if err != nil {
				a.catchUpFailed(ctx, err)
				return out
			}
			if s != nil && s.Discrimination.VersionsSeen > 0 {
				d := s.DiscriminationSnapshot(k, a.suites.Config(), at)
				data, _ := json.Marshal(d)
				id := suiteFeedID(s.SnapshotVersion, at)
				out = append(out, &FeedEvent{Kind: "discrimination", Workspace: k.Workspace, Subject: k.Suite, ID: id, Data: data})
				for i := range s.Versions {
					st := s.StabilitySnapshot(k, i, a.suites.Config(), at)
					data, _ := json.Marshal(st)
					out = append(out, &FeedEvent{Kind: "stability", Workspace: k.Workspace, Subject: k.Suite, Version: st.Version,
						ID: id, Data: data})
				}
			}
		}
		if sel.suite != "" {
			return out
		}
	}
	if a.catalog == nil {
		return out
	}
	pg, err := a.catalog.Aggregates(ctx, sel.workspace, idPrefix(v), "", maxCatchUp)
	if err != nil {
		a.catchUpFailed(ctx, err)
		return out
	}
	for _, id := range pg.Items {
		if !sel.matchAggregate(id) {
			continue
		}
		parts, _ := schemas.SplitEscaped(id)
		src, ok := aggregator.ParseSource(parts[6])
		if !ok {
			continue
		}
		k := aggregator.Key{Scope: schemas.Scope{Workspace: parts[0], Model: parts[1], Run: parts[2], Checkpoint: parts[3],
			Artifact: parts[4]}, CorrectionID: parts[5], Source: src}
		t, err := a.r.Tally(ctx, k, at)
		if err != nil {
			a.catchUpFailed(ctx, err)
			return out
		}
		if t.Version == 0 {
			continue
		}
		s := t.Snapshot(k, at)
		data, _ := json.Marshal(s)
		out = append(out, &FeedEvent{Kind: "snapshot", Workspace: k.Scope.Workspace, Subject: id, ID: s.Version, Data: data})
	}
	return out
}
