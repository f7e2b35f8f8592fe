package aggregator

import (
	"cmp"
	"context"
	"encoding/binary"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// stampMargin is how long before apply.lua would refresh an aggregate's TTL stamp the processor
// leaves the call to apply.lua: the processor's clock and Redis's may differ by this much before
// store.lua refuses calls for it.
const stampMargin = 5 // seconds

// skipAfterMiss is the most batches left unread after a batch in which the processor computed fewer
// than half the records it read of aggregates that exist: a call it reads and cannot compute costs
// a read for nothing, and a stream whose calls mostly leave the path (reassessments that move the
// winner in most calls) would pay one per call. Misses in a row leave 0, 1, 2, 4, then 7 batches
// unread: most misses pass with their batch (the minute's or hour's turn on aggregates another
// processor wrote last, in layout 10; the first batch on a store whose aggregates were idle for
// an hour of minutes or more), so one alone is no pattern. A fixed 7 after that first batch left
// 7 of a prefilled run's 20 to apply.lua, and 1 a twentieth of its calls. Records, not calls,
// are weighed: a long tail of aggregates with a record or two a minute, every one off the path at
// its minute's turn before the processor kept their minutes, would otherwise keep the few busy
// aggregates that carry most records off it too. A new aggregate's call is not counted: its next
// one is on the path. One batch in skipAfterMiss+1 still probes.
const skipAfterMiss = 7

// readNext reports whether the next batch's calls are read for the computation. The caller holds
// sealMu.
func (r *Redis) readNext() bool {
	if r.skipReads > 0 {
		r.skipReads--
		return false
	}
	return true
}

// readBatch records that a batch read read records of aggregates that exist, of which the calls
// it computed hold hit. The caller holds sealMu.
func (r *Redis) readBatch(read, hit int) {
	if read == 0 {
		return // only new aggregates, or nothing read: no sign either way
	}
	if 2*hit >= read {
		r.misses = 0
		return
	}
	r.misses++
	if r.misses > 1 {
		r.skipReads = min(1<<min(r.misses-2, 3), skipAfterMiss)
	}
}

// computeCalls reads, in one pipelined round trip, what apply.lua would read for each call of e
// that the processor may compute, and computes those it can (computed.go); it returns them, how
// many records it read of aggregates that exist (every record read when the read fails), and how
// many of those the calls it computed hold. A call it does not compute, and every call when the
// read fails, is left to apply.lua: it is absent from the map. In layout 11 (packed) the buckets
// a call reads depend on the store's shape in the head: they are read with the state under the
// shape the cache expects, and in a second round trip for a call whose head says another; the
// buckets the processor holds (bucketCache) are taken from there when the token and stamp read
// with the others are theirs, and read again in the second round trip otherwise.
func (r *Redis) computeCalls(ctx context.Context, e *Encoded, at time.Time, packed bool) (map[Key]*computedCall, int, int) {
	ret, atUS := int64(r.cfg.Retention/time.Microsecond), Micros(at)
	span, ttl := groupSpan(ret), r.cfg.IdleTTL.Milliseconds()
	type read struct {
		k          Key
		plan       *callRead
		fields     []any // the call's record fields, class and occurred times: planRead's
		class      []int8
		occ        []int64
		recs       []any
		state, rec *redis.Cmd
		store      *bucketStore
		names      []any          // layout 11: the bucket fields read
		guess      *packedShapeOf // layout 11: the shape the buckets were read under with the state
		// cached, in layout 11, holds buckets of the call taken from the bucket cache in place
		// of Redis, valid while the token and stamp read with the others are theirs; got is
		// then rec's reply with them in their places.
		cached *cachedStore
		got    []any
	}
	var reads []read
	p := r.client.Pipeline()
	for _, k := range e.keys {
		args := e.args[k][headArgs:]
		n := len(args) / 2
		class, occ := make([]int8, n), make([]int64, n)
		for j, i := range e.groups[k] {
			class[j], occ[j] = classIndex(e.obs[i].Class), e.obs[i].Occurred
		}
		since, ok := r.sums[k]
		if !ok {
			since = -1
		}
		plan, ok := planRead(args[:n], class, occ, span, atUS, packed, since)
		if !ok {
			continue
		}
		keys := e.redis[k]
		state := append(append(make([]any, 0, 2+len(plan.state)), "hmget", keys[1]), plan.state...)
		rd := read{k: k, plan: plan, fields: args[:n], class: class, occ: occ, recs: args[n:], state: p.Do(ctx, state...)}
		if !packed {
			rd.rec = p.Do(ctx, append(append(make([]any, 0, 2+n), "hmget", keys[0]), plan.records...)...)
		} else if shape, ok := r.shapes[k]; ok {
			rd.store, rd.names = bucketRead(plan.records, shape, int64(n))
			rd.guess = &shape
			names := rd.names
			if cs := r.buckets.at(k); cs != nil {
				rd.cached, names = cs, cs.uncached(rd.store)
			}
			rd.rec = p.Do(ctx, bucketsRead(keys[2], names)...)
		}
		reads = append(reads, rd)
	}
	if len(reads) == 0 {
		return nil, 0, 0
	}
	all := 0
	for _, rd := range reads {
		all += len(rd.recs)
	}
	if !r.storeLoaded.Load() {
		// Before the first store: a pipeline in which apply.lua runs and store.lua is missing
		// could only fail (applyEncoded). On every primary of a cluster.
		if err := storeScript.Load(ctx, r.client).Err(); err != nil {
			return nil, all, 0 // the next batches go unread, not each held up by a load
		}
		r.storeLoaded.Store(true)
	}
	if _, err := p.Exec(ctx); err != nil {
		return nil, all, 0
	}
	if packed {
		// The buckets of each call's fingerprints and those its new records could split, under
		// the shape its head says: read with the state when the cache guessed that shape, and in
		// a second round trip otherwise.
		var again redis.Pipeliner
		// readAgain reads every bucket of rd's call under shape in the second round trip. When
		// head, as read, has the window sums for one of the 59 minutes before the call's other
		// than the one the call planned for (this processor has not met the aggregate since it
		// started, or another wrote it last), the call plans its read from that minute and
		// reads its state again too, which store.lua checks as any other.
		readAgain := func(rd *read, shape packedShapeOf, head string) {
			r.buckets.drop(rd.k)
			rd.cached = nil
			r.secondReads.Add(1)
			if again == nil {
				again = r.client.Pipeline()
			}
			if since, M := cachedMinute(head), floorDiv(atUS, minuteUS); since >= 0 && since != rd.plan.shiftFrom && since < M && M-since < 60 {
				if plan, ok := planRead(rd.fields, rd.class, rd.occ, span, atUS, true, since); ok {
					rd.plan = plan
					rd.state = again.Do(ctx, append(append(make([]any, 0, 2+len(plan.state)), "hmget", e.redis[rd.k][1]), plan.state...)...)
				}
			}
			rd.store, rd.names = bucketRead(rd.plan.records, shape, int64(len(rd.recs)))
			rd.rec = again.Do(ctx, bucketsRead(e.redis[rd.k][2], rd.names)...)
			r.bucketsRead.Add(int64(len(rd.names)))
		}
		for i := range reads {
			rd := &reads[i]
			var h string
			if head, _ := rd.state.Val().([]any); len(head) > 0 {
				h, _ = head[0].(string)
			}
			l, sp, sn, ok := packedShape(h)
			if !ok {
				rd.rec = nil
				delete(r.shapes, rd.k)
				r.buckets.drop(rd.k)
				continue
			}
			shape := packedShapeOf{l, sp, sn}
			r.shapes.put(rd.k, shape)
			if rd.guess == nil || *rd.guess != shape {
				readAgain(rd, shape, h)
				continue
			}
			if rd.cached == nil {
				r.bucketsRead.Add(int64(len(rd.names)))
				continue
			}
			// The cached buckets stand when the token and stamp read with the others are
			// theirs; otherwise every bucket is read again.
			got, err := rd.rec.Slice()
			if err != nil {
				continue // the computation leaves the call to apply.lua
			}
			read, token, stamp, whole := bucketsReply(got)
			r.bucketsRead.Add(int64(len(read)))
			if whole && token == any(rd.cached.token) && stamp == any(rd.cached.stamp) {
				if rd.got, whole = rd.cached.reply(rd.store, read, token, stamp); whole {
					r.bucketsCached.Add(int64(len(rd.store.buckets) - len(read)))
					continue
				}
			}
			readAgain(rd, shape, h)
		}
		if again != nil {
			if _, err := again.Exec(ctx); err != nil {
				return nil, all, 0
			}
		}
	}
	now := time.Now().Unix()
	// compute is one call's computation: pure (its read, its plan, its bucket store), so that calls
	// are computed side by side. The new aggregate's records are not counted as existing.
	compute := func(rd *read) (cc *computedCall, fresh bool) {
		state, err := rd.state.Slice()
		if err != nil || len(state) != len(rd.plan.state) {
			return nil, false
		}
		if state[0] == nil {
			return nil, true // a new aggregate: apply.lua creates it
		}
		if rd.rec == nil {
			return nil, false // layout 11, a head no call of the path reads
		}
		got, err := rd.got, error(nil)
		if got == nil {
			if got, err = rd.rec.Slice(); err != nil {
				return nil, false
			}
		}
		// held is each record's value as the call meets it first; store.lua checks the record
		// fields read: in layout 11 the bucket fields and the buckets' token and write stamp,
		// read with them, or under a head with a write count the token and stamp alone, in
		// their place.
		fields, held := rd.plan.records, got
		var token, written any
		if rd.store != nil {
			// The buckets were named under the shape of the head read first; a call that read
			// its state again (readAgain) may have met another writer's head in between, whose
			// records the buckets read may not hold: apply.lua runs it.
			h, _ := state[0].(string)
			if l, p, n, ok := packedShape(h); !ok || (packedShapeOf{l, p, n}) != (packedShapeOf{rd.store.l, rd.store.p, rd.store.n}) {
				return nil, false
			}
			var ok bool
			if got, token, written, ok = bucketsReply(got); !ok {
				return nil, false
			}
			if held, ok = packedHeld(rd.store, got, rd.plan.records); !ok {
				return nil, false
			}
			fields = rd.names
		}
		if len(got) != len(fields) {
			return nil, false
		}
		cc, ok := computeCall(rd.plan, state, held, rd.recs, ret, atUS, ttl, rd.store)
		if !ok || (ttl > 0 && float64(now-cc.stamp+stampMargin) >= float64(ttl)/2000) {
			return nil, false
		}
		if rd.store != nil {
			// The token and the stamp are checked with the fields read, the stamp last, so that
			// store.lua makes a new one whenever the call writes a bucket: also under a head
			// without the count, which the call leaves with it. A call that writes a bucket
			// writes a new token with it.
			if h, _ := state[0].(string); len(h) == headBytesWC {
				fields, got = []any{bucketsToken, bucketsWritten}, []any{token, written}
			} else {
				fields, got = append(fields[:len(fields):len(fields)], bucketsToken, bucketsWritten), append(got, token, written)
			}
			if len(cc.records) > 0 || len(cc.deletes) > 0 {
				cc.token = r.tokens()
				cc.records = append(cc.records, bucketsToken, cc.token)
			}
		}
		cc.args = storeArgs(cc, rd.plan.state, state, fields, got, ttl)
		if rd.store != nil {
			cc.shape = &packedShapeOf{rd.store.l, rd.store.p, rd.store.n}
			// The buckets as the call leaves them are cached once it is stored (bucketCache),
			// under a token and stamp one computed call wrote together: this call's, or those
			// of cached buckets it took. A call that writes no bucket may have read a stamp
			// apply.lua made beside an older call's token, a pair a lost write can repeat.
			cc.readToken, _ = token.(string)
			if stamp, ok := written.(string); ok && (cc.token != "" || rd.got != nil && cc.readToken != "") {
				cc.buckets, cc.readStamp, cc.token = rd.store, stamp, cmp.Or(cc.token, cc.readToken)
			}
		}
		return cc, false
	}
	type result struct {
		cc    *computedCall
		fresh bool
	}
	results := make([]result, len(reads))
	inParallel(len(reads), all, cmp.Or(r.parallelFrom, minParallelRecords), func(i int) {
		cc, fresh := compute(&reads[i])
		results[i] = result{cc, fresh}
	})
	out := make(map[Key]*computedCall, len(reads))
	existing, hit := all, 0
	for i, rd := range reads {
		switch res := results[i]; {
		case res.fresh:
			existing -= len(rd.recs)
		case res.cc != nil:
			out[rd.k] = res.cc
			hit += len(rd.recs)
		}
	}
	return out, existing, hit
}

// BucketReads returns how many buckets layout-11 calls read from Redis for the processor's
// computation, and how many they took from the bucket cache in their place (bucketCache).
func (r *Redis) BucketReads() (read, cached int64) {
	return r.bucketsRead.Load(), r.bucketsCached.Load()
}

// BucketCache returns the bytes the bucket cache holds (RedisConfig.BucketCacheBytes bounds them),
// and how many aggregates' buckets it has forgotten to make room: a count that keeps rising says
// the aggregates in use need more than the bound, and their calls read their buckets again.
func (r *Redis) BucketCache() (held, evicted int64) {
	return r.buckets.held.Load(), r.buckets.evicted.Load()
}

// minParallelRecords is the fewest records a chunk's calls hold for computeCalls to compute them on
// more than one goroutine: below it a goroutine's start costs more than the computation it takes
// over.
const minParallelRecords = 256

// inParallel calls do(i) for each i in [0, n), on up to GOMAXPROCS goroutines when the calls hold
// at least from records, and returns once every call has returned. The apply stage runs one batch
// at a time and waits for these computations, so on a machine with a core to spare they shorten it.
func inParallel(n, records, from int, do func(int)) {
	workers := min(runtime.GOMAXPROCS(0), n)
	if records < from || workers < 2 {
		for i := range n {
			do(i)
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				do(i)
			}
		})
	}
	wg.Wait()
}

