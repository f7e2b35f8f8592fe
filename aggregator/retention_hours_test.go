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

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/repeatrate/repeatrate/internal/testenv"
)

// Edge-case tests of state layout 7 (apply.lua, docs/semantics.md#retention and #delivery): hours
// keep their bounds only from 32 winners up, bounds are kept exact as winners enter and leave, a
// smaller hour's bounds are read from its index when the first or last retained winner must be
// found again, a stored duplicate's hour is read lazily. Every sequence is applied to the store and
// to the model (the oracle): outcomes and tallies (counts, windows, first/last, version) must be
// equal after every batch, and the stored state must say what the model holds (retainedRig.check).

// retainedBounded mirrors apply.lua's BOUNDED: an hour keeps its bounds once it holds this many winners.
const retainedBounded = 32

// retainedBackends runs f on the test Redis and, when embedded, on the embedded Redis of
// `repeatrate dev` (gopher-lua).
func retainedBackends(t *testing.T, embedded bool, f func(t *testing.T, c *redis.Client)) {
	t.Run("redis", func(t *testing.T) { f(t, testenv.Redis(t)) })
	if embedded {
		t.Run("embedded", func(t *testing.T) {
			m := miniredis.RunT(t)
			f(t, redis.NewClient(&redis.Options{Addr: m.Addr()}))
		})
	}
}

// retainedBatch is one delivery of observations at an observation time.
type retainedBatch struct {
	obs []Observation
	at  time.Time
}

// retainedRig applies batches to a store and to the model side by side.
type retainedRig struct {
	t    *testing.T
	s    *Redis
	c    *redis.Client
	m    *Model
	ret  int64
	outs map[Outcome]int
	hist []retainedBatch // every batch applied, in order, for the failure message
	// spanRet is the retention the aggregates were created under, whose index group span their
	// heads keep (ret, unless a test changes the retention later).
	spanRet int64
	// seen counts what the stored state showed across checks, so a test can require that its
	// sequence reached the cases it is about.
	seen map[string]int
}

func newRetainedRig(t *testing.T, c *redis.Client, what string, retention time.Duration) *retainedRig {
	s, _ := storeOn(t, c, what, RedisConfig{Retention: retention})
	ret := int64(retention / time.Microsecond)
	return &retainedRig{t: t, s: s, c: c, m: NewModel(retention), ret: ret, spanRet: ret,
		outs: map[Outcome]int{}, seen: map[string]int{}}
}

// history renders the last batches applied, for a failure message.
func (x *retainedRig) history(last int) string {
	var b strings.Builder
	from := max(0, len(x.hist)-last)
	for i := from; i < len(x.hist); i++ {
		fmt.Fprintf(&b, "batch %d at %d:\n", i, Micros(x.hist[i].at))
		for _, o := range x.hist[i].obs {
			fmt.Fprintf(&b, "  {%q, %v, occ %d (h%d+%d), asd %d, seq %d}\n", o.OpportunityID, o.Class, o.Occurred,
				o.Occurred/hourUS, o.Occurred%hourUS, o.Assessed, o.Seq)
		}
	}
	return b.String()
}

// apply applies batch at at to both, requires equal outcomes and tallies, and checks the stored
// state of every aggregate of the batch.
func (x *retainedRig) apply(what string, batch []Observation, at time.Time) Applied {
	x.t.Helper()
	return x.applyChecked(what, batch, at, true)
}

// applyChecked is apply, checking the stored state (retainedRig.check) only when check is set: a rig
// that checks the state its own way passes false.
func (x *retainedRig) applyChecked(what string, batch []Observation, at time.Time, check bool) Applied {
	x.t.Helper()
	ctx := context.Background()
	x.hist = append(x.hist, retainedBatch{batch, at})
	got, err := x.s.Apply(ctx, batch, at)
	if err != nil {
		x.t.Fatalf("%s: %v", what, err)
	}
	want, _ := x.m.Apply(ctx, batch, at)
	for j := range batch {
		x.outs[want.Outcomes[j]]++
		if got.Outcomes[j] != want.Outcomes[j] {
			x.t.Fatalf("%s, event %d (%+v): redis %v, model %v\n%s", what, j, batch[j], got.Outcomes[j], want.Outcomes[j], x.history(3))
		}
	}
	for _, k := range want.Keys {
		if got.Tallies[k] != want.Tallies[k] {
			x.t.Fatalf("%s, %s:\nredis %+v\nmodel %+v\n%s", what, k, got.Tallies[k], want.Tallies[k], x.history(3))
		}
		if check {
			x.check(what, k)
		}
	}
	return got
}

// again applies a batch once more (a retry after a lost reply, or a redelivery): the promise is that
// it changes nothing, on either side.
func (x *retainedRig) again(what string, batch []Observation, at time.Time) {
	x.t.Helper()
	x.againWith(what, batch, at, x.apply)
}

// againWith is again through the given apply (a rig that checks more than retainedRig passes its own).
func (x *retainedRig) againWith(what string, batch []Observation, at time.Time, apply func(string, []Observation, time.Time) Applied) {
	x.t.Helper()
	before := map[Key]int64{}
	for _, k := range x.m.Keys() {
		before[k] = x.m.Tally(k, at).Version
	}
	got := apply(what, batch, at)
	for j, o := range got.Outcomes {
		if o == Counted || o == Reassessed {
			x.t.Fatalf("%s: event %d (%+v) was %v when applied again", what, j, batch[j], o)
		}
	}
	for k, tl := range got.Tallies {
		if tl.Version != before[k] {
			x.t.Fatalf("%s moved %s from version %d to %d", what, k, before[k], tl.Version)
		}
	}
}

// tallies reads every aggregate back at a few observation times and compares with the model (never
// more than 10 minutes behind the newest event: the 1h window is exact only that far back,
// docs/semantics.md#windows).
func (x *retainedRig) tallies(at time.Time) {
	x.t.Helper()
	for _, when := range []time.Time{at, at.Add(-9 * time.Minute), at.Add(26 * time.Hour), at.Add(40 * 24 * time.Hour)} {
		for _, k := range x.m.Keys() {
			got, err := x.s.Tally(context.Background(), k, when)
			if err != nil {
				x.t.Fatal(err)
			}
			if want := x.m.Tally(k, when); got != want {
				x.t.Fatalf("tally of %s at %v: redis %+v, model %+v", k, when, got, want)
			}
		}
	}
}

// retainedField is the record field of an opportunity id (recordFields).
func retainedField(id string) string { return fmt.Sprintf("%03x", len(id)) + id }

// retainedRecord parses a stored record "<class><occ>,<assessed>[,<seq>][;<horizon>]" (hex).
func retainedRecord(v string) (cls byte, occ, asd, seq, horizon int64, err error) {
	if v == "" {
		return 0, 0, 0, 0, 0, fmt.Errorf("empty record")
	}
	cls = v[0]
	body, hz, hasHz := strings.Cut(v[1:], ";")
	p := strings.Split(body, ",")
	if len(p) < 2 || len(p) > 3 {
		return 0, 0, 0, 0, 0, fmt.Errorf("record %q", v)
	}
	hexs := func(s string) int64 {
		n, e := strconv.ParseInt(s, 16, 64)
		if e != nil && err == nil {
			err = fmt.Errorf("record %q: %v", v, e)
		}
		return n
	}
	occ, asd = hexs(p[0]), hexs(p[1])
	if len(p) == 3 {
		seq = hexs(p[2])
	}
	horizon = occ
	if hasHz {
		horizon = hexs(hz)
		if horizon <= occ && err == nil {
			err = fmt.Errorf("record %q carries a horizon not above its occurred time", v)
		}
	}
	return cls, occ, asd, seq, horizon, err
}

