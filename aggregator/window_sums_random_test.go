package aggregator

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/repeatrate/repeatrate/internal/testenv"
)

// turnStream makes batches for a few aggregates over an observation time that moves on by 1 to 70
// minutes, most often across an hour, and now and then by hours (the cut moves, hours expire):
// records near the observation time, far back, in the week's hours and up to 10 minutes ahead,
// duplicates, reassessments, ids repeated within a call, long ids and batches delivered again.
// Computed calls then carry the window sums over the hour's turn, move the cut past empty hours
// and prune minutes, and meet every way off that path.
type turnStream struct {
	r     *rand.Rand
	keys  []Key
	clock int64 // the observation time (µs)
	ret   int64 // the retention (µs)
	near  int   // percent of new records that occurred near the observation time
	dup   int   // percent of records that are each a duplicate, a reassessment, an id again in the call
	seen  []Observation
	last  []Observation
	next  int
}

// newTurnStream is a stream of seed for aggs aggregates under retention ret.
func newTurnStream(seed uint64, aggs int, ret time.Duration, near, dup int) *turnStream {
	s := &turnStream{r: rand.New(rand.NewPCG(seed, 18)), clock: Micros(t0), ret: int64(ret / time.Microsecond), near: near, dup: dup}
	for i := range aggs {
		s.keys = append(s.keys, Key{Scope: collisionScopes[i%len(collisionScopes)], CorrectionID: fmt.Sprint("turn-", i), Source: Live})
	}
	return s
}

// step moves the observation time on: by minutes, to just past the next hour's start, by seconds,
// or by hours an aggregate is idle for.
func (s *turnStream) step() {
	r := s.r
	switch p := r.IntN(100); {
	case p < 30:
		s.clock += int64(1+r.IntN(10)) * minuteUS
	case p < 55:
		s.clock += int64(40+r.IntN(20)) * minuteUS
	case p < 75:
		s.clock += int64(55+r.IntN(16)) * minuteUS
	case p < 82:
		s.clock += int64(r.IntN(60)) * 1e6
	case p < 88:
		s.clock += int64(1+r.IntN(int(3*s.ret/hourUS)+2)) * hourUS
	default:
		s.clock += int64(1+r.IntN(70)) * minuteUS
	}
	s.clock += int64(r.IntN(60)) * 1e6
}

// batch returns the next batch: up to maxPer records of one aggregate, or of several in a quarter
// of the batches; one in ten is the last batch again.
func (s *turnStream) batch(maxPer int) []Observation {
	r := s.r
	if s.last != nil && r.IntN(10) == 0 {
		return s.last
	}
	nk := 1
	if r.IntN(4) == 0 {
		nk = 1 + r.IntN(len(s.keys))
	}
	var b []Observation
	recent := func() Observation { return s.seen[len(s.seen)-1-r.IntN(min(len(s.seen), 100))] }
	for _, ki := range r.Perm(len(s.keys))[:nk] {
		for range 1 + r.IntN(maxPer) {
			switch p := r.IntN(100); {
			case p < s.dup && len(s.seen) > 0: // a duplicate
				b = append(b, recent())
			case p < 2*s.dup && len(s.seen) > 0: // a reassessment, mostly of the same occurrence, or a stale one
				o := recent()
				o.Class = Class(1 + r.IntN(3))
				o.Assessed += int64(r.IntN(600)-100) * 1e6
				if r.IntN(6) == 0 {
					o.Occurred = min(o.Occurred+int64(r.IntN(7200)-3600)*1e6, s.clock+MaxFutureSkew.Microseconds())
				}
				if r.IntN(3) == 0 {
					o.Seq++
				}
				b = append(b, o)
			case p < 3*s.dup && len(b) > 0: // an id again in the call
				o := b[r.IntN(len(b))]
				o.Assessed += 1e6
				if r.IntN(2) == 0 {
					o.Class = Class(1 + r.IntN(3))
				}
				b = append(b, o)
			default:
				occ := s.clock - int64(r.ExpFloat64()*float64(4*minuteUS))
				if q := r.IntN(100); q < 100-s.near {
					switch q = q * 24 / (100 - s.near); {
					case q < 8: // far back, some of them expired
						occ = s.clock - int64(r.IntN(int(2*s.ret/minuteUS)+1))*minuteUS
					case q < 14: // in one of the week's hours
						occ = s.clock - int64(r.IntN(170))*hourUS - int64(r.IntN(3600))*1e6
					default: // ahead, as far as the skew allowed
						occ = s.clock + r.Int64N(MaxFutureSkew.Microseconds()+1)
					}
				}
				id := fmt.Sprintf("op-%d", s.next)
				if r.IntN(10) == 0 {
					id += strings.Repeat("y", 100+r.IntN(150))
				}
				s.next++
				b = append(b, Observation{Key: s.keys[ki], OpportunityID: id, Class: Class(1 + r.IntN(3)),
					Occurred: occ, Assessed: occ + int64(r.IntN(30))*1e6})
			}
		}
	}
	s.seen = append(s.seen, b...)
	s.last = b
	return b
}

