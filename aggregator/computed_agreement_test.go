package aggregator

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/repeatrate/repeatrate/internal/testenv"
)

// rawApply applies batch on every side without the model (crafted state), and reports (Errorf)
// differing outcomes, tallies and keys.
func rawApply(x *computedSides, what string, batch []Observation, at time.Time) {
	x.t.Helper()
	var res []Applied
	for i, s := range x.stores {
		s.skipReads = 0
		got, err := s.Apply(context.Background(), batch, at)
		if err != nil {
			x.t.Fatalf("%s: %s: %v", what, x.names[i], err)
		}
		res = append(res, got)
	}
	for i := 1; i < len(res); i++ {
		for j := range batch {
			if res[i].Outcomes[j] != res[0].Outcomes[j] {
				x.t.Errorf("%s: event %d: %s %v, %s %v", what, j, x.names[0], res[0].Outcomes[j], x.names[i], res[i].Outcomes[j])
			}
		}
		for k, t := range res[0].Tallies {
			if res[i].Tallies[k] != t {
				x.t.Errorf("%s: tally %s %+v, %s %+v", what, x.names[0], t, x.names[i], res[i].Tallies[k])
			}
		}
	}
	want := x.dump(0)
	for i := 1; i < len(x.rigs); i++ {
		got := x.dump(i)
		for k, v := range want {
			if got[k] != v {
				x.t.Errorf("%s: key %s differs\n%s: %s\n%s: %s", what, k, x.names[0], v, x.names[i], got[k])
			}
		}
		for k := range got {
			if _, ok := want[k]; !ok {
				x.t.Errorf("%s: key %s only on %s", what, k, x.names[i])
			}
		}
	}
}

func setRecord(x *computedSides, k Key, id, v string) {
	for i, rig := range x.rigs {
		f := fmt.Sprintf("%03x%s", len(id), id)
		if err := rig.c.HSet(context.Background(), x.stores[i].keys(k)[0], f, v).Err(); err != nil {
			x.t.Fatal(err)
		}
	}
}

