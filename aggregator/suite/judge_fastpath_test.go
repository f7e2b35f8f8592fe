package suite

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/repeatrate/repeatrate/internal/testenv"
)

// Commit b32d5dc gave the suite script's discrimination step a fast path: a case whose outcome
// changed in the call, with min_history above 1 and runs in exactly one version, moves the too-new
// count by +1 or -1 (it gained or lost its one outcome) instead of being judged before and after.
// It also made new cells share one 'before' table, memoised the histogram field names, and made a
// case's entry of the touched-cases table the list of its touched cells.
//
// These tests aim at that path and at its edges: min_history 1 (where it must not apply), 2 and 5,
// judge_last_versions windows (a single version outside the window is still too new), a lone run
// re-assessed from pass or fail to error (the case loses its outcome) and back, pass to fail and
// back within one version, cells that gain and lose an outcome within one call, a case's second
// version arriving in the same call as its first (the general path), a case whose other version
// holds only errored runs (listed, without an outcome: the general path too), a case's only version
// reordered by a greater version_seq, versions created in the call (ranked last, first and
// between), every prefix of the calls delivered again, cases whose runs come over many calls, and
// random streams mixing all of these.
//
// Each sequence runs through a9Compare (the current script against the model and, with
// REPEATRATE_SCRIPT_PREV or REPEATRATE_ADV9_PREV_FILE, against that script: replies and every
// stored key after every call) and through a10State, which after every call (and applied again,
// and after announcing) compares the whole discrimination hash, revived set and pending set each
// script holds with what the model's runs give (sjCheckState), and counts, from the model, which
// discrimination path each changed case takes, so that each test provably reaches the fast path's
// three moves (tn up, tn down, tn kept) and the general path it must leave alone. Both backends:
// the test Redis and the embedded one of `repeatrate dev` (gopher-lua).
//
//	REPEATRATE_TEST_REDIS=127.0.0.1:16379 REPEATRATE_SCRIPT_PREV=6e668c6 go test -count=1 -run TestJudgeFastPath ./aggregator/suite/

// a10Stats counts, from the model, the discrimination path each case whose outcome in a touched
// cell changed takes in a call that neither reorders versions nor moves the first judged version.
type a10Stats struct {
	up, down, kept int // fast path: the case gained its one outcome (tn +1), lost it (tn -1), changed it (tn kept)
	single1        int // a case of one version under min_history 1: the general path must judge it
	general        int // cases with runs in two or more versions
	secondInCall   int // ... of which the call gave both their first and their second version
	errOther       int // ... of which another version holds only errored runs
	reordered      int // calls that reordered versions or moved the first judged version
	checks         int // state comparisons made
}

// a10Snap is what the model held for judgeSuite at one time: the versions each case has runs in,
// each cell's outcome (1 pass, 2 fail; absent when none) and the order of versions.
type a10Snap struct {
	cells map[string]map[string]bool
	outs  map[cellKey]int
	order orderState
}

func a10Take(m *Model, cfg Config) a10Snap {
	sn := a10Snap{cells: map[string]map[string]bool{}, outs: map[cellKey]int{}, order: m.orderState(judgeSuite, cfg)}
	s := m.suites[judgeSuite]
	if s == nil {
		return sn
	}
	for ck := range s.planned { // every cell that received a run holds one
		if sn.cells[ck.c] == nil {
			sn.cells[ck.c] = map[string]bool{}
		}
		sn.cells[ck.c][ck.version] = true
	}
	for c, outs := range s.outcomesByCase() {
		for _, o := range outs {
			sn.outs[cellKey{o.version, c}] = 2 - b2i(o.pass)
		}
	}
	return sn
}

// a10Classify adds to st the paths the cases of obs took between before and after.
func a10Classify(st *a10Stats, m *Model, cfg Config, obs []RunObservation, before, after a10Snap) {
	if m.reordered(judgeSuite, before.order, cfg) {
		st.reordered++
		return
	}
	touched := map[string]map[string]bool{}
	for _, o := range obs {
		if touched[o.Key.Case] == nil {
			touched[o.Key.Case] = map[string]bool{}
		}
		touched[o.Key.Case][o.Key.Version] = true
	}
	for c, vs := range touched {
		changed := false
		for v := range vs {
			changed = changed || before.outs[cellKey{v, c}] != after.outs[cellKey{v, c}]
		}
		if !changed {
			continue
		}
		if len(after.cells[c]) > 1 {
			st.general++
			if len(before.cells[c]) == 0 {
				st.secondInCall++
			}
			for v := range after.cells[c] {
				if after.outs[cellKey{v, c}] == 0 {
					st.errOther++
					break
				}
			}
			continue
		}
		if cfg.MinHistory == 1 {
			st.single1++
			continue
		}
		has := func(sn a10Snap) int {
			for v := range after.cells[c] {
				if sn.outs[cellKey{v, c}] != 0 {
					return 1
				}
			}
			return 0
		}
		switch has(after) - has(before) {
		case 1:
			st.up++
		case -1:
			st.down++
		default:
			st.kept++
		}
	}
}