// retainedHour is a parsed hour field: the byte 1 (exact bounds) or 2 (loose: a bound may lie beyond
// the winners), then C,P,U and the bounds a,b (as offsets from the hour's start) in 5 bytes each.
// Only an hour that holds winners is stored, and it keeps its bounds.
type retainedHour struct {
	c, p, u int64
	bounded bool
	loose   bool
	a, b    int64 // offsets from the hour's start
}

// retainedSpan is apply.lua's index group span, in hours, under retention ret (µs).
func retainedSpan(ret int64) int64 { return min(max(ret/(8*hourUS), 1), 255) }

// retainedGroup is a parsed index group field: the byte 0, k (closed chunks), n (entries listed) and
// x (entries that moves may have left behind) in 5 bytes each, then the open chunk.
type retainedGroup struct {
	k, n, x int64
	open    string
}

// stateNumbers reads count little-endian unsigned numbers of width bytes from v, and what follows.
func stateNumbers(v string, width, count int) ([]int64, string, error) {
	if len(v) < width*count {
		return nil, "", fmt.Errorf("%d bytes, want %d numbers of %d bytes", len(v), count, width)
	}
	out := make([]int64, count)
	for i := range out {
		var x int64
		for j := width - 1; j >= 0; j-- {
			x = x<<8 | int64(v[i*width+j])
		}
		out[i] = x
	}
	return out, v[width*count:], nil
}

// headNumbers reads the state's head: the byte 10, the index group span in hours (one byte), then
// 21 numbers of 7 bytes, which it returns.
func headNumbers(v string) ([]int64, error) {
	if len(v) != 2+21*7 || v[0] != 10 {
		return nil, fmt.Errorf("head %q: want the byte 10, a span and 21 numbers of 7 bytes", v)
	}
	if v[1] < 1 {
		return nil, fmt.Errorf("head %q: index group span %d hours, want 1 to 255", v, v[1])
	}
	x, _, err := stateNumbers(v[2:], 7, 21)
	return x, err
}

// minuteNumbers reads a minute bucket: the byte 0, then C,P,U in 5 bytes each.
func minuteNumbers(v string) ([]int64, error) {
	if len(v) != 1+3*5 || v[0] != 0 {
		return nil, fmt.Errorf("minute %q: want the byte 0 and 3 numbers of 5 bytes", v)
	}
	x, _, err := stateNumbers(v[1:], 5, 3)
	return x, err
}

func retainedParseHour(v string) (retainedHour, error) {
	var h retainedHour
	if len(v) != 1+5*5 || (v[0] != 1 && v[0] != 2) {
		return h, fmt.Errorf("hour field %q: want the byte 1 or 2 and 5 numbers of 5 bytes", v)
	}
	h.loose = v[0] == 2
	vals, _, err := stateNumbers(v[1:], 5, 5)
	if err != nil {
		return h, fmt.Errorf("hour field %q: %v", v, err)
	}
	h.c, h.p, h.u, h.bounded, h.a, h.b = vals[0], vals[1], vals[2], true, vals[3], vals[4]
	return h, nil
}

func retainedParseGroup(v string) (retainedGroup, error) {
	var g retainedGroup
	if len(v) < 1+3*5 || v[0] != 0 {
		return g, fmt.Errorf("index group field %q: want the byte 0 and 3 numbers of 5 bytes", v)
	}
	vals, open, err := stateNumbers(v[1:], 5, 3)
	if err != nil {
		return g, fmt.Errorf("index group field %q: %v", v, err)
	}
	g.k, g.n, g.x, g.open = vals[0], vals[1], vals[2], open
	return g, nil
}

// retainedEntries splits an index chunk into record fields.
func retainedEntries(s string) ([]string, error) {
	var out []string
	for len(s) > 0 {
		if len(s) < 3 {
			return nil, fmt.Errorf("index chunk ends in %q", s)
		}
		n, err := strconv.ParseInt(s[:3], 16, 64)
		if err != nil || int(n)+3 > len(s) {
			return nil, fmt.Errorf("bad index entry at %q", s)
		}
		out = append(out, s[:3+n])
		s = s[3+n:]
	}
	return out, nil
}

// retainedIndex is what check learnt of one aggregate's index: per index group, the entries listed
// and the ids that have a reason to be listed there (their winner, while retained, or their
// horizon); per hour, whether it keeps bounds; and the group span G in hours.
type retainedIndex struct {
	listed  map[int64]int // entries, duplicates included
	reasons map[int64]int
	bounded map[int64]bool
	span    int64
}

// group returns the index group of hour h.
func (idx retainedIndex) group(h int64) int64 { return floorDiv(h, idx.span) }