// TestRecordsTheProcessorDidNotWriteGoToTheScript: records of shapes the processor never writes (a
// horizon at or below the occurred time, numbers past 2⁵³−1 that Lua rounds, leading zeros,
// uppercase hex, a lowercase class) leave the call to apply.lua, or are computed to the same bytes
// and reply: every side holds the same keys and answers the same.
func TestRecordsTheProcessorDidNotWriteGoToTheScript(t *testing.T) {
	k := Key{Scope: collisionScopes[0], CorrectionID: "foreign", Source: Live}
	as := func(id string, c Class, occ, assessed, seq int64) Observation {
		return Observation{Key: k, OpportunityID: id, Class: c, Occurred: occ, Assessed: assessed, Seq: seq}
	}
	computed := func(x *computedSides) int64 { n, _ := x.stores[1].ComputedCalls(); return n }
	occ := Micros(t0) + 30*minuteUS
	at := time.UnixMicro(occ + 10e6)
	hx := func(v int64) string { return strconv.FormatInt(v, 16) }

	t.Run("horizon below occurred, in another group", func(t *testing.T) {
		x := newComputedSides(t, "hzlow", 24*time.Hour, 0)
		rawApply(x, "first", []Observation{as("a", Confirmed, occ-4*hourUS, occ-4*hourUS, 0), as("r", Passed, occ, occ, 0)}, at)
		setRecord(x, k, "r", "P"+hx(occ)+","+hx(occ)+";"+hx(occ-4*hourUS))
		before := computed(x)
		rawApply(x, "newer of r", []Observation{as("r", Confirmed, occ, occ+1e6, 0)}, at)
		if n := computed(x) - before; n != 0 {
			t.Errorf("%d calls computed: want the call left to apply.lua", n)
		}
	})
	t.Run("horizon above 2^53", func(t *testing.T) {
		x := newComputedSides(t, "hzbig", 24*time.Hour, 0)
		rawApply(x, "first", []Observation{as("a", Confirmed, occ-1e6, occ, 0), as("r", Passed, occ, occ, 0)}, at)
		setRecord(x, k, "r", "P"+hx(occ)+","+hx(occ)+";"+hx(1<<53+1))
		before := computed(x)
		rawApply(x, "newer of r", []Observation{as("r", Confirmed, occ, occ+1e6, 0)}, at)
		if n := computed(x) - before; n != 0 {
			t.Errorf("%d calls computed: want the call left to apply.lua", n)
		}
	})
	t.Run("seq above 2^53", func(t *testing.T) {
		x := newComputedSides(t, "seqbig", 24*time.Hour, 0)
		rawApply(x, "first", []Observation{as("a", Confirmed, occ-1e6, occ, 0), as("r", Passed, occ, occ, 1<<53+1)}, at)
		before := computed(x)
		rawApply(x, "seq 2^53 of r", []Observation{as("r", Confirmed, occ, occ, 1<<53)}, at)
		if n := computed(x) - before; n != 0 {
			t.Errorf("%d calls computed: want the call left to apply.lua", n)
		}
	})
	t.Run("leading zeros, horizon equal to occurred, uppercase, lowercase class", func(t *testing.T) {
		x := newComputedSides(t, "shapes", 24*time.Hour, 0)
		rawApply(x, "first", []Observation{as("a", Confirmed, occ-1e6, occ, 0), as("z", Passed, occ, occ, 0),
			as("e", Passed, occ, occ, 0), as("u", Passed, occ, occ, 0), as("l", Passed, occ, occ, 0)}, at)
		// A leading zero within 14 digits reads as Lua reads it, and both calls are computed; the
		// other shapes leave both calls to apply.lua.
		setRecord(x, k, "z", "P0"+hx(occ)+",0"+hx(occ))
		setRecord(x, k, "e", "P"+hx(occ)+","+hx(occ)+";"+hx(occ))
		setRecord(x, k, "u", "P"+fmt.Sprintf("%X", occ)+","+hx(occ))
		setRecord(x, k, "l", "p"+hx(occ)+","+hx(occ))
		for id, want := range map[string]int64{"z": 2, "e": 0, "u": 0, "l": 0} {
			before := computed(x)
			rawApply(x, "equal "+id, []Observation{as(id, Confirmed, occ, occ, 0)}, at)
			rawApply(x, "newer "+id, []Observation{as(id, Confirmed, occ, occ+1e6, 0), as(id, Unscored, occ, occ+1e6, 1)}, at)
			if n := computed(x) - before; n != want {
				t.Errorf("%s: %d calls computed, want %d", id, n, want)
			}
		}
	})
}

