package aggregator

import (
	"strconv"
	"strings"

	"github.com/repeatrate/repeatrate/schemas"
)

// The processor computes the commonest apply call itself (layout 10 here, layout 11's differences
// in computed11.go): an aggregate that exists, every record new, a duplicate, an older assessment
// that leaves the horizon as it is, or a newer assessment of the same occurrence (its count moves
// between classes in place), an opportunity met more than once meeting its record as the call's
// earlier occurrences left it, each new one in an index group that lists ids already, the window
// sums cached for the observation time or, for one of the 59 minutes before it, for the minute
// this processor's last stored call on the aggregate left them (sumsMinutes: it moves them on over
// the minutes, and over the hour when one turned, as apply.lua does), no hour that holds a winner
// expiring (the cut moves past empty ones), no prune of more than 300 minutes or into the hour's
// window, no garbage to collect, no index to compact and no TTL stamp to refresh. It reads what
// apply.lua would read, computes the fields apply.lua would write and its reply, and stores them
// through store.lua, which refuses unless every field read still holds what was read; any other
// call, and a refused one, runs apply.lua (docs/performance.md, "Storing state the processor
// computed"). The computation is apply.lua's on
// that path, held to it byte for byte by computed_path_test.go.

// Sizes of apply.lua's layout 10 fields (docs in apply.lua's header).
const (
	headBytes   = 2 + 21*7 // the byte 10, the group span, 21 numbers of 7 bytes
	hourBytes   = 1 + 5*5  // the byte 1 or 2, C, P, U and two bounds in 5 bytes each
	minuteBytes = 1 + 3*5  // the byte 0, C, P, U in 5 bytes each
	groupHead   = 1 + 3*5  // the byte 0, k, n, x in 5 bytes each, then the open chunk

	minuteKeep = 70  // apply.lua's MKEEP: minute buckets kept behind the newest event
	chunkBytes = 480 // apply.lua's CHUNKBYTES: an index chunk is closed before it grows past it
)

// groupSpan is apply.lua's G: the hours an index group spans under retention ret (µs).
func groupSpan(ret int64) int64 { return min(max(ret/(8*hourUS), 1), 255) }

// littleEndian reads the unsigned little-endian number in b.
func littleEndian(b string) int64 {
	var x int64
	for i := len(b) - 1; i >= 0; i-- {
		x = x<<8 | int64(b[i])
	}
	return x
}

// appendLittleEndian appends x in width bytes, little-endian.
func appendLittleEndian(b []byte, x int64, width int) []byte {
	for range width {
		b = append(b, byte(x))
		x >>= 8
	}
	return b
}

// computedHour is an hour field as read and changed: counts by class, and the bounds of its
// winners' occurred times (absolute µs) when it holds any.
type computedHour struct {
	c              [3]int64
	a, b           int64
	bounded, loose bool
}

// computedGroup is an index group field as read, and the record fields the call lists in it.
type computedGroup struct {
	k, n, x int64
	open    string
	add     []string
}

// callRead is what the processor reads for one call before computing it, as one HMGET of the state
// fields and one of the call's record fields, and where each record's hour, index group and minute
// are among the state fields.
type callRead struct {
	state   []any // H, v, then every hour, group and minute the call may touch, as strings
	records []any // the call's record fields (Encoded's arguments)
	class   []int8
	occ     []int64
	// hourAt, groupAt and minuteAt are each record's fields' indexes in state; minuteAt is -1 for a
	// minute below every floor the call can have.
	hourAt, groupAt, minuteAt []int32
	// repeats says that a record field occurs more than once in the call: each occurrence meets
	// the record as the ones before it left it, as in apply.lua.
	repeats bool
	// shiftFrom is the minute the call expects the head's window sums to be for when it read the
	// minutes that move them on to its own (-1 when it read none); shiftOut and shiftIn are those
	// that leave the hour's window and those that enter it, as indexes in state.
	shiftFrom         int64
	shiftOut, shiftIn []int32
	// turn is, when shiftFrom lies in the hour before the call's, the hours that move the day's
	// and the week's sums on: the one that leaves the week's window, the one that leaves the
	// day's, and the call's own, which enters both.
	turn []hourAt
}

