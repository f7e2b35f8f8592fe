package aggregator

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/repeatrate/repeatrate/internal/testenv"
)

// Edge-case tests of state layout 9 (apply.lua, docs/semantics.md#retention and #delivery): the id
// index lives per index group of G hours (G = an eighth of the retention, 1 to 24, fixed in the
// head when the aggregate is created), every hour with winners keeps exact bounds (rescanned from
// its group's index when a bound holder leaves), a group counts its entries n and the entries
// moves may have left behind x and is compacted when 2x >= n + 64, and records whose horizon
// expired read as absent at once but are deleted only once their horizon's whole group expired.
//
// Every sequence runs against the model (retainedRig: outcomes and tallies after every batch, retainedRig.check
// of the stored state) and against groupsRig.inspect, which checks what retainedRig.check does with the head's
// span given explicitly (so that it still applies after the retention changed) and more:
//   - every stored record, garbage included, is listed under its horizon's group (otherwise
//     garbage collection never finds it);
//   - for every group not wholly expired: x is at least the entries listed without a reason (winner
//     or horizon in the group), 2x <= n + 64 (the compaction trigger was honoured), and so the
//     group lists at most 2·(ids with a reason) + 64 entries: the index stays proportional.

// groupsSpan mirrors apply.lua's G: an eighth of the retention in whole hours, from 1 to 255.
func groupsSpan(ret time.Duration) int64 { return retainedSpan(int64(ret / time.Microsecond)) }

// groupsRig wraps retainedRig with the span the head must keep and the extra invariants of layout 9.
type groupsRig struct {
	*retainedRig
	span  int64
	full  bool                    // also run retainedRig.check (it wants the span of the current retention)
	prevN map[Key]map[int64]int64 // n of each retained group at the last inspection: compaction seen
	// prev: the store runs the apply.lua of REPEATRATE_SCRIPT_PREV (another layout): only
	// outcomes and tallies are compared with the model, the stored state is not inspected.
	prev bool
}

// newGroupsRig is newRetainedRig with layout 9's checks. With REPEATRATE_SCRIPT_PREV=<revision> set, its store
// runs that revision's apply.lua instead (a client hook swaps the script), to tell which failures
// a change brought: then only outcomes and tallies are held to the model.
func newGroupsRig(t *testing.T, c *redis.Client, what string, retention time.Duration) *groupsRig {
	y := &groupsRig{span: groupsSpan(retention), full: true, prevN: map[Key]map[int64]int64{}}
	if testenv.ScriptPrevCommit() != "" {
		_, pc, _, _ := testenv.ScriptClients(t, c.Options().Addr, applySource, testenv.ScriptPrevSource(t, "aggregator/apply.lua"))
		c, y.prev, y.full = pc, true, false
	}
	y.retainedRig = newRetainedRig(t, c, what, retention)
	return y
}

// groupsNoPrev skips a test that compares stored bytes of this layout (pairs of servers) when the
// store would run another revision's script.
func groupsNoPrev(t *testing.T) {
	if testenv.ScriptPrevCommit() != "" {
		t.Skip("compares stored state of layout 9 on two servers: not run against REPEATRATE_SCRIPT_PREV")
	}
}

func wrapGroupsRig(x *retainedRig, span int64) *groupsRig {
	return &groupsRig{retainedRig: x, span: span, full: true, prevN: map[Key]map[int64]int64{}}
}

// apply applies a batch to store and model (retainedRig.apply when full, the same without retainedRig.check
// otherwise), inspects every aggregate it touched, and counts what the batch did to the model's
// records: winners that crossed a group boundary (and came back below their horizon's group),
// horizons that grew into another group, identities re-created over a garbage record.
func (y *groupsRig) apply(what string, batch []Observation, at time.Time) Applied {
	y.t.Helper()
	snap := y.snapshot(batch)
	var got Applied
	if y.full {
		got = y.retainedRig.apply(what, batch, at)
	} else {
		got = y.applyUnchecked(what, batch, at)
	}
	for _, k := range got.Keys {
		y.inspect(what, k)
	}
	y.count(snap, batch, got.Outcomes)
	return got
}

type groupsKey struct {
	k  Key
	id string
}

// groupsSnap is what the model held, and the store kept, of a batch's opportunities before it.
type groupsSnap struct {
	before map[groupsKey]record
	stored map[groupsKey]string
}

func (y *groupsRig) snapshot(batch []Observation) groupsSnap {
	ctx := context.Background()
	s := groupsSnap{before: map[groupsKey]record{}, stored: map[groupsKey]string{}}
	for _, o := range batch {
		kk := groupsKey{o.Key, o.OpportunityID}
		if a := y.m.aggs[o.Key]; a != nil {
			if r, ok := a.opps[o.OpportunityID]; ok {
				s.before[kk] = r
			}
		}
		if v, err := y.c.HGet(ctx, y.s.keys(o.Key)[0], retainedField(o.OpportunityID)).Result(); err == nil {
			s.stored[kk] = v
		}
	}
	return s
}

// count records what the batch did to the model's records (winners that crossed a group boundary,
// and came back below their horizon's group; horizons that grew into another group) and, given
// the outcomes, identities re-created over a garbage record.
func (y *groupsRig) count(s groupsSnap, batch []Observation, outs []Outcome) {
	grp := func(us int64) int64 { return floorDiv(floorDiv(us, hourUS), y.span) }
	done := map[groupsKey]bool{}
	for j, o := range batch {
		kk := groupsKey{o.Key, o.OpportunityID}
		if outs != nil && outs[j] == Counted {
			_, held := s.before[kk]
			if v, ok := s.stored[kk]; ok && !held {
				if _, occ, _, _, hz, err := retainedRecord(v); err == nil {
					y.seen["re-created over garbage"]++
					if g := grp(o.Occurred); g == grp(occ) || g == grp(hz) {
						y.seen["re-created in its garbage's group"]++
					} else {
						y.seen["re-created in another group"]++
					}
				}
			}
		}
		if done[kk] {
			continue
		}
		done[kk] = true
		a := y.m.aggs[o.Key]
		r, ok := a.opps[o.OpportunityID]
		b, was := s.before[kk]
		if !ok || !was {
			continue
		}
		if grp(r.occ) != grp(b.occ) {
			y.seen["winner crossed groups"]++
			if grp(r.occ) < grp(b.occ) && grp(r.horizon) != grp(r.occ) {
				y.seen["winner back below its horizon's group"]++
			}
		}
		if r.occ == b.occ && r.assessed == b.assessed && grp(r.horizon) != grp(b.horizon) {
			y.seen["horizon grew into another group"]++
		}
	}
}

// applyUnchecked is retainedRig.apply without retainedRig.check (inspect checks the state instead).
func (y *groupsRig) applyUnchecked(what string, batch []Observation, at time.Time) Applied {
	y.t.Helper()
	return y.retainedRig.applyChecked(what, batch, at, false)
}

// again applies a batch once more: it must change nothing, not even a version.
func (y *groupsRig) again(what string, batch []Observation, at time.Time) {
	y.t.Helper()
	y.retainedRig.againWith(what, batch, at, y.apply)
}

// deliver is retainedRig.deliver through groupsRig's apply: batches, now and then retried at once, or every
// batch since the last commit redelivered in order.
func (y *groupsRig) deliver(r *rand.Rand, next func(i int) ([]Observation, time.Time)) time.Time {
	y.t.Helper()
	apply := func(what string, b []Observation, at time.Time) { y.apply(what, b, at) }
	return retainedDeliverWith(r, y.seen, apply, y.again, next)
}

// collect is retainedRig.collect with the head's span: expired probes until no record whose horizon's
// group wholly expired, no field of an expired hour or group, no expired group in the sorted set.
func (y *groupsRig) collect(k Key, at time.Time, rounds int) {
	y.t.Helper()
	ctx := context.Background()
	a := y.m.aggs[k]
	cutH := floorDiv(a.cut, hourUS)
	cutG := floorDiv(cutH, y.span)
	for i := 0; i < rounds; i++ {
		y.apply("collect", []Observation{{Key: k, OpportunityID: "expired-probe", Class: Passed, Occurred: 0, Assessed: 0}}, at)
		keys := y.s.keys(k)
		garbage := 0
		for _, v := range y.c.HGetAll(ctx, keys[0]).Val() {
			if _, _, _, _, hz, _ := retainedRecord(v); floorDiv(floorDiv(hz, hourUS), y.span) < cutG {
				garbage++
			}
		}
		stale := 0
		for f := range y.c.HGetAll(ctx, keys[1]).Val() {
			if strings.HasPrefix(f, "h") || strings.HasPrefix(f, "i") {
				n, _ := strconv.ParseInt(strings.SplitN(f[1:], ".", 2)[0], 10, 64)
				if (f[0] == 'h' && n < cutH) || (f[0] == 'i' && n < cutG) {
					stale++
				}
			}
		}
		low := y.c.ZRangeByScore(ctx, keys[3], &redis.ZRangeBy{Min: "-inf", Max: "(" + strconv.FormatInt(cutG, 10)}).Val()
		if garbage == 0 && stale == 0 && len(low) == 0 {
			y.seen["collected"]++
			return
		}
		if i == rounds-1 {
			y.t.Fatalf("after %d batches, %d garbage records, %d fields of expired hours or groups, expired groups listed %v", rounds, garbage, stale, low)
		}
	}
}

