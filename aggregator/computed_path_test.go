package aggregator

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/repeatrate/repeatrate/internal/testenv"
)

// computedSides are stores that apply the same batches: apply.lua alone on the test Redis, and the
// processor's computation (ComputeCalls) on the test Redis and on the embedded server of
// `repeatrate dev`, each under its own prefix.
type computedSides struct {
	t        *testing.T
	names    []string
	prefixes []string
	rigs     []*retainedRig
	stores   []*Redis
	// layout11: the stores keep layout 11, whose state retainedRig.check does not read (the
	// script side's state is held to the model by TestFingerprintedRecordsMatchModel).
	layout11 bool
}

func newComputedSides(t *testing.T, what string, retention, idle time.Duration) *computedSides {
	return newComputedSidesIn(t, what, retention, idle, nil)
}

// newComputedSidesIn is newComputedSides in layout 11 under fingerprinter fp, or in layout 10 when
// fp is nil.
func newComputedSidesIn(t *testing.T, what string, retention, idle time.Duration, fp *Fingerprinter) *computedSides {
	m := miniredis.RunT(t)
	x := &computedSides{t: t, names: []string{"script", "computed", "computed, embedded"}, layout11: fp != nil}
	for i, c := range []*redis.Client{testenv.Redis(t), testenv.Redis(t), redis.NewClient(&redis.Options{Addr: m.Addr()})} {
		prefix := testenv.Name(t, what)
		testenv.CleanPrefix(t, c, prefix)
		s, err := NewRedis(c, RedisConfig{Prefix: prefix, Retention: retention, IdleTTL: idle, ComputeCalls: i > 0, Fingerprint: fp})
		if err != nil {
			t.Fatal(err)
		}
		// The computed sides store a batch in chunks of 2 and of 3 calls (at most maxChunks),
		// each chunk computed while the one before is stored; the first computes every chunk's
		// calls side by side, the embedded one only those past minParallelRecords.
		if i > 0 {
			s.chunkCalls = i + 1
		}
		if i == 1 {
			s.parallelFrom = 1
		}
		x.prefixes, x.stores = append(x.prefixes, prefix), append(x.stores, s)
		x.rigs = append(x.rigs, &retainedRig{t: t, s: s, c: c, m: NewModel(retention), ret: int64(retention / time.Microsecond),
			spanRet: int64(retention / time.Microsecond), outs: map[Outcome]int{}, seen: map[string]int{}})
	}
	return x
}

// apply applies batch on every side: each must reply what the model does (retainedRig.apply), and
// all must store the same keys byte for byte.
func (x *computedSides) apply(what string, batch []Observation, at time.Time) {
	x.t.Helper()
	for i, rig := range x.rigs {
		x.stores[i].skipReads = 0 // every batch read: the path taken as often as it can be
		rig.applyChecked(x.names[i]+": "+what, batch, at, !x.layout11)
	}
	x.same(what)
}

// same requires every side to hold the same keys, byte for byte, after its prefix.
func (x *computedSides) same(what string) {
	x.t.Helper()
	want := x.dump(0)
	for i := 1; i < len(x.rigs); i++ {
		got := x.dump(i)
		for k, v := range want {
			if got[k] != v {
				x.t.Fatalf("%s: key %s differs\n%s: %s\n%s: %s\n%s", what, k, x.names[0], v, x.names[i], got[k], x.rigs[0].history(2))
			}
		}
		for k, v := range got {
			if _, ok := want[k]; !ok {
				x.t.Fatalf("%s: %s holds key %s, which %s does not: %s", what, x.names[i], k, x.names[0], v)
			}
		}
	}
}

func (x *computedSides) dump(i int) map[string]string {
	out := map[string]string{}
	for k, v := range codecDumpAcross(x.t, x.rigs[i].c, x.prefixes[i]) {
		out[strings.TrimPrefix(k, x.prefixes[i])] = v
	}
	return out
}