// a10AltSource returns the script a9Compare compares the current one with (a file named by
// REPEATRATE_ADV9_PREV_FILE, else the one at REPEATRATE_SCRIPT_PREV), "" when none.
func a10AltSource(t *testing.T) string {
	if f := os.Getenv("REPEATRATE_ADV9_PREV_FILE"); f != "" {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		return string(src)
	}
	if testenv.ScriptPrevCommit() != "" {
		return testenv.ScriptPrevSource(t, "aggregator/suite/suite.lua")
	}
	return ""
}

// a10State applies calls to the current script and (when a10AltSource names one) the other
// script, each beside a model of its own, and after every call, every call applied again and every
// announcement compares the summaries and the discrimination hash, revived set and pending set
// with the model's (sjCheckState); reads come back as the model's. It returns the paths taken.
func a10State(t *testing.T, addr string, cfg Config, calls []a9Call) a10Stats {
	t.Helper()
	ctx := context.Background()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	type side struct {
		name   string
		client *redis.Client
		store  *Redis
		model  *Memory
	}
	var sides []*side
	if src := a10AltSource(t); src != "" {
		cur, prev, _, _ := testenv.ScriptClients(t, addr, suiteSource, src)
		sides = []*side{{name: "current", client: cur}, {name: "other", client: prev}}
	} else {
		c := redis.NewClient(&redis.Options{Addr: addr})
		t.Cleanup(func() { c.Close() })
		sides = []*side{{name: "current", client: c}}
	}
	for _, s := range sides {
		s.store, s.model = newTestRedis(t, s.client, "fastpathRig", cfg), NewMemory(cfg)
	}
	var st a10Stats
	apply := func(n int, s *side, c a9Call, what string) {
		t.Helper()
		e := Encode(c.obs)
		if c.split {
			e = splitEncode(c.obs)
		}
		got, err := s.store.ApplyEncoded(ctx, e, c.at)
		if err != nil {
			t.Fatalf("call %d (%s), %s script: %v", n, what, s.name, err)
		}
		want, _ := s.model.Apply(ctx, c.obs, c.at)
		if g, w := advOutcomes(got.Outcomes), advOutcomes(want.Outcomes); g != w {
			t.Fatalf("call %d (%s), %s script: outcomes %s, model %s", n, what, s.name, g, w)
		}
		if d := summaryDiff(got.Summaries[judgeSuite], want.Summaries[judgeSuite]); d != "" {
			t.Fatalf("call %d (%s), %s script: summary differs from the model's: %s", n, what, s.name, d)
		}
		sjCheckState(t, s.client, s.store, s.model, judgeSuite, cfg)
		st.checks++
	}
	for n, c := range calls {
		for i, s := range sides {
			before := a10Take(s.model.Model, cfg)
			apply(n, s, c, "first")
			if i == 0 {
				a10Classify(&st, s.model.Model, cfg, c.obs, before, a10Take(s.model.Model, cfg))
			}
			if c.twice {
				apply(n, s, c, "again")
			}
			if c.announce {
				var cases []string
				_, revived := s.model.Model.Discrimination(judgeSuite, cfg)
				for _, rc := range slices.Sorted(maps.Keys(revived)) {
					if n%2 == 0 || len(cases) == 0 { // every other call announces only the first
						cases = append(cases, rc)
					}
				}
				if err := s.store.MarkAnnounced(ctx, judgeSuite, cases); err != nil {
					t.Fatal(err)
				}
				s.model.MarkAnnounced(ctx, judgeSuite, cases)
				sjCheckState(t, s.client, s.store, s.model, judgeSuite, cfg)
			}
			if c.read {
				got, err := s.store.Read(ctx, judgeSuite, c.at)
				if err != nil {
					t.Fatal(err)
				}
				m := s.model.Model
				want := m.Summary(judgeSuite, slices.Sorted(slices.Values(m.Versions(judgeSuite))), s.model.announced[judgeSuite], cfg, c.at)
				if d := summaryDiff(got, &want); d != "" {
					t.Fatalf("read after call %d, %s script, differs from the model's: %s", n, s.name, d)
				}
			}
		}
	}
	return st
}