// hourAt is an hour a call reads, and its field's index in state (in layout 11, its day's).
type hourAt struct {
	h  int64
	at int32
}

// sumsMinutes is, per aggregate, the minute its head's window sums are for as this processor last
// left them: every call it stores, computed or apply.lua's, leaves them for its observation
// time's minute. A call less than an hour of minutes later then reads the minutes that leave and
// enter the hour's window with its other fields (planRead), and the hours that leave and enter the
// day's and the week's when the hour turned, and the processor moves the sums on as apply.lua
// would (computeCall), where otherwise apply.lua ran the call, and in layout 11 the bucket cache
// forgot the aggregate: every busy aggregate's first call of each minute. A wrong minute (another
// processor wrote the aggregate since) only leaves the call to apply.lua, as the head read says
// which minute its sums are for; in layout 11 the call reads again from that minute when its
// buckets take a second round trip (computeCalls). Bounded as shapeCache. Guarded by sealMu.
type sumsMinutes map[Key]int64

// put records that aggregate k's window sums are for minute m.
func (c *sumsMinutes) put(k Key, m int64) { boundedPut((*map[Key]int64)(c), k, m) }

// maxComputedRecords is the most records a call the processor computes may hold: a larger call's
// fixed cost in apply.lua is spread thin already, and store.lua's arguments stay far below what
// one script call can unpack.
const maxComputedRecords = 1000

// planRead returns what a call reads, for an aggregate whose index groups span span hours, given
// the call's record fields (strings) and each record's class (0 C, 1 P, 2 U) and occurred time, or
// false when the processor cannot compute the call: more than maxComputedRecords records. With
// days (layout 11) a record's hour is read from its day's field. now is the observation time: the
// minute of a record that occurred within 2 hours before it is read, as apply.lua reads (and
// checks) it, even when the call cannot bump it. since is the minute the processor expects the
// window sums to be for (sumsMinutes; -1 when it does not know): when it is one of the 59 minutes
// before now's, the minutes that move the sums on to now's are read too, and when it lies in the
// hour before, the hours that move the day's and the week's sums on.
func planRead(fields []any, class []int8, occ []int64, span, now int64, days bool, since int64) (*callRead, bool) {
	n := len(fields)
	if n > maxComputedRecords {
		return nil, false
	}
	plan := &callRead{state: append(make([]any, 0, 8), "H", "v"), records: fields,
		class: class, occ: occ, hourAt: make([]int32, 3*n)}
	plan.groupAt, plan.minuteAt = plan.hourAt[n:2*n], plan.hourAt[2*n:]
	plan.hourAt = plan.hourAt[:n]
	var buf []byte
	at := map[int64]int32{} // a field's index in state by its number and kind (0 h, 1 i, 2 m, 3 d: the low 2 bits)
	field := func(kind byte, x int64) int32 {
		key := x<<2 | int64(strings.IndexByte("himd", kind))
		if i, ok := at[key]; ok {
			return i
		}
		buf = strconv.AppendInt(append(buf[:0], kind), x, 10)
		i := int32(len(plan.state))
		at[key] = i
		plan.state = append(plan.state, string(buf))
		return i
	}
	ids := make(map[string]struct{}, n)
	var top int64 // the greatest occurred time so far: a minute below its floor is never bumped
	lastH, lastM := int64(-1), int64(-1)
	var hi, gi, mi int32
	for i, f := range fields {
		id, _ := f.(string)
		if _, ok := ids[id]; ok {
			plan.repeats = true
		}
		ids[id] = struct{}{}
		top = max(top, occ[i])
		if h := floorDiv(occ[i], hourUS); h != lastH {
			if days {
				hi = field('d', floorDiv(h, 24))
			} else {
				hi = field('h', h)
			}
			gi, lastH = field('i', floorDiv(h, span)), h
		}
		plan.hourAt[i], plan.groupAt[i], plan.minuteAt[i] = hi, gi, -1
		if m := floorDiv(occ[i], minuteUS); m >= floorDiv(top, minuteUS)-minuteKeep || occ[i] >= now-2*hourUS {
			if m != lastM {
				mi, lastM = field('m', m), m
			}
			plan.minuteAt[i] = mi
		}
	}
	plan.shiftFrom = -1
	// As apply.lua moves the sums on (less than an hour of minutes turned): the minutes since-59
	// to M-60 leave the hour's window, since+1 to M enter it; when the hour turned too (by one:
	// fewer than 60 minutes did), hour H-168 leaves the week's, H-24 the day's, and H enters both.
	if M := floorDiv(now, minuteUS); since >= 0 && since < M && M-since < 60 {
		plan.shiftFrom = since
		for m := since - 59; m <= M-60; m++ {
			plan.shiftOut = append(plan.shiftOut, field('m', m))
		}
		for m := since + 1; m <= M; m++ {
			plan.shiftIn = append(plan.shiftIn, field('m', m))
		}
		if H := floorDiv(M, 60); floorDiv(since, 60) != H {
			for _, h := range []int64{H - 168, H - 24, H} {
				var at int32
				if days {
					at = field('d', floorDiv(h, 24))
				} else {
					at = field('h', h)
				}
				plan.turn = append(plan.turn, hourAt{h, at})
			}
		}
	}
	return plan, true
}