// check compares aggregate k's stored state with what the model holds:
//   - every identity the model holds is stored with the same winner and horizon, and every other
//     stored record is garbage (its horizon is expired);
//   - every retained hour's counts are the model's and it keeps as bounds the least and greatest
//     occurred time of its winners (exact), or bounds within the hour that hold them (loose); an
//     hour that holds no winner (an expired one included) has no field;
//   - the index lists every retained winner under its hour's group and every identity under its
//     horizon's; every closed chunk a group counts exists, and none beyond; a retained group counts
//     exactly the entries it lists; a group that lists nothing has no field; every group that
//     lists ids is in the sorted set of groups, and the head's lowest listed group is its lowest
//     member;
//   - the head's counts and first and last occurred time are the model's, and its group span is
//     an eighth of the retention, from 1 to 255 hours.
func (x *retainedRig) check(what string, k Key) retainedIndex {
	t := x.t
	t.Helper()
	ctx := context.Background()
	keys := x.s.keys(k)
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("%s, %s: %s\n%s", what, k, fmt.Sprintf(format, args...), x.history(3))
	}
	recs, err := x.c.HGetAll(ctx, keys[0]).Result()
	if err != nil {
		t.Fatal(err)
	}
	st, err := x.c.HGetAll(ctx, keys[1]).Result()
	if err != nil {
		t.Fatal(err)
	}
	zs, err := x.c.ZRangeWithScores(ctx, keys[3], 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	a := x.m.aggs[k]
	idx := retainedIndex{listed: map[int64]int{}, reasons: map[int64]int{}, bounded: map[int64]bool{}}
	if a == nil {
		return idx
	}
	cutH := floorDiv(a.cut, hourUS)
	cut := cutH * hourUS

	// The head.
	head, ok := st["H"]
	if !ok {
		fail("no head")
	}
	x16, err := headNumbers(head)
	if err != nil {
		fail("%v", err)
	}
	idx.span = int64(head[1])
	if want := retainedSpan(x.spanRet); idx.span != want {
		fail("head's index group span %d hours, want %d (retention %d µs)", idx.span, want, x.ret)
	}
	cutG := floorDiv(cutH, idx.span)

	// Records.
	live := map[string]record{}
	for id, r := range a.opps {
		if r.horizon < cut {
			continue
		}
		f := retainedField(id)
		live[f] = r
		v, ok := recs[f]
		if !ok {
			fail("the record of %q (%+v) is missing", id, r)
		}
		cls, occ, asd, seq, hz, err := retainedRecord(v)
		if err != nil {
			fail("%v", err)
		}
		if cls != classCode(r.class) || occ != r.occ || asd != r.assessed || seq != r.seq || hz != r.horizon {
			fail("record of %q is %q, the model holds %+v", id, v, r)
		}
	}
	for f, v := range recs {
		if _, ok := live[f]; ok {
			continue
		}
		_, _, _, _, hz, err := retainedRecord(v)
		if err != nil {
			fail("%v", err)
		}
		if hz >= cut {
			fail("record %q = %q has a retained horizon, but the model holds no such identity", f, v)
		}
		x.seen["garbage"]++
	}

	// What the model says each hour holds.
	type modelHour struct {
		c, p, u, lo, hi int64
		n               int64
	}
	mh := map[int64]*modelHour{}
	var first, last int64
	var retained int64
	for _, r := range a.opps {
		if r.occ < cut {
			continue
		}
		h := r.occ / hourUS
		m := mh[h]
		if m == nil {
			m = &modelHour{lo: r.occ, hi: r.occ}
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
		m.n++
		m.lo, m.hi = min(m.lo, r.occ), max(m.hi, r.occ)
		if retained == 0 || r.occ < first {
			first = r.occ
		}
		if retained == 0 || r.occ > last {
			last = r.occ
		}
		retained++
	}

	// Hours, index groups and chunks.
	hours := map[int64]retainedHour{}
	groups := map[int64]retainedGroup{}
	chunks := map[int64]map[int64]string{}
	for f, v := range st {
		if f == "H" || f == "v" || f == "enc" || strings.HasPrefix(f, "m") {
			continue
		}
		if !strings.HasPrefix(f, "h") && !strings.HasPrefix(f, "i") {
			fail("unknown state field %q", f)
		}
		ns, is, isChunk := strings.Cut(f[1:], ".")
		n, err := strconv.ParseInt(ns, 10, 64)
		if err != nil || (isChunk && f[0] == 'h') {
			fail("state field %q", f)
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
			hours[n] = hv
		default:
			gv, err := retainedParseGroup(v)
			if err != nil {
				fail("%s: %v", f, err)
			}
			groups[n] = gv
		}
	}
	for h, hv := range hours {
		m := mh[h]
		if m == nil {
			fail("hour %d (cut %d) holds no winner in the model but is stored as %+v", h, cutH, hv)
		}
		if hv.c != m.c || hv.p != m.p || hv.u != m.u {
			fail("hour %d holds %d,%d,%d, the model %d,%d,%d", h, hv.c, hv.p, hv.u, m.c, m.p, m.u)
		}
		start := h * hourUS
		if !hv.loose && (hv.a != m.lo-start || hv.b != m.hi-start) {
			fail("hour %d of %d winners keeps exact bounds [%d, %d], want [%d, %d]", h, m.n, hv.a, hv.b, m.lo-start, m.hi-start)
		}
		if hv.loose {
			x.seen["loose"]++
			if hv.a > m.lo-start || hv.b < m.hi-start || hv.b >= hourUS {
				fail("hour %d of %d winners keeps loose bounds [%d, %d] that do not hold its winners [%d, %d]", h, m.n, hv.a, hv.b, m.lo-start, m.hi-start)
			}
		}
		idx.bounded[h] = true
		x.seen["bounded"]++
	}
	for h, m := range mh {
		if _, ok := hours[h]; !ok {
			fail("hour %d holds %d winners in the model and has no field", h, m.n)
		}
	}
	listed := map[int64]map[string]bool{}
	for g, gv := range groups {
		set := map[string]bool{}
		listed[g] = set
		add := func(chunk string) {
			es, err := retainedEntries(chunk)
			if err != nil {
				fail("index group %d: %v", g, err)
			}
			for _, e := range es {
				set[e] = true
				idx.listed[g]++
			}
		}
		for i := int64(1); i <= gv.k; i++ {
			c, ok := chunks[g][i]
			if !ok {
				fail("index group %d counts %d closed chunks but i%d.%d is missing", g, gv.k, g, i)
			}
			add(c)
		}
		add(gv.open)
		if gv.k > 0 {
			x.seen["closed chunks"]++
		}
		if idx.listed[g] == 0 {
			fail("index group %d lists nothing but is stored (%q)", g, st[fmt.Sprint("i", g)])
		}
		if g >= cutG && (gv.n != int64(idx.listed[g]) || gv.x > gv.n) {
			fail("index group %d counts %d entries (%d left behind), lists %d", g, gv.n, gv.x, idx.listed[g])
		}
	}
	for g, cs := range chunks {
		for i := range cs {
			if gv, ok := groups[g]; !ok || i > gv.k {
				fail("chunk i%d.%d is stored beyond the group's %d closed chunks", g, i, groups[g].k)
			}
		}
	}
	for f, r := range live {
		og, zg := idx.group(r.occ/hourUS), idx.group(r.horizon/hourUS)
		if r.occ >= cut {
			idx.reasons[og]++
			if !listed[og][f] {
				fail("retained winner %q (occ %d) is not listed under its hour's group %d", f, r.occ, og)
			}
		}
		if r.occ < cut || zg != og {
			idx.reasons[zg]++
		}
		if !listed[zg][f] {
			fail("identity %q (horizon %d) is not listed under its horizon's group %d", f, r.horizon, zg)
		}
	}
	for g, n := range idx.listed {
		if n > 2*idx.reasons[g]+64 {
			x.seen["overgrown index"]++
			x.seen["most entries over"] = max(x.seen["most entries over"], n-2*idx.reasons[g]-64)
		}
	}
	members := map[int64]bool{}
	var lowest int64
	for i, z := range zs {
		g, err := strconv.ParseInt(z.Member.(string), 10, 64)
		if err != nil || float64(g) != z.Score {
			fail("groups set member %v", z)
		}
		members[g] = true
		if i == 0 {
			lowest = g
		}
	}
	for g := range groups {
		if !members[g] {
			fail("index group %d lists ids but is not in the sorted set of groups %v: garbage collection would never visit it", g, zs)
		}
	}

	opt := func(i int) (int64, bool) { return x16[i] - 1, x16[i] > 0 }
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
	if x16[8] != mc || x16[9] != mp || x16[10] != mu {
		fail("head counts %d,%d,%d, model %d,%d,%d", x16[8], x16[9], x16[10], mc, mp, mu)
	}
	if want := max(cutH+1, 0); x16[20] != want {
		fail("head's cut %d (stored plus one), the model's %d", x16[20], want)
	}
	g, okg := opt(7)
	if len(zs) > 0 && (!okg || g != lowest) {
		fail("head's lowest listed group %d %v, the sorted set's lowest %d", g, okg, lowest)
	}
	return idx
}

// collect applies batches of one expired observation (they change nothing, and garbage collection
// runs with every batch) until the store holds no garbage that collection owes: no record whose
// horizon's index group is wholly expired, no field of an expired hour or of a wholly expired
// group, no wholly expired group in the sorted set. It fails if rounds batches do not get there.
func (x *retainedRig) collect(k Key, at time.Time, rounds int) {
	x.t.Helper()
	ctx := context.Background()
	a := x.m.aggs[k]
	cutH := floorDiv(a.cut, hourUS)
	if cutH <= 0 {
		x.t.Fatalf("collect needs an expired hour 0 (cut %d)", cutH)
	}
	span := retainedSpan(x.spanRet)
	cutG := floorDiv(cutH, span)
	for i := 0; i < rounds; i++ {
		x.apply("collect", []Observation{{Key: k, OpportunityID: "expired-probe", Class: Passed, Occurred: 0, Assessed: 0}}, at)
		keys := x.s.keys(k)
		garbage := 0
		for _, v := range x.c.HGetAll(ctx, keys[0]).Val() {
			if _, _, _, _, hz, _ := retainedRecord(v); floorDiv(hz/hourUS, span) < cutG {
				garbage++
			}
		}
		stale := 0
		for f := range x.c.HGetAll(ctx, keys[1]).Val() {
			if strings.HasPrefix(f, "h") || strings.HasPrefix(f, "i") {
				n, _ := strconv.ParseInt(strings.SplitN(f[1:], ".", 2)[0], 10, 64)
				if (f[0] == 'h' && n < cutH) || (f[0] == 'i' && n < cutG) {
					stale++
				}
			}
		}
		low := x.c.ZRangeByScore(ctx, keys[3], &redis.ZRangeBy{Min: "-inf", Max: "(" + strconv.FormatInt(cutG, 10)}).Val()
		if garbage == 0 && stale == 0 && len(low) == 0 {
			return
		}
		if i == rounds-1 {
			x.t.Fatalf("after %d batches, %d garbage records, %d fields of expired hours or groups, expired groups listed %v", rounds, garbage, stale, low)
		}
	}
}

// retainedOffsets are offsets within an hour that collide often (ties) or sit at its edges.
var retainedOffsets = []int64{0, 1, 2, 1800e6, 1800e6 + 1, hourUS - 2, hourUS - 1}

func retainedOffset(r *rand.Rand) int64 {
	if r.IntN(3) == 0 {
		return r.Int64N(hourUS)
	}
	return retainedOffsets[r.IntN(len(retainedOffsets))]
}

// retainedID is the id of opportunity i; some carry the bytes the state's fields use as separators.
func retainedID(i int) string {
	if i%5 == 0 {
		return fmt.Sprintf("x|%d;,\x00", i)
	}
	return fmt.Sprintf("x%03d", i)
}

// retainedSize is a batch size: often one or a few, often enough to carry an hour across 32 winners.
func retainedSize(r *rand.Rand) int {
	switch r.IntN(4) {
	case 0:
		return 1
	case 1:
		return 2 + r.IntN(8)
	default:
		return 20 + r.IntN(70)
	}
}

// retainedDeliver applies batches made by next (nil ends), and now and then applies a batch again at
// once (a retried script whose reply was lost) or redelivers every batch since the last commit, in
// order, at the current observation time.
func (x *retainedRig) deliver(r *rand.Rand, next func(i int) ([]Observation, time.Time)) time.Time {
	x.t.Helper()
	apply := func(what string, b []Observation, at time.Time) { x.apply(what, b, at) }
	return retainedDeliverWith(r, x.seen, apply, x.again, next)
}

// retainedDeliverWith is retainedRig.deliver's schedule through the given apply and again (a rig that checks
// more than retainedRig does reuses it).
func retainedDeliverWith(r *rand.Rand, seen map[string]int, apply, again func(what string, b []Observation, at time.Time),
	next func(i int) ([]Observation, time.Time)) time.Time {
	var done []retainedBatch
	committed := 0
	var at time.Time
	for i := 0; ; i++ {
		batch, bat := next(i)
		if batch == nil {
			return at
		}
		at = bat
		apply(fmt.Sprint("batch ", i), batch, at)
		done = append(done, retainedBatch{batch, at})
		if r.IntN(6) == 0 {
			again(fmt.Sprint("batch ", i, " retried"), batch, at)
		}
		if r.IntN(4) == 0 {
			committed = len(done)
		}
		if r.IntN(9) == 0 && committed < len(done) {
			upTo := committed + r.IntN(len(done)-committed)
			for j := committed; j <= upTo; j++ {
				again(fmt.Sprint("batch ", j, " redelivered after batch ", i), done[j].obs, at)
			}
			seen["redelivered"]++
		}
	}
}

// TestBoundedHoursMatchModel moves about a hundred opportunities between three hours in
// batches of 1 to 90, so that hours cross 32 winners up and down within a batch and across
// batches, with occurred times that tie (several winners at one µs) and sit at the hours' edges,
// re-assessments that move an opportunity within its hour, to another and back, stale assessments
// and byte-identical duplicates, retried and redelivered batches.
func TestBoundedHoursMatchModel(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		retainedBackends(t, seed == 1, func(t *testing.T, c *redis.Client) { retainedRunBounded(t, c, seed, 120) })
	}
}