// a10Need runs calls through a9Compare and a10State on both backends (the embedded one when
// embedded is set) and fails unless every path named in need was taken: 'u' tn up, 'd' tn down,
// 'k' tn kept, '1' a single-version case under min_history 1, 'g' the general path, '2' a case's
// first two versions in one call, 'e' another version with errored runs only, 'r' a reordering.
func a10Need(t *testing.T, cfg Config, calls []a9Call, embedded bool, dumpEvery int, need string) {
	equivBackends(t, embedded, func(t *testing.T, addr string) {
		a9Compare(t, addr, cfg, calls, dumpEvery)
		st := a10State(t, addr, cfg, calls)
		got := map[rune]int{'u': st.up, 'd': st.down, 'k': st.kept, '1': st.single1, 'g': st.general,
			'2': st.secondInCall, 'e': st.errOther, 'r': st.reordered}
		for _, p := range need {
			if got[p] == 0 {
				t.Errorf("path %c never taken: the scenario does not test it (%+v)", p, st)
			}
		}
		t.Logf("paths %+v", st)
	})
}

// a10Configs are the judging configurations every scenario runs under, and the fast-path moves
// each must reach.
var a10Configs = []Config{
	{MinHistory: 1, MissingAfter: 20 * time.Minute},
	{MinHistory: 2, MissingAfter: 20 * time.Minute},
	{MinHistory: 5, MissingAfter: 20 * time.Minute},
	{MinHistory: 2, JudgeLastVersions: 2, MissingAfter: 20 * time.Minute},
	{MinHistory: 3, JudgeLastVersions: 4, MissingAfter: 20 * time.Minute},
	{MinHistory: 5, JudgeLastVersions: 5, MissingAfter: 20 * time.Minute},
}

// a10Name names a configuration in a subtest.
func a10Name(cfg Config) string {
	return fmt.Sprintf("min%d-last%d", cfg.MinHistory, cfg.JudgeLastVersions)
}

// a10NeedOf is what a scenario must reach under cfg: under min_history 1 the single-version cases
// go the general path ('1'), above it they take the fast path's three moves.
func a10NeedOf(cfg Config, general string) string {
	if cfg.MinHistory == 1 {
		return "1" + general
	}
	return "udk" + general
}