// inspect checks aggregate k's stored state against the model with the span y.span: records,
// hours (counts and exact bounds), head (span, counts, first and last, lowest listed group), and
// the index (see the file comment).
func (y *groupsRig) inspect(what string, k Key) {
	if y.prev {
		return
	}
	x := y.retainedRig
	t := x.t
	t.Helper()
	ctx := context.Background()
	keys := x.s.keys(k)
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("%s, %s (span %d): %s\n%s", what, k, y.span, fmt.Sprintf(format, args...), x.history(3))
	}
	recs := x.c.HGetAll(ctx, keys[0]).Val()
	st := x.c.HGetAll(ctx, keys[1]).Val()
	zs, err := x.c.ZRangeWithScores(ctx, keys[3], 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	a := x.m.aggs[k]
	if a == nil {
		return
	}
	span := y.span
	grp := func(us int64) int64 { return floorDiv(floorDiv(us, hourUS), span) }
	cutH := floorDiv(a.cut, hourUS)
	cut := cutH * hourUS
	cutG := floorDiv(cutH, span)

	head, ok := st["H"]
	if !ok {
		fail("no head")
	}
	hx, err := headNumbers(head)
	if err != nil {
		fail("%v", err)
	}
	if int64(head[1]) != span {
		fail("head keeps the index group span %d hours, want %d", head[1], span)
	}

	// Records: every identity the model holds is stored as it holds it; every other is garbage.
	type rec struct{ occ, hz int64 }
	stored := map[string]rec{}
	for f, v := range recs {
		_, occ, _, _, hz, err := retainedRecord(v)
		if err != nil {
			fail("record %q: %v", f, err)
		}
		stored[f] = rec{occ, hz}
	}
	live := map[string]record{}
	for id, r := range a.opps {
		if r.horizon < cut {
			continue
		}
		f := retainedField(id)
		live[f] = r
		v, ok := recs[f]
		if !ok {
			fail("the record of %q (%+v), a retained identity, is missing", id, r)
		}
		cls, occ, asd, seq, hz, _ := retainedRecord(v)
		if cls != classCode(r.class) || occ != r.occ || asd != r.assessed || seq != r.seq || hz != r.horizon {
			fail("record of %q is %q, the model holds %+v", id, v, r)
		}
	}
	for f, s := range stored {
		if _, ok := live[f]; ok {
			continue
		}
		if s.hz >= cut {
			fail("record %q = %q has a retained horizon, but the model holds no such identity", f, recs[f])
		}
		x.seen["garbage"]++
		if grp(s.hz) >= cutG {
			x.seen["garbage in a group not wholly expired"]++
		}
	}

	// Hours against the model.
	type mhour struct{ c, p, u, lo, hi int64 }
	mh := map[int64]*mhour{}
	var first, last, retained int64
	for _, r := range a.opps {
		if r.occ < cut {
			continue
		}
		h := r.occ / hourUS
		m := mh[h]
		if m == nil {
			m = &mhour{lo: r.occ, hi: r.occ}
			mh[h] = m
		}
		switch r.class {
		case Confirmed:
			m.c++
		case Passed:
			m.p++
		default:
			m.u++
		}
		m.lo, m.hi = min(m.lo, r.occ), max(m.hi, r.occ)
		if retained == 0 || r.occ < first {
			first = r.occ
		}
		if retained == 0 || r.occ > last {
			last = r.occ
		}
		retained++
	}
	groups := map[int64]retainedGroup{}
	chunks := map[int64]map[int64]string{}
	hours := map[int64]bool{}
	for f, v := range st {
		if f == "H" || f == "v" || f == "enc" || strings.HasPrefix(f, "m") {
			continue
		}
		ns, is, isChunk := strings.Cut(f[1:], ".")
		n, err := strconv.ParseInt(ns, 10, 64)
		if err != nil || (f[0] != 'h' && f[0] != 'i') || (isChunk && f[0] == 'h') {
			fail("unknown state field %q", f)
		}
		switch {
		case isChunk:
			i, err := strconv.ParseInt(is, 10, 64)
			if err != nil || i < 1 {
				fail("state field %q", f)
			}
			if chunks[n] == nil {
				chunks[n] = map[int64]string{}
			}
			chunks[n][i] = v
		case f[0] == 'h':
			hv, err := retainedParseHour(v)
			if err != nil {
				fail("%s: %v", f, err)
			}
			m := mh[n]
			if m == nil {
				fail("hour %d (cut %d) holds no winner in the model but is stored as %+v", n, cutH, hv)
			}
			start := n * hourUS
			exact := hv.a == m.lo-start && hv.b == m.hi-start
			holds := hv.a <= m.lo-start && hv.b >= m.hi-start && hv.b < hourUS
			if hv.c != m.c || hv.p != m.p || hv.u != m.u || (!hv.loose && !exact) || !holds {
				fail("hour %d stored as %+v, the model holds %d,%d,%d bounds [%d, %d]", n, hv, m.c, m.p, m.u, m.lo-start, m.hi-start)
			}
			hours[n] = true
		default:
			gv, err := retainedParseGroup(v)
			if err != nil {
				fail("%s: %v", f, err)
			}
			groups[n] = gv
		}
	}
	for h := range mh {
		if !hours[h] {
			fail("hour %d holds winners in the model and has no field", h)
		}
	}

	// The index.
	members := map[int64]bool{}
	for _, z := range zs {
		g, err := strconv.ParseInt(z.Member.(string), 10, 64)
		if err != nil || float64(g) != z.Score {
			fail("groups set member %v", z)
		}
		members[g] = true
	}
	listed := map[int64]map[string]bool{}
	var prev map[int64]int64
	if y.prevN[k] == nil {
		y.prevN[k] = map[int64]int64{}
	}
	prev = y.prevN[k]
	for g, gv := range groups {
		var ents []string
		for i := int64(1); i <= gv.k; i++ {
			c, ok := chunks[g][i]
			if !ok {
				fail("index group %d counts %d closed chunks but i%d.%d is missing", g, gv.k, g, i)
			}
			es, err := retainedEntries(c)
			if err != nil {
				fail("index group %d chunk %d: %v", g, i, err)
			}
			if len(es) == 0 {
				fail("index group %d: closed chunk %d is empty", g, i)
			}
			ents = append(ents, es...)
		}
		es, err := retainedEntries(gv.open)
		if err != nil {
			fail("index group %d open chunk: %v", g, err)
		}
		ents = append(ents, es...)
		if len(ents) == 0 {
			fail("index group %d lists nothing but is stored", g)
		}
		if gv.k > 0 {
			x.seen["closed chunks"]++
		}
		if !members[g] {
			fail("index group %d lists ids but is not in the sorted set of groups", g)
		}
		set := map[string]bool{}
		for _, e := range ents {
			set[e] = true
		}
		listed[g] = set
		if g < cutG {
			continue // wholly expired: left to garbage collection, its counts no longer kept
		}
		keep := 0
		for f := range set {
			if s, ok := stored[f]; ok && (grp(s.occ) == g || grp(s.hz) == g) {
				keep++
			}
		}
		n := int64(len(ents))
		if gv.n != n || gv.x > gv.n {
			fail("index group %d counts n=%d x=%d, lists %d", g, gv.n, gv.x, n)
		}
		if gv.x < n-int64(keep) {
			fail("index group %d counts x=%d entries left behind, but %d of its %d entries have no reason to be there (%d ids with one): compaction would come too late", g, gv.x, n-int64(keep), n, keep)
		}
		if 2*gv.x > gv.n+64 {
			fail("index group %d: 2x = %d > n + 64 = %d after a batch: the compaction trigger was missed", g, 2*gv.x, gv.n+64)
		}
		if n > 2*int64(keep)+64 {
			fail("index group %d lists %d entries for %d ids with a reason: not proportional", g, n, keep)
		}
		if p, ok := prev[g]; ok && n < p {
			x.seen["compacted"]++
		}
		if n-int64(keep) > 0 {
			x.seen["entries left behind"]++
		}
		prev[g] = n
	}
	for g, cs := range chunks {
		for i := range cs {
			if gv, ok := groups[g]; !ok || i > gv.k {
				fail("chunk i%d.%d is stored beyond the group's closed chunks", g, i)
			}
		}
	}
	for g := range prev {
		if _, ok := groups[g]; !ok {
			if g >= cutG {
				x.seen["compacted"]++ // compacted to nothing
			}
			delete(prev, g)
		}
	}
	// Every stored record is listed under its horizon's group, garbage included (else garbage
	// collection never meets it); every retained winner under its hour's group.
	for f, s := range stored {
		if !listed[grp(s.hz)][f] {
			fail("record %q (occ %d, horizon %d, cut %d) is not listed under its horizon's group %d: never collected or found", f, s.occ, s.hz, cut, grp(s.hz))
		}
		if s.occ >= cut && !listed[grp(s.occ)][f] {
			fail("retained winner %q (occ %d) is not listed under its hour's group %d", f, s.occ, grp(s.occ))
		}
	}
	// Head.
	opt := func(i int) (int64, bool) { return hx[i] - 1, hx[i] > 0 }
	if hw, ok := opt(0); !ok || hw != a.watermark {
		fail("head watermark %d, model %d", hw, a.watermark)
	}
	hf, okf := opt(2)
	hl, okl := opt(3)
	if retained > 0 && (!okf || !okl || hf != first || hl != last) {
		fail("head first/last %d %v, %d %v; the model's %d, %d", hf, okf, hl, okl, first, last)
	}
	if retained == 0 && (okf || okl) {
		fail("nothing retained, yet the head keeps first/last %d, %d", hf, hl)
	}
	var mc, mp, mu int64
	for _, m := range mh {
		mc, mp, mu = mc+m.c, mp+m.p, mu+m.u
	}
	if hx[8] != mc || hx[9] != mp || hx[10] != mu {
		fail("head counts %d,%d,%d, model %d,%d,%d", hx[8], hx[9], hx[10], mc, mp, mu)
	}
	if len(zs) > 0 {
		lowest, _ := strconv.ParseInt(zs[0].Member.(string), 10, 64)
		if g, ok := opt(7); !ok || g != lowest {
			fail("head's lowest listed group %d %v, the sorted set's lowest %d", g, ok, lowest)
		}
	}
}