// What a call did that the computed path takes since it carries the sums over the hour's turn, as
// the script side's heads before and after it show (headChanges).
const (
	hourTurned = "the hour turned"
	cutMoved   = "the cut moved past empty hours"
	pruned     = "minutes pruned"
)

// headChanges returns what a call did to its aggregate's head, before to after (either layout;
// "" for none): the sums moved on into the next hour less than an hour of minutes on, the cut
// moved while the first retained winner stays above it, the minutes' floor moved.
func headChanges(before, after string) []string {
	if len(before) < headBytes || len(after) < headBytes {
		return nil
	}
	// The head's numbers are stored plus one: pm 1, f 2, the cached minute 4 and hour 5, the cut 20.
	b := func(i int) int64 { return littleEndian(before[2+7*i : 9+7*i]) }
	a := func(i int) int64 { return littleEndian(after[2+7*i : 9+7*i]) }
	var out []string
	if b(5) != 0 && a(5) == b(5)+1 && a(4) > b(4) && a(4)-b(4) < 60 {
		out = append(out, hourTurned)
	}
	if b(20) != 0 && a(20) > b(20) && b(2) != 0 && b(2)-1 >= (a(20)-1)*hourUS {
		out = append(out, cutMoved)
	}
	if b(1) != 0 && a(1) > b(1) {
		out = append(out, pruned)
	}
	return out
}

// turnSides are computedSides with, when asked, a second processor on each computing side (its
// prefix, its server), so that a call finds the window sums, the shape and the buckets another
// processor left; and whose processors restart, forgetting all they knew. They count the calls
// computed on Redis, by what the calls did and after restarts.
type turnSides struct {
	*computedSides
	second []*Redis          // a computing side's second processor, by side; nil for none
	fresh  [2]map[Key]bool   // the aggregates each processor has not applied a call on since it (re)started
	calls  map[string][2]int // calls by what they did (headChanges): all, and computed
	// afterRestart are the calls that were their processor's first on the aggregate since it
	// restarted, and of those, the computed ones.
	afterRestart [2]int
}

// newTurnSides are newComputedSidesIn's sides, with a second processor on each computing side
// when two is set.
func newTurnSides(t *testing.T, what string, ret, idle time.Duration, fp *Fingerprinter, two bool) *turnSides {
	x := &turnSides{computedSides: newComputedSidesIn(t, what, ret, max(idle, 0), fp), second: make([]*Redis, 3),
		fresh: [2]map[Key]bool{{}, {}}, calls: map[string][2]int{}}
	for i, s := range x.stores {
		if idle < 0 {
			s.cfg.IdleTTL = 0 // kept for ever: no TTL stamp in the heads
		}
		if i == 0 || !two {
			continue
		}
		cfg := s.cfg
		cfg.Pending = nil
		o, err := NewRedis(x.rigs[i].c, cfg)
		if err != nil {
			t.Fatal(err)
		}
		o.cfg.IdleTTL, o.chunkCalls, o.parallelFrom = s.cfg.IdleTTL, s.chunkCalls, s.parallelFrom
		x.second[i] = o
	}
	return x
}

