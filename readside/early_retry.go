package readside

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// earlyRetries holds back clients that send again before the Retry-After they were given. A
// request from a key (a token, else a client address) that was answered 429 less than its
// Retry-After ago waits until that has passed, at most maxHold, and is then judged like any
// other: served if its limits allow it by then. A client that honours Retry-After never waits.
// One that ignores it gets an answer per Retry-After per connection instead of a refusal as fast
// as it can send; each such refusal cost the server a request parsed and, for a body left
// unread, a connection closed, then dialled again into the address's connection cap.
//
// At most perKey requests of one key are held at once (the rest are judged at once), so one
// token spread over many addresses cannot hold the server's connections. It remembers at most
// maxLimiterKeys keys; when full it forgets those whose Retry-After has passed, and holds no new
// key until one has.
type earlyRetries struct {
	maxHold time.Duration
	perKey  int
	now     func() time.Time
	held    func() // counts a held request (a metric)

	mu    sync.Mutex
	until map[string]time.Time
	count map[string]int
}

func newEarlyRetries(maxHold time.Duration, perKey int, now func() time.Time, held func()) *earlyRetries {
	return &earlyRetries{maxHold: maxHold, perKey: perKey, now: now, held: held, until: map[string]time.Time{}, count: map[string]int{}}
}

// wait holds a request of key until key's Retry-After has passed (or maxHold). It reports false
// when ctx ended first: the client is gone and nothing should be answered.
func (e *earlyRetries) wait(ctx context.Context, key string) bool {
	if e.maxHold <= 0 {
		return true
	}
	e.mu.Lock()
	d := e.until[key].Sub(e.now())
	if d <= 0 || e.count[key] >= e.perKey {
		e.mu.Unlock()
		return true
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
	t := time.NewTimer(min(d, e.maxHold))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// refused records that key was answered 429 with the Retry-After retryAfter (seconds; absent
// is one second: a refusal that waiting alone does not lift is still not to be sent again at once).
func (e *earlyRetries) refused(key, retryAfter string) {
	if e.maxHold <= 0 {
		return
	}
	d := time.Second
	if s, err := strconv.Atoi(retryAfter); err == nil && s > 0 {
		d = time.Duration(s) * time.Second
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.now()
	if _, ok := e.until[key]; !ok && len(e.until) >= maxLimiterKeys {
		for k, t := range e.until {
			if !t.After(now) && e.count[k] == 0 {
				delete(e.until, k)
			}
		}
		if len(e.until) >= maxLimiterKeys {
			return
		}
	}
	if t := now.Add(d); t.After(e.until[key]) {
		e.until[key] = t
	}
}

// statusWriter remembers the status a handler answered with.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
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