// a10Scenario is a hand-made sequence, one trap a case: each comment names the path the case must
// take under min_history above 1.
func a10Scenario() []a9Call {
	h := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Hour) }
	var six, sixAgain []RunObservation
	for i := int64(0); i < 6; i++ {
		six = append(six, a9("v5", fmt.Sprint("n", i), 0, "pfe"[i%3], 5, 4, 0, 0), a9("v5", fmt.Sprint("n", i), 1, "pp"[i%2], 5, 4, 0, 0))
		sixAgain = append(sixAgain, a9("v5", fmt.Sprint("n", i), i%2, "epf"[i%3], 5, 4, 1, 0))
	}
	return []a9Call{
		{at: h(1), want: "NNNRNNNRNRNRR", obs: []RunObservation{
			a9("v1", "a", 0, 'p', 1, 4, 0, 0), // v1 created in the call; a: up
			a9("v1", "b", 0, 'e', 1, 4, 0, 0), // b: listed, no outcome: unchanged
			a9("v1", "c", 0, 'p', 1, 4, 0, 0),
			a9("v1", "c", 0, 'f', 1, 4, 1, 0), // c: pass then fail in the call: up (to fail)
			a9("v1", "d", 0, 'p', 1, 4, 0, 0),
			a9("v2", "d", 0, 'f', 2, 4, 0, 0), // d: first and second version in one call: general
			a9("v1", "k", 0, 'p', 1, 4, 0, 0),
			a9("v1", "k", 0, 'e', 1, 4, 1, 0),
			a9("v1", "k", 1, 'f', 1, 4, 0, 0),
			a9("v1", "k", 1, 'e', 1, 4, 1, 0), // k: an outcome made and lost in the call: unchanged
			a9("v1", "k2", 0, 'p', 1, 4, 0, 0),
			a9("v1", "k2", 0, 'e', 1, 4, 1, 0),
			a9("v1", "k2", 0, 'p', 1, 4, 2, 0), // k2: pass, error, pass in the call: up
		}},
		{at: h(2), want: "RRNNNN", announce: true, obs: []RunObservation{
			a9("v1", "a", 0, 'e', 1, 4, 1, 0), // a: pass re-assessed to error: down
			a9("v1", "b", 0, 'f', 1, 4, 1, 0), // b: error re-assessed to fail: up
			a9("v1", "c", 1, 'p', 1, 4, 0, 0), // c: still fail: unchanged
			a9("v1", "e", 0, 'p', 1, 4, 0, 0),
			a9("v1", "e", 1, 'f', 1, 4, 0, 0), // e: new case of an existing version: up
			a9("v3", "f", 0, 'p', 3, 4, 0, 0), // f: in a version created last in the call: up
		}},
		{at: h(3), want: "RRDSRNRNRR", split: true, twice: true, read: true, obs: []RunObservation{
			a9("v1", "a", 0, 'p', 1, 4, 2, 0),  // a: back to pass: up
			a9("v1", "c", 0, 'p', 1, 4, 2, 0),  // c: fail to pass: kept
			a9("v1", "b", 0, 'f', 1, 4, 1, 0),  // duplicate
			a9("v1", "e", 1, 'p', 1, 4, -1, 0), // stale
			a9("v2", "d", 0, 'e', 2, 4, 1, 0),  // d: its fail errored, v1 still passes: general
			a9("v1", "m", 0, 'f', 1, 4, 0, 0),
			a9("v1", "m", 0, 'e', 1, 4, 1, 0),
			a9("v1", "m", 1, 'p', 1, 4, 0, 0),
			a9("v1", "m", 1, 'f', 1, 4, 1, 0),
			a9("v1", "c", 1, 'f', 1, 4, 1, 0), // c: pass to fail again, in the same call: kept
		}},
		{at: h(4), want: "NR", obs: []RunObservation{
			a9("v1", "g", 0, 'p', 4, 4, 0, 0), // v1's version_seq 1 -> 4: reordered, every case judged
			a9("v3", "f", 0, 'e', 3, 4, 1, 0), // f loses its outcome in the reordering call
		}},
		{at: h(5), want: "RRNNRRR", obs: []RunObservation{
			a9("v1", "a", 0, 'e', 1, 4, 3, 0), // a: down (in the version now last)
			a9("v1", "g", 0, 'f', 1, 4, 1, 0), // g: pass to fail: kept
			a9("v2", "h", 0, 'e', 2, 4, 0, 0),
			a9("v1", "h", 0, 'p', 1, 4, 0, 0), // h: two versions in one call, one errored only: general
			a9("v3", "f", 0, 'p', 3, 4, 2, 0), // f: up
			a9("v1", "m", 1, 'p', 1, 4, 2, 0), // m: up
			a9("v1", "m", 0, 'f', 1, 4, 2, 0), // m: to fail, same call
		}},
		{at: h(6), want: "RNNR", announce: true, read: true, obs: []RunObservation{
			a9("v2", "h", 0, 'p', 2, 4, 1, 0), // h: general
			a9("v4", "i", 0, 'f', 0, 4, 0, 0), // i: in a version created first in the order: up
			a9("v4", "a", 0, 'p', 0, 4, 0, 0), // a: a second version, its first with an outcome: general
			a9("v1", "e", 0, 'f', 1, 4, 1, 0), // e: fail: kept
		}},
		// Six cases of one version, all up; then some down, some kept.
		{at: h(7), want: "NNNNNNNNNNNN", announce: true, obs: six},
		{at: h(8), want: "RRRRRR", read: true, split: true, obs: sixAgain},
		{at: h(9), want: "NNR", obs: []RunObservation{
			a9("v6", "j", 0, 'p', 3, 4, 0, 0), // j: a version created between v3 and v1 (ties: by label)
			a9("v6", "k", 2, 'p', 3, 4, 0, 0), // k: a second version, its first outcome: general
			a9("v1", "b", 0, 'e', 1, 4, 2, 0), // b: down
		}},
	}
}

// TestJudgeFastPathSingleVersion: the hand-made scenario (a10Scenario) under min_history 1, 2 and 5
// and judge_last_versions windows: every fast-path move, a lone run re-assessed to error and back,
// pass and fail within one version and one call, a case's first two versions in one call, a
// second version with errored runs only, versions created first, between and last, and a case's
// only version reordered; whole and as two groups per cell, applied twice, read, announced.
func TestJudgeFastPathSingleVersion(t *testing.T) {
	calls := a10Scenario()
	for _, cfg := range a10Configs {
		t.Run(a10Name(cfg), func(t *testing.T) {
			a10Need(t, cfg, calls, true, 1, a10NeedOf(cfg, "g2er"))
		})
	}
}