// computed returns the calls the processors on Redis computed and stored, and those store.lua
// refused.
func (x *turnSides) computed() (stored, refused int64) {
	for _, s := range []*Redis{x.stores[1], x.second[1]} {
		if s != nil {
			n, r := s.ComputedCalls()
			stored, refused = stored+n, refused+r
		}
	}
	return stored, refused
}

// restart makes processor p of each computing side forget what it knew of the aggregates of keys
// (restartProcessor).
func (x *turnSides) restart(p int, keys []Key) {
	for i := 1; i < len(x.stores); i++ {
		s := x.stores[i]
		if p == 1 {
			s = x.second[i]
		}
		restartProcessor(s, keys)
	}
	for _, k := range keys {
		x.fresh[p][k] = true
	}
}

// restartProcessor makes s forget what it knew of the aggregates of keys, as a processor just
// started: the minutes their window sums are for, their stores' shapes and their buckets.
func restartProcessor(s *Redis, keys []Key) {
	s.sealMu.Lock()
	defer s.sealMu.Unlock()
	s.sums, s.shapes = nil, nil
	for _, k := range keys {
		s.buckets.drop(k)
	}
}

// applyBy is computedSides.apply with the computing sides' processor p (0, or 1 for the second):
// replies the model's, keys the same byte for byte. It counts what the calls did by the script
// side's heads, and which were computed: those of a batch whose every call was.
func (x *turnSides) applyBy(what string, batch []Observation, at time.Time, p int) {
	x.t.Helper()
	var keys []Key
	heads := map[Key]string{}
	head := func(k Key) string { return x.rigs[0].c.HGet(context.Background(), x.stores[0].keys(k)[1], "H").Val() }
	for _, o := range batch {
		if _, ok := heads[o.Key]; !ok {
			keys = append(keys, o.Key)
			heads[o.Key] = head(o.Key)
		}
	}
	was, _ := x.computed()
	for i, rig := range x.rigs {
		if p == 1 && i > 0 {
			rig.s = x.second[i]
		}
		rig.s.skipReads = 0 // every batch read: the path taken as often as it can be
		rig.applyChecked(x.names[i]+": "+what, batch, at, !x.layout11)
		rig.s = x.stores[i]
	}
	x.same(what)
	now, _ := x.computed()
	all := now-was == int64(len(keys))
	for _, k := range keys {
		for _, c := range headChanges(heads[k], head(k)) {
			n := x.calls[c]
			n[0]++
			if all {
				n[1]++
			}
			x.calls[c] = n
		}
		if x.fresh[p][k] {
			delete(x.fresh[p], k)
			x.afterRestart[0]++
			if all {
				x.afterRestart[1]++
			}
		}
	}
}