// groupsID is opportunity i's id: some look like state fields or index entries ("i1", "h3", "001a",
// "i1.2"), some carry separators or NUL, some are long (entries close index chunks).
func groupsID(i int) string {
	switch i % 9 {
	case 0:
		return fmt.Sprintf("i%d", i)
	case 1:
		return fmt.Sprintf("i%d.%d", i, i%3+1)
	case 2:
		return fmt.Sprintf("\x00%d\x00", i)
	case 3:
		return fmt.Sprintf("%03x%s", i%16, ".")
	case 4:
		return fmt.Sprintf("%d-%s", i, strings.Repeat("long", 40)) // 160+ bytes
	case 5:
		return fmt.Sprintf("h%d;,|", i)
	default:
		return fmt.Sprintf("g%03d", i)
	}
}

// groupsNear returns an occurred time near a boundary of span-hour groups: the start of the group
// holding hour h or of the next, moved by up to two hours either way, at an hour's edge or inside.
func groupsNear(r *rand.Rand, h, span int64) int64 {
	b := floorDiv(h, span) * span
	if r.IntN(2) == 0 {
		b += span
	}
	b += int64(r.IntN(5) - 2)
	return b*hourUS + retainedOffset(r)
}

// ---------------------------------------------------------------------------------------------

// TestIDIndexSpansRandomStreams runs random streams under retentions that give G = 1, 2, 3, 5,
// 23 and 24 (and one of no whole hours): occurred times straddle group boundaries all across the retained range (near the cut
// too, so that hours expire while their group does not), winners move across groups and back
// below their horizon's group, horizons grow into other groups (stale assessments dated later),
// duplicates, stale and expired events, identities re-created over garbage records, watermark
// steps of an hour, a group and past everything; batches are retried and redelivered. After the
// stream, garbage collection must take every wholly expired group.
func TestIDIndexSpansRandomStreams(t *testing.T) {
	total := map[string]int{}
	for _, tc := range []struct {
		ret      time.Duration
		seed     uint64
		embedded bool
	}{
		{8 * time.Hour, 1, true}, {16 * time.Hour, 2, false}, {24 * time.Hour, 3, true}, {40 * time.Hour, 4, false},
		{184 * time.Hour, 5, false}, {30 * 24 * time.Hour, 6, true},
		{47*time.Hour + 30*time.Minute, 7, false}, // not whole hours: G = 5
	} {
		t.Run(tc.ret.String(), func(t *testing.T) {
			retainedBackends(t, tc.embedded, func(t *testing.T, c *redis.Client) {
				seen := groupsRunSpan(t, c, tc.ret, tc.seed, 140)
				for k, v := range seen {
					total[k] += v
				}
			})
		})
	}
	t.Logf("seen over all spans: %v", total)
	if testenv.ScriptPrevCommit() != "" {
		return // the stored state was not inspected: nothing seen
	}
	for _, want := range []string{"winner crossed groups", "winner back below its horizon's group", "horizon grew into another group",
		"garbage in a group not wholly expired", "re-created in its garbage's group", "re-created in another group",
		"compacted", "closed chunks", "entries left behind", "collected", "redelivered"} {
		if total[want] == 0 {
			t.Errorf("no stream reached %q", want)
		}
	}
}

func groupsRunSpan(t *testing.T, c *redis.Client, ret time.Duration, seed uint64, batches int) map[string]int {
	r := rand.New(rand.NewPCG(seed, 8))
	y := newGroupsRig(t, c, "spans", ret)
	g := newGroupsGen(r, y.span, (Micros(t0)/hourUS)/y.span*y.span*hourUS+1)
	y.deliver(r, func(i int) ([]Observation, time.Time) {
		if i == batches {
			return nil, time.Time{}
		}
		return g.next(y.m)
	})
	y.finish(g)
	t.Logf("G=%d outcomes %v, seen %v", y.span, y.outs, y.seen)
	for _, o := range []Outcome{Counted, Reassessed, Duplicate, Stale, Expired} {
		if y.outs[o] == 0 {
			t.Errorf("the stream never produced %v", o)
		}
	}
	if !y.prev && (y.seen["winner crossed groups"] == 0 || y.seen["garbage"] == 0) {
		t.Errorf("no winner crossed a group boundary, or no garbage record was met: %v", y.seen)
	}
	return y.seen
}

// finish steps the watermark a group at a time past everything the generator dated (so that the
// data expires hour by hour, then all of it), collecting now and then and at the end.
func (y *groupsRig) finish(g *groupsGen) {
	y.t.Helper()
	y.tallies(time.UnixMicro(g.maxOcc))
	retH := y.ret / hourUS
	steps := (retH+2*y.span)/y.span + 2
	for s := int64(1); s <= steps; s++ {
		occ := g.maxOcc + s*y.span*hourUS
		g.asd++
		y.apply(fmt.Sprint("step ", s), []Observation{{Key: keyLive, OpportunityID: groupsID(int(s)), Class: Unscored, Occurred: occ, Assessed: g.asd}}, time.UnixMicro(occ))
		if s%4 == 0 {
			y.collect(keyLive, time.UnixMicro(occ), 40)
		}
	}
	last := g.maxOcc + steps*y.span*hourUS
	y.collect(keyLive, time.UnixMicro(last), 40)
	y.tallies(time.UnixMicro(last))
	g.maxOcc = last
}

// groupsGen makes batches of one aggregate (keyLive) from what a model holds, dated near the
// boundaries of span-hour groups.
type groupsGen struct {
	r                  *rand.Rand
	span               int64
	clock, asd, maxOcc int64
	sent               []Observation
	pool               int
}

func newGroupsGen(r *rand.Rand, span, clock int64) *groupsGen {
	return &groupsGen{r: r, span: span, clock: clock, asd: clock, pool: 150}
}