// computedStream returns batches for aggregates aggs over a clock that moves by seconds, so that
// most calls find their window sums cached, with the minute and the hour turning, new hours and
// index groups, duplicates (some redelivered whole batches), reassessments, stale and expired
// events, long ids (closed index chunks), ids that repeat within a batch, and now and then a leap
// that expires hours and leaves garbage to collect.
func computedStream(r *rand.Rand, aggs, batches, maxBatch int, retention time.Duration) [][]Observation {
	keys := make([]Key, aggs)
	for i := range keys {
		keys[i] = Key{Scope: collisionScopes[i%len(collisionScopes)], CorrectionID: fmt.Sprint("fix-", i), Source: Live}
	}
	var out [][]Observation
	var seen []Observation
	clock := Micros(t0)
	next := 0
	for range batches {
		clock += int64(r.IntN(20)) * 1e6
		if r.IntN(40) == 0 {
			clock += int64(r.IntN(int(3*retention/time.Hour))) * hourUS // a leap: hours expire
		}
		n := 1 + r.IntN(maxBatch)
		if len(out) > 0 && r.IntN(10) == 0 { // a redelivered batch
			out = append(out, out[r.IntN(len(out))])
			continue
		}
		var b []Observation
		for len(b) < n {
			switch p := r.IntN(100); {
			case p < 12 && len(seen) > 0: // a duplicate
				b = append(b, seen[len(seen)-1-r.IntN(min(len(seen), 200))])
			case p < 16 && len(seen) > 0: // a reassessment, or a stale one
				o := seen[len(seen)-1-r.IntN(min(len(seen), 200))]
				o.Class = Class(1 + r.IntN(3))
				o.Assessed += int64(r.IntN(600)-200) * 1e6
				if r.IntN(4) == 0 {
					o.Occurred += int64(r.IntN(7200)-3600) * 1e6
				}
				b = append(b, o)
			case p < 18 && len(b) > 0: // an id twice in a batch
				o := b[r.IntN(len(b))]
				o.Assessed += 1e6
				b = append(b, o)
			default:
				back := int64(r.ExpFloat64() * float64(5*time.Minute/time.Microsecond))
				switch q := r.IntN(100); {
				case q < 3:
					back = int64(r.IntN(int(2*retention/time.Hour))) * hourUS // hours late, some expired
				case q < 5:
					back = -int64(r.IntN(300)) * 1e6 // ahead of the clock, within the skew allowed
				}
				id := fmt.Sprintf("op-%d", next)
				if r.IntN(8) == 0 {
					id += strings.Repeat("x", 100+r.IntN(200))
				}
				next++
				occ := clock - back
				b = append(b, Observation{Key: keys[r.IntN(aggs)], OpportunityID: id, Class: Class(1 + r.IntN(3)),
					Occurred: occ, Assessed: occ + int64(r.IntN(30))*1e6})
			}
		}
		seen = append(seen, b...)
		out = append(out, b)
	}
	return out
}

// TestComputedCallsStoreWhatTheScriptStores applies streams through apply.lua alone and through the
// processor's own computation with store.lua, on Redis and on the embedded server: every reply is
// the model's, and every key and field is the same byte for byte after every batch. Most calls
// must take the computed path, or the test would prove nothing.
func TestComputedCallsStoreWhatTheScriptStores(t *testing.T) {
	for _, tc := range []struct {
		name      string
		seed      uint64
		aggs      int
		batches   int
		maxBatch  int
		retention time.Duration
		idle      time.Duration
		layout11  bool
	}{
		{"a few aggregates", 1, 3, 400, 12, 24 * time.Hour, 0, false},
		{"many aggregates, large batches", 2, 12, 200, 80, 3 * 24 * time.Hour, 0, false},
		{"short retention, no idle TTL", 3, 4, 400, 10, 2 * time.Hour, -1, false},
		{"layout 11, a few aggregates", 4, 3, 400, 12, 24 * time.Hour, 0, true},
		{"layout 11, many aggregates, large batches", 5, 12, 200, 80, 3 * 24 * time.Hour, 0, true},
		{"layout 11, short retention, no idle TTL", 6, 4, 400, 10, 2 * time.Hour, -1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			idle := tc.idle
			if idle < 0 {
				idle = 0
			}
			var fp *Fingerprinter
			if tc.layout11 {
				fp = testFingerprinter(t)
			}
			x := newComputedSidesIn(t, "computed", tc.retention, idle, fp)
			if tc.idle < 0 {
				for _, s := range x.stores {
					s.cfg.IdleTTL = 0
				}
			}
			r := rand.New(rand.NewPCG(tc.seed, 11))
			clock := t0
			for i, b := range computedStream(r, tc.aggs, tc.batches, tc.maxBatch, tc.retention) {
				var top int64
				for _, o := range b {
					top = max(top, o.Occurred)
				}
				if at := time.UnixMicro(top + int64(r.IntN(30))*1e6); at.After(clock) {
					clock = at
				}
				x.apply(fmt.Sprint("batch ", i), b, clock)
			}
			for i, s := range x.stores[1:] {
				stored, refused := s.ComputedCalls()
				t.Logf("%s: %d calls computed and stored, %d refused", x.names[i+1], stored, refused)
				if stored < int64(tc.batches)/2 {
					t.Errorf("%s: only %d calls took the computed path", x.names[i+1], stored)
				}
				if refused != 0 {
					t.Errorf("%s: the store refused %d calls no other writer touched", x.names[i+1], refused)
				}
				// Layout 11's calls take the buckets the last stored call left from the cache.
				if read, cached := s.BucketReads(); tc.layout11 && cached < read/4 {
					t.Errorf("%s: %d buckets read and only %d taken from the cache", x.names[i+1], read, cached)
				} else if tc.layout11 {
					t.Logf("%s: %d buckets read, %d taken from the cache", x.names[i+1], read, cached)
				}
			}
			for o, n := range x.rigs[0].outs {
				t.Logf("%v: %d", o, n)
			}
		})
	}
}