func retainedRunBounded(t *testing.T, c *redis.Client, seed uint64, batches int) {
	r := rand.New(rand.NewPCG(seed, 6))
	x := newRetainedRig(t, c, "bounded", 30*24*time.Hour)
	base := (Micros(t0)/hourUS - 2) * hourUS
	asd := base + 10*hourUS
	var sent []Observation
	var maxOcc int64
	x.deliver(r, func(i int) ([]Observation, time.Time) {
		if i == batches {
			return nil, time.Time{}
		}
		n := retainedSize(r)
		batch := make([]Observation, 0, n)
		for len(batch) < n {
			switch p := r.IntN(100); {
			case p < 12 && len(sent) > 0: // the same event again, or an older one: stale or duplicate
				batch = append(batch, sent[r.IntN(len(sent))])
			default:
				asd += int64(r.IntN(2))
				o := Observation{Key: keyLive, OpportunityID: retainedID(r.IntN(100)), Class: Class(1 + r.IntN(3)),
					Occurred: base + int64(r.IntN(3))*hourUS + retainedOffset(r), Assessed: asd, Seq: int64(r.IntN(2))}
				if r.IntN(10) == 0 {
					o.Assessed -= int64(r.IntN(40)) // older than what may be held
				}
				batch = append(batch, o)
			}
		}
		sent = append(sent, batch...)
		for _, o := range batch {
			maxOcc = max(maxOcc, o.Occurred)
		}
		return batch, time.UnixMicro(maxOcc + int64(r.IntN(120))*1e6)
	})
	x.tallies(time.UnixMicro(maxOcc))
	t.Logf("outcomes %v, seen %v", x.outs, x.seen)
	if x.seen["bounded"] == 0 || x.outs[Reassessed] == 0 || x.outs[Stale] == 0 || x.outs[Duplicate] == 0 {
		t.Fatal("the sequence never reached a bounded hour, a re-assessment, a stale or a duplicate")
	}
}

// TestRetentionHoursBoundAtEveryTie holds an hour around 32 winners whose least and greatest occurred
// µs are each shared by four of them, and takes the bound holders away one at a time (each leaves
// at a bound, with others still at it, until the last one moves the bound while the hour still
// keeps bounds), drops below 32 and comes back above it in one batch, moves the top holders out
// and back in one batch, and at exactly 32 lets one leave while another enters at a new extreme.
func TestRetentionHoursBoundAtEveryTie(t *testing.T) {
	retainedBackends(t, true, retainedRunTies)
}