// TestComputedCallsMeetingOpportunitiesAgainStoreWhatTheScriptStores: streams heavy in opportunities
// met again within a call, reassessments of the same occurrence, seq ties and equal assessments
// give the model's replies and the same bytes on every side.
func TestComputedCallsMeetingOpportunitiesAgainStoreWhatTheScriptStores(t *testing.T) {
	inBothLayouts(t, func(t *testing.T, fp *Fingerprinter) {
		for seed := uint64(1); seed <= 3; seed++ {
			t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
				ret := 24 * time.Hour
				if seed%2 == 0 {
					ret = 3 * time.Hour
				}
				x := newComputedSidesIn(t, "repeats", ret, time.Hour, fp)
				r := rand.New(rand.NewPCG(seed, 99))
				keys := []Key{{Scope: collisionScopes[0], CorrectionID: "rep-a", Source: Live}, {Scope: collisionScopes[1], CorrectionID: "rep-b", Source: Live}}
				type opp struct {
					k   Key
					id  string
					occ int64
					as  int64
				}
				var pool []opp
				clock := Micros(t0)
				for b := range 300 {
					clock += int64(r.IntN(3)) * 1e6
					if r.IntN(50) == 0 {
						clock += int64(r.IntN(90)) * minuteUS
					}
					var batch []Observation
					n := 1 + r.IntN(25)
					for len(batch) < n {
						p := r.IntN(100)
						switch {
						case p < 35 || len(pool) == 0:
							back := int64(r.ExpFloat64() * 120e6)
							if r.IntN(10) == 0 {
								back = int64(r.IntN(int(ret/time.Minute))) * minuteUS
							}
							o := opp{keys[r.IntN(2)], fmt.Sprint("o", len(pool)), clock - back, 0}
							o.as = o.occ + int64(r.IntN(5))*1e6
							pool = append(pool, o)
							batch = append(batch, Observation{Key: o.k, OpportunityID: o.id, Class: Class(1 + r.IntN(3)), Occurred: o.occ, Assessed: o.as, Seq: int64(r.IntN(3))})
						case p < 60 && len(batch) > 0:
							o := batch[r.IntN(len(batch))]
							o.Class = Class(1 + r.IntN(3))
							switch r.IntN(6) {
							case 0:
								o.Assessed += 1e6
							case 1:
								o.Seq += 1
							case 2:
								o.Seq = max(o.Seq-1, 0)
							case 3:
								o.Assessed -= 1e6
							case 4:
								o.Occurred += int64(r.IntN(7)-3) * 1e6
							}
							batch = append(batch, o)
						default:
							o := pool[len(pool)-1-r.IntN(min(len(pool), 100))]
							ob := Observation{Key: o.k, OpportunityID: o.id, Class: Class(1 + r.IntN(3)), Occurred: o.occ, Assessed: o.as + int64(r.IntN(5)-2)*1e6, Seq: int64(r.IntN(3))}
							if r.IntN(8) == 0 {
								ob.Occurred -= int64(r.IntN(120)) * minuteUS
							}
							batch = append(batch, ob)
						}
					}
					var top int64
					for _, o := range batch {
						top = max(top, o.Occurred)
					}
					at := time.UnixMicro(max(clock, top))
					x.apply(fmt.Sprint("batch ", b), batch, at)
				}
				for i, s := range x.stores[1:] {
					st, rf := s.ComputedCalls()
					op, un := s.ComputedCallsLeft()
					t.Logf("%s: stored %d refused %d offpath %d unread %d", x.names[i+1], st, rf, op, un)
					if st < 100 {
						t.Errorf("%s: %d calls computed: the stream should keep most on the path", x.names[i+1], st)
					}
				}
				for o, n := range x.rigs[0].outs {
					t.Logf("%v: %d", o, n)
				}
			})
		}
	})
}