// TestComputedCallsAtTheEdges holds the computed path to apply.lua where a window, garbage
// collection or an index's compaction begins: new records in the first and last hour and minute
// of each window; calls while garbage of wholly expired groups is still being collected, call by
// call; and a group whose index lists more entries left behind than it may (as an older release
// could leave it), which apply.lua compacts.
func TestComputedCallsAtTheEdges(t *testing.T) {
	inBothLayouts(t, func(t *testing.T, fp *Fingerprinter) {
		k := Key{Scope: collisionScopes[0], CorrectionID: "edges", Source: Live}
		obs := func(id string, occ int64) Observation {
			return Observation{Key: k, OpportunityID: id, Class: Class(1 + len(id)%3), Occurred: occ, Assessed: occ + 1e6}
		}
		computed := func(x *computedSides) int64 {
			n, _ := x.stores[1].ComputedCalls()
			return n
		}

		t.Run("window edges", func(t *testing.T) {
			x := newComputedSidesIn(t, "edges", 30*24*time.Hour, 0, fp)
			at := time.UnixMicro(Micros(t0) + 30*minuteUS + 7e6)
			a := Micros(at)
			H, M := a/hourUS, a/minuteUS
			edges := []int64{(H-168)*hourUS + 5, (H-167)*hourUS + 5, (H-24)*hourUS + 5, (H-23)*hourUS + 5,
				(M-61)*minuteUS + 5, (M-60)*minuteUS + 5, (M-59)*minuteUS + 5, M*minuteUS + 5, a + 60e6}
			var first []Observation
			for i, occ := range edges {
				first = append(first, obs(fmt.Sprint("first-", i), occ))
			}
			x.apply("the edges' hours and groups", first, at)
			for round := range 3 {
				var b []Observation
				for i, occ := range edges {
					b = append(b, obs(fmt.Sprint("new-", round, "-", i), occ+int64(round)))
				}
				x.apply(fmt.Sprint("new records at the edges, round ", round), b, at)
			}
			if n := computed(x); n != 3 {
				t.Fatalf("%d calls took the computed path, want 3", n)
			}
		})

		t.Run("garbage still to collect", func(t *testing.T) {
			x := newComputedSidesIn(t, "garbage", 24*time.Hour, 0, fp)
			base := Micros(t0)
			var old []Observation
			for i := range 1500 {
				old = append(old, obs(fmt.Sprint("old-", i), base-int64(i%20)*hourUS-int64(i)*1e6))
			}
			x.apply("old records over 20 hours", old, time.UnixMicro(base))
			leap := base + 40*hourUS
			at := time.UnixMicro(leap + 1e6)
			x.apply("a leap that expires them", []Observation{obs("leap", leap)}, at)
			for i := range 20 {
				x.apply(fmt.Sprint("new records while collecting, call ", i),
					[]Observation{obs(fmt.Sprint("late-", i), leap-int64(i)*1e6), obs(fmt.Sprint("late-b-", i), leap-int64(i)*1e6-5e5)}, at)
			}
			if n := computed(x); n == 0 {
				t.Fatal("no call took the computed path once the garbage was collected")
			}
		})

		t.Run("reassessments", func(t *testing.T) {
			x := newComputedSidesIn(t, "reassessed", 24*time.Hour, 0, fp)
			occ := Micros(t0) + 30*minuteUS
			at := time.UnixMicro(occ + 10e6)
			as := func(id string, c Class, occ, assessed, seq int64) Observation {
				return Observation{Key: k, OpportunityID: id, Class: c, Occurred: occ, Assessed: assessed, Seq: seq}
			}
			x.apply("the first assessments", []Observation{as("a", Confirmed, occ, occ+1e6, 0), as("b", Passed, occ-2e6, occ+1e6, 3),
				as("c", Unscored, occ-3*minuteUS, occ, 0), as("h", Passed, occ-5e6, occ, 0)}, at)
			x.apply("newer ones of the same occurrences, and older ones", []Observation{
				as("a", Passed, occ, occ+2e6, 0),             // another class
				as("b", Passed, occ-2e6, occ+1e6, 4),         // the same class, a later seq
				as("c", Confirmed, occ-3*minuteUS, occ-1, 0), // older: stale
				as("n", Confirmed, occ+1e6, occ+1e6, 0),      // new
			}, at)
			x.apply("an assessment equal to the held one in time and seq: a duplicate", []Observation{as("a", Unscored, occ, occ+2e6, 0)}, at)
			// An earlier occurrence moves the winner and keeps its horizon (apply.lua); a newer
			// assessment of that occurrence then carries the horizon on.
			x.apply("a newer assessment that occurred earlier", []Observation{as("h", Confirmed, occ-9e6, occ+1e6, 0)}, at)
			x.apply("a newer one of that occurrence", []Observation{as("h", Unscored, occ-9e6, occ+2e6, 0)}, at)
			for i, rig := range x.rigs {
				if fp != nil {
					break // layout 11's records are bytes in buckets, compared byte for byte above
				}
				rec, err := rig.c.HGet(t.Context(), x.stores[i].keys(k)[0], "001h").Result()
				if err != nil || !strings.HasSuffix(rec, ";"+strconv.FormatInt(occ-5e6, 16)) {
					t.Fatalf("%s: h's record %q, %v: want its horizon %x kept", x.names[i], rec, err, occ-5e6)
				}
			}
			x.apply("an older one that occurred later than the horizon", []Observation{as("h", Passed, occ+3e6, occ, 0)}, at)
			// One call meeting the same opportunities again and again: each occurrence meets the
			// record as the ones before it left it, and each record is written once.
			x.apply("the same opportunities several times in one call", []Observation{
				as("r", Passed, occ-7e6, occ, 0),        // new
				as("r", Passed, occ-7e6, occ, 0),        // a duplicate of what this call wrote
				as("r", Confirmed, occ-7e6, occ+1e6, 0), // newer
				as("r", Unscored, occ-7e6, occ, 0),      // older than what this call wrote: stale
				as("r", Unscored, occ-7e6, occ+1e6, 2),  // newer by its seq
				as("h", Confirmed, occ-9e6, occ+5e6, 0), // newer, of the record with a horizon
				as("h", Passed, occ-9e6, occ+6e6, 0),    // and again
				as("h", Passed, occ-9e6, occ+6e6, 0),    // a duplicate of it
				as("s", Confirmed, occ-8e6, occ, 0),     // new
				as("r", Unscored, occ-7e6, occ+1e6, 2),  // a duplicate of r's last
			}, at)
			if n := computed(x); n != 4 {
				t.Fatalf("%d calls took the computed path, want 4 (same occurrences, the duplicate, the horizon carried on, the repeats)", n)
			}
		})

		t.Run("minutes to prune", func(t *testing.T) {
			x := newComputedSidesIn(t, "prune", 24*time.Hour, 0, fp)
			start := floorDiv(Micros(t0), hourUS)*hourUS + 30*minuteUS // minute X
			at := time.UnixMicro(start + 60*minuteUS + 30e6)
			// Minute buckets pruned up to X-70; the newest event 59 minutes on: nothing to prune yet.
			x.apply("minutes X and X+59", []Observation{obs("x", start), obs("x59", start+59*minuteUS)}, at)
			// The newest event 60 minutes on: an hour of minute buckets pruned, computed as
			// apply.lua prunes them.
			x.apply("minute X+60", []Observation{obs("x60", start+60*minuteUS)}, at)
			x.apply("minute X+60 again", []Observation{obs("x60b", start+60*minuteUS+1)}, at)
			if n := computed(x); n != 2 {
				t.Fatalf("%d calls took the computed path, want 2 (the prune, and the last)", n)
			}
		})

		t.Run("more than 300 minutes to prune", func(t *testing.T) {
			// 30 days: index groups of 90 hours; minute X in the middle of one, so that every
			// event below lies in the group the first call lists in.
			x := newComputedSidesIn(t, "prune-300", 30*24*time.Hour, 0, fp)
			start := (floorDiv(Micros(t0), 90*hourUS)*90 + 45) * hourUS // minute X
			// An event 301 minutes old, then one of now, a minute later: apply.lua finds the minute
			// buckets to prune among the hash's fields rather than name 301 (300 it names).
			x.apply("minute X-301", []Observation{obs("old", start-301*minuteUS)}, time.UnixMicro(start+30e6))
			x.apply("minute X", []Observation{obs("now", start)}, time.UnixMicro(start+minuteUS+30e6))
			x.apply("minute X again", []Observation{obs("now-b", start+1)}, time.UnixMicro(start+minuteUS+31e6))
			if n := computed(x); n != 1 {
				t.Fatalf("%d calls took the computed path, want 1 (the last)", n)
			}
		})

		t.Run("minutes to prune in the hour's window", func(t *testing.T) {
			x := newComputedSidesIn(t, "prune-window", 30*24*time.Hour, 0, fp) // as above
			start := (floorDiv(Micros(t0), 90*hourUS)*90 + 45) * hourUS
			// An event 12 minutes ahead of the observation time's minute (past the consumer's
			// future skew, 5 minutes by default) moves the floor into the hour's window:
			// apply.lua recomputes the window sums without the pruned minute, b's (X-58, the
			// window's first at the call). The 1h window is exact only while the observation
			// time is at most 10 minutes behind the newest event (docs/semantics.md), so the
			// sides are held to each other here, not to the model.
			sides := func(what string, b []Observation, at time.Time) {
				t.Helper()
				var want Applied
				for i, s := range x.stores {
					s.skipReads = 0
					got, err := s.Apply(t.Context(), b, at)
					if err != nil {
						t.Fatal(err)
					}
					if i == 0 {
						want = got
					} else if !reflect.DeepEqual(got.Outcomes, want.Outcomes) || !reflect.DeepEqual(got.Tallies, want.Tallies) {
						t.Fatalf("%s: %s replied %+v, %s %+v", what, x.names[i], got, x.names[0], want)
					}
				}
				x.same(what)
			}
			sides("minute X-50", []Observation{obs("a", start-50*minuteUS), obs("b", start-58*minuteUS)}, time.UnixMicro(start+30e6))
			sides("minute X+13", []Observation{obs("ahead", start+13*minuteUS)}, time.UnixMicro(start+minuteUS+30e6))
			sides("minute X+13 again", []Observation{obs("ahead-b", start+13*minuteUS+1)}, time.UnixMicro(start+minuteUS+31e6))
			if n := computed(x); n != 1 {
				t.Fatalf("%d calls took the computed path, want 1 (the last)", n)
			}
		})

		t.Run("an index to compact", func(t *testing.T) {
			x := newComputedSidesIn(t, "compact", 24*time.Hour, 0, fp)
			mid := Micros(t0) + 30*minuteUS
			at := time.UnixMicro(mid + 1e6)
			var b []Observation
			for i := range 100 {
				b = append(b, obs(fmt.Sprint("listed-", i), mid-int64(i)*1e6))
			}
			x.apply("a hundred records in one group", b, at)
			g := "i" + fmt.Sprint(floorDiv(floorDiv(mid, hourUS), groupSpan(int64(24*time.Hour/time.Microsecond))))
			ctx := t.Context()
			for i, rig := range x.rigs {
				key := x.stores[i].keys(k)[1]
				v, err := rig.c.HGet(ctx, key, g).Result()
				if err != nil {
					t.Fatal(err)
				}
				n := v[6:11] // every entry counted as left behind by a move
				if err := rig.c.HSet(ctx, key, g, v[:11]+n+v[16:]).Err(); err != nil {
					t.Fatal(err)
				}
			}
			x.apply("a new record in that group", []Observation{obs("new", mid-500e6)}, at)
			x.apply("another", []Observation{obs("new-2", mid-501e6)}, at)
			if n := computed(x); n != 1 {
				t.Fatalf("%d calls took the computed path, want 1 (the second, after the compaction)", n)
			}
		})
	})
}