func retainedRunTies(t *testing.T, c *redis.Client) {
	x := newRetainedRig(t, c, "ties", 30*24*time.Hour)
	h := Micros(t0)/hourUS - 5
	start := h * hourUS
	asd := start + 20*hourUS
	next := func(i int, occ int64) Observation {
		asd++
		return Observation{Key: keyLive, OpportunityID: fmt.Sprint("t", i), Class: Class(1 + i%3), Occurred: occ, Assessed: asd}
	}
	at := time.UnixMicro(start + 3*hourUS)
	bounds := func(what string, want bool) {
		t.Helper()
		if idx := x.check(what, keyLive); idx.bounded[h] != want {
			t.Fatalf("%s: the hour keeps bounds %v, want %v", what, idx.bounded[h], want)
		}
	}
	// 36 winners: 4 at the hour's first µs (t0..t3), 4 at its last (t32..t35), 28 between.
	var batch []Observation
	for i := 0; i < 36; i++ {
		occ := start + 1000 + int64(i)
		switch {
		case i < 4:
			occ = start
		case i >= 32:
			occ = start + hourUS - 1
		}
		batch = append(batch, next(i, occ))
	}
	x.apply("36 winners", batch, at)
	bounds("36 winners", true)
	// The low bound holders move to the next hour, one per batch: the bound stays while a tie
	// holds it, and moves up when the last one leaves, at 32 winners.
	for i := 0; i < 4; i++ {
		x.apply(fmt.Sprint("low holder ", i, " leaves"), []Observation{next(i, start+hourUS+int64(i))}, at)
	}
	bounds("32 winners", true)
	// One from between leaves: 31, the bounds stay as they are (layout 9: every hour that holds
	// winners keeps its bounds).
	x.apply("t10 leaves", []Observation{next(10, start-1)}, at)
	bounds("31 winners", true)
	// In one batch: the five come back, one of the top holders leaves: 35.
	batch = nil
	for _, i := range []int{0, 1, 2, 3, 10} {
		batch = append(batch, next(i, start+int64(i%2)))
	}
	batch = append(batch, next(33, start+2*hourUS))
	x.apply("back, and one top holder leaves", batch, at)
	bounds("35 winners", true)
	// In one batch: the other top holders leave and come back (one of them twice, one a µs
	// lower), while the hour dips below 32.
	batch = nil
	for _, i := range []int{32, 34, 35, 5, 6, 7} {
		batch = append(batch, next(i, start-hourUS+int64(i)))
	}
	for _, i := range []int{32, 34, 35, 34} {
		batch = append(batch, next(i, start+hourUS-1-int64(i%2)))
	}
	x.apply("top holders leave and return", batch, at)
	bounds("32 winners again", true)
	// Re-assessed in place (same occurred time, another class): nothing moves.
	x.apply("in place", []Observation{next(0, start), next(32, start+hourUS-1)}, at)
	// At exactly 32, one from between leaves and a newcomer enters below the low bound: still 32.
	x.apply("one out, one in below", []Observation{next(20, start+hourUS), next(40, start)}, at)
	x.apply("one out, one in above", []Observation{next(21, start+hourUS), next(41, start+hourUS-1)}, at)
	bounds("32 winners with new extremes", true)
	// Every winner leaves to the hour before but one; then it leaves too.
	batch = nil
	for i := 1; i < 42; i++ {
		batch = append(batch, next(i, start-hourUS+int64(i)*1000))
	}
	x.apply("all but one leave", batch, at)
	x.apply("the last one leaves", []Observation{next(0, start-1)}, at)
	bounds("no winner", false)
	x.tallies(at)
}

// TestFirstLastUnderShortRetention runs 1h to 3h retention with a watermark that
// creeps, jumps a few hours and now and then past everything held, with re-assessments that move
// the holder of the first or the last retained occurred time to another hour (found from the
// model), stale assessments dated later than the winner (the horizon grows), late and expired
// events, and identities that expire and come back; batches are retried and redelivered. At the
// end garbage collection must have deleted every expired record and index chunk.
func TestFirstLastUnderShortRetention(t *testing.T) {
	garbage := 0
	for _, tc := range []struct {
		seed      uint64
		retention time.Duration
		pool      int
		embedded  bool
	}{
		{1, 2 * time.Hour, 60, true}, {2, 3 * time.Hour, 60, false}, {3, 2 * time.Hour, 200, false}, {4, 3 * time.Hour, 200, true},
		{5, time.Hour, 100, false}, {6, 150 * time.Minute, 100, false},
	} {
		t.Run(fmt.Sprint("seed", tc.seed), func(t *testing.T) {
			retainedBackends(t, tc.embedded, func(t *testing.T, c *redis.Client) {
				garbage += retainedRunShort(t, c, tc.seed, tc.retention, tc.pool, 150)
			})
		})
	}
	if garbage == 0 {
		t.Fatal("no sequence left a garbage record for the collection to delete")
	}
}

// retainedRunShort runs the sequence of TestFirstLastUnderShortRetention and returns how
// many garbage records its checks met.
func retainedRunShort(t *testing.T, c *redis.Client, seed uint64, retention time.Duration, pool, batches int) int {
	r := rand.New(rand.NewPCG(seed, 66))
	x := newRetainedRig(t, c, "shortret", retention)
	clock := Micros(t0)
	var maxOcc int64
	var sent []Observation
	// holder returns the id of the retained winner at the first (or last) occurred time.
	holder := func(last bool) (string, record, bool) {
		a := x.m.aggs[keyLive]
		if a == nil {
			return "", record{}, false
		}
		cut := floorDiv(a.cut, hourUS) * hourUS
		var id string
		var best record
		found := false
		ids := make([]string, 0, len(a.opps))
		for k := range a.opps {
			ids = append(ids, k)
		}
		sort.Strings(ids)
		for _, k := range ids {
			rec := a.opps[k]
			if rec.occ < cut {
				continue
			}
			if !found || (!last && rec.occ < best.occ) || (last && rec.occ > best.occ) {
				id, best, found = k, rec, true
			}
		}
		return id, best, found
	}
	x.deliver(r, func(i int) ([]Observation, time.Time) {
		if i == batches {
			return nil, time.Time{}
		}
		switch p := r.IntN(100); {
		case p < 3:
			clock += int64(5+r.IntN(10)) * hourUS // past everything held
		case p < 15:
			clock += int64(1+r.IntN(3)) * hourUS
		default:
			clock += int64(r.IntN(15)) * 60e6
		}
		n := retainedSize(r)
		batch := make([]Observation, 0, n)
		for len(batch) < n {
			occ := clock - int64(r.ExpFloat64()*float64(30*60e6))
			if r.IntN(10) == 0 {
				occ = clock - r.Int64N(int64(retention/time.Microsecond)+2*hourUS) // late, maybe expired
			}
			occ = max(occ, 0)
			switch p := r.IntN(100); {
			case p < 12: // the holder of first or last moves to another hour (or within its own)
				id, rec, ok := holder(r.IntN(2) == 0)
				if !ok {
					continue
				}
				moved := occ
				if r.IntN(3) == 0 {
					moved = rec.occ/hourUS*hourUS + retainedOffset(r)
				}
				batch = append(batch, Observation{Key: keyLive, OpportunityID: id, Class: Class(1 + r.IntN(3)),
					Occurred: moved, Assessed: rec.assessed + 1 + r.Int64N(3), Seq: r.Int64N(2)})
			case p < 20: // a stale assessment dated later than the winner: the horizon grows
				id, rec, ok := holder(r.IntN(2) == 0)
				if !ok || rec.assessed == 0 {
					continue
				}
				batch = append(batch, Observation{Key: keyLive, OpportunityID: id, Class: Class(1 + r.IntN(3)),
					Occurred: min(rec.occ+r.Int64N(2*hourUS), clock), Assessed: rec.assessed - 1})
			case p < 32 && len(sent) > 0:
				batch = append(batch, sent[len(sent)-1-r.IntN(min(len(sent), 400))])
			default:
				batch = append(batch, Observation{Key: keyLive, OpportunityID: fmt.Sprintf("s%03d", r.IntN(pool)),
					Class: Class(1 + r.IntN(3)), Occurred: occ, Assessed: clock + r.Int64N(3), Seq: r.Int64N(2)})
			}
		}
		sent = append(sent, batch...)
		for _, o := range batch {
			maxOcc = max(maxOcc, o.Occurred)
		}
		at := maxOcc + int64(r.IntN(120))*1e6
		switch r.IntN(12) {
		case 0, 1, 2:
			at = maxOcc - int64(r.IntN(9*60))*1e6 // events slightly ahead of the observer
		case 3:
			at = maxOcc + r.Int64N(50*hourUS) // an observer far ahead of the events (a backfill)
		}
		return batch, time.UnixMicro(at)
	})
	at := time.UnixMicro(maxOcc)
	x.tallies(at)
	x.collect(keyLive, at, 60)
	t.Logf("outcomes %v, seen %v", x.outs, x.seen)
	if x.outs[Expired] == 0 || x.outs[Stale] == 0 || x.outs[Reassessed] == 0 {
		t.Fatal("the sequence never expired, staled or re-assessed")
	}
	return x.seen["garbage"]
}

