package aggregator

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestComputedPathReadsDaysAsWritten: every day field appendDay writes reads back as written,
// and a field apply.lua refuses (its dayOf and parseHour) is refused here too, so that the
// processor never computes a call apply.lua would fail.
func TestComputedPathReadsDaysAsWritten(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 24))
	const d = 20513
	for range 20000 {
		var hours [24]computedHour
		for hk := range hours {
			if r.IntN(3) > 0 {
				continue
			}
			h := &hours[hk]
			for j := range h.c {
				h.c[j] = []int64{0, 1, 255, 256, 65535, 65536, 1<<24 - 1, 1 << 24, 1<<40 - 1}[r.IntN(9)]
			}
			if h.c == [3]int64{} {
				h.c[r.IntN(3)] = 1
			}
			start := (d*24 + int64(hk)) * hourUS
			a := r.Int64N(hourUS)
			h.a, h.b, h.bounded, h.loose = start+a, start+a+r.Int64N(hourUS-a), true, r.IntN(2) == 0
		}
		v := string(appendDay(nil, d, &hours))
		if v == "" {
			continue
		}
		var got [24]computedHour
		if !parseDay(v, d, &got) || got != hours {
			t.Fatalf("day %q read back as %+v, want %+v", v, got, hours)
		}
	}
	one := func(hk, code byte, c [3]int64, a, b int64) string {
		buf := []byte{hk | code<<6}
		for _, n := range c {
			buf = appendLittleEndian(buf, n, dayWidths[code])
		}
		return string(appendLittleEndian(appendLittleEndian(buf, a, 4), b, 4))
	}
	good := one(3, 0, [3]int64{1, 2, 3}, 5, 9)
	var hours [24]computedHour
	if !parseDay(good, d, &hours) {
		t.Fatal("a day of one hour refused")
	}
	for name, v := range map[string]string{
		"empty":               "",
		"hour 24":             one(24, 0, [3]int64{1, 0, 0}, 0, 0),
		"hours out of order":  one(5, 0, [3]int64{1, 0, 0}, 0, 0) + good,
		"an hour twice":       good + good,
		"cut short":           good[:len(good)-1],
		"stray bytes":         good + "x",
		"no counts":           one(3, 0, [3]int64{}, 5, 9),
		"counts wider":        one(3, 1, [3]int64{1, 2, 3}, 5, 9),
		"bounds crossed":      one(3, 0, [3]int64{1, 2, 3}, 9, 5),
		"bound past the hour": one(3, 0, [3]int64{1, 2, 3}, 5, hourUS),
	} {
		if parseDay(v, d, &hours) {
			t.Errorf("%s: day %q read", name, v)
		}
	}
}

// TestComputedPathReadsOnlyBucketsAndShapesTheStoreLeaves: a bucket that does not split into
// whole records of known tags, and a shape packed_records.lua refuses, are refused.
func TestComputedPathReadsOnlyBucketsAndShapesTheStoreLeaves(t *testing.T) {
	fp := strings.Repeat("f", 16)
	rec := string(append([]byte{1}, make([]byte, 14)...))
	for name, tc := range map[string]struct {
		v    string
		want bool
	}{
		"empty":              {"", true},
		"two records":        {fp + rec + fp + rec, true},
		"cut short":          {fp + rec[:10], false},
		"a fingerprint only": {fp, false},
		"an unknown tag":     {fp + "\x04" + rec[1:], false},
		"stray bytes":        {fp + rec + "x", false},
	} {
		if validBucket(tc.v) != tc.want {
			t.Errorf("%s: validBucket = %v, want %v", name, !tc.want, tc.want)
		}
	}
	head := func(l, p, n int64) string {
		b := append(make([]byte, 0, headBytes11), 11, 3)
		for range 21 {
			b = appendLittleEndian(b, 1, 7)
		}
		for _, x := range []int64{l, p, n} {
			b = appendLittleEndian(b, x, 7)
		}
		return string(b)
	}
	for _, tc := range []struct {
		l, p, n int64
		want    bool
	}{
		{0, 0, 0, true}, {0, 0, 8, true}, {0, 0, 9, false}, {1, 0, 8, true}, {1, 0, 3, false},
		{1, 1, 12, true}, {1, 2, 12, false}, {3, 5, 104, true}, {3, 5, 105, false}, {3, 5, 47, false},
		{32, 0, 1 << 35, false},
	} {
		if _, _, _, ok := packedShape(head(tc.l, tc.p, tc.n)); ok != tc.want {
			t.Errorf("shape %d,%d,%d: accepted %v, want %v", tc.l, tc.p, tc.n, ok, tc.want)
		}
	}
	if _, _, _, ok := packedShape(head(0, 0, 0)[1:]); ok {
		t.Error("a head cut short accepted")
	}
}