// TestComputedCallRefusedWhenAnotherWriterCameBetween runs another processor's batch on the same
// aggregate between the computed call's read and its store: the store refuses the call, which
// writes nothing, and apply.lua applies it on the state as the other writer left it. Nothing is
// counted twice, and the outcomes say what happened.
func TestComputedCallRefusedWhenAnotherWriterCameBetween(t *testing.T) {
	inBothLayouts(t, func(t *testing.T, fp *Fingerprinter) {
		c := testenv.Redis(t)
		prefix := testenv.Name(t, "refused")
		testenv.CleanPrefix(t, c, prefix)
		open := func(compute bool) *Redis {
			s, err := NewRedis(c, RedisConfig{Prefix: prefix, Retention: 24 * time.Hour, ComputeCalls: compute, Fingerprint: fp})
			if err != nil {
				t.Fatal(err)
			}
			return s
		}
		mine, other := open(true), open(false)
		k := Key{Scope: collisionScopes[0], CorrectionID: "refused", Source: Live}
		occ := Micros(t0) + 30*minuteUS
		at := time.UnixMicro(occ + 5e6)
		ob := func(id string, cls Class) Observation {
			return Observation{Key: k, OpportunityID: id, Class: cls, Occurred: occ, Assessed: occ + 1e6}
		}
		ctx := t.Context()
		// "first" occurred before the others, so that an older assessment of it can move its
		// horizon and nothing else.
		first := Observation{Key: k, OpportunityID: "first", Class: Passed, Occurred: occ - 2e6, Assessed: occ}
		if _, err := other.Apply(ctx, []Observation{first}, at); err != nil {
			t.Fatal(err)
		}
		older := first
		older.Occurred, older.Assessed = occ-1e6, occ-5e5
		head := func() string { return c.HGet(ctx, mine.keys(k)[1], "H").Val() }
		for _, tc := range []struct {
			name    string
			between []Observation // the other writer's batch
			batch   []Observation
			want    []Outcome
			all     Counts // the aggregate's counts after both
			onlyWC  bool   // layout 11: the other writer changes the head's write count alone
		}{
			{"the same opportunity", []Observation{ob("a", Confirmed)}, []Observation{ob("a", Confirmed), ob("b", Passed)},
				[]Outcome{Duplicate, Counted}, Counts{Confirmed: 1, Passed: 2}, false},
			{"another opportunity", []Observation{ob("c", Unscored)}, []Observation{ob("d", Passed)},
				[]Outcome{Counted}, Counts{Confirmed: 1, Passed: 3, Unscored: 1}, false},
			// An older assessment that occurred later moves a record's horizon and no count,
			// bound, version or shape: in layout 11 the head's write count is all that tells the
			// store that the bucket it read changed. Stored, the call would drop the horizon.
			{"a record alone", []Observation{older}, []Observation{first, ob("e", Passed)},
				[]Outcome{Duplicate, Counted}, Counts{Confirmed: 1, Passed: 4, Unscored: 1}, true},
		} {
			t.Run(tc.name, func(t *testing.T) {
				mine.afterRead = func() {
					was := head()
					if _, err := other.Apply(ctx, tc.between, at); err != nil {
						t.Fatal(err)
					}
					if now := head(); tc.onlyWC && fp != nil && now[:headBytes11] != was[:headBytes11] {
						t.Fatalf("the other writer's head changed otherwise than in its write count:\n%q\n%q", was, now)
					}
				}
				_, refusedBefore := mine.ComputedCalls()
				got, err := mine.Apply(ctx, tc.batch, at)
				if err != nil {
					t.Fatal(err)
				}
				if _, refused := mine.ComputedCalls(); refused != refusedBefore+1 {
					t.Fatalf("the store refused %d calls, want 1", refused-refusedBefore)
				}
				if fmt.Sprint(got.Outcomes) != fmt.Sprint(tc.want) {
					t.Fatalf("outcomes %v, want %v", got.Outcomes, tc.want)
				}
				mine.afterRead = nil
				tl, err := mine.Tally(ctx, k, at)
				if err != nil {
					t.Fatal(err)
				}
				if tl.All != tc.all || got.Tallies[k] != tl {
					t.Fatalf("counts %+v, replied %+v, want %+v", tl, got.Tallies[k], tc.all)
				}
			})
		}
		if stored, _ := mine.ComputedCalls(); stored != 0 {
			t.Fatalf("%d computed calls stored over another writer's", stored)
		}
	})
}