func (g *groupsGen) next(m *Model) ([]Observation, time.Time) {
	r, G := g.r, g.span
	ret := m.retention
	retH := ret / hourUS
	switch p := r.IntN(100); {
	case p < 3:
		g.clock += (retH + G*int64(1+r.IntN(2))) * hourUS // past everything held
	case p < 15:
		g.clock += int64(1+r.IntN(int(G)+1)) * hourUS
	case p < 25:
		g.clock += max(retH/6, 1) * hourUS // the cut walks into the data
	default:
		g.clock += r.Int64N(20) * minuteUS
	}
	clock := g.clock
	w := clock
	a := m.aggs[keyLive]
	if a != nil {
		w = max(w, a.watermark)
	}
	cutH := floorDiv(w-ret, hourUS)
	clockH := clock / hourUS
	somewhere := func() int64 { // an occurred time near a group boundary in the retained range
		h := cutH + r.Int64N(max(clockH-cutH, 0)+1)
		return min(max(groupsNear(r, h, G), 0), clock)
	}
	var ids []string
	if a != nil {
		for id := range a.opps {
			ids = append(ids, id)
		}
		sort.Strings(ids)
	}
	held := func() (string, record, bool) {
		if len(ids) == 0 {
			return "", record{}, false
		}
		id := ids[r.IntN(len(ids))]
		return id, a.opps[id], true
	}
	n := retainedSize(r)
	batch := make([]Observation, 0, n)
	for len(batch) < n {
		switch p := r.IntN(100); {
		case p < 15: // a held winner crosses the boundary next to it, either way
			id, rec, ok := held()
			if !ok {
				continue
			}
			gw := floorDiv(rec.occ/hourUS, G)
			var occ int64
			if r.IntN(2) == 0 {
				occ = (gw+1)*G*hourUS + retainedOffset(r)%(2*hourUS) // just into the next group
			} else {
				occ = gw*G*hourUS - 1 - r.Int64N(hourUS) // just below its group
			}
			occ = min(max(occ, 0), clock)
			g.asd++
			batch = append(batch, Observation{Key: keyLive, OpportunityID: id, Class: Class(1 + r.IntN(3)), Occurred: occ, Assessed: g.asd, Seq: r.Int64N(2)})
		case p < 25: // stale, dated later than the horizon: it grows, maybe into the next group
			id, rec, ok := held()
			if !ok || rec.assessed < 3 {
				continue
			}
			occ := min(rec.horizon+r.Int64N((G+1)*hourUS), clock)
			batch = append(batch, Observation{Key: keyLive, OpportunityID: id, Class: Class(1 + r.IntN(3)), Occurred: occ, Assessed: rec.assessed - 1 - r.Int64N(2)})
		case p < 32: // re-graded in place
			id, rec, ok := held()
			if !ok {
				continue
			}
			g.asd++
			batch = append(batch, Observation{Key: keyLive, OpportunityID: id, Class: Class(1 + r.IntN(3)), Occurred: rec.occ, Assessed: g.asd})
		case p < 42 && len(g.sent) > 0: // the same event again (duplicate, stale or expired by now)
			batch = append(batch, g.sent[len(g.sent)-1-r.IntN(min(len(g.sent), 300))])
		case p < 47: // expired
			occ := max(cutH*hourUS-1-r.Int64N(3*hourUS), 0)
			g.asd++
			batch = append(batch, Observation{Key: keyLive, OpportunityID: groupsID(r.IntN(g.pool)), Class: Passed, Occurred: occ, Assessed: g.asd})
		default:
			g.asd += int64(r.IntN(2))
			batch = append(batch, Observation{Key: keyLive, OpportunityID: groupsID(r.IntN(g.pool)), Class: Class(1 + r.IntN(3)),
				Occurred: somewhere(), Assessed: g.asd - int64(r.IntN(3)), Seq: r.Int64N(2)})
		}
	}
	g.sent = append(g.sent, batch...)
	for _, o := range batch {
		g.maxOcc = max(g.maxOcc, o.Occurred)
	}
	at := g.maxOcc + int64(r.IntN(120))*1e6
	if r.IntN(5) == 0 {
		at = g.maxOcc + r.Int64N(3*G*hourUS) // an observer ahead of the events
	}
	return batch, time.UnixMicro(at)
}

// switchRetention makes y apply through a new store over the same prefix with another retention,
// and the model retain by it. The head's span must stay the one the aggregate was created with;
// retainedRig.check (which wants the new retention's span) is left out from then on.
func (y *groupsRig) switchRetention(ret time.Duration) {
	y.t.Helper()
	s, err := NewRedis(y.c, RedisConfig{Prefix: y.s.cfg.Prefix, Retention: ret})
	if err != nil {
		y.t.Fatal(err)
	}
	y.s = s
	y.m.retention = int64(ret / time.Microsecond)
	y.ret = y.m.retention
	y.full = false
}

// headSpan reads the head's span byte.
func (y *groupsRig) headSpan(k Key) int64 {
	y.t.Helper()
	if y.prev {
		return y.span // another layout's head
	}
	h := y.c.HGet(context.Background(), y.s.keys(k)[1], "H").Val()
	if len(h) < 2 {
		y.t.Fatalf("no head: %q", h)
	}
	return int64(h[1])
}

// TestIDIndexRetentionChanged changes the retention of a store between batches (a new
// RedisConfig over the same prefix) for aggregates created under another one: the head keeps the
// span G it was created with, and every later batch (groups, garbage collection, bounds, first and
// last) must work with that G, not the new retention's, and agree with the model retaining by the
// new retention. The change is made while everything held lies within both retentions (nothing
// expired yet), so that the model's answer is well defined; then a random stream with expiry and
// garbage collection follows under the new retention.
func TestIDIndexRetentionChanged(t *testing.T) {
	for i, tc := range []struct{ from, to time.Duration }{
		{30 * 24 * time.Hour, 8 * time.Hour},  // G 24 kept under a retention of G 1
		{16 * time.Hour, 30 * 24 * time.Hour}, // G 2 kept under a retention of G 24
		{8 * time.Hour, 184 * time.Hour},      // G 1 kept under G 23
		{184 * time.Hour, 24 * time.Hour},     // G 23 kept under G 3
		{40 * time.Hour, 16 * time.Hour},      // G 5 kept under G 2
	} {
		t.Run(fmt.Sprint(tc.from, "→", tc.to), func(t *testing.T) {
			retainedBackends(t, i < 2, func(t *testing.T, c *redis.Client) {
				r := rand.New(rand.NewPCG(uint64(i+1), 88))
				y := newGroupsRig(t, c, "retchange", tc.from)
				G := y.span
				// Phase 1: six hours straddling a group boundary (of G and of the new span),
				// nothing expires under either retention.
				base := ((Micros(t0)/hourUS)/G*G - 3) * hourUS
				asd := base + 100*hourUS
				for i := 0; i < 25; i++ {
					var b []Observation
					for range 1 + r.IntN(30) {
						asd++
						b = append(b, Observation{Key: keyLive, OpportunityID: groupsID(r.IntN(60)), Class: Class(1 + r.IntN(3)),
							Occurred: base + retainedOffset(r) + int64(r.IntN(6))*hourUS, Assessed: asd - r.Int64N(4), Seq: r.Int64N(2)})
					}
					y.apply(fmt.Sprint("phase 1 batch ", i), b, time.UnixMicro(base+6*hourUS))
				}
				if got := y.headSpan(keyLive); got != G {
					t.Fatalf("created under %v: head span %d, want %d", tc.from, got, G)
				}
				y.switchRetention(tc.to)
				if groupsSpan(tc.to) == G {
					t.Fatalf("the retentions %v and %v have the same span", tc.from, tc.to)
				}
				g := newGroupsGen(r, G, base+6*hourUS)
				g.asd = asd + 1
				g.maxOcc = y.m.aggs[keyLive].watermark
				y.deliver(r, func(i int) ([]Observation, time.Time) {
					if i == 90 {
						return nil, time.Time{}
					}
					return g.next(y.m)
				})
				y.finish(g)
				if got := y.headSpan(keyLive); got != G {
					t.Fatalf("after the stream under %v: head span %d, want %d (created under %v)", tc.to, got, G, tc.from)
				}
				t.Logf("span %d under %v: outcomes %v, seen %v", G, tc.to, y.outs, y.seen)
				if y.outs[Expired] == 0 || y.seen["collected"] == 0 || y.seen["winner crossed groups"] == 0 || (!y.prev && y.seen["garbage"] == 0) {
					t.Fatalf("the stream under the new retention never expired, left garbage, collected or moved a winner across groups")
				}
			})
		})
	}
}

