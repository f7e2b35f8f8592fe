package readside

import (
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// earlyRetries paces clients that send again before the Retry-After they were given. A refusal
// (429) by a limit of a key (a token, else a client address) that the same limit refused less
// than its Retry-After ago is answered when that Retry-After has passed, at most maxHold later,
// instead of at once. Only refusals wait: a request its limits admit is served at once, whoever
// sent it, so a client that honours Retry-After never waits, nor does another connection of the
// same token that the limits let through, nor a refusal by another limit (a dashboard's first
// rate-limit refusal while the token's uploads are over their workspace's quota). One that
// ignores it gets about one refusal per Retry-After per connection instead of a refusal as fast
// as it can send; each of those cost the server a request parsed and, for a body left unread, a
// connection closed and dialled again into its address's connection cap. A held refusal waits
// its time even when its client half-closes or leaves (which net/http reports as the request's
// context ending), or a client could end every wait at once by half-closing.
//
// Keys here are "<key>|<limit>". At most perKey refusals of one key wait at once (the rest are answered at once), so one token
// spread over many addresses cannot hold the server's connections. Tokens are remembered apart
// from addresses, one each at most; at most maxLimiterKeys addresses are, and when they are all
// within their Retry-After a new one is not held until one has passed, so outsiders cycling
// addresses neither grow it nor crowd a token out.
type earlyRetries struct {
	maxHold time.Duration
	perKey  int
	now     func() time.Time
	held    func() // counts a held refusal (a metric)

	mu        sync.Mutex
	tokens    map[string]time.Time // "token <name>" → when its Retry-After passes
	addrs     map[string]time.Time // "addr <address>" → when its Retry-After passes
	nextPrune time.Time            // addrs is full: none has passed before this
	count     map[string]int       // refusals held now, by key
}

func newEarlyRetries(maxHold time.Duration, perKey int, now func() time.Time, held func()) *earlyRetries {
	return &earlyRetries{maxHold: maxHold, perKey: perKey, now: now, held: held,
		tokens: map[string]time.Time{}, addrs: map[string]time.Time{}, count: map[string]int{}}
}

func (e *earlyRetries) keys(key string) map[string]time.Time {
	if strings.HasPrefix(key, "token ") {
		return e.tokens
	}
	return e.addrs
}

// hold delays a refusal of key until key's last Retry-After has passed (or maxHold) and
// returns how long it waited.
func (e *earlyRetries) hold(key string) time.Duration {
	if e.maxHold <= 0 {
		return 0
	}
	e.mu.Lock()
	d := e.keys(key)[key].Sub(e.now())
	if d <= 0 || e.count[key] >= e.perKey {
		e.mu.Unlock()
		return 0
	}
	e.count[key]++
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		if e.count[key]--; e.count[key] == 0 {
			delete(e.count, key)
		}
		e.mu.Unlock()
	}()
	e.held()
	d = min(d, e.maxHold)
	time.Sleep(d)
	return d
}

// retryAfter is a 429's Retry-After (seconds) as a duration: one second without one (waiting
// alone does not lift such a refusal, but it is not to be sent again at once either).
func retryAfter(h string) time.Duration {
	if s, err := strconv.Atoi(h); err == nil && s > 0 {
		return time.Duration(min(s, 3600)) * time.Second
	}
	return time.Second
}

// refused records that key was refused, not to be sent again before until.
func (e *earlyRetries) refused(key string, until time.Time) {
	if e.maxHold <= 0 {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.now()
	m := e.keys(key)
	if _, ok := m[key]; !ok && len(m) >= maxLimiterKeys { // addresses only: tokens are few
		if now.Before(e.nextPrune) {
			return
		}
		e.nextPrune = time.Time{}
		for k, t := range m {
			switch {
			case !t.After(now) && e.count[k] == 0:
				delete(m, k)
			case e.nextPrune.IsZero() || t.Before(e.nextPrune):
				e.nextPrune = t
			}
		}
		if len(m) >= maxLimiterKeys {
			return
		}
	}
	if until.After(m[key]) {
		m[key] = until
	}
}

// statusWriter holds a 429 back while its key and limit are within an earlier Retry-After
// (earlyRetries), then records the refusal's own Retry-After, counted from when it was decided:
// the time it was held is taken off the Retry-After it answers (one second at least).
type statusWriter struct {
	http.ResponseWriter
	key   string
	limit string // the limit that refuses, set before a 429 is written (else the route's)
	early *earlyRetries
	code  int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
		if code == http.StatusTooManyRequests {
			key := w.key + "|" + w.limit
			decided := w.early.now()
			after := retryAfter(w.Header().Get("Retry-After"))
			if held := w.early.hold(key); held > 0 && w.Header().Get("Retry-After") != "" {
				w.Header().Set("Retry-After", strconv.Itoa(max(1, int((after-held+time.Second-1)/time.Second))))
			}
			w.early.refused(key, decided.Add(after))
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection (the stream's flushes and deadlines).
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
