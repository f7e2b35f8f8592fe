package aggregator

import (
	"cmp"
	"context"
	"sync"
	"time"
)

// Reading the next batch ahead.
//
// A batch stored in chunks (applyEncoded) reads and computes each chunk while Redis stores the one
// before, but its first chunk's read and computation and its last chunk's store overlap nothing:
// the processor waits for Redis, then Redis for the processor. When the batch after it is already
// decoded (the processor announced it, Upcoming), the last chunk's store overlaps the next batch's
// first chunk instead: its read and computation, for aggregates the last chunk does not write.
// Every chunk before the last is stored by then, so that read sees what this batch wrote; and
// store.lua writes a computed call only if nothing it read changed since, so a read that another
// writer, or this batch's refused calls run again by apply.lua, overtook costs that call a second
// run by apply.lua, never a wrong count.

// maxUpcoming is the most batches announced ahead that a store remembers: the processor decodes
// at most batch.max_in_flight (4 by default) ahead of the one it applies. A batch announced and
// never applied (its group generation ended) is forgotten once this many came after it.
const maxUpcoming = 16

// upcoming is a batch the processor announced (Upcoming), with the clock that gives it its time.
type upcoming struct {
	e   *Encoded
	now func() time.Time
}

// upcomingBatches is the queue of announced batches, in the order they will be applied. Guarded
// by its own mutex, not sealMu: the processor announces a batch while another is being applied.
type upcomingBatches struct {
	mu      sync.Mutex
	batches []upcoming
}

// add appends e, forgetting the oldest beyond maxUpcoming.
func (q *upcomingBatches) add(u upcoming) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.batches) == maxUpcoming {
		q.batches = append(q.batches[:0], q.batches[1:]...)
	}
	q.batches = append(q.batches, u)
}

// after returns the batch announced right after e and forgets e and every batch before it: they
// have been applied, or never will be. It returns false when e was not announced (a batch applied
// again, or encoded again for a new mode) or nothing follows it yet.
func (q *upcomingBatches) after(e *Encoded) (upcoming, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for i, u := range q.batches {
		if u.e != e {
			continue
		}
		q.batches = append(q.batches[:0], q.batches[i+1:]...)
		if len(q.batches) == 0 {
			return upcoming{}, false
		}
		return q.batches[0], true
	}
	return upcoming{}, false
}

// readAhead is the first chunk of a batch, read and computed while the batch before it was being
// stored: its calls (computeCalls), what the read found, and the time it was computed at, which
// the batch must be applied at for them to be used (ReadAt).
type readAhead struct {
	e         *Encoded
	mode      *applyMode
	at        time.Time
	keys      []Key // e's aggregates in the order its chunks take them: the first chunk's first
	computed  map[Key]*computedCall
	read, hit int
}

// Upcoming tells the store that e, which Encode made, is the next batch to be applied after every
// batch announced before it, and that now gives the time it will be applied at. The store may then
// read and compute part of e while it stores the batch before. A batch announced and then applied
// at another time, or not at all, costs the work ahead and nothing else.
func (r *Redis) Upcoming(e *Encoded, now func() time.Time) {
	if e == nil || now == nil || !r.cfg.ComputeCalls {
		return
	}
	r.upcoming.add(upcoming{e: e, now: now})
}

// ReadAt returns the time the store read part of e ahead at (Upcoming): applied at that time, e
// uses what was read; at another, e is read again. false when nothing of e was read ahead.
func (r *Redis) ReadAt(e *Encoded) (time.Time, bool) {
	r.sealMu.Lock()
	defer r.sealMu.Unlock()
	if a := r.ahead; a != nil && a.e == e {
		return a.at, true
	}
	return time.Time{}, false
}

// ReadsAhead returns how many batches were applied with their first chunk read ahead (Upcoming),
// and how many were read ahead and not: applied at another time, after another batch, in another
// mode, or not (yet) at all.
func (r *Redis) ReadsAhead() (used, unused int64) {
	used = r.aheadUsed.Load()
	return used, r.aheadMade.Load() - used
}

// takeAhead returns what was read ahead of e, if it was read in mode m for time at, and forgets
// whatever was read ahead. The caller holds sealMu.
func (r *Redis) takeAhead(e *Encoded, m *applyMode, at time.Time) *readAhead {
	a := r.ahead
	r.ahead = nil
	if a == nil || a.e != e || a.mode != m || !a.at.Equal(at) {
		return nil
	}
	r.aheadUsed.Add(1)
	return a
}

// readNextAhead reads and computes the first chunk of the batch announced after e, for aggregates
// the chunk being stored (writing) does not touch, and keeps it for that batch's ApplyEncoded. It
// runs while writing's pipeline is in Redis, and touches no state of r that sendChunk does. The
// caller holds sealMu; every chunk of e before writing has been stored.
func (r *Redis) readNextAhead(ctx context.Context, e *Encoded, m *applyMode, writing []Key) {
	next, ok := r.upcoming.after(e)
	if !ok || next.e.mode != m || next.e.err != nil || m.both || r.skipReads > 0 {
		return
	}
	busy := make(map[Key]bool, len(writing))
	for _, k := range writing {
		busy[k] = true
	}
	// The aggregates writing stores go last, so that the first chunk holds none of them when the
	// batch has enough others.
	keys := make([]Key, 0, len(next.e.keys))
	for _, k := range next.e.keys {
		if !busy[k] {
			keys = append(keys, k)
		}
	}
	for _, k := range next.e.keys {
		if busy[k] {
			keys = append(keys, k)
		}
	}
	ordered := *next.e
	ordered.keys = keys
	first := ordered.chunks(r.minChunk())[0]
	for _, k := range first.keys {
		if busy[k] {
			return
		}
	}
	at := next.now()
	computed, read, hit := r.computeCalls(ctx, first, at, m.fp != nil)
	if len(computed) == 0 {
		return // every call left to apply.lua, or the read failed: the batch reads again
	}
	r.aheadMade.Add(1)
	r.ahead = &readAhead{e: next.e, mode: m, at: at, keys: keys, computed: computed, read: read, hit: hit}
}

// minChunk is the fewest calls a chunk of a batch holds (Encoded.chunks).
func (r *Redis) minChunk() int { return cmp.Or(r.chunkCalls, minChunkCalls) }
