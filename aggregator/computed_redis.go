package aggregator

import (
	"context"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// stampMargin is how long before apply.lua would refresh an aggregate's TTL stamp the processor
// leaves the call to apply.lua: the processor's clock and Redis's may differ by this much before
// store.lua refuses calls for it.
const stampMargin = 5 // seconds

// computeCalls reads, in one pipelined round trip, what apply.lua would read for each call of e
// that the processor may compute, and computes those it can (computed.go). A call it does not
// compute, and every call when the read fails, is left to apply.lua: it is absent from the map.
func (r *Redis) computeCalls(ctx context.Context, e *Encoded, at time.Time) map[Key]*computedCall {
	ret, atUS := int64(r.cfg.Retention/time.Microsecond), Micros(at)
	span, ttl := groupSpan(ret), r.cfg.IdleTTL.Milliseconds()
	type read struct {
		k          Key
		plan       callRead
		recs       []string
		state, rec *redis.SliceCmd
	}
	var reads []read
	p := r.client.Pipeline()
	for _, k := range e.keys {
		args := e.args[k][headArgs:]
		n := len(args) / 2
		fields, recs := make([]string, n), make([]string, n)
		for i := range n {
			fields[i], _ = args[i].(string)
			recs[i], _ = args[n+i].(string)
		}
		plan, ok := planRead(fields, recs, span)
		if !ok {
			continue
		}
		keys := e.redis[k]
		reads = append(reads, read{k: k, plan: plan, recs: recs,
			state: p.HMGet(ctx, keys[1], plan.state...), rec: p.HMGet(ctx, keys[0], plan.records...)})
	}
	if len(reads) == 0 {
		return nil
	}
	if !r.storeLoaded.Load() {
		// Before the first store: a pipeline in which apply.lua runs and store.lua is missing
		// could only fail (applyEncoded).
		p.ScriptLoad(ctx, storeLua)
	}
	if _, err := p.Exec(ctx); err != nil {
		return nil
	}
	r.storeLoaded.Store(true)
	now := time.Now().Unix()
	out := make(map[Key]*computedCall, len(reads))
	for _, rd := range reads {
		state, present := values(rd.state.Val())
		held, heldPresent := values(rd.rec.Val())
		if len(state) != len(rd.plan.state) || len(held) != len(rd.plan.records) {
			continue
		}
		cc, ok := computeCall(rd.plan, state, present, held, heldPresent, rd.recs, ret, atUS, ttl)
		if !ok || (ttl > 0 && float64(now-cc.stamp+stampMargin) >= float64(ttl)/2000) {
			continue
		}
		cc.args = storeArgs(cc, rd.plan, state, present, held, heldPresent, ttl)
		out[rd.k] = cc
	}
	return out
}

// values splits an HMGET reply into its values and whether each field was present.
func values(got []any) ([]string, []bool) {
	vs, present := make([]string, len(got)), make([]bool, len(got))
	for i, v := range got {
		vs[i], present[i] = v.(string)
	}
	return vs, present
}

// storeArgs returns store.lua's arguments for call cc, computed from plan's fields as read.
func storeArgs(cc *computedCall, plan callRead, state []string, present []bool, held []string, heldPresent []bool, ttl int64) []any {
	args := make([]any, 0, 7+2*len(state)+2*len(held)+len(cc.state)+len(cc.records))
	args = append(args, strconv.FormatInt(ttl, 10), strconv.FormatInt(cc.stamp, 10),
		strconv.Itoa(len(state)), strconv.Itoa(len(held)), presence(present), presence(heldPresent))
	for _, f := range plan.state {
		args = append(args, f)
	}
	for _, v := range state {
		args = append(args, v)
	}
	for _, f := range plan.records {
		args = append(args, f)
	}
	for _, v := range held {
		args = append(args, v)
	}
	args = append(args, strconv.Itoa(len(cc.state)/2))
	args = append(args, cc.state...)
	return append(args, cc.records...)
}

// presence is store.lua's byte per field read: '1' present, '0' absent.
func presence(present []bool) string {
	b := make([]byte, len(present))
	for i, p := range present {
		b[i] = '0'
		if p {
			b[i] = '1'
		}
	}
	return string(b)
}

// ComputedCalls returns how many calls the processor computed that the store wrote, and how many
// it refused (their aggregates changed after they were read; apply.lua ran them).
func (r *Redis) ComputedCalls() (stored, refused int64) {
	return r.computedStored.Load(), r.computedRefused.Load()
}