// TestRetentionGrowthRevivesGarbage: under layout 9 a record whose horizon expired
// stays stored (reading as absent) until its horizon's whole group expires, up to G hours later.
// The retention is then raised (a new RedisConfig over the same prefix, as a restart with a
// longer retention does): the hour of the garbage record is inside what the new retention would
// cover, but its counts left long ago and its identity was forgotten. The cut never moves back
// (docs/semantics.md#retention), so the garbage stays garbage: a new assessment in a retained hour
// counts the opportunity anew, one in the garbage winner's hour is expired, as in the model, and
// the stored counts stay consistent. (It failed before the cut was kept in the head: the garbage
// record came back, a batch failed on every retry or counts went wrong.)
func TestRetentionGrowthRevivesGarbage(t *testing.T) {
	for _, tc := range []struct {
		name string
		next func(S int64, asd int64) Observation
		want Outcome
	}{
		{"newer assessment", func(S, asd int64) Observation {
			return Observation{Key: keyLive, OpportunityID: "old", Class: Confirmed, Occurred: (S+3)*hourUS + 5, Assessed: asd + 10}
		}, Counted},
		{"older assessment", func(S, asd int64) Observation {
			return Observation{Key: keyLive, OpportunityID: "old", Class: Confirmed, Occurred: (S+3)*hourUS + 5, Assessed: asd - 10}
		}, Counted},
		{"newer assessment in the garbage winner's hour, another class", func(S, asd int64) Observation {
			return Observation{Key: keyLive, OpportunityID: "old", Class: Confirmed, Occurred: S*hourUS + 20*minuteUS, Assessed: asd + 10}
		}, Expired},
	} {
		t.Run(tc.name, func(t *testing.T) {
			retainedBackends(t, true, func(t *testing.T, c *redis.Client) {
				y := newGroupsRig(t, c, "revive", 24*time.Hour) // G = 3
				S := (Micros(t0)/hourUS)/3*3 - 60               // the first hour of a group
				asd := (S + 100) * hourUS
				y.apply("seed", []Observation{
					{Key: keyLive, OpportunityID: "old", Class: Passed, Occurred: S*hourUS + 10*minuteUS, Assessed: asd},
					{Key: keyLive, OpportunityID: "keep", Class: Passed, Occurred: (S+2)*hourUS + 1, Assessed: asd},
				}, time.UnixMicro((S+2)*hourUS+1))
				// The cut passes hour S (not its group, hours S..S+2): "old" is garbage.
				w := (S+25)*hourUS + 1
				y.apply("hour S expires", []Observation{{Key: keyLive, OpportunityID: "w", Class: Passed, Occurred: w, Assessed: asd}}, time.UnixMicro(w))
				if !y.prev && y.seen["garbage in a group not wholly expired"] == 0 {
					t.Fatalf("no garbage record in a group not wholly expired: %v", y.seen)
				}
				y.switchRetention(48 * time.Hour)
				b := []Observation{tc.next(S, asd)}
				ctx := context.Background()
				got, err := y.s.Apply(ctx, b, time.UnixMicro(w))
				want, _ := y.m.Apply(ctx, b, time.UnixMicro(w))
				if err != nil {
					t.Fatalf("the batch fails, and will on every retry: %v", err)
				}
				if got.Outcomes[0] != tc.want || want.Outcomes[0] != tc.want || got.Tallies[keyLive] != want.Tallies[keyLive] {
					hx, _ := headNumbers(y.c.HGet(ctx, y.s.keys(keyLive)[1], "H").Val())
					t.Fatalf("outcome %v (model %v, want %v)\nredis %+v\nmodel %+v\nhead counts C,P,U as stored: %d, %d, %d",
						got.Outcomes[0], want.Outcomes[0], tc.want, got.Tallies[keyLive], want.Tallies[keyLive], hx[8], hx[9], hx[10])
				}
				y.inspect("after", keyLive)
				y.tallies(time.UnixMicro(w))
			})
		})
	}
}

// TestRetentionShrunkOverData lowers the retention (a new RedisConfig over the same
// prefix) while winners are held in hours the new retention no longer covers: those hours have
// expired (docs/semantics.md#retention: expired hours leave the counts at once), so the next
// batch's counts and first/last must not include them. (This failed with layout 8's script as
// well: the cut was computed from the retention of the batch, and hours between the old and the
// new cut never left the counts.)
func TestRetentionShrunkOverData(t *testing.T) {
	retainedBackends(t, false, func(t *testing.T, c *redis.Client) {
		y := newGroupsRig(t, c, "shrink", 48*time.Hour)
		S := Micros(t0)/hourUS - 60
		asd := (S + 100) * hourUS
		y.apply("seed", []Observation{
			{Key: keyLive, OpportunityID: "early", Class: Passed, Occurred: S * hourUS, Assessed: asd},
			{Key: keyLive, OpportunityID: "late", Class: Passed, Occurred: (S + 30) * hourUS, Assessed: asd},
		}, time.UnixMicro((S+30)*hourUS))
		y.switchRetention(24 * time.Hour)
		w := (S+30)*hourUS + 1
		y.apply("a new event under 24h", []Observation{{Key: keyLive, OpportunityID: "new", Class: Confirmed, Occurred: w, Assessed: asd}}, time.UnixMicro(w))
	})
}

// TestIDIndexGarbageRecreated makes garbage records (horizon expired, their group not wholly
// expired) of every shape — winner and horizon in one hour, the horizon an hour later in the same
// group, the winner in the group before (already wholly expired) and the horizon in this one —
// then re-creates their opportunities with new events: in the garbage's own group (where the index
// lists the id already), in another group, with an assessment older than the garbage winner (it
// must count: the identity is forgotten), and a byte-identical copy of the garbage winner (expired).
// The re-created records then move across groups and back, and finally the watermark passes the
// group: garbage collection must delete the garbage and records re-created there once they expire
// too, and never a record whose horizon is retained.
func TestIDIndexGarbageRecreated(t *testing.T) {
	for _, ret := range []time.Duration{24 * time.Hour, 40 * time.Hour, 184 * time.Hour} {
		t.Run(ret.String(), func(t *testing.T) {
			retainedBackends(t, ret == 24*time.Hour, func(t *testing.T, c *redis.Client) { groupsRunGarbage(t, c, ret) })
		})
	}
}

func groupsRunGarbage(t *testing.T, c *redis.Client, ret time.Duration) {
	y := newGroupsRig(t, c, "garbage", ret)
	G := y.span
	retH := int64(ret / time.Hour)
	S := (Micros(t0)/hourUS)/G*G - 2*G // the first hour of group D
	D := S / G
	asd := (S + 10*retH) * hourUS
	ob := func(id string, cls Class, occ, a int64) Observation {
		return Observation{Key: keyLive, OpportunityID: id, Class: cls, Occurred: occ, Assessed: a}
	}
	seed := []Observation{
		ob("same", Passed, S*hourUS+5, asd),                  // winner and horizon in hour S
		ob("later", Confirmed, S*hourUS+7, asd),              // horizon in hour S+1 (below)
		ob("before", Unscored, (S-1)*hourUS+hourUS-1, asd),   // winner in group D-1, horizon in hour S (below)
		ob("other", Passed, S*hourUS+9, asd),                 // re-created in another group
		ob("older", Confirmed, S*hourUS+11, asd),             // re-created by an older assessment
		ob("copy", Passed, S*hourUS+13, asd),                 // a byte-identical copy arrives
		ob("i1", Passed, S*hourUS+15, asd),                   // an id like a field
		ob("keep", Passed, (S+G)*hourUS+1, asd),              // retained throughout
		ob("hold", Confirmed, (S+retH)*hourUS+hourUS/2, asd), // keeps the watermark
		ob("later", Confirmed, (S+1)*hourUS+3, asd-1),        // stale, dated later: horizon hour S+1
		ob("before", Unscored, S*hourUS+hourUS/3, asd-1),     // stale, dated later: horizon in group D
		ob("\x00.i2", Passed, (S+1)*hourUS+hourUS-1, asd),    // garbage in hour S+1
	}
	w0 := (S+retH)*hourUS + hourUS/2
	y.apply("seed", seed, time.UnixMicro(w0))
	// The cut moves to hour S+2: hours S and S+1 expire, group D (hours S..S+G-1) does not.
	w1 := (S+2+retH)*hourUS + 1
	y.apply("hours S and S+1 expire", []Observation{ob("hold2", Passed, w1, asd)}, time.UnixMicro(w1))
	cutH := floorDiv(w1-y.ret, hourUS)
	if cutH != S+2 || floorDiv(cutH, G) != D {
		t.Fatalf("cut hour %d (want %d), its group %d (want %d)", cutH, S+2, floorDiv(cutH, G), D)
	}
	recs := y.c.HGetAll(context.Background(), y.s.keys(keyLive)[0]).Val()
	for _, id := range []string{"same", "later", "before", "other", "older", "copy", "i1", "\x00.i2"} {
		v, ok := recs[retainedField(id)]
		if !ok {
			t.Fatalf("garbage record %q was deleted before its group expired", id)
		}
		if _, _, _, _, hz, _ := retainedRecord(v); hz >= cutH*hourUS {
			t.Fatalf("record %q = %q is not garbage", id, v)
		}
	}
	// Re-created. "same" and "later" in hour S+2 (group D: the index lists them there already),
	// "before" in hour S+2 (group D, its garbage horizon's group, not its winner's), "other" in
	// group D+1, "older" by an assessment older than its garbage winner, "copy" as a byte-identical
	// copy of its garbage winner (expired: hour S).
	b := []Observation{
		ob("same", Confirmed, (S+2)*hourUS+1, asd+1),
		ob("later", Passed, (S+2)*hourUS+2, asd+1),
		ob("before", Passed, (S+2)*hourUS+3, asd+1),
		ob("other", Unscored, (S+G)*hourUS+4, asd+1),
		ob("older", Passed, (S+2)*hourUS+5, asd-5),
		seed[5],
		ob("i1", Passed, (S+G+1)*hourUS, asd+2),
		ob("\x00.i2", Passed, (S+2)*hourUS+hourUS-1, asd-9),
	}
	got := y.apply("re-created", b, time.UnixMicro(w1))
	for j, o := range got.Outcomes {
		want := Counted
		if j == 5 {
			want = Expired
		}
		if o != want {
			t.Fatalf("event %d (%q) was %v, want %v", j, b[j].OpportunityID, o, want)
		}
	}
	y.again("re-created, again", b, time.UnixMicro(w1))
	if !y.prev && y.seen["re-created in its garbage's group"] < 4 || y.seen["re-created in another group"] < 2 {
		t.Fatalf("re-creations seen: %v", y.seen)
	}
	// Moves: "same" to group D+1 and back to hour S+2; "other" back into group D; "later" stays,
	// its horizon grows into group D+1; the bound holders of hour S+2 leave it.
	y.apply("moves out", []Observation{
		ob("same", Passed, (S+G)*hourUS+7, asd+3),
		ob("other", Confirmed, (S+2)*hourUS+hourUS/2, asd+3),
		ob("later", Unscored, (S+G)*hourUS+hourUS-1, asd), // stale, later: horizon into D+1
		ob("before", Passed, (S+G+1)*hourUS, asd+3),       // the low bound holder of hour S+2 leaves
	}, time.UnixMicro(w1))
	y.apply("and back", []Observation{
		ob("same", Confirmed, (S+2)*hourUS+1, asd+4),
		ob("\x00.i2", Confirmed, (S+G)*hourUS+2, asd+4), // the high bound holder of hour S+2 leaves
	}, time.UnixMicro(w1))
	// The cut walks hour by hour to hour S+G: group D wholly expires, D+1 is retained.
	for h := S + 3; h <= S+G; h++ {
		w := (h+retH)*hourUS + 2
		y.apply(fmt.Sprint("cut at hour ", h), []Observation{ob(fmt.Sprint("w", h), Passed, w, asd)}, time.UnixMicro(w))
	}
	w := (S+G+retH)*hourUS + 2
	y.collect(keyLive, time.UnixMicro(w), 20)
	// Re-created records whose horizon is in group D+1 are held (their winners in group D expired),
	// "older" (re-created in hour S+2) is gone.
	a := y.m.aggs[keyLive]
	if _, ok := a.opps["older"]; ok {
		t.Fatal("the model still holds \"older\"")
	}
	for _, id := range []string{"same", "later", "before", "other", "\x00.i2", "keep", "i1"} {
		if _, ok := a.opps[id]; !ok {
			t.Fatalf("the model no longer holds %q: the sequence does not test what it means to", id)
		}
	}
	y.tallies(time.UnixMicro(w))
	t.Logf("G=%d outcomes %v seen %v", G, y.outs, y.seen)
}