// TestLayout11CallsReadTheirBucketsWithTheirState: once a processor has read or written an
// aggregate, its next calls read their buckets in the round trip that reads their state, also
// after apply.lua ran a call (the shape grown by the records it counted) and a call was left
// unread; another processor's write makes the next call read them again, and that call is still
// computed, as apply.lua would.
func TestLayout11CallsReadTheirBucketsWithTheirState(t *testing.T) {
	x := newComputedSidesIn(t, "one-trip", 24*time.Hour, 0, testFingerprinter(t))
	s := x.stores[1]
	k := Key{Scope: collisionScopes[0], CorrectionID: "one-trip", Source: Live}
	base := floorDiv(Micros(t0), hourUS)*hourUS + 30*minuteUS
	next := 0
	batch := func(n int, occ int64) []Observation {
		var b []Observation
		for range n {
			b = append(b, Observation{Key: k, OpportunityID: fmt.Sprint("o-", next), Class: Class(1 + next%3), Occurred: occ, Assessed: occ})
			next++
		}
		return b
	}
	at := time.UnixMicro(base + 60e6)
	x.apply("the aggregate", batch(30, base), at)
	x.apply("its first computed call: no shape cached", batch(30, base), at)
	second := s.secondReads.Load()
	if second != 1 {
		t.Fatalf("%d calls read their buckets in a second round trip, want 1", second)
	}
	stored, _ := s.ComputedCalls()
	for i := range 5 {
		x.apply(fmt.Sprint("computed call ", i), batch(40, base+int64(i)), at)
	}
	// A new index group 9 hours earlier: off the path, apply.lua counts its records.
	x.apply("a call apply.lua runs", batch(25, base-9*hourUS), at)
	x.apply("the call after it", batch(40, base), at)
	// by hand: x.apply reads every batch
	unread := batch(17, base)
	for i, rig := range x.rigs {
		x.stores[i].skipReads = 1
		if _, err := x.stores[i].Apply(t.Context(), unread, at); err != nil {
			t.Fatal(err)
		}
		rig.m.Apply(t.Context(), unread, at)
	}
	x.apply("after a call left unread", batch(40, base), at)
	if got, _ := s.ComputedCalls(); got != stored+7 {
		t.Fatalf("%d calls computed, want %d", got, stored+7)
	}
	if got := s.secondReads.Load(); got != second {
		t.Fatalf("%d calls read their buckets in a second round trip since the first, want 0", got-second)
	}
	// Another processor writes the aggregate: the shape cached is none the head says.
	other, err := NewRedis(x.rigs[1].c, RedisConfig{Prefix: x.prefixes[1], Retention: 24 * time.Hour, Fingerprint: testFingerprinter(t)})
	if err != nil {
		t.Fatal(err)
	}
	theirs := batch(12, base)
	if _, err := other.Apply(t.Context(), theirs, at); err != nil {
		t.Fatal(err)
	}
	for i, rig := range x.rigs {
		if i != 1 {
			if _, err := x.stores[i].Apply(t.Context(), theirs, at); err != nil {
				t.Fatal(err)
			}
		}
		rig.m.Apply(t.Context(), theirs, at)
	}
	x.apply("after another processor's write", batch(40, base), at)
	if got := s.secondReads.Load(); got != second+1 {
		t.Fatalf("%d calls read their buckets again after another processor's write, want 1", got-second)
	}
	if got, _ := s.ComputedCalls(); got != stored+8 {
		t.Fatalf("%d calls computed, want %d", got, stored+8)
	}
}

// TestShapeCacheStaysBounded: past maxShapes aggregates a new shape takes another's place, and
// the shapes cached stay those put (an update of a cached one evicts nothing).
func TestShapeCacheStaysBounded(t *testing.T) {
	var c shapeCache
	const n = maxShapes + 1000
	for i := range n {
		c.put(Key{CorrectionID: fmt.Sprint(i)}, packedShapeOf{0, 0, int64(i)})
		if len(c) > maxShapes {
			t.Fatalf("%d shapes cached, more than %d", len(c), maxShapes)
		}
	}
	if len(c) != maxShapes {
		t.Fatalf("%d shapes cached, want %d", len(c), maxShapes)
	}
	last := Key{CorrectionID: fmt.Sprint(n - 1)}
	if c[last] != (packedShapeOf{0, 0, n - 1}) {
		t.Fatalf("the last shape put is not cached: %v", c[last])
	}
	c.put(last, packedShapeOf{0, 0, 1})
	for k, s := range c {
		if i, _ := strconv.Atoi(k.CorrectionID); k != last && s != (packedShapeOf{0, 0, int64(i)}) {
			t.Fatalf("%v holds %v", k, s)
		}
	}
	if len(c) != maxShapes {
		t.Fatalf("an update evicted a shape: %d cached", len(c))
	}
}

// TestShapeCacheGrowsAsTheStoreSplits: the shape grow predicts is the one a store's puts leave,
// one split per put past the load.
func TestShapeCacheGrowsAsTheStoreSplits(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	fp := func() string {
		var b [16]byte
		for i := range b {
			b[i] = byte(r.IntN(256))
		}
		return string(b[:])
	}
	rec := string(append([]byte{1}, make([]byte, 14)...))
	s := &bucketStore{}
	c := shapeCache{}
	k := Key{CorrectionID: "grow"}
	c.put(k, packedShapeOf{})
	for range 300 {
		adds := int64(r.IntN(40))
		for range adds {
			// Every bucket read: a store of all its buckets.
			for b := range int64(1)<<s.l + s.p + 1 {
				s.add(b)
			}
			if !s.put(fp(), rec) {
				t.Fatal("put refused")
			}
		}
		c.grow(k, adds)
		if want := (packedShapeOf{s.l, s.p, s.n}); c[k] != want {
			t.Fatalf("grew to %v, the store's puts left %v", c[k], want)
		}
	}
}

// TestBucketNamesArePackedNames: the boxed field names a call reads and writes its buckets by are
// packed_records.lua's, in the table and past it.
func TestBucketNamesArePackedNames(t *testing.T) {
	for _, b := range []int64{0, 1, 255, 256, 4095, 4096, 65535, 65536, 1<<24 - 1, 1 << 24, 1<<31 - 1} {
		if got, want := bucketName(b), packedName(b); got != any(want) {
			t.Errorf("bucket %d named %q, want %q", b, got, want)
		}
	}
	for b := range int64(len(bucketNames)) {
		if bucketNames[b] != any(packedName(b)) {
			t.Fatalf("bucket %d named %q in the table, want %q", b, bucketNames[b], packedName(b))
		}
	}
}