// TestBatchesMostlyOffThePathGoUnread: a batch whose calls the processor read but could mostly not
// compute (here: reassessments that move the winner) paid a read round trip for nothing, so the
// next batches go to apply.lua unread: 0 after one such batch (most pass with their batch), 1, 2, 4,
// then skipAfterMiss for misses in a row, and a batch on the path starts over. New aggregates do
// not count: the batch after the one that created them is read.
func TestBatchesMostlyOffThePathGoUnread(t *testing.T) {
	s := computingStore(t, "unread")
	occ := Micros(t0) + 30*minuteUS
	at := time.UnixMicro(occ + 5e6)
	const onPath = 20 // the one batch of new opportunities after the first
	batch := func(i int) []Observation {
		var b []Observation
		for a := range 4 {
			o := Observation{Key: Key{Scope: collisionScopes[0], CorrectionID: fmt.Sprint("unread-", a), Source: Live},
				OpportunityID: fmt.Sprint("o-", i), Class: Passed, Occurred: occ, Assessed: occ}
			if i > 0 && i != onPath { // o-0 again, newer, occurred earlier each time: the winner moves
				o.OpportunityID, o.Occurred, o.Assessed = "o-0", occ-int64(i)*1e6, occ+int64(i)*1e6
			}
			b = append(b, o)
		}
		return b
	}
	// Which batches are read: 0 (new aggregates, not a miss), 1 (a miss: none unread), 2 (the
	// second in a row: 1 unread), 4 (2 unread), 7 (4 unread), 12 (7 unread), 20 (on the path), 21
	// (a miss again: none unread), 22 (1 unread), 24 (2 unread).
	read := map[int]bool{0: true, 1: true, 2: true, 4: true, 7: true, 12: true, onPath: true, 21: true, 22: true, 24: true}
	var want [3]int64 // computed, off the path, unread
	for i := range 27 {
		if _, err := s.Apply(t.Context(), batch(i), at); err != nil {
			t.Fatal(err)
		}
		switch {
		case !read[i]:
			want[2] += 4
		case i == onPath:
			want[0] += 4
		default:
			want[1] += 4
		}
		// Every call is counted once: computed, off the path or unread.
		stored, _ := s.ComputedCalls()
		offPath, unread := s.ComputedCallsLeft()
		if got := [3]int64{stored, offPath, unread}; got != want {
			t.Fatalf("after batch %d: %d calls computed, %d off the path and %d unread; want %d, %d and %d",
				i, got[0], got[1], got[2], want[0], want[1], want[2])
		}
	}
}