// TestCompactionBetweenTwoGroups moves 150 of 250 opportunities with long ids (closed
// chunks; the other 100 stay) between two neighbouring groups again and again — to the later group (their horizon follows)
// and back below it (the horizon stays), in whole waves and in random subsets, several times
// within a batch too — so that the earlier group's index gains an entry per return: it must be
// compacted and stay proportional (inspect). Between waves, the bound holders of the earlier
// group's hours leave one at a time while that group lists many entries left behind in closed
// chunks: the bounds found again from its index must be exact.
func TestCompactionBetweenTwoGroups(t *testing.T) {
	for _, ret := range []time.Duration{8 * time.Hour, 40 * time.Hour, 30 * 24 * time.Hour} {
		t.Run(ret.String(), func(t *testing.T) {
			retainedBackends(t, ret == 40*time.Hour, func(t *testing.T, c *redis.Client) { groupsRunCompaction(t, c, ret) })
		})
	}
}

func groupsRunCompaction(t *testing.T, c *redis.Client, ret time.Duration) {
	r := rand.New(rand.NewPCG(uint64(ret), 9))
	y := newGroupsRig(t, c, "compaction", ret)
	G := y.span
	A := (Micros(t0)/hourUS)/G*G - G // the first hour of group A; group B follows
	B := A + G
	asd := (A + 1000) * hourUS
	id := func(i int) string { return fmt.Sprintf("%03d-%s", i, strings.Repeat("x", 60)) }
	at := time.UnixMicro((B + G) * hourUS)
	inA := func(i int) int64 { return (A+int64(i)%G)*hourUS + 1000 + int64(i)*997 + r.Int64N(1000) }
	inB := func(i int) int64 { return (B+int64(i)%G)*hourUS + 1000 + int64(i)*991 + r.Int64N(1000) }
	next := func(i int, occ int64) Observation {
		asd++
		return Observation{Key: keyLive, OpportunityID: id(i), Class: Class(1 + r.IntN(3)), Occurred: occ, Assessed: asd}
	}
	var b []Observation
	for i := 0; i < 250; i++ { // 150 movers, 100 that stay in A
		b = append(b, next(i, inA(i)))
	}
	y.apply("250 in group A", b, at)
	gA := A / G
	listedA := func() int64 {
		gv, err := retainedParseGroup(y.c.HGet(context.Background(), y.s.keys(keyLive)[1], fmt.Sprint("i", gA)).Val())
		if err != nil {
			t.Fatal(err)
		}
		return gv.n
	}
	most := int64(0)
	for wave := 0; wave < 12; wave++ {
		// Out to B (the horizon follows), then back below it: A gains an entry per id.
		b = b[:0]
		for i := 0; i < 150; i++ {
			b = append(b, next(i, inB(i)))
		}
		y.apply(fmt.Sprint("wave ", wave, " to B"), b, at)
		b = b[:0]
		for i := 0; i < 150; i++ {
			b = append(b, next(i, inA(i)))
		}
		y.apply(fmt.Sprint("wave ", wave, " back to A"), b, at)
		if !y.prev {
			most = max(most, listedA())
		}
		// A random subset, out and back within one batch, some twice.
		b = b[:0]
		for _, i := range r.Perm(150)[:40+r.IntN(60)] {
			b = append(b, next(i, inB(i)), next(i, inA(i)))
			if r.IntN(4) == 0 {
				b = append(b, next(i, inB(i)), next(i, inA(i)))
			}
		}
		y.apply(fmt.Sprint("wave ", wave, " subset out and back"), b, at)
		// The bound holders of A's hours leave one at a time, to B and to the hour before A.
		for k := 0; k < 3; k++ {
			a := y.m.aggs[keyLive]
			h := A + int64(r.IntN(int(G)))
			var lo, hi string
			var loOcc, hiOcc int64
			for oid, rec := range a.opps {
				if rec.occ/hourUS != h {
					continue
				}
				if lo == "" || rec.occ < loOcc || (rec.occ == loOcc && oid < lo) {
					lo, loOcc = oid, rec.occ
				}
				if hi == "" || rec.occ > hiOcc || (rec.occ == hiOcc && oid < hi) {
					hi, hiOcc = oid, rec.occ
				}
			}
			if lo == "" {
				continue
			}
			i, _ := strconv.Atoi(lo[:3])
			j, _ := strconv.Atoi(hi[:3])
			y.apply("low bound holder leaves", []Observation{next(i, inB(i))}, at)
			y.apply("high bound holder leaves", []Observation{next(j, (A-1)*hourUS+int64(j))}, at)
			y.seen["bound holder left"]++
		}
	}
	y.tallies(at)
	t.Logf("G=%d: group A listed at most %d entries; outcomes %v, seen %v", G, most, y.outs, y.seen)
	if y.prev {
		return
	}
	if y.seen["compacted"] == 0 || y.seen["closed chunks"] == 0 || y.seen["bound holder left"] == 0 {
		t.Fatalf("no compaction, no closed chunk or no bound holder left: %v", y.seen)
	}
	if most > 2*250+64 || most < 300 {
		t.Fatalf("group A listed at most %d entries for 250 ids: not proportional, or never more than one per id", most)
	}
}

// TestIDIndexFirstLastRescan moves the holders of the first and last retained occurred time
// (head f and l) while their hours' groups list entries left behind: the first winner leaves its
// hour for another group (the hour's least bound is found again from the index), a winner tied
// with it leaves and one stays, the first hour empties (the next hour with winners gives f), a
// winner comes in below f in the same batch as the first leaves, the last winner moves into an
// earlier hour and its hour empties, and the last winner leaves and comes back in one batch.
func TestIDIndexFirstLastRescan(t *testing.T) {
	for _, ret := range []time.Duration{8 * time.Hour, 40 * time.Hour, 30 * 24 * time.Hour} {
		t.Run(ret.String(), func(t *testing.T) {
			retainedBackends(t, true, func(t *testing.T, c *redis.Client) { groupsRunFirstLast(t, c, ret) })
		})
	}
}