// TestStoredDuplicateFirstThenReassessed starts batches with byte-identical copies of
// stored winners (their hour is not read up front) and then, in the same batch, assesses the same
// opportunities again: newer (to their own hour, another hour, back), stale and dated later (the
// horizon grows), or again the same. The hours touched so lazily must be read before they change.
func TestStoredDuplicateFirstThenReassessed(t *testing.T) {
	for _, seed := range []uint64{1, 2} {
		retainedBackends(t, seed == 1, func(t *testing.T, c *redis.Client) { retainedRunLazy(t, c, seed, 80) })
	}
}

func retainedRunLazy(t *testing.T, c *redis.Client, seed uint64, batches int) {
	r := rand.New(rand.NewPCG(seed, 666))
	ret := 6 * time.Hour
	x := newRetainedRig(t, c, "lazyhour", ret)
	clock := Micros(t0)
	asd := clock
	var maxOcc int64
	// Seed: 120 opportunities over four hours.
	var seedBatch []Observation
	for i := 0; i < 120; i++ {
		asd++
		occ := clock - int64(i%4)*hourUS - retainedOffset(r)
		seedBatch = append(seedBatch, Observation{Key: keyLive, OpportunityID: fmt.Sprintf("d%03d", i), Class: Class(1 + i%3), Occurred: occ, Assessed: asd})
		maxOcc = max(maxOcc, occ)
	}
	x.apply("seed", seedBatch, time.UnixMicro(maxOcc))
	stored := func(id string) (Observation, bool) {
		rec, ok := x.m.aggs[keyLive].opps[id]
		if !ok || rec.horizon != rec.occ {
			return Observation{}, false // a record with a horizon is no byte-identical copy
		}
		return Observation{Key: keyLive, OpportunityID: id, Class: rec.class, Occurred: rec.occ, Assessed: rec.assessed, Seq: rec.seq}, true
	}
	lazy := 0
	x.deliver(r, func(i int) ([]Observation, time.Time) {
		if i == batches {
			return nil, time.Time{}
		}
		if r.IntN(8) == 0 {
			clock += int64(r.IntN(90)) * 60e6 // hours expire now and then
		}
		var batch, later []Observation
		for _, j := range r.Perm(120)[:1+r.IntN(40)] {
			id := fmt.Sprintf("d%03d", j)
			o, ok := stored(id)
			if !ok {
				continue
			}
			batch = append(batch, o)
			lazy++
			for range 1 + r.IntN(3) {
				asd++
				n := o
				switch p := r.IntN(6); p {
				case 0: // newer, same occurred time, maybe another class
					n.Class, n.Assessed = Class(1+r.IntN(3)), asd
				case 1: // newer, another µs of its hour
					n.Occurred, n.Assessed = o.Occurred/hourUS*hourUS+retainedOffset(r), asd
				case 2: // newer, another hour (up to three back or one ahead, within the clock)
					n.Occurred, n.Assessed = min(clock, o.Occurred+int64(r.IntN(5)-3)*hourUS+r.Int64N(1000)), asd
				case 3: // stale and dated later: the horizon grows (maybe into a new hour)
					n.Occurred, n.Assessed = min(clock, o.Occurred+r.Int64N(3*hourUS)), o.Assessed-1
				case 4: // the same again
				default: // newer, far back: maybe expired
					n.Occurred, n.Assessed = max(0, o.Occurred-int64(ret/time.Microsecond)), asd
				}
				later = append(later, n)
			}
		}
		// Every id's copy comes first, then its later assessments, interleaved with others'.
		r.Shuffle(len(later), func(a, b int) { later[a], later[b] = later[b], later[a] })
		batch = append(batch, later...)
		if r.IntN(3) == 0 { // a new opportunity now and then keeps hours filling
			asd++
			batch = append(batch, Observation{Key: keyLive, OpportunityID: fmt.Sprintf("d%03d", r.IntN(120)), Class: Passed, Occurred: clock - r.Int64N(hourUS), Assessed: asd})
		}
		if len(batch) == 0 {
			batch = append(batch, seedBatch[0])
		}
		for _, o := range batch {
			maxOcc = max(maxOcc, o.Occurred)
		}
		return batch, time.UnixMicro(maxOcc + 60e6)
	})
	x.tallies(time.UnixMicro(maxOcc))
	t.Logf("outcomes %v, %d stored copies first in a batch, seen %v", x.outs, lazy, x.seen)
	if lazy < 100 || x.outs[Reassessed] == 0 || x.outs[Stale] == 0 {
		t.Fatal("too few stored copies, re-assessments or stale assessments")
	}
}

// TestStoredDuplicateSequences are the lazy hour reads one by one: a stored winner's
// byte-identical copy first in the batch, then the same opportunity assessed again.
func TestStoredDuplicateSequences(t *testing.T) {
	retainedBackends(t, true, retainedRunSequences)
}