// TestBusyAggregatesKeepBatchesRead: the read gate weighs records, not calls. A batch whose few
// calls of one record each are off the path while one busy aggregate's call of as many records or
// more is on it is worth its read, and the next batch is read too.
func TestBusyAggregatesKeepBatchesRead(t *testing.T) {
	for _, busy := range []int{10, 4} { // 4: exactly half the records read computed
		t.Run(fmt.Sprint(busy, " records on the path"), func(t *testing.T) {
			s := computingStore(t, "busy")
			occ := Micros(t0) + 30*minuteUS
			at := time.UnixMicro(occ + 5e6)
			key := func(name string) Key { return Key{Scope: collisionScopes[0], CorrectionID: name, Source: Live} }
			batch := func(i int) []Observation {
				var b []Observation
				for a := range 4 { // the tail: one record each, from batch 1 on a reassessment that moves the winner
					o := Observation{Key: key(fmt.Sprint("tail-", a)), OpportunityID: "o", Class: Passed, Occurred: occ, Assessed: occ}
					if i > 0 {
						o.Occurred, o.Assessed = occ-int64(i)*1e6, occ+int64(i)*1e6
					}
					b = append(b, o)
				}
				for j := range busy { // the busy aggregate's new opportunities
					b = append(b, Observation{Key: key("busy"), OpportunityID: fmt.Sprint("b-", i, "-", j), Class: Confirmed, Occurred: occ, Assessed: occ})
				}
				return b
			}
			for i := range 3 {
				if _, err := s.Apply(t.Context(), batch(i), at); err != nil {
					t.Fatal(err)
				}
			}
			stored, _ := s.ComputedCalls()
			offPath, unread := s.ComputedCallsLeft()
			// Batch 0 creates the five aggregates; batches 1 and 2 compute the busy call and leave
			// the four reassessments to apply.lua, and neither closes the gate.
			if stored != 2 || offPath != 5+8 || unread != 0 {
				t.Fatalf("%d calls computed, %d off the path, %d unread; want 2, 13 and 0", stored, offPath, unread)
			}
		})
	}
}