func groupsRunFirstLast(t *testing.T, c *redis.Client, ret time.Duration) {
	y := newGroupsRig(t, c, "firstlast", ret)
	G := y.span
	// Hours L (the first with winners) .. L+3, spread over two groups when G > 1; the watermark
	// in hour L+5 keeps them all retained (8h retention: the cut is hour L-3 or so).
	L := (Micros(t0)/hourUS)/G*G - 2
	top := L + 5
	asd := (L + 100) * hourUS
	at := time.UnixMicro(top*hourUS + 1)
	next := func(id string, occ int64) Observation {
		asd++
		return Observation{Key: keyLive, OpportunityID: id, Class: Class(1 + asd%3), Occurred: occ, Assessed: asd}
	}
	head := func(what string, wantF, wantL int64) {
		t.Helper()
		tl := y.m.Tally(keyLive, at)
		if tl.First != wantF || tl.Last != wantL {
			t.Fatalf("%s: the model's first/last %d, %d, the sequence expects %d, %d", what, tl.First, tl.Last, wantF, wantL)
		}
		y.seen["first/last checked"]++
	}
	// Left-behind entries in both groups: 80 ids come in hour L+1 and leave for hour L+2.. and
	// back, so L's group lists entries for other hours' winners.
	var b []Observation
	for i := 0; i < 80; i++ {
		b = append(b, next(fmt.Sprint("f", i), (L+1)*hourUS+int64(i)*1000+500))
	}
	b = append(b,
		next("first", L*hourUS+100), next("tie", L*hourUS+100), next("second", L*hourUS+200), next("third", L*hourUS+hourUS-1),
		next("last", (L+3)*hourUS+hourUS-1), next("penult", (L+3)*hourUS+50), next("w", top*hourUS))
	y.apply("build", b, at)
	b = b[:0]
	for i := 0; i < 80; i += 2 {
		b = append(b, next(fmt.Sprint("f", i), (L+2+int64(i%2))*hourUS+int64(i)))
	}
	y.apply("entries left behind", b, at)
	head("built", L*hourUS+100, top*hourUS)
	// "w" holds the last; it moves down into hour L+3 below "last": l is "last"'s.
	y.apply("w moves down", []Observation{next("w", (L+3)*hourUS+10)}, at)
	head("w moved down", L*hourUS+100, (L+3)*hourUS+hourUS-1)
	y.apply("first leaves for another group", []Observation{next("first", (L+2)*hourUS+5)}, at)
	head("first left, tie stays", L*hourUS+100, (L+3)*hourUS+hourUS-1)
	y.apply("tie leaves", []Observation{next("tie", (L+1)*hourUS+3)}, at)
	head("tie left", L*hourUS+200, (L+3)*hourUS+hourUS-1)
	y.apply("second leaves, one comes in below in the same batch", []Observation{next("second", (L+2)*hourUS), next("below", L*hourUS+150)}, at)
	head("below holds first", L*hourUS+150, (L+3)*hourUS+hourUS-1)
	y.apply("hour L empties", []Observation{next("below", (L+3)*hourUS+7), next("third", (L+2)*hourUS+1)}, at)
	a := y.m.aggs[keyLive]
	lo := int64(-1)
	for _, r := range a.opps {
		if lo < 0 || r.occ < lo {
			lo = r.occ
		}
	}
	head("hour L emptied", lo, (L+3)*hourUS+hourUS-1)
	if lo/hourUS != L+1 {
		t.Fatalf("first winner in hour %d, want L+1 = %d", lo/hourUS, L+1)
	}
	// The last winner ("last") moves into an earlier hour, and then hour L+3's others leave.
	y.apply("last moves into an earlier hour", []Observation{next("last", (L+1)*hourUS+hourUS-2)}, at)
	y.apply("hour L+3 empties", []Observation{next("penult", (L+1)*hourUS+60), next("w", (L+1)*hourUS+70), next("below", (L+2)*hourUS+9), next("first", (L+1)*hourUS+4)}, at)
	hi := int64(-1)
	for _, r := range a.opps {
		hi = max(hi, r.occ)
	}
	if hi/hourUS >= L+3 {
		t.Fatalf("a winner is still in hour L+3 or later (%d)", hi)
	}
	head("hour L+3 emptied", lo, hi)
	// The last winner leaves and comes back a µs lower in one batch; the first the same.
	var hiID, loID string
	for id, r := range a.opps {
		if r.occ == hi && (hiID == "" || id < hiID) {
			hiID = id
		}
		if r.occ == lo && (loID == "" || id < loID) {
			loID = id
		}
	}
	y.apply("last and first out and back", []Observation{next(hiID, L*hourUS), next(hiID, hi-1), next(loID, hi+1), next(loID, lo+1)}, at)
	y.tallies(at)
	if y.seen["first/last checked"] < 6 || (!y.prev && y.seen["bounded"] == 0) {
		t.Fatalf("seen %v", y.seen)
	}
}

// groupsPair is codecPair (the test Redis and the embedded one, byte for byte, each against its
// model) with groupsRig.inspect on both sides.
type groupsPair struct {
	p  *codecPair
	ys [2]*groupsRig
}

func newGroupsPair(t *testing.T, what string, ret time.Duration) *groupsPair {
	groupsNoPrev(t)
	p := newCodecPair(t, what, ret)
	return &groupsPair{p: p, ys: [2]*groupsRig{wrapGroupsRig(p.sides[0], groupsSpan(ret)), wrapGroupsRig(p.sides[1], groupsSpan(ret))}}
}

func (q *groupsPair) apply(what string, b []Observation, at time.Time) {
	q.p.t.Helper()
	snap := q.ys[0].snapshot(b)
	q.p.apply(what, b, at)
	q.ys[0].count(snap, b, nil)
	for i, y := range q.ys {
		y.inspect(codecSideNames[i]+": "+what, keyLive)
	}
}

func (q *groupsPair) again(what string, b []Observation, at time.Time) {
	q.p.t.Helper()
	q.p.again(what, b, at)
	for i, y := range q.ys {
		y.inspect(codecSideNames[i]+": "+what, keyLive)
	}
}

// TestBackendsAgreeAcrossSpans runs the group-boundary streams of
// TestIDIndexSpansRandomStreams under G = 3, 5 and 23 on the test Redis and the embedded one
// under one prefix: replies and every stored key must be equal byte for byte after every batch
// (retries and redeliveries included), and each side what its model holds; then the watermark
// walks past everything and garbage collection runs on both.
func TestBackendsAgreeAcrossSpans(t *testing.T) {
	for i, ret := range []time.Duration{24 * time.Hour, 40 * time.Hour, 184 * time.Hour} {
		t.Run(ret.String(), func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(i), 808))
			q := newGroupsPair(t, "pairspans", ret)
			G := groupsSpan(ret)
			g := newGroupsGen(r, G, (Micros(t0)/hourUS)/G*G*hourUS+1)
			var done []retainedBatch
			for i := 0; i < 60; i++ {
				b, at := g.next(q.ys[0].m)
				q.apply(fmt.Sprint("batch ", i), b, at)
				done = append(done, retainedBatch{b, at})
				if r.IntN(5) == 0 {
					q.again(fmt.Sprint("batch ", i, " retried"), b, at)
				}
				if r.IntN(10) == 0 {
					from := r.IntN(len(done))
					for j := from; j < len(done); j++ {
						q.again(fmt.Sprint("batch ", j, " redelivered after ", i), done[j].obs, at)
					}
				}
			}
			q.p.tallies(time.UnixMicro(g.maxOcc))
			retH := int64(ret / time.Hour)
			for s := int64(1); s <= retH/G+3; s++ {
				occ := g.maxOcc + s*G*hourUS
				g.asd++
				q.apply(fmt.Sprint("step ", s), []Observation{{Key: keyLive, OpportunityID: groupsID(int(s)), Class: Passed, Occurred: occ, Assessed: g.asd}}, time.UnixMicro(occ))
			}
			last := g.maxOcc + (retH/G+3)*G*hourUS
			q.p.collect(keyLive, time.UnixMicro(last))
			x := q.ys[0]
			t.Logf("G=%d: %d dumps compared, outcomes %v, seen %v", G, q.p.dumps, x.outs, x.seen)
			if x.seen["garbage in a group not wholly expired"] == 0 || x.seen["winner crossed groups"] == 0 || x.seen["closed chunks"] == 0 {
				t.Fatalf("the stream left no garbage in a live group, moved no winner across groups, or closed no chunk: %v", x.seen)
			}
		})
	}
}

