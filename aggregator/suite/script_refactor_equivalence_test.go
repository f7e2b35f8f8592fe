package suite

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/internal/testenv"
	"github.com/repeatrate/repeatrate/schemas"
)

// The suite script's globals were read into locals and some of its appends keep their own
// counters (commit 81dd70e): a change of speed that must change nothing else. These tests run the
// current script and the script of the commit before that change side by side, under two prefixes
// of one Redis (the real one, and the embedded one of `repeatrate dev`), through the store's own
// Apply, Read and MarkAnnounced (a client hook hands the previous script's source and hash to
// Redis in place of the current one's), and require every reply and every stored key, field,
// member, score and expiry to be equal. Run them with REPEATRATE_SCRIPT_PREV=<revision>, e.g.
//
//	REPEATRATE_SCRIPT_PREV=1bc9c97 go test -count=1 -run SameAsPrevious ./aggregator/...
//
// (they are skipped without it: a change that means to change what a script stores differs from
// every earlier revision).

// equivBatch is one delivery of graded runs at an observation time; announce marks the revived
// cases the batch reports as published before the next one (as the processor does).
type equivBatch struct {
	obs      []RunObservation
	at       time.Time
	announce bool
}

func equivNoIgnore(string) bool         { return false }
func equivNoNorm(_, _, v string) string { return v }

