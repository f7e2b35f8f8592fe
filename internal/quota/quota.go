// Package quota keeps budgets of work per key (a token, a workspace, a client address), refilled
// at a steady rate up to a burst. Work is paid as it is done, so its cost need not be known up
// front: a key may run into debt by the last request's cost, and is refused new work until the
// debt is paid off. The read side charges the Redis commands a token's reads send; the ingest
// charges each workspace the events it writes.
package quota

import (
	"sync"
	"time"
)

// Buckets is a budget per key. The zero value is not usable; see New.
type Buckets struct {
	rate, burst float64
	maxKeys     int
	now         func() time.Time

	mu   sync.Mutex
	keys map[string]*bucket
}

type bucket struct {
	level float64 // may be negative: work done past the budget, still to be paid off
	at    time.Time
}

// New returns budgets refilled at rate units per second up to burst, for at most maxKeys keys at
// once: when that many are kept, keys whose budget is full again are forgotten (which loses
// nothing), and a new key is refused while every kept one is still paying.
func New(rate, burst float64, maxKeys int, now func() time.Time) *Buckets {
	return &Buckets{rate: rate, burst: max(burst, 1), maxKeys: max(maxKeys, 1), now: now, keys: map[string]*bucket{}}
}

// Admit reports whether key may start new work: its budget is not in debt. When it is not
// admitted, wait is how long until it will be.
func (b *Buckets) Admit(key string) (ok bool, wait time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	k, ok := b.get(key)
	if !ok {
		return false, time.Second
	}
	if k.level >= 0 {
		return true, 0
	}
	return false, b.until(-k.level)
}

// AdmitAll is Admit of every key at once: all are admitted, or wait is the longest wait of those
// that are not.
func (b *Buckets) AdmitAll(keys []string) (ok bool, wait time.Duration) {
	ok = true
	for _, k := range keys {
		if a, w := b.Admit(k); !a {
			ok, wait = false, max(wait, w)
		}
	}
	return ok, wait
}

// Charge takes n units of work from key's budget, into debt when it holds less; a negative n
// gives units back (work charged ahead that was not done), up to the burst.
func (b *Buckets) Charge(key string, n float64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if k, ok := b.get(key); ok {
		k.level = min(b.burst, k.level-n)
	}
}

// Take admits and charges at once, under one lock: when no key of amounts is in debt, each is
// charged its amount and ok is true; else nothing is charged and wait is the longest wait. Work
// charged ahead this way counts against requests that start while it is done.
func (b *Buckets) Take(amounts map[string]float64) (ok bool, wait time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	ok = true
	for key := range amounts {
		k, kept := b.get(key)
		switch {
		case !kept:
			ok, wait = false, max(wait, time.Second)
		case k.level < 0:
			ok, wait = false, max(wait, b.until(-k.level))
		}
	}
	if !ok {
		return false, wait
	}
	for key, n := range amounts {
		k, _ := b.get(key)
		k.level -= n
	}
	return true, 0
}

// Level is key's budget now: what it may still spend, negative while in debt.
func (b *Buckets) Level(key string) float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if k, ok := b.get(key); ok {
		return k.level
	}
	return 0
}

// get returns key's bucket refilled to now, making it when there is room. The caller holds mu.
func (b *Buckets) get(key string) (*bucket, bool) {
	now := b.now()
	k := b.keys[key]
	if k == nil {
		if len(b.keys) >= b.maxKeys {
			for name, o := range b.keys {
				if o.level+now.Sub(o.at).Seconds()*b.rate >= b.burst {
					delete(b.keys, name)
				}
			}
			if len(b.keys) >= b.maxKeys {
				return nil, false
			}
		}
		k = &bucket{level: b.burst, at: now}
		b.keys[key] = k
	}
	if now.After(k.at) {
		k.level = min(b.burst, k.level+now.Sub(k.at).Seconds()*b.rate)
		k.at = now
	}
	return k, true
}

// until is how long a refill of n units takes, rounded up to a millisecond.
func (b *Buckets) until(n float64) time.Duration {
	if b.rate <= 0 {
		return time.Hour
	}
	d := time.Duration(n / b.rate * float64(time.Second))
	return d.Truncate(time.Millisecond) + time.Millisecond
}
