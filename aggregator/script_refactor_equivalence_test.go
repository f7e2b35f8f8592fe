package aggregator

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/repeatrate/repeatrate/internal/testenv"
)

// The apply script's globals were read into locals and some of its appends keep their own
// counters (commits 9ee3f3f, 81dd70e): a change of speed that must change nothing else. These tests
// run the current script and the script of the commit before that change side by side, under two
// prefixes of one Redis (the real one, and the embedded one of `repeatrate dev`), through the
// store's own Apply and Tally (a client hook hands the previous script's source and hash to Redis
// in place of the current one's), and require every reply and every stored key, field, member,
// score and expiry to be equal. Run them with REPEATRATE_SCRIPT_PREV=<revision>, e.g.
//
//	REPEATRATE_SCRIPT_PREV=1bc9c97 go test -count=1 -run SameAsPrevious ./aggregator/...
//
// (they are skipped without it: a change that means to change what a script stores differs from
// every earlier revision).

// onBackends runs f on the test Redis and, when embedded, on an embedded one (the server of
// `repeatrate dev`, whose Lua is gopher-lua).
func onBackends(t *testing.T, embedded bool, f func(t *testing.T, addr string)) {
	if embedded {
		t.Run("embedded", func(t *testing.T) { f(t, miniredis.RunT(t).Addr()) })
	}
	t.Run("redis", func(t *testing.T) { f(t, testenv.RedisAddr(t)) })
}

// equivNormState hides the server-clock stamp of the state's head: the two scripts run a moment
// apart.
func equivNormState(key, field, v string) string { return testenv.NormStateHead(key, field, v) }

func equivIgnorePending(name string) bool { return strings.Contains(name, "}:pending:") }

// equivBatch is one delivery of observations at an observation time.
type equivBatch struct {
	obs []Observation
	at  time.Time
}

// equivCompare applies batches to two stores under fresh prefixes on addr, one running the
// current apply script and one the previous, and fails on the first reply or stored key that
// differs; at the end it reads every aggregate back with Tally at a few times.
func equivCompare(t *testing.T, addr string, cfg RedisConfig, batches []equivBatch) map[Outcome]int {
	t.Helper()
	ctx := context.Background()
	cur, prev, hc, hp := testenv.ScriptClients(t, addr, applySource, testenv.ScriptPrevSource(t, "aggregator/apply.lua"))
	cc, cp := cfg, cfg
	cc.Prefix, cp.Prefix = testenv.Name(t, "equivcur"), testenv.Name(t, "equivprev")
	testenv.CleanPrefix(t, cur, cc.Prefix)
	testenv.CleanPrefix(t, cur, cp.Prefix)
	sc, err := NewRedis(cur, cc)
	if err != nil {
		t.Fatal(err)
	}
	sp, err := NewRedis(prev, cp)
	if err != nil {
		t.Fatal(err)
	}
	outcomes := map[Outcome]int{}
	keys := map[Key]bool{}
	calls := 0
	var last time.Time
	for n, b := range batches {
		gc, err := sc.Apply(ctx, b.obs, b.at)
		if err != nil {
			t.Fatalf("batch %d, current script: %v", n, err)
		}
		gp, err := sp.Apply(ctx, b.obs, b.at)
		if err != nil {
			t.Fatalf("batch %d, previous script: %v", n, err)
		}
		rc, rp := hc.Take(), hp.Take()
		if len(rc) == 0 || !reflect.DeepEqual(rc, rp) {
			t.Fatalf("batch %d: replies differ\ncurrent script:  %v\nprevious script: %v", n, rc, rp)
		}
		calls += len(rc)
		if !reflect.DeepEqual(gc, gp) {
			t.Fatalf("batch %d: results differ\ncurrent script:  %+v\nprevious script: %+v", n, gc, gp)
		}
		for _, o := range gc.Outcomes {
			outcomes[o]++
		}
		for _, k := range gc.Keys {
			keys[k] = true
		}
		// The whole state, now and then and at the end (a dump costs a read of every key).
		if n%max(7, len(batches)/12) == 0 || n == len(batches)-1 {
			testenv.SameDumps(t, fmt.Sprint("after batch ", n),
				testenv.DumpKeys(t, cur, cc.Prefix, equivIgnorePending, equivNormState),
				testenv.DumpKeys(t, cur, cp.Prefix, equivIgnorePending, equivNormState))
		}
		last = b.at
	}
	for _, at := range []time.Time{last, last.Add(-3 * time.Hour), last.Add(40 * 24 * time.Hour)} {
		for k := range keys {
			tc, err := sc.Tally(ctx, k, at)
			if err != nil {
				t.Fatal(err)
			}
			tp, err := sp.Tally(ctx, k, at)
			if err != nil {
				t.Fatal(err)
			}
			rc, rp := hc.Take(), hp.Take()
			if tc != tp || len(rc) != 1 || !reflect.DeepEqual(rc, rp) {
				t.Fatalf("tally of %s at %v: current %+v %v, previous %+v %v", k, at, tc, rc, tp, rp)
			}
		}
	}
	testenv.SameDumps(t, "after the reads", testenv.DumpKeys(t, cur, cc.Prefix, equivIgnorePending, equivNormState),
		testenv.DumpKeys(t, cur, cp.Prefix, equivIgnorePending, equivNormState))
	t.Logf("%d batches, %d script calls, %d aggregates, outcomes %v", len(batches), calls, len(keys), outcomes)
	return outcomes
}