func retainedRunSequences(t *testing.T, c *redis.Client) {
	h := time.Hour
	m := time.Minute
	for _, tc := range []struct {
		name    string
		seed    []Observation // applied first, at t0 + 3h
		batches [][]Observation
	}{
		{"copy, then moved to another hour", []Observation{obs("a", Confirmed, 30*m, h, 0), obs("b", Passed, 40*m, h, 0)},
			[][]Observation{{obs("a", Confirmed, 30*m, h, 0), obs("a", Passed, 90*m, 2*h, 0)}}},
		{"copy, stale dated later (horizon), then newer back in the old hour", []Observation{obs("a", Confirmed, 30*m, h, 0)},
			[][]Observation{{obs("a", Confirmed, 30*m, h, 0), obs("a", Passed, 150*m, 30*m, 0), obs("a", Unscored, 20*m, 2*h, 0)}}},
		{"copy, moved out and back in one batch", []Observation{obs("a", Confirmed, 30*m, h, 0), obs("b", Passed, 31*m, h, 0)},
			[][]Observation{{obs("a", Confirmed, 30*m, h, 0), obs("a", Passed, 70*m, 2*h, 0), obs("a", Unscored, 29*m, 2*h, 1)}}},
		{"the only winner: copy, then moved, so first and last move", []Observation{obs("a", Confirmed, 0, h, 0)},
			[][]Observation{{obs("a", Confirmed, 0, h, 0), obs("a", Passed, 2*h+59*m, 2*h, 0)}}},
		{"copy of an expiring winner after a jump, then re-assessed", []Observation{obs("a", Confirmed, 10*m, h, 0), obs("b", Passed, 2*h, 2*h, 0)},
			[][]Observation{{obs("b", Passed, 2*h, 2*h, 0), obs("c", Passed, 5*h, 5*h, 0), obs("a", Confirmed, 10*m, h, 0), obs("a", Passed, 4*h, 6*h, 0)}}},
		{"copy, then a conflicting copy under the same assessment", []Observation{obs("a", Confirmed, 30*m, h, 0)},
			[][]Observation{{obs("a", Confirmed, 30*m, h, 0), obs("a", Passed, 80*m, h, 0), obs("a", Passed, 30*m, h, 1)}}},
		{"two copies, then each moved into the other's hour", []Observation{obs("a", Confirmed, 10*m, h, 0), obs("b", Passed, 70*m, h, 0)},
			[][]Observation{{obs("a", Confirmed, 10*m, h, 0), obs("b", Passed, 70*m, h, 0), obs("a", Passed, 71*m, 2*h, 0), obs("b", Confirmed, 9*m, 2*h, 0)}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := newRetainedRig(t, c, "lazyseq", 3*time.Hour)
			at := t0.Add(3 * time.Hour)
			x.apply("seed", tc.seed, at)
			for i, b := range tc.batches {
				at = t0.Add(6 * time.Hour)
				got := x.apply(fmt.Sprint("batch ", i), b, at)
				if got.Outcomes[0] != Duplicate && got.Outcomes[0] != Expired {
					t.Fatalf("the first event was %v: not the stored copy this test is about", got.Outcomes[0])
				}
				x.again(fmt.Sprint("batch ", i, " again"), b, at)
			}
			x.tallies(at)
		})
	}
}

// TestRetentionEpochHours dates events at the first hours of 1970: hour 0 starts at 0, so bounds
// are offsets from 0, the cut is negative at first, and the sorted set of hours holds hour 0.
// Hour 0 fills past 32 winners with its bounds at µs 0 and at its last µs, opportunities move
// between hours 0, 1 and 2, then the watermark passes them and garbage collection takes hour 0.
func TestRetentionEpochHours(t *testing.T) {
	retainedBackends(t, true, retainedRunEpoch)
}

func retainedRunEpoch(t *testing.T, c *redis.Client) {
	r := rand.New(rand.NewPCG(1970, 1))
	x := newRetainedRig(t, c, "epoch", 2*time.Hour)
	var asd int64 = 10
	next := func(id string, occ int64) Observation {
		asd++
		return Observation{Key: keyLive, OpportunityID: id, Class: Class(1 + r.IntN(3)), Occurred: occ, Assessed: asd}
	}
	var batch []Observation
	for i := 0; i < 40; i++ {
		occ := int64(i) * 1000
		switch i % 8 {
		case 0:
			occ = 0
		case 7:
			occ = hourUS - 1
		}
		batch = append(batch, next(fmt.Sprint("e", i), occ))
	}
	x.apply("hour 0 of 1970", batch, time.UnixMicro(hourUS-1))
	for round := 0; round < 30; round++ {
		batch = batch[:0]
		for range retainedSize(r) {
			h := int64(r.IntN(3))
			batch = append(batch, next(fmt.Sprint("e", r.IntN(45)), h*hourUS+retainedOffset(r)))
		}
		w := x.m.aggs[keyLive].watermark
		for _, o := range batch {
			w = max(w, o.Occurred)
		}
		x.apply(fmt.Sprint("round ", round), batch, time.UnixMicro(w))
		if r.IntN(4) == 0 {
			x.again(fmt.Sprint("round ", round, " again"), batch, time.UnixMicro(w))
		}
	}
	// The watermark passes hour 0, then everything.
	x.apply("hour 3", []Observation{next("late", 3*hourUS+5)}, time.UnixMicro(3*hourUS+5))
	x.apply("hour 4", []Observation{next("later", 4*hourUS)}, time.UnixMicro(4*hourUS))
	x.collect(keyLive, time.UnixMicro(4*hourUS), 10)
	x.apply("hour 9", []Observation{next("latest", 9*hourUS)}, time.UnixMicro(9*hourUS))
	x.collect(keyLive, time.UnixMicro(9*hourUS), 10)
	x.tallies(time.UnixMicro(9 * hourUS))
	if x.seen["bounded"] == 0 {
		t.Fatal("no bounded hour was seen")
	}
}

// TestRetentionManyIDsInOneHour lists hundreds of long ids under hours (closed chunks), with and
// without bounds: an hour of 300 winners (bounded) of which 290 leave for an earlier hour, so that
// it keeps 10 winners (no bounds) but lists 300 ids for their horizon while it holds the last
// retained winner and that winner moves (its chunks are scanned); then the 290 move on to a later
// hour, taking their horizon along, and the next scan of each hour compacts its index.
func TestRetentionManyIDsInOneHour(t *testing.T) {
	retainedBackends(t, true, retainedRunManyIDs)
}

func retainedRunManyIDs(t *testing.T, c *redis.Client) {
	// 8 hours' retention: index groups of one hour, so that the moves between hours leave entries
	// behind; 30 days': one group of 24 hours holds them all.
	for _, ret := range []time.Duration{8 * time.Hour, 30 * 24 * time.Hour} {
		t.Run(ret.String(), func(t *testing.T) { retainedRunManyIDsUnder(t, c, ret) })
	}
}