// TestComputedCallsBesideAnotherWriterAnswerTruthfully: another processor (apply.lua) applies a
// batch on the same aggregates between the computed calls' read and their store; the replies are
// the model's with the other batch first, and every call is counted once: stored, refused, off
// the path or unread.
func TestComputedCallsBesideAnotherWriterAnswerTruthfully(t *testing.T) {
	inBothLayouts(t, func(t *testing.T, fp *Fingerprinter) {
		c := testenv.Redis(t)
		for seed := uint64(1); seed <= 3; seed++ {
			t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
				prefix := testenv.Name(t, "beside")
				testenv.CleanPrefix(t, c, prefix)
				open := func(compute bool) *Redis {
					s, err := NewRedis(c, RedisConfig{Prefix: prefix, Retention: 24 * time.Hour, IdleTTL: time.Hour, ComputeCalls: compute, Fingerprint: fp})
					if err != nil {
						t.Fatal(err)
					}
					return s
				}
				mine, other := open(true), open(false)
				m := NewModel(24 * time.Hour)
				ctx := context.Background()
				r := rand.New(rand.NewPCG(seed, 7))
				keys := []Key{{Scope: collisionScopes[0], CorrectionID: "c-a", Source: Live}, {Scope: collisionScopes[1], CorrectionID: "c-b", Source: Live}}
				clock := Micros(t0)
				nid := 0
				gen := func(n int) []Observation {
					var b []Observation
					for len(b) < n {
						if nid == 0 || r.IntN(3) == 0 {
							occ := clock - int64(r.IntN(100))*1e6
							b = append(b, Observation{Key: keys[r.IntN(2)], OpportunityID: fmt.Sprint("o", nid), Class: Class(1 + r.IntN(3)), Occurred: occ, Assessed: occ})
							nid++
							continue
						}
						id := r.IntN(nid)
						occ := clock - int64(id%100)*1e6
						b = append(b, Observation{Key: keys[id%2], OpportunityID: fmt.Sprint("o", id), Class: Class(1 + r.IntN(3)),
							Occurred: occ, Assessed: occ + int64(r.IntN(4))*1e6, Seq: int64(r.IntN(3))})
					}
					return b
				}
				calls := int64(0)
				for b := range 200 {
					clock += int64(r.IntN(2)) * 1e6
					at := time.UnixMicro(clock + 200e6)
					batch := gen(1 + r.IntN(12))
					for i := range batch {
						var id int
						fmt.Sscanf(batch[i].OpportunityID, "o%d", &id)
						batch[i].Key = keys[id%2]
						batch[i].Occurred = Micros(t0) - int64(id%100)*1e6 + int64(id/100)*1e6
						if batch[i].Assessed < batch[i].Occurred {
							batch[i].Assessed = batch[i].Occurred
						}
					}
					ks := map[Key]bool{}
					for _, o := range batch {
						ks[o.Key] = true
					}
					calls += int64(len(ks))
					var between []Observation
					if r.IntN(2) == 0 {
						between = gen(1 + r.IntN(4))
						for i := range between {
							var id int
							fmt.Sscanf(between[i].OpportunityID, "o%d", &id)
							between[i].Key = keys[id%2]
							between[i].Occurred = Micros(t0) - int64(id%100)*1e6 + int64(id/100)*1e6
							if between[i].Assessed < between[i].Occurred {
								between[i].Assessed = between[i].Occurred
							}
						}
						mine.afterRead = func() {
							if _, err := other.Apply(ctx, between, at); err != nil {
								t.Fatal(err)
							}
						}
						m.Apply(ctx, between, at)
					} else {
						mine.afterRead = nil
					}
					mine.skipReads = 0
					got, err := mine.Apply(ctx, batch, at)
					if err != nil {
						t.Fatal(err)
					}
					want, _ := m.Apply(ctx, batch, at)
					for j := range batch {
						if got.Outcomes[j] != want.Outcomes[j] {
							t.Fatalf("batch %d event %d %+v: redis %v model %v (between %v)", b, j, batch[j], got.Outcomes[j], want.Outcomes[j], between)
						}
					}
					for _, k := range want.Keys {
						if got.Tallies[k] != want.Tallies[k] {
							t.Fatalf("batch %d %s: redis %+v model %+v", b, k, got.Tallies[k], want.Tallies[k])
						}
					}
				}
				st, rf := mine.ComputedCalls()
				op, un := mine.ComputedCallsLeft()
				t.Logf("stored %d refused %d offpath %d unread %d; calls %d", st, rf, op, un, calls)
				if st+rf+op+un != calls {
					t.Errorf("counted %d calls, made %d", st+rf+op+un, calls)
				}
				if st == 0 || rf == 0 {
					t.Errorf("%d calls stored and %d refused: want both, or the other writer never came between", st, rf)
				}
			})
		}
	})
}