// TestComputedCallsAcrossHoursStoreWhatTheScriptStores applies random streams whose observation
// time jumps by minutes, mostly across hours, under short retentions, through apply.lua alone and
// through computing processors on Redis and on the embedded server: one processor a side, or two
// taking turns, each restarted now and then. Every reply is the model's and every key the same
// byte for byte after every batch; store.lua refuses nothing (no writer comes between a read and
// its store). The test requires that the calls that turn the hour, move the cut past empty hours
// and prune minutes were computed many times, and in layout 11 the first calls after a restart or
// another processor's call, whose state is read again as planned from the head's minute.
func TestComputedCallsAcrossHoursStoreWhatTheScriptStores(t *testing.T) {
	const batches = 170
	cases := []struct {
		ret       time.Duration
		seed      uint64
		aggs      int
		near, dup int // turnStream's
		maxPer    int
		two       bool          // two processors a side
		idle      time.Duration // -1: no idle TTL
	}{
		{1 * time.Hour, 1, 2, 97, 3, 3, true, -1},
		{3 * time.Hour, 2, 3, 76, 6, 6, true, 0},
		{16 * time.Hour, 3, 1, 97, 3, 4, false, 0},
		{17 * time.Hour, 4, 2, 97, 3, 3, true, -1},
		{24 * time.Hour, 5, 2, 90, 4, 4, false, 0},
		{24 * time.Hour, 6, 3, 76, 6, 6, true, -1},
	}
	inBothLayouts(t, func(t *testing.T, fp *Fingerprinter) {
		calls, afterRestart := map[string][2]int{}, [2]int{}
		var stored int64
		for _, c := range cases {
			t.Run(fmt.Sprint(c.ret, " seed ", c.seed), func(t *testing.T) {
				x := newTurnSides(t, "turns", c.ret, c.idle, fp, c.two)
				st := newTurnStream(c.seed, c.aggs, c.ret, c.near, c.dup)
				for i := range batches {
					st.step()
					b := st.batch(c.maxPer)
					p := 0
					if c.two && st.r.IntN(2) == 0 {
						p = 1
					}
					if st.r.IntN(12) == 0 {
						x.restart(p, st.keys)
					}
					x.applyBy(fmt.Sprint("batch ", i), b, time.UnixMicro(st.clock), p)
				}
				n, refused := x.computed()
				if refused != 0 {
					t.Errorf("store.lua refused %d calls that no other writer came between", refused)
				}
				stored += n
				t.Logf("%d calls computed; by what they did (all, computed): %v; first after a restart: %v", n, x.calls, x.afterRestart)
				for k, v := range x.calls {
					calls[k] = [2]int{calls[k][0] + v[0], calls[k][1] + v[1]}
				}
				afterRestart[0], afterRestart[1] = afterRestart[0]+x.afterRestart[0], afterRestart[1]+x.afterRestart[1]
			})
		}
		t.Logf("%d calls computed on Redis; first calls after a restart: %d, computed %d", stored, afterRestart[0], afterRestart[1])
		// Floors at about half what these seeds compute in layout 10 (68, 43 and 42; layout 11
		// computes more, and 34 first calls after a restart): the paths this test is about are taken.
		floors := map[string]int{hourTurned: 30, cutMoved: 20, pruned: 20}
		for _, what := range []string{hourTurned, cutMoved, pruned} {
			t.Logf("%s: %d calls, %d of them computed", what, calls[what][0], calls[what][1])
			if calls[what][1] < floors[what] {
				t.Errorf("%s: %d calls computed, want at least %d", what, calls[what][1], floors[what])
			}
		}
		if fp != nil && afterRestart[1] < 15 {
			t.Errorf("%d first calls after a restart computed, want at least 15", afterRestart[1])
		}
	})
}