func retainedRunManyIDsUnder(t *testing.T, c *redis.Client, ret time.Duration) {
	x := newRetainedRig(t, c, "manyids", ret)
	id := func(i int) string { return fmt.Sprintf("opportunity-with-a-long-name-%05d", i) }
	hA := Micros(t0)/hourUS - 10
	hB := hA - 3
	at := time.UnixMicro((hA + 3) * hourUS)
	asd := (hA + 20) * hourUS
	next := func(i int, occ int64) Observation {
		asd++
		return Observation{Key: keyLive, OpportunityID: id(i), Class: Class(1 + i%3), Occurred: occ, Assessed: asd}
	}
	var batch []Observation
	for i := 0; i < 300; i++ {
		batch = append(batch, next(i, hA*hourUS+int64(i)*10e6))
	}
	x.apply("300 in hour A", batch, at)
	idx := x.check("300 in hour A", keyLive)
	gA, gB := idx.group(hA), idx.group(hB)
	if !idx.bounded[hA] || idx.listed[gA] != 300 {
		t.Fatalf("hour A: bounded %v, its group lists %d", idx.bounded[hA], idx.listed[gA])
	}
	// 290 leave hour A for the earlier hour B, the top bound holders first: A's group is
	// scanned for its new bounds, and keeps listing them for their horizon.
	batch = batch[:0]
	for i := 299; i >= 10; i-- {
		batch = append(batch, next(i, hB*hourUS+int64(i)))
	}
	x.apply("290 leave A for B", batch, at)
	idx = x.check("290 leave A for B", keyLive)
	if !idx.bounded[hA] || !idx.bounded[hB] || idx.listed[gA] < 300 || x.seen["closed chunks"] == 0 {
		t.Fatalf("hour A bounded %v, its group listing %d, hour B bounded %v, closed chunks seen %d", idx.bounded[hA], idx.listed[gA], idx.bounded[hB], x.seen["closed chunks"])
	}
	// Hour A is the highest with winners: the last winner (its top bound) moves within A (A's
	// group is read to find the new bound), leaves A, and B's first winner leaves B and comes
	// back.
	x.apply("last moves within A", []Observation{next(9, hA*hourUS+5)}, at)
	x.apply("last leaves A", []Observation{next(8, hB*hourUS+hourUS-1)}, at)
	x.apply("first leaves B", []Observation{next(10, hA*hourUS+1)}, at)
	x.apply("first comes back", []Observation{next(10, hB*hourUS)}, at)
	// The 290 move on to hour A+1, later than their horizon: it goes along, so neither A nor
	// B has a reason to list them any more.
	batch = batch[:0]
	for i := 10; i < 300; i++ {
		batch = append(batch, next(i, (hA+1)*hourUS+int64(i)))
	}
	x.apply("290 to A+1", batch, at)
	// Hour A's last winners leave one per batch, up and down: it empties.
	for i := 0; i < 10; i++ {
		if i == 8 {
			continue
		}
		occ := hB*hourUS + hourUS/2 + int64(i)
		if i%2 == 1 {
			occ = (hA+2)*hourUS + int64(i)
		}
		x.apply(fmt.Sprint("winner ", i, " leaves A"), []Observation{next(i, occ)}, at)
	}
	idx = x.check("A emptied", keyLive)
	for _, g := range []int64{gA, gB} {
		if idx.listed[g] > 2*idx.reasons[g]+64 {
			t.Errorf("index group %d lists %d ids for %d reasons", g, idx.listed[g], idx.reasons[g])
		}
	}
	if idx.listed[gA] == 0 || (idx.span == 1 && idx.listed[gA] >= 300) {
		t.Errorf("hour A's group lists %d ids: its horizons are lost, or it was never compacted", idx.listed[gA])
	}
	x.tallies(at)
}

// TestTwoAggregatesInterleaved runs the bounded-hours sequence over two aggregates in
// the same batches (one script call each), so that one aggregate's hours never leak into the
// other's, with retries and redeliveries.
func TestTwoAggregatesInterleaved(t *testing.T) {
	retainedBackends(t, false, retainedRunTwoAggregates)
}

func retainedRunTwoAggregates(t *testing.T, c *redis.Client) {
	r := rand.New(rand.NewPCG(22, 6))
	x := newRetainedRig(t, c, "twoaggs", 2*time.Hour)
	other := keyLive
	other.Source = Evaluation
	clock := Micros(t0)
	asd := clock
	var maxOcc int64
	x.deliver(r, func(i int) ([]Observation, time.Time) {
		if i == 100 {
			return nil, time.Time{}
		}
		clock += int64(r.IntN(20)) * 60e6
		n := retainedSize(r)
		var batch []Observation
		for len(batch) < n {
			k := keyLive
			if r.IntN(2) == 0 {
				k = other
			}
			asd += int64(r.IntN(2))
			occ := max(0, clock-int64(r.IntN(3))*hourUS+retainedOffset(r)-hourUS)
			batch = append(batch, Observation{Key: k, OpportunityID: fmt.Sprintf("y%03d", r.IntN(150)), Class: Class(1 + r.IntN(3)),
				Occurred: min(occ, clock), Assessed: asd - int64(r.IntN(3)), Seq: int64(r.IntN(2))})
		}
		for _, o := range batch {
			maxOcc = max(maxOcc, o.Occurred)
		}
		return batch, time.UnixMicro(maxOcc + 30e6)
	})
	x.tallies(time.UnixMicro(maxOcc))
	if x.seen["bounded"] == 0 || x.outs[Expired] == 0 {
		t.Fatalf("seen %v, outcomes %v: no bounded hour or no expiry", x.seen, x.outs)
	}
}

// TestLargeBatchOfCopiesThenMoves sends one aggregate a batch of more observations than
// the script reads in one command (4 000): byte-identical copies of 3 000 stored winners first
// (their hours not read up front), then newer assessments of the same opportunities that move them
// between four hours (each well past 32 winners, bound holders among them), stale ones dated later
// than their winners, and the copies once more; then the batch again.
func TestLargeBatchOfCopiesThenMoves(t *testing.T) {
	retainedBackends(t, false, retainedRunLargeCopies)
}

func retainedRunLargeCopies(t *testing.T, c *redis.Client) {
	r := rand.New(rand.NewPCG(4000, 6))
	x := newRetainedRig(t, c, "largecopies", 30*24*time.Hour)
	base := (Micros(t0)/hourUS - 6) * hourUS
	at := time.UnixMicro(base + 6*hourUS)
	var seed []Observation
	for i := 0; i < 3000; i++ {
		seed = append(seed, Observation{Key: keyLive, OpportunityID: fmt.Sprintf("big-%05d", i), Class: Class(1 + i%3),
			Occurred: base + int64(i%4)*hourUS + retainedOffset(r), Assessed: base + 10*hourUS})
	}
	x.apply("seed", seed, at)
	batch := append([]Observation(nil), seed...)
	for i := 0; i < 3000; i++ {
		o := seed[r.IntN(len(seed))]
		switch r.IntN(3) {
		case 0:
			o.Occurred, o.Assessed, o.Seq = base+int64(r.IntN(4))*hourUS+retainedOffset(r), o.Assessed+1+int64(i), int64(r.IntN(2))
		case 1:
			o.Occurred, o.Assessed = o.Occurred/hourUS*hourUS+retainedOffset(r), o.Assessed+1+int64(i)
		default:
			o.Occurred, o.Assessed = min(o.Occurred+r.Int64N(2*hourUS), base+5*hourUS), o.Assessed-1
		}
		batch = append(batch, o)
	}
	batch = append(batch, seed[:2000]...)
	if len(batch) <= 4000 {
		t.Fatalf("batch of %d: not past one command's 4 000", len(batch))
	}
	x.apply("copies then moves", batch, at)
	x.again("copies then moves, again", batch, at)
	x.tallies(at)
	if x.outs[Reassessed] == 0 || x.outs[Stale] == 0 || x.outs[Duplicate] < 3000 || x.seen["bounded"] == 0 {
		t.Fatalf("outcomes %v, seen %v", x.outs, x.seen)
	}
}