// rawApplyFailing applies batch on every side, each of which must fail as apply.lua does on a
// state it refuses, with nothing written: every side holds what it held.
func rawApplyFailing(x *computedSides, what string, batch []Observation, at time.Time) {
	x.t.Helper()
	before := make([]map[string]string, len(x.stores))
	for i := range x.stores {
		before[i] = x.dump(i)
	}
	for i, s := range x.stores {
		s.skipReads = 0
		if _, err := s.Apply(context.Background(), batch, at); err == nil {
			x.t.Errorf("%s: %s applied a batch apply.lua refuses", what, x.names[i])
		}
		after := x.dump(i)
		for k, v := range before[i] {
			if after[k] != v {
				x.t.Errorf("%s: %s changed key %s", what, x.names[i], k)
			}
		}
	}
}

// TestStateTheScriptReadsOtherwiseGoesToTheScript: state written by hand that apply.lua reads
// otherwise than the processor would (a head number or version past 2⁵³, which Lua's doubles
// round), or refuses (a minute it reads for an event within 2 hours of the observation time that
// no bump of the call reaches), is left to apply.lua in both layouts: the same replies and bytes,
// or the same refusal with nothing written.
func TestStateTheScriptReadsOtherwiseGoesToTheScript(t *testing.T) {
	inBothLayouts(t, func(t *testing.T, fp *Fingerprinter) {
		k := Key{Scope: collisionScopes[0], CorrectionID: "by-hand", Source: Live}
		as := func(id string, c Class, occ int64) Observation {
			return Observation{Key: k, OpportunityID: id, Class: c, Occurred: occ, Assessed: occ}
		}
		computed := func(x *computedSides) int64 { n, _ := x.stores[1].ComputedCalls(); return n }
		base := floorDiv(Micros(t0), 3*hourUS)*3*hourUS + 120*minuteUS
		at := time.UnixMicro(base + 30e6)
		setState := func(x *computedSides, field string, set func(v string) string) {
			for i, rig := range x.rigs {
				key := x.stores[i].keys(k)[1]
				v, err := rig.c.HGet(t.Context(), key, field).Result()
				if err != nil {
					t.Fatalf("%s: %s: %v", x.names[i], field, err)
				}
				if err := rig.c.HSet(t.Context(), key, field, set(v)).Err(); err != nil {
					t.Fatal(err)
				}
			}
		}
		for _, tc := range []struct {
			name  string
			field string
			set   func(v string) string
		}{
			{"a window sum past 2^53", "H", func(v string) string {
				return v[:2+7*12] + string(appendLittleEndian(nil, 1<<53+1, 7)) + v[2+7*13:]
			}},
			{"a version past 2^53", "v", func(string) string { return strconv.FormatInt(1<<53+1, 10) }},
		} {
			t.Run(tc.name, func(t *testing.T) {
				x := newComputedSidesIn(t, "past-2p53", 24*time.Hour, 0, fp)
				rawApply(x, "first", []Observation{as("x", Passed, base)}, at)
				setState(x, tc.field, tc.set)
				before := computed(x)
				rawApply(x, "a new record", []Observation{as("y", Passed, base+1e6)}, at)
				if n := computed(x) - before; n != 0 {
					t.Errorf("%d calls computed: want the call left to apply.lua", n)
				}
			})
		}
		t.Run("a minute apply.lua reads and refuses", func(t *testing.T) {
			x := newComputedSidesIn(t, "minute", 24*time.Hour, 0, fp)
			rawApply(x, "first", []Observation{as("x", Confirmed, base-60*minuteUS), as("y", Confirmed, base-100*minuteUS)}, at)
			setState(x, fmt.Sprint("m", floorDiv(base-100*minuteUS, minuteUS)), func(string) string { return "not a minute" })
			// a first sets the call's floor 70 minutes below it; b, 100 minutes back, lies
			// under it but within the 2 hours apply.lua reads minutes for.
			rawApplyFailing(x, "a batch meeting that minute", []Observation{as("a", Confirmed, base-20e6), as("b", Confirmed, base-100*minuteUS+10e6)}, at)
		})
	})
}