// TestJudgeFastPathPrefixes: after each call of the scenario, every call before it delivered again
// one by one, then the whole prefix as one call (as two groups per cell every other time): the
// redeliveries change nothing, and later calls still take the fast path from the state they left.
func TestJudgeFastPathPrefixes(t *testing.T) {
	base := a10Scenario()
	var calls []a9Call
	for k, c := range base {
		calls = append(calls, c)
		var all []RunObservation
		for _, p := range base[:k+1] {
			again := p
			again.want, again.at, again.twice = "", c.at, false
			calls = append(calls, again)
			all = append(all, p.obs...)
		}
		calls = append(calls, a9Call{obs: all, at: c.at, split: k%2 == 1, announce: k%3 == 0})
	}
	for _, cfg := range []Config{a10Configs[0], a10Configs[1], a10Configs[5]} {
		t.Run(a10Name(cfg), func(t *testing.T) {
			a10Need(t, cfg, calls, true, 4, a10NeedOf(cfg, "g2r"))
		})
	}
}

// TestJudgeFastPathManyCalls: 24 cases whose runs come one a call over 12 calls (run index = call),
// each case's results drawn so that its outcome comes, goes (errored runs) and flips, with a
// re-assessment of the call before's run every third call; from call 5 the even cases get runs in
// a second version too, four more cases start in both versions at once, and call 8 reorders the
// first version.
func TestJudgeFastPathManyCalls(t *testing.T) {
	r := rand.New(rand.NewPCG(10, 10))
	var calls []a9Call
	for n := int64(0); n < 12; n++ {
		var obs []RunObservation
		vseq := int64(1)
		if n >= 8 {
			vseq = 9
		}
		for c := 0; c < 28; c++ {
			name := fmt.Sprint("m", c)
			if c >= 24 { // from call 5, in both versions at once
				if n >= 5 {
					obs = append(obs, a9("v2", name, n, "pfe"[r.IntN(3)], 2, 12, 0, 0), a9("v1", name, n, "pfe"[r.IntN(3)], vseq, 12, 0, 0))
				}
				continue
			}
			obs = append(obs, a9("v1", name, n, "ppfeee"[r.IntN(6)], vseq, 12, 0, 0))
			if n%3 == 2 {
				obs = append(obs, a9("v1", name, n-1, "pfe"[r.IntN(3)], vseq, 12, 1, 0))
			}
			if n >= 5 && c%2 == 0 {
				obs = append(obs, a9("v2", name, n, "pfee"[r.IntN(4)], 2, 12, 0, 0))
			}
		}
		calls = append(calls, a9Call{obs: obs, at: t0.Add(time.Duration(n+1) * time.Hour), split: n%4 == 3, twice: n%5 == 4,
			announce: n%2 == 0, read: n%6 == 5})
	}
	for _, cfg := range a10Configs {
		t.Run(a10Name(cfg), func(t *testing.T) {
			a10Need(t, cfg, calls, cfg.MinHistory != 5, 2, a10NeedOf(cfg, "g2er"))
		})
	}
}

// a10Case names case i of a random stream: some names hold the script's separators, spaces,
// braces or digits only.
func a10Case(i int) string {
	names := []string{"c0", "1", "c|2", " ", "{c}4", "5|5", "é6", "c 7", "08", "9|"}
	if i < len(names) {
		return names[i]
	}
	return fmt.Sprint("c", i)
}