// TestIDIndexLargeBatchPair applies batches of more than 4 000 observations of one aggregate
// (apply.lua's CHUNK: reads, writes and index appends in several commands) on both servers, byte
// for byte: 1 450 ids, among them ids that look like state fields and index entries ("i1", "i1.2",
// "h3", NUL, ".") and long ids whose entries fill or pass an index chunk (477, 478 and 512
// bytes), dated over hours straddling group boundaries; then the same ids moved across groups,
// several times within the batch, stale ones dated later, byte-identical copies; the batch again;
// a second large batch moving them back; finally a large batch that expires the first groups
// (garbage collection with the largest budget), and collection to the end.
func TestIDIndexLargeBatchPair(t *testing.T) {
	r := rand.New(rand.NewPCG(4000, 8))
	ret := 24 * time.Hour // G = 3
	q := newGroupsPair(t, "largebatch", ret)
	G := int64(3)
	S := (Micros(t0)/hourUS)/G*G - 30
	asd := (S + 500) * hourUS
	var ids []string
	for i := 0; i < 1400; i++ {
		ids = append(ids, groupsID(i))
	}
	ids = append(ids, "i1", "i1.2", "h3", "\x00", ".", "..", "\x00\x00", "001a", "i", "H", "v", "enc")
	for i := 0; len(ids) < 1450; i++ {
		n := []int{477, 478, 512}[i%3]
		ids = append(ids, fmt.Sprintf("%02d", i)+strings.Repeat(string(rune('a'+i%26)), n-2))
	}
	occAt := func() int64 { return (S+int64(r.IntN(12)))*hourUS + retainedOffset(r) } // hours S..S+11: groups D..D+3
	at := time.UnixMicro((S+12)*hourUS + 1)
	var b []Observation
	for _, id := range ids {
		asd++
		b = append(b, Observation{Key: keyLive, OpportunityID: id, Class: Class(1 + r.IntN(3)), Occurred: occAt(), Assessed: asd})
	}
	first := append([]Observation(nil), b...)
	for len(b) < 4300 {
		o := first[r.IntN(len(first))]
		switch r.IntN(4) {
		case 0, 1: // newer, anywhere (across groups)
			asd++
			o.Occurred, o.Assessed, o.Class = occAt(), asd, Class(1+r.IntN(3))
		case 2: // stale, dated later
			o.Occurred, o.Assessed = min(o.Occurred+r.Int64N(4*hourUS), (S+11)*hourUS), o.Assessed-1
		default: // the first assessment again
		}
		b = append(b, o)
	}
	q.apply("4300 events", b, at)
	q.again("4300 events again", b, at)
	b2 := make([]Observation, 0, 4100)
	for len(b2) < 4100 {
		id := ids[r.IntN(len(ids))]
		asd++
		b2 = append(b2, Observation{Key: keyLive, OpportunityID: id, Class: Class(1 + r.IntN(3)), Occurred: occAt(), Assessed: asd, Seq: r.Int64N(2)})
	}
	q.apply("4100 moves", b2, at)
	// Hours up to S+6 expire: groups D and D+1 wholly (collected in this batch, up to its budget),
	// hour S+6 of group D+2 leaves garbage.
	ctx := context.Background()
	before := q.ys[0].c.HLen(ctx, q.ys[0].s.keys(keyLive)[0]).Val()
	w := (S+7)*hourUS + int64(ret/time.Microsecond)
	b3 := make([]Observation, 0, 4050)
	for i := 0; i < 4050; i++ {
		asd++
		b3 = append(b3, Observation{Key: keyLive, OpportunityID: fmt.Sprint("late-", i), Class: Passed, Occurred: w - int64(i)*1000, Assessed: asd})
	}
	q.apply("4050 later events expire the first groups", b3, time.UnixMicro(w))
	x := q.ys[0]
	after := x.c.HLen(ctx, x.s.keys(keyLive)[0]).Val()
	if x.outs[Reassessed] == 0 || x.outs[Stale] == 0 || x.outs[Duplicate] == 0 || x.seen["closed chunks"] == 0 ||
		x.seen["garbage in a group not wholly expired"] == 0 || after >= before+4050 {
		t.Fatalf("outcomes %v, seen %v, %d records before the expiring batch and %d after", x.outs, x.seen, before, after)
	}
	q.p.collect(keyLive, time.UnixMicro(w))
	q.p.tallies(time.UnixMicro(w))
	t.Logf("outcomes %v, seen %v", x.outs, x.seen)
}

// TestIDIndexCollectionInProgress fills one group with 2 500 opportunities (long ids: many
// closed chunks) and lets it expire wholly under small batches, so that garbage collection takes it
// a budget at a time (closed chunks from the last, over many batches). Meanwhile the batches
// re-create opportunities whose garbage records are still listed under the group being collected
// (newer and older assessments, in the next groups), move them on, and send expired copies: a
// re-created record must never be deleted by the collection of its old entries, and the
// collection must finish.
func TestIDIndexCollectionInProgress(t *testing.T) {
	retainedBackends(t, true, func(t *testing.T, c *redis.Client) {
		r := rand.New(rand.NewPCG(25, 8))
		ret := 24 * time.Hour // G = 3
		y := newGroupsRig(t, c, "inprogress", ret)
		G := y.span
		S := (Micros(t0)/hourUS)/G*G - 10*G
		asd := (S + 1000) * hourUS
		id := func(i int) string { return fmt.Sprintf("collect-me-%05d-%s", i, strings.Repeat("z", 40)) }
		var b []Observation
		for i := 0; i < 2500; i++ {
			b = append(b, Observation{Key: keyLive, OpportunityID: id(i), Class: Class(1 + i%3), Occurred: (S+int64(i)%G)*hourUS + int64(i)*1000, Assessed: asd})
		}
		y.apply("2500 in group D", b, time.UnixMicro((S+G)*hourUS))
		// The cut passes group D: every record there is garbage, listed in D only.
		w := (S+G)*hourUS + int64(ret/time.Microsecond)
		ctx := context.Background()
		gD := fmt.Sprint("i", S/G)
		inProgress := 0
		var recreated []int
		for i := 0; i < 60; i++ {
			asd++
			b = []Observation{{Key: keyLive, OpportunityID: fmt.Sprint("w", i), Class: Passed, Occurred: w + int64(i), Assessed: asd}}
			for range 2 + r.IntN(4) {
				j := r.IntN(400) // among the first listed: their chunks are collected last
				occ := w - r.Int64N(20*hourUS)
				switch r.IntN(3) {
				case 0: // newer
					asd++
					b = append(b, Observation{Key: keyLive, OpportunityID: id(j), Class: Confirmed, Occurred: occ, Assessed: asd})
				case 1: // older than its garbage winner: it must count
					b = append(b, Observation{Key: keyLive, OpportunityID: id(j), Class: Unscored, Occurred: occ, Assessed: 5})
				default: // a copy of its garbage winner: expired
					b = append(b, Observation{Key: keyLive, OpportunityID: id(j), Class: Class(1 + j%3), Occurred: (S+int64(j)%G)*hourUS + int64(j)*1000, Assessed: (S + 1000) * hourUS})
				}
				recreated = append(recreated, j)
			}
			if len(recreated) > 0 && r.IntN(3) == 0 { // a re-created one moves on
				asd++
				b = append(b, Observation{Key: keyLive, OpportunityID: id(recreated[r.IntN(len(recreated))]), Class: Passed, Occurred: w - r.Int64N(5*hourUS), Assessed: asd})
			}
			y.apply(fmt.Sprint("batch ", i), b, time.UnixMicro(w+int64(i)))
			if y.c.HExists(ctx, y.s.keys(keyLive)[1], gD).Val() {
				inProgress++
			}
		}
		y.collect(keyLive, time.UnixMicro(w+60), 40)
		y.tallies(time.UnixMicro(w + 60))
		t.Logf("collection in progress over %d batches; outcomes %v; seen %v", inProgress, y.outs, y.seen)
		if !y.prev && (inProgress < 5 || y.seen["re-created over garbage"] < 20 || y.outs[Expired] < 10) {
			t.Fatalf("the collection was in progress over %d batches, %d re-created over garbage, %d expired", inProgress, y.seen["re-created over garbage"], y.outs[Expired])
		}
	})
}

// TestIDIndexEpochGroups dates events in the first hours of 1970 under G = 3 and G = 24: group
// 0 starts at µs 0, the cut is negative at first (the groups' too), the lowest listed group is 0;
// winners move across groups 0, 1 and 2, then the watermark passes them and group 0 is collected.
func TestIDIndexEpochGroups(t *testing.T) {
	for _, ret := range []time.Duration{24 * time.Hour, 30 * 24 * time.Hour} {
		t.Run(ret.String(), func(t *testing.T) {
			q := newGroupsPair(t, "epochgroups", ret)
			G := groupsSpan(ret)
			r := rand.New(rand.NewPCG(1970, uint64(G)))
			var asd int64 = 1
			var w int64
			next := func(i int, occ int64) Observation {
				asd++
				w = max(w, occ)
				return Observation{Key: keyLive, OpportunityID: groupsID(i), Class: Class(1 + r.IntN(3)), Occurred: occ, Assessed: asd}
			}
			for round := 0; round < 15; round++ {
				var b []Observation
				for range 1 + r.IntN(30) {
					h := int64(r.IntN(int(3 * G)))
					occ := h*hourUS + retainedOffset(r)
					if r.IntN(5) == 0 {
						occ = 0
					}
					b = append(b, next(r.IntN(40), occ))
				}
				q.apply(fmt.Sprint("round ", round), b, time.UnixMicro(w))
			}
			ret := int64(ret / time.Microsecond)
			end := ret + 2*G*hourUS // groups 0 and 1 wholly expire
			q.apply("groups 0 and 1 expire", []Observation{next(99, end)}, time.UnixMicro(end))
			q.p.collect(keyLive, time.UnixMicro(end))
			q.p.tallies(time.UnixMicro(end))
			if q.ys[0].seen["winner crossed groups"] == 0 {
				t.Fatalf("seen %v", q.ys[0].seen)
			}
		})
	}
}