// equivCut cuts stream into batches of random sizes (up to maxBatch) at an observation time near
// the greatest occurred time so far (sometimes behind it), and now and then delivers again from
// an earlier batch's start.
func equivCut(r *rand.Rand, stream []Observation, maxBatch int) []equivBatch {
	var out []equivBatch
	var maxOcc int64
	var starts []int
	for i := 0; i < len(stream); {
		end := min(i+1+r.IntN(maxBatch), len(stream))
		for _, o := range stream[i:end] {
			maxOcc = max(maxOcc, o.Occurred)
		}
		at := time.UnixMicro(maxOcc + int64(r.IntN(120))*1e6)
		if r.IntN(4) == 0 {
			at = time.UnixMicro(maxOcc - int64(r.IntN(9*60))*1e6)
		}
		starts = append(starts, i)
		out = append(out, equivBatch{stream[i:end], at})
		if r.IntN(6) == 0 { // a redelivery of what was applied since an earlier batch, cut anew
			for j := starts[r.IntN(len(starts))]; j < end; {
				m := min(j+1+r.IntN(maxBatch), end)
				out = append(out, equivBatch{stream[j:m], at})
				j = m
			}
		}
		i = end
	}
	return out
}

// equivWide is a batch of one aggregate whose n observations spread over hours hours and their
// minutes, many of them re-assessments and duplicates of each other: more fields to read than a
// command takes at once (CHUNK), many hours, index chunks closed.
func equivWide(r *rand.Rand, n, hours int, end time.Time) []Observation {
	k := Key{Scope: collisionScopes[0], CorrectionID: "wide", Source: Live}
	var out []Observation
	for len(out) < n {
		if len(out) > 0 && r.IntN(4) == 0 {
			o := out[r.IntN(len(out))]
			if r.IntN(2) == 0 {
				o.Assessed += int64(1+r.IntN(600)) * 1e6
				o.Class = Class(1 + r.IntN(3))
				o.Occurred += int64(r.IntN(7200)-3600) * 1e6
			}
			out = append(out, o)
			continue
		}
		occ := Micros(end) - int64(r.IntN(hours*3600))*1e6
		out = append(out, Observation{Key: k, OpportunityID: fmt.Sprintf("w%06d/%s", len(out), strings.Repeat("x", r.IntN(40))),
			Class: Class(1 + r.IntN(3)), Occurred: occ, Assessed: occ + int64(r.IntN(60))*1e6})
	}
	return out
}

// Random streams (duplicates, re-assessments moving across hours, stale ones, late and far too
// late events, watermark leaps that expire whole aggregates and leave records to collect, short
// retention whose hours expire with their minute buckets), and wide batches past the script's
// chunk of arguments: the current apply script and the previous one reply and store the same.
func TestApplyScriptSameAsPrevious(t *testing.T) {
	for _, tc := range []struct {
		name      string
		seed      uint64
		n         int
		span      time.Duration
		retention time.Duration
		jumpEvery int
		maxBatch  int
		embedded  bool
	}{
		{"days", 1, 4000, 10 * 24 * time.Hour, 3 * 24 * time.Hour, 0, 300, true},
		{"leaps", 2, 4000, 10 * 24 * time.Hour, 3 * 24 * time.Hour, 300, 300, false},
		{"short retention", 3, 4000, 12 * time.Hour, time.Hour, 0, 200, false},
		{"short retention, leaps", 4, 3000, 2 * time.Hour, time.Hour, 400, 100, true},
		{"minutes, small batches", 5, 2000, 20 * time.Minute, 3 * 24 * time.Hour, 0, 20, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(tc.seed, 3))
			batches := equivCut(r, randomStreamOver(r, tc.n, tc.span, tc.jumpEvery), tc.maxBatch)
			onBackends(t, tc.embedded, func(t *testing.T, addr string) {
				got := equivCompare(t, addr, RedisConfig{Retention: tc.retention}, batches)
				for _, o := range []Outcome{Counted, Reassessed, Duplicate, Stale, Expired} {
					if got[o] == 0 {
						t.Errorf("the stream never produced %v: it does not test it", o)
					}
				}
			})
		})
	}
	t.Run("wide batches", func(t *testing.T) {
		r := rand.New(rand.NewPCG(7, 3))
		end := t0.Add(30 * 24 * time.Hour)
		var batches []equivBatch
		// Past CHUNK fields and hours and minutes to read; then the same again (duplicates and
		// stale), later ones that expire most of it and collect its records, and small ones.
		wide := equivWide(r, 9000, 200, end)
		batches = append(batches, equivBatch{wide, end}, equivBatch{wide[:5000], end})
		for i := 1; i <= 6; i++ {
			at := end.Add(time.Duration(i) * 40 * time.Hour)
			batches = append(batches, equivBatch{equivWide(r, 1500, 100, at), at})
		}
		onBackends(t, false, func(t *testing.T, addr string) {
			equivCompare(t, addr, RedisConfig{Retention: 3 * 24 * time.Hour}, batches)
		})
	})
}