// a10Stream returns calls of random runs aimed at the fast path: most cases live in one version
// (a few get a second one), versions are created as the stream goes (most last, some first or
// between, some tied), a run is often re-assessed to error and back or to the other result, a
// cell's every run sometimes to error, some
// deliveries are repeated as they were, some versions get a greater version_seq, and some calls
// deliver a run of earlier calls again.
func a10Stream(r *rand.Rand, n, versions, cases int) []a9Call {
	vseq := map[string]int64{}
	var labels []string
	top, wipe := int64(0), int64(0)
	newVersion := func() string {
		v := fmt.Sprint("v", len(labels))
		switch p := r.IntN(10); {
		case p < 6 || len(labels) == 0:
			top += 10
			vseq[v] = top
		case p < 8:
			vseq[v] = vseq[labels[r.IntN(len(labels))]] - int64(r.IntN(6)) // below or tied with one
		default:
			vseq[v] = int64(r.IntN(int(top) + 1))
		}
		labels = append(labels, v)
		return v
	}
	home := map[string][]string{}
	var sent []RunObservation
	var calls []a9Call
	at := t0
	for len(calls) < n {
		var obs []RunObservation
		size := 1 + r.IntN([]int{2, 6, 16}[r.IntN(3)])
		for len(obs) < size {
			switch p := r.IntN(100); {
			case p < 35 && len(sent) > 0: // re-assess a recent run: to error, from error, or flipped
				o := sent[len(sent)-1-r.IntN(min(len(sent), 30))]
				if o.Record.Result == 'e' {
					o.Record.Result = "pf"[r.IntN(2)]
				} else {
					o.Record.Result = "eepf"[r.IntN(4)]
				}
				o.Record.Assessed += []int64{1, 1, 1, 2, 0, -1}[r.IntN(6)] * 60e6
				o.Record.Seq = int64(r.IntN(2))
				obs = append(obs, o)
			case p < 45 && len(sent) > 0: // a run delivered again as it was
				obs = append(obs, sent[r.IntN(len(sent))])
			case p < 50 && len(sent) > 0: // every run of a cell re-assessed to error: it loses its outcome
				o := sent[len(sent)-1-r.IntN(min(len(sent), 30))]
				wipe++
				for idx := int64(0); idx < 4; idx++ {
					w := a9(o.Key.Version, o.Key.Case, idx, 'e', o.Record.VersionSeq, 4, 1000+wipe, 0)
					if slices.ContainsFunc(sent, func(s RunObservation) bool { return s.Key == w.Key }) {
						obs = append(obs, w)
					}
				}
			case p < 52 && len(labels) > 1: // an existing version moves last
				v := labels[r.IntN(len(labels))]
				top += 10
				vseq[v] = top
				c := a10Case(r.IntN(cases))
				obs = append(obs, a9(v, c, int64(r.IntN(4)), "pfe"[r.IntN(3)], vseq[v], 4, 0, 0))
			default:
				if len(labels) == 0 || (len(labels) < versions && r.IntN(10) == 0) {
					newVersion()
				}
				c := a10Case(r.IntN(cases))
				if len(home[c]) == 0 || r.IntN(12) == 0 {
					v := labels[len(labels)-1]
					if r.IntN(3) == 0 {
						v = labels[r.IntN(len(labels))]
					}
					if !slices.Contains(home[c], v) {
						home[c] = append(home[c], v)
					}
				}
				v := home[c][r.IntN(len(home[c]))]
				obs = append(obs, a9(v, c, int64(r.IntN(4)), "ppffe"[r.IntN(5)], vseq[v], 4, int64(r.IntN(2)), int64(r.IntN(2))))
			}
		}
		sent = append(sent, obs...)
		at = at.Add(time.Duration(r.IntN(15)) * time.Minute)
		calls = append(calls, a9Call{obs: obs, at: at, split: r.IntN(4) == 0, twice: r.IntN(6) == 0,
			announce: r.IntN(3) > 0, read: r.IntN(10) == 0})
		if r.IntN(6) == 0 { // a run of earlier calls delivered again, as one call
			var again []RunObservation
			for j := len(calls) - 1 - r.IntN(min(len(calls), 8)); j < len(calls); j++ {
				again = append(again, calls[j].obs...)
			}
			calls = append(calls, a9Call{obs: again, at: at, split: r.IntN(2) == 0, announce: true})
		}
	}
	return calls
}

// TestJudgeFastPathRandomStreams: random streams (a10Stream) under every configuration, eight seeds each,
// the first on the embedded server too; subtests run in parallel (they wait on Redis round trips).
func TestJudgeFastPathRandomStreams(t *testing.T) {
	for i, cfg := range a10Configs {
		for seed := uint64(0); seed < 8; seed++ {
			s := 100*uint64(i) + seed
			t.Run(fmt.Sprintf("%s seed %d", a10Name(cfg), s), func(t *testing.T) {
				t.Parallel()
				calls := a10Stream(rand.New(rand.NewPCG(s, 10)), 60, 6, 10)
				need := "udg" // tn kept is a matter of luck here: the hand-made scenarios reach it
				if cfg.MinHistory == 1 {
					need = "1g"
				}
				a10Need(t, cfg, calls, seed == 0, 10, need)
			})
		}
	}
}