// TestNewAggregatesLeaveTheReadGateAsItWas: a batch whose calls read are all of new aggregates says
// nothing of the path, so misses on either side of it still add up: after it, the next miss leaves
// 1 batch unread, not none.
func TestNewAggregatesLeaveTheReadGateAsItWas(t *testing.T) {
	s := computingStore(t, "gate-new")
	occ := Micros(t0) + 30*minuteUS
	at := time.UnixMicro(occ + 5e6)
	k := Key{Scope: collisionScopes[0], CorrectionID: "gate-old", Source: Live}
	miss := func(i int) []Observation { // o again, newer, occurred earlier each time: the winner moves
		return []Observation{{Key: k, OpportunityID: "o", Class: Passed, Occurred: occ - int64(i)*1e6, Assessed: occ + int64(i)*1e6}}
	}
	fresh := func(i int) []Observation {
		return []Observation{{Key: Key{Scope: collisionScopes[0], CorrectionID: fmt.Sprint("gate-new-", i), Source: Live},
			OpportunityID: "o", Class: Passed, Occurred: occ, Assessed: occ}}
	}
	// 0 creates k; 1 misses (none unread); 2 holds only a new aggregate; 3 misses again, the second
	// in a row (1 unread: 4); 5 misses (2 unread: 6 and 7).
	batches := [][]Observation{miss(0), miss(1), fresh(2), miss(3), miss(4), miss(5), miss(6), miss(7)}
	wantUnread := []int64{0, 0, 0, 0, 1, 1, 2, 3}
	for i, b := range batches {
		if _, err := s.Apply(t.Context(), b, at); err != nil {
			t.Fatal(err)
		}
		if _, unread := s.ComputedCallsLeft(); unread != wantUnread[i] {
			t.Fatalf("after batch %d: %d calls unread, want %d", i, unread, wantUnread[i])
		}
	}
}