// classIndex is a class's index in a call's counts (0 C, 1 P, 2 U), as apply.lua reads it from the
// record's first letter (classCode).
func classIndex(c Class) int8 { return int8(strings.IndexByte("CPU", classCode(c))) }

// computedCall is a call the processor computed: what it stores and what apply.lua would have
// replied.
type computedCall struct {
	state    []any // state field, value, ...: the fields apply.lua would set
	unset    []any // the state fields apply.lua would delete: the minutes a prune passed
	records  []any // record field, value, ...: the new records
	deletes  []any // layout 11: the bucket fields a split emptied
	outcomes []Outcome
	tally    Tally
	// stamp is the head's server-clock stamp of the TTL refresh: the store refuses the call when
	// it is due (apply.lua would refresh it), as the processor cannot read Redis's clock.
	stamp int64
	// args are store.lua's arguments (storeArgs).
	args []any
	// shape is, in layout 11, the packed store's shape the call leaves in the head.
	shape *packedShapeOf
	// buckets are, in layout 11, the packed store's buckets as the call read and left them (nil
	// when the call leaves the store without a stamp or a token), readStamp and readToken their
	// write stamp and token as read,
	// and token the one the call writes with them, or readToken when it writes none
	// (bucketCache).
	buckets                     *bucketStore
	readStamp, readToken, token string
}

// computedField is a state field of a call as the computation loaded and changed it.
type computedField struct {
	loaded bool
	hour   computedHour
	minute [3]int64
	group  *computedGroup
	day    *[24]computedHour // layout 11: a day's hours
}