// equivCompare applies batches to two stores under fresh prefixes on addr, one running the
// current suite script and one the previous, and fails on the first reply or stored key that
// differs; every few batches and at the end it reads every suite back with Read.
func equivCompare(t *testing.T, addr string, cfg Config, batches []equivBatch) map[aggregator.Outcome]int {
	t.Helper()
	ctx := context.Background()
	cur, prev, hc, hp := testenv.ScriptClients(t, addr, suiteSource, testenv.ScriptPrevSource(t, "aggregator/suite/suite.lua"))
	pc, pp := testenv.Name(t, "equivcur"), testenv.Name(t, "equivprev")
	testenv.CleanPrefix(t, cur, pc)
	testenv.CleanPrefix(t, cur, pp)
	sc, err := NewRedis(cur, aggregator.RedisConfig{Prefix: pc, Retention: time.Hour}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	sp, err := NewRedis(prev, aggregator.RedisConfig{Prefix: pp, Retention: time.Hour}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	dumps := func(what string) {
		t.Helper()
		testenv.SameDumps(t, what, testenv.DumpKeys(t, cur, pc, equivNoIgnore, equivNoNorm), testenv.DumpKeys(t, cur, pp, equivNoIgnore, equivNoNorm))
	}
	read := func(what string, suites map[Key]bool, at time.Time) {
		t.Helper()
		for _, k := range slices.SortedFunc(func(yield func(Key) bool) {
			for k := range suites {
				if !yield(k) {
					return
				}
			}
		}, func(a, b Key) int { return strings.Compare(a.ID(), b.ID()) }) {
			gc, err := sc.Read(ctx, k, at)
			if err != nil {
				t.Fatal(err)
			}
			gp, err := sp.Read(ctx, k, at)
			if err != nil {
				t.Fatal(err)
			}
			rc, rp := hc.Take(), hp.Take()
			if len(rc) != 1 || !reflect.DeepEqual(rc, rp) || !reflect.DeepEqual(gc, gp) {
				t.Fatalf("%s: read of %v differs\ncurrent script:  %v\nprevious script: %v", what, k, rc, rp)
			}
		}
	}
	outcomes := map[aggregator.Outcome]int{}
	suites := map[Key]bool{}
	calls, revived, missing := 0, 0, 0
	every := max(5, len(batches)/12)
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
		for _, k := range gc.Suites {
			suites[k] = true
			s := gc.Summaries[k]
			revived += len(s.Revived)
			for _, v := range s.Versions {
				missing += len(v.Missing)
			}
			if b.announce && len(s.Revived) > 0 {
				var cases []string
				for _, r := range s.Revived {
					cases = append(cases, r.CaseID)
				}
				if err := sc.MarkAnnounced(ctx, k, cases); err != nil {
					t.Fatal(err)
				}
				if err := sp.MarkAnnounced(ctx, k, cases); err != nil {
					t.Fatal(err)
				}
			}
		}
		if n%every == 0 || n == len(batches)-1 {
			dumps(fmt.Sprint("after batch ", n))
			read(fmt.Sprint("after batch ", n), suites, b.at)
			dumps(fmt.Sprint("after the reads of batch ", n))
		}
	}
	last := batches[len(batches)-1].at
	read("late", suites, last.Add(48*time.Hour))
	dumps("after the late reads")
	t.Logf("%d batches, %d script calls, %d suites, outcomes %v, %d revived, %d missing lists", len(batches), calls, len(suites),
		outcomes, revived, missing)
	if revived == 0 || missing == 0 {
		t.Errorf("%d revived, %d missing lists: the batches must report both", revived, missing)
	}
	return outcomes
}

// equivCut cuts stream into batches of random sizes at a clock moving a few minutes each, with
// redeliveries from an earlier batch's start, announcing revived cases after most batches.
func equivCut(r *rand.Rand, stream []RunObservation) []equivBatch {
	var out []equivBatch
	var starts []int
	at := t0
	for i := 0; i < len(stream); {
		end := min(i+1+r.IntN([]int{3, 40, 300}[r.IntN(3)]), len(stream))
		at = at.Add(time.Duration(r.IntN(20)) * time.Minute)
		starts = append(starts, i)
		out = append(out, equivBatch{stream[i:end], at, r.IntN(3) > 0})
		if r.IntN(4) == 0 {
			for j := starts[r.IntN(len(starts))]; j < end; {
				m := min(j+1+r.IntN(200), end)
				out = append(out, equivBatch{stream[j:m], at, r.IntN(3) > 0})
				j = m
			}
		}
		i = end
	}
	return out
}

// equivWide is a batch of runs of one suite past the script's chunk of arguments (CHUNK, 1000):
// more runs, cases and cells than one command takes, more runs to write than one HSET takes.
func equivWide(r *rand.Rand, n, cases int, as int64) []RunObservation {
	var out []RunObservation
	for i := range n {
		c := fmt.Sprint("w", r.IntN(cases))
		v := r.IntN(3)
		o := adv(fmt.Sprint("wv", v), c, int64(i%40), "pfe"[r.IntN(3)], int64(v), 40, int64(r.IntN(60)), as, 0)
		if r.IntN(2) == 0 {
			o = withReply(o, r.IntN(300), []string{"", "gzip_ratio"}[r.IntN(2)])
		}
		out = append(out, o)
	}
	return out
}

// Random streams of graded runs (repeats, re-assessments of result, reply, tokens and trigger,
// version_seq growing later and reordering versions, run indexes up to MaxRuns-1, two suites with
// colliding names, redeliveries, announcements) and wide batches past the script's chunk of
// arguments: the current suite script and the previous one reply and store the same.
func TestSuiteScriptSameAsPrevious(t *testing.T) {
	for _, tc := range []struct {
		name            string
		seed            uint64
		cfg             Config
		versions, cases int
		embedded        bool
	}{
		{"few versions", 1, Config{MinHistory: 2, MissingAfter: 30 * time.Minute}, 4, 5, true},
		{"judge last 3", 2, Config{MinHistory: 2, JudgeLastVersions: 3, MissingAfter: 30 * time.Minute}, 9, 3, true},
		{"many cases", 3, Config{MinHistory: 1, JudgeLastVersions: 2, MissingAfter: 10 * time.Minute}, 4, 12, false},
		{"min history 3", 4, Config{MinHistory: 3, MissingAfter: 30 * time.Minute}, 6, 6, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(tc.seed, 5))
			batches := equivCut(r, advStream(r, 1500, tc.versions, tc.cases))
			equivBackends(t, tc.embedded, func(t *testing.T, addr string) {
				got := equivCompare(t, addr, tc.cfg, batches)
				for _, o := range []aggregator.Outcome{aggregator.Counted, aggregator.Reassessed, aggregator.Duplicate, aggregator.Stale} {
					if got[o] == 0 {
						t.Errorf("the stream never produced %v: it does not test it", o)
					}
				}
			})
		})
	}
	t.Run("wide batches", func(t *testing.T) {
		r := rand.New(rand.NewPCG(9, 5))
		// At most 2000 runs a call: the bound of `repeatrate dev`, whose gopher-lua overflows its
		// registry on about 3000 (table.concat of the outcome codes), with either script.
		first := equivWide(r, 2000, 1500, 1)
		again := slices.Clone(first)
		for i := range again {
			if i%3 == 0 {
				again[i].Record.Assessed += 60e6
				again[i].Record.Result = "pfe"[(i/3)%3]
			}
		}
		batches := []equivBatch{{first, t0, true}, {again, t0.Add(time.Hour), true}, {equivWide(r, 1800, 1200, 3), t0.Add(2 * time.Hour), true},
			{[]RunObservation{adv("wv9", "w1", 0, 'p', 0, schemas.MaxRuns, 0, 5, 0)}, t0.Add(3 * time.Hour), true}}
		equivBackends(t, true, func(t *testing.T, addr string) {
			equivCompare(t, addr, Config{MinHistory: 2, JudgeLastVersions: 2, MissingAfter: 30 * time.Minute}, batches)
		})
	})
}

// equivBackends runs f on the test Redis and, when embedded, on an embedded one.
func equivBackends(t *testing.T, embedded bool, f func(t *testing.T, addr string)) {
	if embedded {
		t.Run("embedded", func(t *testing.T) { f(t, miniredis.RunT(t).Addr()) })
	}
	t.Run("redis", func(t *testing.T) { f(t, testenv.RedisAddr(t)) })
}
