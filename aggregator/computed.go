package aggregator

import (
	"strconv"
	"strings"
)

// The processor computes the commonest apply call itself: in layout 10, an aggregate that exists,
// every record new or a byte-for-byte duplicate, each new one in an index group that lists ids
// already, the window sums cached for the observation time, no hour expiring, no minutes to prune,
// no garbage to collect, no index to compact and no TTL stamp to refresh. It reads what apply.lua
// would read, computes the fields apply.lua would write and its reply, and stores them through
// store.lua, which refuses unless every field read still holds what was read; any other call, and a
// refused one, runs apply.lua (docs/performance.md, "Storing state the processor computed"). The
// computation is apply.lua's on that path, held to it byte for byte by computed_path_test.go.

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
	c             [3]int64
	a, b          int64
	bounded, lose bool
}

// computedGroup is an index group field as read, and the record fields the call lists in it.
type computedGroup struct {
	k, n, x int64
	open    string
	add     []string
}

// callRead is what the processor reads for one call before computing it: the state fields and the
// record fields, as one HMGET each.
type callRead struct {
	state   []string // H, v, then every hour, group and minute the call may touch
	records []string // the call's record fields
}

// planRead returns the fields a call of records recs at record fields fields reads, for an aggregate
// whose index groups span span hours, or false when the processor cannot compute the call: a
// record field that repeats, or a record it cannot read.
func planRead(fields, recs []string, span int64) (callRead, bool) {
	seen := make(map[string]struct{}, 2+3*len(recs))
	plan := callRead{state: []string{"H", "v"}, records: fields}
	add := func(f string) {
		if _, ok := seen[f]; !ok {
			seen[f] = struct{}{}
			plan.state = append(plan.state, f)
		}
	}
	ids := make(map[string]struct{}, len(fields))
	var top int64 // the greatest occurred time so far: a minute below its floor is never bumped
	for i, rec := range recs {
		if _, ok := ids[fields[i]]; ok {
			return callRead{}, false
		}
		ids[fields[i]] = struct{}{}
		_, occ, ok := recordClassOccurred(rec)
		if !ok {
			return callRead{}, false
		}
		top = max(top, occ)
		h := floorDiv(occ, hourUS)
		add("h" + strconv.FormatInt(h, 10))
		add("i" + strconv.FormatInt(floorDiv(h, span), 10))
		if m := floorDiv(occ, minuteUS); m >= floorDiv(top, minuteUS)-minuteKeep {
			add("m" + strconv.FormatInt(m, 10))
		}
	}
	return plan, true
}

// recordClassOccurred reads a layout 10 record's class (0 C, 1 P, 2 U) and occurred time.
func recordClassOccurred(rec string) (int, int64, bool) {
	if len(rec) < 3 {
		return 0, 0, false
	}
	j := strings.IndexByte("CPU", rec[0])
	comma := strings.IndexByte(rec[2:], ',')
	if j < 0 || comma < 0 {
		return 0, 0, false
	}
	occ, err := strconv.ParseInt(rec[1:2+comma], 16, 64)
	if err != nil || occ < 0 {
		return 0, 0, false
	}
	return j, occ, true
}

// computedCall is a call the processor computed: what it stores and what apply.lua would have
// replied.
type computedCall struct {
	state    []any // state field, value, ...: the fields apply.lua would set
	records  []any // record field, value, ...: the new records
	outcomes []Outcome
	tally    Tally
	// stamp is the head's server-clock stamp of the TTL refresh: the store refuses the call when
	// it is due (apply.lua would refresh it), as the processor cannot read Redis's clock.
	stamp int64
	// args are store.lua's arguments (storeArgs).
	args []any
}