// TestRacingComputedCallsStoreOneOrderOfTheScripts: two computing processors apply a batch each to
// one aggregate at the same moment, round after round, across hours, one of them now and then
// restarted. The state and both replies must be those of apply.lua applying the two batches one
// after the other, in one order or the other: store.lua refuses a call whose fields the other
// processor changed since its read, and apply.lua runs it. Each call mostly finds the other's
// writes, so in layout 11 it reads its buckets, and its state as planned from the head's minute,
// in a second round trip, which the other's call may come before. The serial orders are applied
// under two prefixes of their own, the one that matched copied over the other after each round
// (DUMP and RESTORE).
func TestRacingComputedCallsStoreOneOrderOfTheScripts(t *testing.T) {
	const rounds = 120
	inBothLayouts(t, func(t *testing.T, fp *Fingerprinter) {
		for _, ret := range []time.Duration{2 * time.Hour, 17 * time.Hour} {
			t.Run(fmt.Sprint(ret), func(t *testing.T) {
				ctx := context.Background()
				c := testenv.Redis(t)
				named := func(what string) string {
					prefix := testenv.Name(t, what)
					testenv.CleanPrefix(t, c, prefix)
					return prefix
				}
				open := func(prefix string, compute bool) *Redis {
					s, err := NewRedis(c, RedisConfig{Prefix: prefix, Retention: ret, ComputeCalls: compute, Fingerprint: fp})
					if err != nil {
						t.Fatal(err)
					}
					return s
				}
				racing, ab, ba := named("racing"), named("a-then-b"), named("b-then-a")
				a, b := open(racing, true), open(racing, true)
				serialAB, serialBA := open(ab, false), open(ba, false)
				dump := func(prefix string) map[string]string {
					out := map[string]string{}
					for k, v := range codecDumpAcross(t, c, prefix) {
						out[strings.TrimPrefix(k, prefix)] = v
					}
					return out
				}
				st := newTurnStream(uint64(ret/time.Hour), 1, ret, 98, 3)
				orders := map[string]int{}
				for round := range rounds {
					st.step()
					atA, obsA := time.UnixMicro(st.clock), st.batch(3)
					atB, obsB := atA.Add(time.Duration(st.r.IntN(120)-30)*time.Second), st.batch(3)
					if st.r.IntN(4) == 0 { // the same opportunity in both, assessed apart
						o := obsA[0]
						o.Assessed += int64(1+st.r.IntN(5)) * 1e6
						o.Class = Class(1 + st.r.IntN(3))
						obsB = append(obsB, o)
					}
					if st.r.IntN(8) == 0 { // one of them restarted: its first call plans its read from the head
						restartProcessor([]*Redis{a, b}[st.r.IntN(2)], st.keys)
					}
					a.skipReads, b.skipReads = 0, 0
					var ra, rb Applied
					var ea, eb error
					done := make(chan struct{})
					go func() { ra, ea = a.Apply(ctx, obsA, atA); close(done) }()
					rb, eb = b.Apply(ctx, obsB, atB)
					<-done
					sa, e1 := serialAB.Apply(ctx, obsA, atA)
					sb, e2 := serialAB.Apply(ctx, obsB, atB)
					tb, e3 := serialBA.Apply(ctx, obsB, atB)
					ta, e4 := serialBA.Apply(ctx, obsA, atA)
					for _, err := range []error{ea, eb, e1, e2, e3, e4} {
						if err != nil {
							t.Fatalf("round %d: %v", round, err)
						}
					}
					got, wantAB, wantBA := dump(racing), dump(ab), dump(ba)
					aThenB := reflect.DeepEqual(got, wantAB) && reflect.DeepEqual(ra, sa) && reflect.DeepEqual(rb, sb)
					bThenA := reflect.DeepEqual(got, wantBA) && reflect.DeepEqual(ra, ta) && reflect.DeepEqual(rb, tb)
					switch {
					case aThenB && bThenA:
						orders["either"]++
					case aThenB:
						orders["a then b"]++
						copyKeys(t, c, ab, ba)
					case bThenA:
						orders["b then a"]++
						copyKeys(t, c, ba, ab)
					default:
						for k, v := range got {
							if v != wantAB[k] || v != wantBA[k] {
								t.Logf("key %s\nracing: %s\na then b: %s\nb then a: %s", k, v, wantAB[k], wantBA[k])
							}
						}
						t.Fatalf("round %d: the racing calls left neither order's state and replies\nracing: %+v %+v\na then b: %+v %+v\nb then a: %+v %+v",
							round, ra, rb, sa, sb, ta, tb)
					}
				}
				var stored, refused int64
				for _, s := range []*Redis{a, b} {
					n, r := s.ComputedCalls()
					stored, refused = stored+n, refused+r
				}
				t.Logf("orders %v; computed calls stored %d, refused by store.lua %d", orders, stored, refused)
				// Most rounds, one call of the two is stored and the other refused.
				if stored < rounds/8 {
					t.Errorf("%d calls computed and stored, want at least %d", stored, rounds/8)
				}
			})
		}
	})
}

// copyKeys makes the keys under prefix dst a copy of those under src, TTLs kept (DUMP, RESTORE).
func copyKeys(t *testing.T, c *redis.Client, src, dst string) {
	t.Helper()
	ctx := context.Background()
	if old := c.Keys(ctx, dst+":*").Val(); len(old) > 0 {
		if err := c.Del(ctx, old...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	keys, err := c.Keys(ctx, src+":*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		d, err := c.Dump(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Restore(ctx, dst+strings.TrimPrefix(k, src), max(c.PTTL(ctx, k).Val(), 0), d).Err(); err != nil {
			t.Fatal(err)
		}
	}
}