// computeCall computes a call as apply.lua would, from the fields plan read: state[i] is the value
// of plan.state[i] and held[i] of plan.records[i] (nil when absent, a string otherwise), as HMGET
// replies. recs are the call's records, ret the retention, at the observation time (µs), ttl the
// idle TTL in ms. store is layout 11's packed record store as read (computed11.go), nil in layout
// 10. It returns false for any call off the path named at the top of this file; apply.lua runs
// those.
func computeCall(plan *callRead, state, held, recs []any, ret, at, ttl int64, store *bucketStore) (*computedCall, bool) {
	head, ok := state[0].(string)
	if !ok || (store == nil && (len(head) != headBytes || head[0] != 10)) || (store != nil && !isHead11(head)) {
		return nil, false
	}
	span := int64(head[1])
	if span != groupSpan(ret) {
		return nil, false // the aggregate keeps another retention's groups: not the fields read
	}
	var x [21]int64
	for i := range x {
		// Lua's doubles round a number past 2⁵³, which the processor would not: a head that
		// holds one (written by hand) is apply.lua's.
		if x[i] = littleEndian(head[2+7*i : 9+7*i]); x[i] > schemas.MaxAssessmentSeq {
			return nil, false
		}
	}
	// w, pm, f, l, the cached minute and hour, the lowest listed group and the cut are stored plus
	// one, 0 meaning absent: every one is present on this path.
	for _, i := range []int{0, 1, 2, 3, 4, 5, 7, 20} {
		if x[i] == 0 {
			return nil, false
		}
	}
	w, pm, f, l, hcm, hch, g, cutH := x[0]-1, x[1]-1, x[2]-1, x[3]-1, x[4]-1, x[5]-1, x[7]-1, x[20]-1
	if ttl > 0 && x[6] == 0 {
		return nil, false // no stamp yet: apply.lua sets one
	}
	counts := [3]int64{x[8], x[9], x[10]}
	var hr, dy, wk [3]int64
	copy(hr[:], x[11:14])
	copy(dy[:], x[14:17])
	copy(wk[:], x[17:20])
	v := int64(0)
	if s, ok := state[1].(string); ok {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n > schemas.MaxAssessmentSeq {
			return nil, false
		}
		v = n
	}
	M, H := floorDiv(at, minuteUS), floorDiv(at, hourUS)
	shift, turn := hcm != M, hch != H
	if shift && plan.shiftFrom != hcm || turn && (!shift || len(plan.turn) == 0 || hch != floorDiv(hcm, 60) || H != hch+1) {
		return nil, false // the window sums are recomputed, or moved on over minutes or hours not read
	}
	if floorDiv(w-ret, hourUS) > cutH || g < floorDiv(cutH, span) {
		return nil, false // hours expire, or garbage is collected
	}
	fields := make([]computedField, len(plan.state))
	parse := parseRecord10
	if store != nil {
		parse = parseRecord11
	}
	if !checkFields(plan, state, fields) {
		return nil, false
	}
	if shift {
		// apply.lua's shift, before any bump: the minutes that left the hour's window out and
		// those that entered in, as they stand before the call. A sum that falls below 0 (a head
		// written by hand) has apply.lua recompute them all.
		for s, ps := range [2][]int32{plan.shiftOut, plan.shiftIn} {
			for _, p := range ps {
				if v, ok := state[p].(string); ok { // checked by checkFields
					for j := range hr {
						hr[j] += int64(2*s-1) * littleEndian(v[1+5*j:6+5*j])
					}
				}
			}
		}
		if turn {
			// The hours, as apply.lua moves the day's and the week's sums on: H-168 leaves the
			// week, H-24 the day, H enters both.
			var c [3][3]int64
			for k, ta := range plan.turn {
				c[k] = hourCounts(state[ta.at], fields[ta.at].day, ta.h)
			}
			for j := range wk {
				wk[j] += c[2][j] - c[0][j]
				dy[j] += c[2][j] - c[1][j]
			}
		}
		for _, n := range [][3]int64{hr, dy, wk} {
			if n[0] < 0 || n[1] < 0 || n[2] < 0 {
				return nil, false
			}
		}
		hcm, hch = M, H
	}
	out := &computedCall{outcomes: make([]Outcome, len(recs)), records: make([]any, 0, 2*len(recs)), stamp: x[6] - 1}
	mfloor := floorDiv(w, minuteUS) - minuteKeep
	cut := cutH * hourUS
	// The minutes pruned by the call, [pruneFrom, pruneTo), when pruneTo >= 0.
	pruneFrom, pruneTo := int64(-1), int64(-1)
	changed := false
	// written holds, when ids repeat, where each record this call wrote has its value in
	// out.records: a later occurrence meets that value, and the record is written once.
	var written map[string]int
	if plan.repeats {
		written = make(map[string]int)
	}
	// put writes record field id's value v: in place when the call wrote it already.
	put := func(id any, v any) {
		if written != nil {
			key, _ := id.(string)
			if pos, ok := written[key]; ok {
				out.records[pos] = v
				return
			}
			written[key] = len(out.records) + 1
		}
		out.records = append(out.records, id, v)
	}
	// loadHour returns record i's hour (hour h) as read: its field, or in layout 11 its entry in
	// its day (checkFields checked both).
	loadHour := func(i int, h int64) *computedHour {
		hf := &fields[plan.hourAt[i]]
		if hf.day != nil {
			hf.loaded = true
			return &hf.day[h-floorDiv(h, 24)*24]
		}
		t := &hf.hour
		if !hf.loaded {
			hf.loaded = true
			if v, ok := state[plan.hourAt[i]].(string); ok { // checked by checkFields
				start := h * hourUS
				t.c = [3]int64{littleEndian(v[1:6]), littleEndian(v[6:11]), littleEndian(v[11:16])}
				t.a, t.b, t.bounded, t.loose = start+littleEndian(v[16:21]), start+littleEndian(v[21:26]), true, v[0] == 2
			}
		}
		return t
	}
	// bump adds d to class j at occurred time occ of record i, in hour t, as apply.lua's bump: the
	// counts, the hour, the minute when above the floor, and the window sums.
	bump := func(i int, j int8, occ int64, t *computedHour, d int64) bool {
		counts[j] += d
		t.c[j] += d
		if occ >= mfloor*minuteUS {
			p := plan.minuteAt[i]
			if p < 0 {
				return false // not read: cannot happen, the plan reads every minute a call can bump
			}
			mf := &fields[p]
			if !mf.loaded {
				mf.loaded = true
				if v, ok := state[p].(string); ok { // checked by checkFields
					mf.minute = [3]int64{littleEndian(v[1:6]), littleEndian(v[6:11]), littleEndian(v[11:16])}
				}
			}
			mf.minute[j] += d
			if m := floorDiv(occ, minuteUS); m <= M && m >= M-59 {
				hr[j] += d
			}
		}
		if h := floorDiv(occ, hourUS); h <= H && h >= H-167 {
			wk[j] += d
			if h >= H-23 {
				dy[j] += d
			}
		}
		return true
	}
	for i := range recs {
		j, occ := plan.class[i], plan.occ[i]
		if occ > w {
			w = occ
			if nc := floorDiv(w-ret, hourUS); nc > cutH {
				// The cut moves up with the watermark, as apply.lua's raiseCut moves it: on this
				// path only past hours that hold no winner (the least retained one lies at or
				// above the new cut) and no index group it leaves wholly expired.
				if f < nc*hourUS || g < floorDiv(nc, span) {
					return nil, false
				}
				cutH, cut = nc, nc*hourUS
			}
			if nm := max(floorDiv(w, minuteUS)-minuteKeep, 0); nm-pm >= 60 {
				// apply.lua prunes the minutes below nm (pruneMinutes): on this path only a
				// range it names minute by minute, none of them in the hour's window (which
				// would have it recompute the sums).
				if nm-pm > 300 || nm > M-59 {
					return nil, false
				}
				if pruneTo < 0 {
					pruneFrom = pm
				}
				pruneTo, pm = nm, nm
			}
			mfloor = floorDiv(w, minuteUS) - minuteKeep
		}
		if occ < cut {
			return nil, false // expired
		}
		h := floorDiv(occ, hourUS)
		old, ok := held[i].(string)
		if written != nil {
			key, _ := plan.records[i].(string)
			if pos, seen := written[key]; seen {
				old, ok = out.records[pos].(string), true
			}
		}
		if ok {
			rec, _ := recs[i].(string)
			if old == rec {
				out.outcomes[i] = Duplicate
				continue
			}
			was, ok1 := parse(old)
			now, ok2 := parse(rec)
			if !ok1 || !ok2 || was.horizon < cut {
				// Garbage (its index entries move). The checks below refuse it too, as its
				// winner occurred before the cut and this record after it; this says why.
				return nil, false
			}
			if now.assessed < was.assessed || (now.assessed == was.assessed && now.seq <= was.seq) {
				if occ > was.horizon {
					return nil, false // an older assessment that grows the horizon: listed anew
				}
				out.outcomes[i] = Stale
				if now.assessed == was.assessed && now.seq == was.seq {
					out.outcomes[i] = Duplicate
				}
				continue
			}
			if was.occurred != occ {
				// The winner moves: its hour's bounds and the first and last may loosen, and
				// its index entries may move.
				return nil, false
			}
			// A newer assessment of the same occurrence: its count moves from the old class to
			// the new one in the same hour and minute, and the record keeps its horizon.
			t := loadHour(i, h)
			if !bump(i, was.class, occ, t, -1) || !bump(i, j, occ, t, 1) {
				return nil, false
			}
			changed = true
			out.outcomes[i] = Reassessed
			if was.horizon > occ && store != nil {
				rec = withHorizon11(rec, was.horizon)
			} else if was.horizon > occ {
				rec += ";" + strconv.FormatInt(was.horizon, 16)
			}
			put(plan.records[i], rec)
			continue
		}
		changed = true
		out.outcomes[i] = Counted
		put(plan.records[i], recs[i])
		gf := &fields[plan.groupAt[i]]
		if !gf.loaded {
			v, ok := state[plan.groupAt[i]].(string)
			if !ok {
				return nil, false // a new group: its sorted set and the TTL stamp change too
			}
			gf.loaded = true
			gf.group = &computedGroup{k: littleEndian(v[1:6]), n: littleEndian(v[6:11]), x: littleEndian(v[11:16]), open: v[16:],
				add: make([]string, 0, min(len(recs)-i, 16))}
			if gf.group.k == 0 && gf.group.open == "" {
				return nil, false
			}
		}
		id, _ := plan.records[i].(string)
		if store != nil {
			id = id[:4] // layout 11 lists a fingerprint's first 4 bytes
		}
		gf.group.add = append(gf.group.add, id)
		t := loadHour(i, h)
		if !t.bounded {
			t.a, t.b, t.bounded = occ, occ, true
		} else {
			t.a, t.b = min(t.a, occ), max(t.b, occ)
		}
		f, l = min(f, occ), max(l, occ)
		if !bump(i, j, occ, t, 1) {
			return nil, false
		}
	}
	set := func(f any, v string) { out.state = append(out.state, f, v) }
	var buf []byte
	for p := 2; p < len(fields); p++ {
		fd := &fields[p]
		if !fd.loaded {
			continue
		}
		name, _ := plan.state[p].(string)
		buf = buf[:0]
		switch name[0] {
		case 'i':
			gr := fd.group
			gr.n += int64(len(gr.add))
			if 2*gr.x >= gr.n+64 {
				return nil, false // apply.lua compacts the group
			}
			open, size := gr.open, len(gr.open)
			var chunk []byte
			for _, id := range gr.add {
				if size+len(id) > chunkBytes && size > 0 {
					gr.k++
					set(name+"."+strconv.FormatInt(gr.k, 10), open+string(chunk))
					open, chunk, size = "", chunk[:0], 0
				}
				chunk = append(chunk, id...)
				size += len(id)
			}
			buf = append(buf, 0)
			buf = appendLittleEndian(buf, gr.k, 5)
			buf = appendLittleEndian(buf, gr.n, 5)
			buf = appendLittleEndian(buf, min(gr.x, gr.n), 5)
			buf = append(append(buf, open...), chunk...)
		case 'h':
			t := &fd.hour
			kind := byte(1)
			if t.loose {
				kind = 2
			}
			start := floorDiv(t.a, hourUS) * hourUS
			buf = append(buf, kind)
			for _, n := range t.c {
				buf = appendLittleEndian(buf, n, 5)
			}
			buf = appendLittleEndian(buf, t.a-start, 5)
			buf = appendLittleEndian(buf, t.b-start, 5)
		case 'm':
			if pruneTo >= 0 {
				if m, _ := strconv.ParseInt(name[1:], 10, 64); m < pruneTo {
					continue // pruned after the call bumped it: deleted, as apply.lua leaves it
				}
			}
			buf = append(buf, 0)
			for _, n := range fd.minute {
				buf = appendLittleEndian(buf, n, 5)
			}
		case 'd':
			d, _ := strconv.ParseInt(name[1:], 10, 64)
			if buf = appendDay(buf, d, fd.day); string(buf) == state[p] {
				continue
			}
		}
		set(plan.state[p], string(buf))
	}
	for m := pruneFrom; m < pruneTo; m++ {
		out.unset = append(out.unset, "m"+strconv.FormatInt(m, 10))
	}
	if changed {
		v = max(v+1, at)
		set("v", strconv.FormatInt(v, 10))
	}
	nh := append(make([]byte, 0, headBytesWC), 10, byte(span))
	for _, n := range []int64{w + 1, pm + 1, f + 1, l + 1, hcm + 1, hch + 1, x[6], g + 1} {
		nh = appendLittleEndian(nh, n, 7)
	}
	for _, n := range [][3]int64{counts, hr, dy, wk} {
		for _, c := range n {
			nh = appendLittleEndian(nh, c, 7)
		}
	}
	nh = appendLittleEndian(nh, cutH+1, 7)
	if store != nil {
		// The records go into the packed store in the order the call first wrote them, as
		// apply.lua puts them, and the head keeps the shape they leave.
		for j := 0; j < len(out.records); j += 2 {
			fp, _ := out.records[j].(string)
			rec, _ := out.records[j+1].(string)
			if !store.put(fp, rec) {
				return nil, false
			}
		}
		out.records, out.deletes = store.writes()
		nh[0] = 11
		// The write count, raised as apply.lua raises it: one more, or the observation time
		// when greater.
		var wc int64
		if len(head) == headBytesWC {
			if wc = littleEndian(head[headBytes11:]); wc > schemas.MaxAssessmentSeq {
				return nil, false // past Lua's exact integers, as the numbers above
			}
		}
		if len(out.records)+len(out.deletes) > 0 {
			wc = max(wc+1, at)
		}
		for _, n := range []int64{store.l, store.p, store.n, wc} {
			nh = appendLittleEndian(nh, n, 7)
		}
	}
	if string(nh) != head {
		set("H", string(nh))
	}
	out.tally = Tally{
		Version: v,
		All:     Counts{counts[0], counts[1], counts[2]},
		Hour:    Counts{hr[0], hr[1], hr[2]},
		Day:     Counts{dy[0], dy[1], dy[2]},
		Week:    Counts{wk[0], wk[1], wk[2]},
		First:   f,
		Last:    l,
	}
	return out, true
}