// computeCall computes a call as apply.lua would, from the fields plan read: state[i] is the value
// of plan.state[i] and held[i] of plan.records[i] (present false when absent). ret is the
// retention, at the observation time (µs), ttl the idle TTL in ms. It returns false for any call
// off the path the package comment names; apply.lua runs those.
func computeCall(plan callRead, state []string, present []bool, held []string, heldPresent []bool,
	recs []string, ret, at, ttl int64) (*computedCall, bool) {
	if !present[0] || len(state[0]) != headBytes || state[0][0] != 10 {
		return nil, false
	}
	head := state[0]
	span := int64(head[1])
	if span != groupSpan(ret) {
		return nil, false // the aggregate keeps another retention's groups: not the fields read
	}
	var x [21]int64
	for i := range x {
		x[i] = littleEndian(head[2+7*i : 9+7*i])
	}
	// w, pm, f, l, the cached minute and hour, the lowest listed group and the cut are stored plus
	// one, 0 meaning absent: every one is present on this path.
	for _, i := range []int{0, 1, 2, 3, 4, 5, 7, 20} {
		if x[i] == 0 {
			return nil, false
		}
	}
	w, pm, f, l, hcm, hch, g, cutH := x[0]-1, x[1]-1, x[2]-1, x[3]-1, x[4]-1, x[5]-1, x[7]-1, x[20]-1
	stamp := x[6] - 1
	if ttl > 0 && x[6] == 0 {
		return nil, false // no stamp yet: apply.lua sets one
	}
	counts := [3]int64{x[8], x[9], x[10]}
	var hr, dy, wk [3]int64
	copy(hr[:], x[11:14])
	copy(dy[:], x[14:17])
	copy(wk[:], x[17:20])
	v := int64(0)
	if present[1] {
		n, err := strconv.ParseInt(state[1], 10, 64)
		if err != nil {
			return nil, false
		}
		v = n
	}
	M, H := floorDiv(at, minuteUS), floorDiv(at, hourUS)
	if hcm != M || hch != H {
		return nil, false // the window sums are shifted or recomputed
	}
	if floorDiv(w-ret, hourUS) > cutH || g < floorDiv(cutH, span) {
		return nil, false // hours expire, or garbage is collected
	}
	field := make(map[string]int, len(plan.state))
	for i, s := range plan.state {
		field[s] = i
	}
	hours := map[int64]*computedHour{}
	mins := map[int64]*[3]int64{}
	groups := map[int64]*computedGroup{}
	var hourOrder, minOrder, groupOrder []int64
	out := &computedCall{outcomes: make([]Outcome, len(recs)), stamp: stamp}
	mfloor := floorDiv(w, minuteUS) - minuteKeep
	cut := cutH * hourUS
	changed := false
	for i, rec := range recs {
		j, occ, ok := recordClassOccurred(rec)
		if !ok {
			return nil, false
		}
		if occ > w {
			w = occ
			if floorDiv(w-ret, hourUS) > cutH || max(floorDiv(w, minuteUS)-minuteKeep, 0)-pm >= 60 {
				return nil, false
			}
			mfloor = floorDiv(w, minuteUS) - minuteKeep
		}
		if occ < cut {
			return nil, false // expired
		}
		if heldPresent[i] {
			if held[i] != rec {
				return nil, false // a reassessment, an older one, or garbage
			}
			out.outcomes[i] = Duplicate
			continue
		}
		changed = true
		out.outcomes[i] = Counted
		out.records = append(out.records, plan.records[i], rec)
		h := floorDiv(occ, hourUS)
		d := floorDiv(h, span)
		gr := groups[d]
		if gr == nil {
			p, ok := field["i"+strconv.FormatInt(d, 10)]
			if !ok || !present[p] || len(state[p]) < groupHead || state[p][0] != 0 {
				return nil, false // a new group: its sorted set and the TTL stamp change too
			}
			v := state[p]
			gr = &computedGroup{k: littleEndian(v[1:6]), n: littleEndian(v[6:11]), x: littleEndian(v[11:16]), open: v[16:]}
			if gr.k == 0 && gr.open == "" {
				return nil, false
			}
			groups[d] = gr
			groupOrder = append(groupOrder, d)
		}
		gr.add = append(gr.add, plan.records[i])
		t := hours[h]
		if t == nil {
			p, ok := field["h"+strconv.FormatInt(h, 10)]
			if !ok {
				return nil, false
			}
			t = &computedHour{}
			if present[p] {
				v := state[p]
				if len(v) != hourBytes || (v[0] != 1 && v[0] != 2) {
					return nil, false
				}
				start := h * hourUS
				t.c = [3]int64{littleEndian(v[1:6]), littleEndian(v[6:11]), littleEndian(v[11:16])}
				t.a, t.b, t.bounded, t.lose = start+littleEndian(v[16:21]), start+littleEndian(v[21:26]), true, v[0] == 2
			}
			hours[h] = t
			hourOrder = append(hourOrder, h)
		}
		if !t.bounded {
			t.a, t.b, t.bounded = occ, occ, true
		} else {
			t.a, t.b = min(t.a, occ), max(t.b, occ)
		}
		f, l = min(f, occ), max(l, occ)
		counts[j]++
		t.c[j]++
		if occ >= mfloor*minuteUS {
			m := floorDiv(occ, minuteUS)
			q := mins[m]
			if q == nil {
				p, ok := field["m"+strconv.FormatInt(m, 10)]
				if !ok {
					return nil, false
				}
				q = &[3]int64{}
				if present[p] {
					v := state[p]
					if len(v) != minuteBytes || v[0] != 0 {
						return nil, false
					}
					*q = [3]int64{littleEndian(v[1:6]), littleEndian(v[6:11]), littleEndian(v[11:16])}
				}
				mins[m] = q
				minOrder = append(minOrder, m)
			}
			q[j]++
			if m <= M && m >= M-59 {
				hr[j]++
			}
		}
		if h <= H && h >= H-167 {
			wk[j]++
			if h >= H-23 {
				dy[j]++
			}
		}
	}
	set := func(f string, v string) { out.state = append(out.state, f, v) }
	for _, d := range groupOrder {
		gr := groups[d]
		name := "i" + strconv.FormatInt(d, 10)
		gr.n += int64(len(gr.add))
		if 2*gr.x >= gr.n+64 {
			return nil, false // apply.lua compacts the group
		}
		var b strings.Builder
		b.WriteString(gr.open)
		size := len(gr.open)
		for _, id := range gr.add {
			if size+len(id) > chunkBytes && size > 0 {
				gr.k++
				set(name+"."+strconv.FormatInt(gr.k, 10), b.String())
				b.Reset()
				size = 0
			}
			b.WriteString(id)
			size += len(id)
		}
		buf := make([]byte, 0, groupHead+b.Len())
		buf = append(buf, 0)
		buf = appendLittleEndian(buf, gr.k, 5)
		buf = appendLittleEndian(buf, gr.n, 5)
		buf = appendLittleEndian(buf, min(gr.x, gr.n), 5)
		set(name, string(append(buf, b.String()...)))
	}
	for _, h := range hourOrder {
		t := hours[h]
		kind := byte(1)
		if t.lose {
			kind = 2
		}
		buf := append(make([]byte, 0, hourBytes), kind)
		for _, n := range t.c {
			buf = appendLittleEndian(buf, n, 5)
		}
		buf = appendLittleEndian(buf, t.a-h*hourUS, 5)
		buf = appendLittleEndian(buf, t.b-h*hourUS, 5)
		set("h"+strconv.FormatInt(h, 10), string(buf))
	}
	for _, m := range minOrder {
		buf := append(make([]byte, 0, minuteBytes), 0)
		for _, n := range mins[m] {
			buf = appendLittleEndian(buf, n, 5)
		}
		set("m"+strconv.FormatInt(m, 10), string(buf))
	}
	if changed {
		v = max(v+1, at)
		set("v", strconv.FormatInt(v, 10))
	}
	nh := append(make([]byte, 0, headBytes), 10, byte(span))
	for _, n := range []int64{w + 1, pm + 1, f + 1, l + 1, hcm + 1, hch + 1, x[6], g + 1} {
		nh = appendLittleEndian(nh, n, 7)
	}
	for _, n := range [][3]int64{counts, hr, dy, wk} {
		for _, c := range n {
			nh = appendLittleEndian(nh, c, 7)
		}
	}
	nh = appendLittleEndian(nh, cutH+1, 7)
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