// TestScriptsPartlyMissingApplyEachCallOnce: after Redis lost its scripts, another client loaded
// apply.lua alone (a Tally, an older release), so in the next batch the apply calls run and the
// computed ones meet no store.lua. The calls that ran stand, the others run through apply.lua
// once: every new opportunity is counted, none reported a duplicate.
func TestScriptsPartlyMissingApplyEachCallOnce(t *testing.T) {
	m := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	s, err := NewRedis(c, RedisConfig{Prefix: "partly", Retention: 24 * time.Hour, ComputeCalls: true})
	if err != nil {
		t.Fatal(err)
	}
	occ := Micros(t0) + 30*minuteUS
	at := time.UnixMicro(occ + 5e6)
	known := Key{Scope: collisionScopes[0], CorrectionID: "known", Source: Live}
	ob := func(k Key, id string) Observation {
		return Observation{Key: k, OpportunityID: id, Class: Passed, Occurred: occ, Assessed: occ}
	}
	ctx := t.Context()
	if _, err := s.Apply(ctx, []Observation{ob(known, "first")}, at); err != nil {
		t.Fatal(err)
	}
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Tally(ctx, known, at); err != nil { // loads apply.lua alone
		t.Fatal(err)
	}
	fresh := Key{Scope: collisionScopes[1], CorrectionID: "fresh", Source: Live}
	s.skipReads = 0 // the first batch created its aggregate: read this one anyway
	got, err := s.Apply(ctx, []Observation{ob(known, "second"), ob(fresh, "third")}, at)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got.Outcomes) != fmt.Sprint([]Outcome{Counted, Counted}) {
		t.Fatalf("outcomes %v, want both counted", got.Outcomes)
	}
	for k, want := range map[Key]int64{known: 2, fresh: 1} {
		tl, err := s.Tally(ctx, k, at)
		if err != nil {
			t.Fatal(err)
		}
		if tl.All.Passed != want || got.Tallies[k] != tl {
			t.Fatalf("%s: counts %+v, replied %+v, want %d passed", k, tl, got.Tallies[k], want)
		}
	}
	if _, refused := s.ComputedCalls(); refused != 1 {
		t.Fatalf("%d computed calls left to apply.lua, want 1 (for the missing script)", refused)
	}
}

// TestLargestComputedCallMatchesTheScript: a call of maxComputedRecords new records with ids long
// enough that each closes an index chunk (as many state fields as records) is computed and stored
// as apply.lua stores it, on Redis and on the embedded server; one record more is left to apply.lua.
func TestLargestComputedCallMatchesTheScript(t *testing.T) {
	inBothLayouts(t, func(t *testing.T, fp *Fingerprinter) {
		x := newComputedSidesIn(t, "largest", 24*time.Hour, 0, fp)
		k := Key{Scope: collisionScopes[0], CorrectionID: "largest", Source: Live}
		occ := floorDiv(Micros(t0), hourUS)*hourUS + 30*minuteUS
		at := time.UnixMicro(occ + 60e6)
		batch := func(from, n int) []Observation {
			var b []Observation
			for i := from; i < from+n; i++ {
				b = append(b, Observation{Key: k, OpportunityID: fmt.Sprintf("%05d-", i) + strings.Repeat("L", 400),
					Class: Class(1 + i%3), Occurred: occ + int64(i), Assessed: occ + int64(i)})
			}
			return b
		}
		x.apply("the aggregate", batch(0, 1), at)
		x.apply("the largest computed call", batch(1, maxComputedRecords), at)
		x.apply("one record more", batch(1+maxComputedRecords, maxComputedRecords+1), at)
		for i, s := range x.stores[1:] {
			if stored, _ := s.ComputedCalls(); stored != 1 {
				t.Errorf("%s: %d calls computed, want 1", x.names[i+1], stored)
			}
		}
	})
}

// inBothLayouts runs f as a subtest in layout 10 (fp nil) and in layout 11 under a test
// fingerprinter.
func inBothLayouts(t *testing.T, f func(t *testing.T, fp *Fingerprinter)) {
	t.Run("layout 10", func(t *testing.T) { f(t, nil) })
	t.Run("layout 11", func(t *testing.T) { f(t, testFingerprinter(t)) })
}

// computingStore is a store on the test Redis, under a prefix of its own named what, with a day's
// retention and the processor computing calls: the read gate's tests.
func computingStore(t *testing.T, what string) *Redis {
	t.Helper()
	c := testenv.Redis(t)
	prefix := testenv.Name(t, what)
	testenv.CleanPrefix(t, c, prefix)
	s, err := NewRedis(c, RedisConfig{Prefix: prefix, Retention: 24 * time.Hour, ComputeCalls: true})
	if err != nil {
		t.Fatal(err)
	}
	return s
}