// hourCounts returns hour h's counts as a call read them (checkFields checked the field): from v,
// its layout-10 field, or in layout 11 from day, its day's hours as parsed; 0 when absent.
func hourCounts(v any, day *[24]computedHour, h int64) [3]int64 {
	if day != nil {
		return day[h-floorDiv(h, 24)*24].c
	}
	s, ok := v.(string)
	if !ok {
		return [3]int64{}
	}
	return [3]int64{littleEndian(s[1:6]), littleEndian(s[6:11]), littleEndian(s[11:16])}
}

// record10 is a layout-10 record as apply.lua's parse reads it: class (0 C, 1 P, 2 U), the
// winner's occurred and assessed times and seq, and its horizon (its occurred time when the record
// carries none).
type record10 struct {
	class                   int8
	occurred, assessed, seq int64
	horizon                 int64
}

// parseRecord10 parses a layout-10 record as recordFields writes it ("C<occurred>,<assessed>" in
// lowercase hex, then ",<seq>" when not 0) and apply.lua adds to it (";<horizon>"), or reports
// false for anything else: apply.lua's pattern reads more shapes, which the processor leaves to it.
func parseRecord10(v string) (record10, bool) {
	if v == "" {
		return record10{}, false
	}
	r := record10{class: int8(strings.IndexByte("CPU", v[0]))}
	body, horizon, hasHorizon := strings.Cut(v[1:], ";")
	occurred, rest, ok1 := strings.Cut(body, ",")
	assessed, seq, hasSeq := strings.Cut(rest, ",")
	var ok bool
	r.occurred, ok = hexNumber(occurred)
	if r.class < 0 || !ok1 || !ok {
		return record10{}, false
	}
	if r.assessed, ok = hexNumber(assessed); !ok {
		return record10{}, false
	}
	if r.seq, ok = hexNumber(seq); hasSeq && !ok {
		return record10{}, false
	}
	r.horizon = r.occurred
	if hasHorizon {
		// apply.lua writes a horizon only above the occurred time; one at or below it (a record
		// written by hand) would make apply.lua leave an index group the processor keeps.
		if r.horizon, ok = hexNumber(horizon); !ok || r.horizon <= r.occurred {
			return record10{}, false
		}
	}
	return r, true
}

// hexNumber reads s, 1 to 14 lowercase hex digits of a number at most schemas.MaxAssessmentSeq
// (2⁵³−1, the schemas' bound), or reports false (0 for ""): Lua's doubles round numbers past 2⁵³,
// which the processor would not.
func hexNumber(s string) (int64, bool) {
	if s == "" || len(s) > 14 {
		return 0, false
	}
	var x int64
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= '0' && c <= '9':
			x = x<<4 | int64(c-'0')
		case c >= 'a' && c <= 'f':
			x = x<<4 | int64(c-'a'+10)
		default:
			return 0, false
		}
	}
	return x, x <= schemas.MaxAssessmentSeq
}