// bucketsRead is the command that reads a layout-11 call's buckets, names, from the packed store
// key, and after them the token of the computed call that last wrote them and their write stamp:
// in one command, so that the token and stamp are those the buckets were read under.
func bucketsRead(key string, names []any) []any {
	return append(append(append(make([]any, 0, 4+len(names)), "hmget", key), names...), bucketsToken, bucketsWritten)
}

// bucketsReply splits the reply to bucketsRead into the buckets read and the token and stamp read
// after them, or reports false for a reply too short to hold the two.
func bucketsReply(got []any) (buckets []any, token, stamp any, ok bool) {
	n := len(got)
	if n < 2 {
		return nil, nil, nil, false
	}
	return got[:n-2], got[n-2], got[n-1], true
}

// newToken returns a computed call's token (bucketsToken): 8 random bytes.
func newToken() string {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], rand.Uint64())
	return string(b[:])
}

// absent is what store.lua is sent for a field read absent (with '0' in its presence string).
var absent any = ""

// storeArgs returns store.lua's arguments for call cc, computed from the state and record fields
// it read (HMGET replies: nil for an absent field).
func storeArgs(cc *computedCall, stateFields, state, recordFields, held []any, ttl int64) []any {
	args := make([]any, 0, 9+2*len(state)+2*len(held)+len(cc.state)+len(cc.unset)+len(cc.deletes)+len(cc.records))
	args = append(args, strconv.FormatInt(ttl, 10), strconv.FormatInt(cc.stamp, 10),
		strconv.Itoa(len(state)), strconv.Itoa(len(held)), presence(state), presence(held))
	args = append(args, stateFields...)
	for _, v := range state {
		if v == nil {
			v = absent
		}
		args = append(args, v)
	}
	args = append(args, recordFields...)
	for _, v := range held {
		if v == nil {
			v = absent
		}
		args = append(args, v)
	}
	args = append(args, strconv.Itoa(len(cc.state)/2))
	args = append(args, cc.state...)
	args = append(args, strconv.Itoa(len(cc.unset)))
	args = append(args, cc.unset...)
	args = append(args, strconv.Itoa(len(cc.deletes)))
	args = append(args, cc.deletes...)
	return append(args, cc.records...)
}

// presence is store.lua's byte per field read: '1' present, '0' absent.
func presence(got []any) string {
	b := make([]byte, len(got))
	for i, v := range got {
		b[i] = '0'
		if v != nil {
			b[i] = '1'
		}
	}
	return string(b)
}

// ComputedCalls returns how many calls the processor computed that the store wrote, and how many
// it did not (their aggregates changed after they were read, the TTL stamp fell due, or Redis had
// lost store.lua; apply.lua ran them).
func (r *Redis) ComputedCalls() (stored, refused int64) {
	return r.computedStored.Load(), r.computedRefused.Load()
}

// ComputedCallsLeft returns how many calls apply.lua ran with the computation on because the
// processor did not compute them: calls off the path (planned or read, then found off it), and
// calls of the batches the read gate left unread (readBatch).
// With ComputedCalls it gives the share of calls computed.
func (r *Redis) ComputedCallsLeft() (offPath, unread int64) {
	return r.offPath.Load(), r.unread.Load()
}
