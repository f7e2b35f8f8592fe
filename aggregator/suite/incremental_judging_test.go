package suite

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/repeatrate/repeatrate/internal/testenv"
)

// When a call neither reorders existing versions nor moves the first judged version, the suite
// script judges a touched case again only when one of its touched cells changed outcome (none,
// pass, fail), and judges its class before the call from the cells' values at the start of the
// call with the ranks of the end of the call. These tests feed the Redis store and the model
// batches aimed at that rule (versions created inside a call below, between, level with and above
// the others; outcomes flipped and flipped back inside a call; error-only cells; a case's cells in
// several versions in one call; revivals that move to another version; redeliveries; revived cases
// announced between batches) and compare, after every batch, the summaries and the whole
// discrimination hash, revived set and pending set with what the model's runs give.

// sjBatch is one delivery; announce marks the revived cases it reports as announced afterwards
// (all of them, or every other one when half is set).
type sjBatch struct {
	obs            []RunObservation
	at             time.Time
	announce, half bool
}

// sjStats counts what a run of sjCompare exercised.
type sjStats struct {
	incremental int // batches on the incremental path in which some case changed class or revival
	recomputed  int // batches that reordered or moved the first judged version
	moved       int // cases revived before and after a batch, at another version
	announced   int // cases marked announced
}

// sjWantD returns what the discrimination hash must hold for suite k, keyed by version label
// instead of version id: the classes, and per version the judged (not too new) cases with an
// outcome there and those passed there, the same over discriminating cases. Zero fields are left
// out, as the store deletes them.
func sjWantD(m *Model, k Key, cfg Config) map[string]int64 {
	out := map[string]int64{}
	s := m.suites[k]
	if s == nil {
		return out
	}
	_, rank, from := m.ranks(k, cfg)
	for _, outs := range s.outcomesByCase() {
		var pass, fail int64
		for _, o := range outs {
			if rank[o.version] >= from {
				if o.pass {
					pass++
				} else {
					fail++
				}
			}
		}
		class := "di"
		switch {
		case pass+fail < int64(cfg.MinHistory):
			class = "tn"
		case fail == 0:
			class = "ap"
		case pass == 0:
			class = "af"
		}
		out[class]++
		if class == "tn" {
			continue
		}
		for _, o := range outs {
			out[o.version+"|n"]++
			if o.pass {
				out[o.version+"|p"]++
			}
			if class == "di" {
				out[o.version+"|dn"]++
				if o.pass {
					out[o.version+"|dp"]++
				}
			}
		}
	}
	return out
}

// sjCheckState compares the discrimination hash, the revived set and the pending set the store
// holds for suite k with the model's runs and announcements.
func sjCheckState(t *testing.T, client *redis.Client, store *Redis, model *Memory, k Key, cfg Config) {
	t.Helper()
	ctx := context.Background()
	runsKey, _ := store.keys(k)
	b := strings.TrimSuffix(runsKey, "r")
	labels, err := client.HGetAll(ctx, b+"vx").Result()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := client.HGetAll(ctx, b+"d").Result()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for f, v := range raw {
		if f == "vn" || f == "sv" {
			continue
		}
		var n int64
		fmt.Sscan(v, &n)
		if i := strings.IndexFunc(f, func(r rune) bool { return r < '0' || r > '9' }); i > 0 {
			f = labels[f[:i]] + "|" + f[i:]
		}
		if n != 0 {
			got[f] = n
		}
	}
	if want := sjWantD(model.Model, k, cfg); !reflect.DeepEqual(got, want) {
		t.Fatalf("discrimination hash of %v\n got %v\nwant %v", k, got, want)
	}
	_, revived := model.Model.Discrimination(k, cfg)
	rl, err := client.ZRange(ctx, b+"rl", 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	if want := slices.Sorted(maps.Keys(revived)); !slices.Equal(rl, want) {
		t.Fatalf("revived set of %v: %q, model %q", k, rl, want)
	}
	pa, err := client.ZRange(ctx, b+"pa", 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	var wantPA []string
	for _, c := range slices.Sorted(maps.Keys(revived)) {
		if !model.announced[k][c] {
			wantPA = append(wantPA, c)
		}
	}
	if !slices.Equal(pa, wantPA) {
		t.Fatalf("pending set of %v: %q, model %q", k, pa, wantPA)
	}
}

// sjCompare applies batches to a fresh Redis store and to the model, announcing as the batches
// say, and fails on the first difference.
func sjCompare(t *testing.T, client *redis.Client, cfg Config, batches []sjBatch) sjStats {
	t.Helper()
	ctx := context.Background()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	store := newTestRedis(t, client, "sjsuite", cfg)
	model := NewMemory(cfg)
	var st sjStats
	at := t0
	for n, b := range batches {
		at = b.at
		type prior struct {
			order orderState
			disc  DiscSummary
			rev   map[string]string // case → revival version
			want  map[string]int64
		}
		before := map[Key]prior{}
		for _, o := range b.obs {
			k := o.Key.Key
			if _, ok := before[k]; ok {
				continue
			}
			d, rv := model.Model.Discrimination(k, cfg)
			p := prior{order: model.Model.orderState(k, cfg), disc: d, rev: map[string]string{}, want: sjWantD(model.Model, k, cfg)}
			for c, r := range rv {
				p.rev[c] = r.Version
			}
			before[k] = p
		}
		got, err := store.Apply(ctx, b.obs, at)
		if err != nil {
			t.Fatalf("batch %d: %v", n, err)
		}
		want, _ := model.Apply(ctx, b.obs, at)
		if g, w := advOutcomes(got.Outcomes), advOutcomes(want.Outcomes); g != w {
			t.Fatalf("batch %d: outcomes %s, model %s", n, g, w)
		}
		if !reflect.DeepEqual(got.Suites, want.Suites) {
			t.Fatalf("batch %d: suites %v, model %v", n, got.Suites, want.Suites)
		}
		for _, k := range want.Suites {
			if d := summaryDiff(got.Summaries[k], want.Summaries[k]); d != "" {
				t.Fatalf("batch %d: summary of %v differs: %s", n, k, d)
			}
			sjCheckState(t, client, store, model, k, cfg)
			p := before[k]
			_, rv := model.Model.Discrimination(k, cfg)
			changed := !reflect.DeepEqual(p.want, sjWantD(model.Model, k, cfg)) || len(rv) != len(p.rev)
			for c, r := range rv {
				if v, ok := p.rev[c]; ok && v != r.Version {
					st.moved++
				}
				if p.rev[c] != r.Version {
					changed = true
				}
			}
			if model.Model.reordered(k, p.order, cfg) {
				st.recomputed++
			} else if changed {
				st.incremental++
			}
			if b.announce {
				var cs []string
				for i, r := range want.Summaries[k].Revived {
					if !b.half || i%2 == 0 {
						cs = append(cs, r.CaseID)
					}
				}
				if err := store.MarkAnnounced(ctx, k, cs); err != nil {
					t.Fatal(err)
				}
				model.MarkAnnounced(ctx, k, cs)
				st.announced += len(cs)
				sjCheckState(t, client, store, model, k, cfg)
			}
		}
	}
	for _, k := range model.Model.Suites() {
		got, err := store.Read(ctx, k, at)
		if err != nil {
			t.Fatal(err)
		}
		want := model.Model.Summary(k, slices.Sorted(slices.Values(model.Model.Versions(k))), model.announced[k], cfg, at)
		if d := summaryDiff(got, &want); d != "" {
			t.Fatalf("read of %v differs: %s", k, d)
		}
		sjCheckState(t, client, store, model, k, cfg)
	}
	return st
}

// sj builds a graded run of advSuite, occurred at t0, assessed at minute as.
func sj(v, c string, idx int64, res byte, vseq, as int64) RunObservation {
	return adv(v, c, idx, res, vseq, 3, 0, as, 0)
}

// Hand-made batches, one trap each; every batch but the reordering ones takes the incremental
// path.
func TestSkipJudgeScenarios(t *testing.T) {
	at := t0.Add(time.Hour)
	// A history of five versions (seq 10 … 50): case a p p f f p, b f f f p, c p p p p, d
	// error-only in v1 and pass in v2.
	base := sjBatch{at: at, obs: []RunObservation{
		sj("v1", "a", 0, 'p', 10, 1), sj("v2", "a", 0, 'p', 20, 1), sj("v3", "a", 0, 'f', 30, 1),
		sj("v4", "a", 0, 'f', 40, 1), sj("v5", "a", 0, 'p', 50, 1),
		sj("v1", "b", 0, 'f', 10, 1), sj("v2", "b", 0, 'f', 20, 1), sj("v3", "b", 0, 'f', 30, 1), sj("v4", "b", 0, 'p', 40, 1),
		sj("v1", "c", 0, 'p', 10, 1), sj("v2", "c", 0, 'p', 20, 1), sj("v3", "c", 0, 'p', 30, 1), sj("v4", "c", 0, 'p', 40, 1),
		sj("v1", "d", 0, 'e', 10, 1), sj("v2", "d", 0, 'p', 20, 1),
	}, announce: true, half: true}
	with := func(bs ...sjBatch) []sjBatch {
		return append([]sjBatch{base}, bs...)
	}
	scenarios := []struct {
		name    string
		batches []sjBatch
	}{
		{"versions created below, between, level with and above, with outcomes", with(
			sjBatch{at: at, obs: []RunObservation{
				sj("u0", "a", 0, 'f', 5, 2), sj("v2b", "a", 0, 'p', 25, 2), sj("v3", "b", 0, 'p', 30, 2),
				sj("v30", "c", 0, 'f', 30, 2), sj("u1", "c", 0, 'f', 1, 2), sj("u1", "b", 0, 'p', 1, 2)}},
			sjBatch{at: at, announce: true, obs: []RunObservation{sj("w9", "b", 0, 'f', 90, 3), sj("u00", "a", 0, 'p', 0, 3)}},
		)},
		{"flips back inside the call: p → f → p and f → e → f", with(
			sjBatch{at: at, obs: []RunObservation{
				sj("v1", "a", 0, 'f', 10, 2), sj("v1", "a", 0, 'p', 10, 3),
				sj("v4", "b", 0, 'e', 40, 2), sj("v4", "b", 0, 'f', 40, 3), sj("v4", "b", 0, 'p', 40, 4),
				sj("v3", "c", 0, 'f', 30, 2), sj("v3", "c", 0, 'e', 30, 3), sj("v3", "c", 0, 'p', 30, 4)}},
			// One cell of a case flips back, another changes: the class before must come from
			// the start of the call, not from the flip.
			sjBatch{at: at, obs: []RunObservation{
				sj("v5", "a", 0, 'f', 50, 5), sj("v5", "a", 0, 'p', 50, 6),
				sj("v2", "a", 0, 'f', 20, 5), sj("v3", "a", 0, 'p', 30, 5)}},
		)},
		{"a case's cells in several versions in one call, a new version among them", with(
			sjBatch{at: at, obs: []RunObservation{
				sj("v1", "c", 1, 'f', 10, 2), sj("v2", "c", 1, 'f', 20, 2), sj("v15", "c", 0, 'p', 15, 2),
				sj("v4", "c", 0, 'e', 40, 2), sj("v5", "c", 0, 'p', 50, 2)}},
			sjBatch{at: at, obs: []RunObservation{sj("v1", "c", 1, 'p', 10, 3), sj("v2", "c", 1, 'p', 20, 3), sj("v4", "c", 0, 'p', 40, 3)}},
		)},
		{"revival moves to another version, announced or not", with(
			// a: p p f f p revived at v3 (streak 2); v2 fails: p f f f p, revived at v2 (streak 1
			// only under MinHistory 1); then v1 fails and a new v0 passes below.
			sjBatch{at: at, obs: []RunObservation{sj("v2", "a", 0, 'f', 20, 2)}},
			sjBatch{at: at, announce: true, obs: []RunObservation{sj("v1", "a", 0, 'f', 10, 3), sj("v0", "a", 0, 'p', 0, 3)}},
			sjBatch{at: at, obs: []RunObservation{sj("v0", "a", 0, 'e', 0, 4), sj("v2", "a", 0, 'p', 20, 4), sj("v15", "b", 0, 'p', 15, 4)}},
			sjBatch{at: at, announce: true, obs: []RunObservation{sj("v3", "b", 0, 'p', 30, 5), sj("v2", "b", 0, 'p', 20, 5)}},
			sjBatch{at: at, obs: []RunObservation{sj("v3", "b", 0, 'f', 30, 6), sj("v2", "b", 0, 'f', 20, 6), sj("v1", "b", 0, 'p', 10, 6)}},
		)},
		{"error-only cells: outcome none before and after, or pass to none", with(
			sjBatch{at: at, obs: []RunObservation{sj("v1", "d", 1, 'e', 10, 2), sj("v3", "d", 0, 'e', 30, 2), sj("v2", "d", 0, 'e', 20, 2)}},
			sjBatch{at: at, obs: []RunObservation{sj("v2", "d", 0, 'p', 20, 3), sj("v1", "d", 0, 'f', 10, 3), sj("v2", "d", 0, 'e', 20, 4)}},
			sjBatch{at: at, obs: []RunObservation{sj("v1", "c", 0, 'e', 10, 2), sj("v2", "c", 0, 'e', 20, 2), sj("v6", "c", 0, 'e', 60, 2)}},
		)},
		{"redelivered batches and announcements between them", func() []sjBatch {
			b1 := sjBatch{at: at, obs: []RunObservation{sj("v2", "a", 0, 'f', 20, 2), sj("v0", "b", 0, 'p', 0, 2), sj("v3", "c", 0, 'f', 30, 2)}}
			b2 := sjBatch{at: at, obs: []RunObservation{sj("v2", "a", 0, 'p', 20, 3), sj("v1", "b", 0, 'p', 10, 3), sj("v3", "c", 0, 'p', 30, 3)}}
			ann := b1
			ann.announce = true
			return with(b1, b1, ann, b1, b2, ann, b2, b1)
		}()},
	}
	incremental := map[string]int{} // scenario → batches that changed a class or revival incrementally
	for _, mh := range []int{1, 2, 3} {
		for _, jl := range []int{0, mh, mh + 1, mh + 3} {
			cfg := Config{MinHistory: mh, JudgeLastVersions: jl, MissingAfter: 20 * time.Minute}
			for _, sc := range scenarios {
				t.Run(fmt.Sprintf("min %d last %d/%s", mh, jl, sc.name), func(t *testing.T) {
					incremental[sc.name] += sjCompare(t, testenv.Redis(t), cfg, sc.batches).incremental
				})
			}
		}
	}
	for _, sc := range scenarios {
		if !t.Failed() && incremental[sc.name] == 0 {
			t.Errorf("%s: no batch changed a class or revival on the incremental path", sc.name)
		}
	}
}

// sjStream returns batches over one suite of few cases whose versions are mostly created inside
// batches, at a version_seq below, between, level with or above the others, and rarely given a
// greater one later; runs are re-assessed within a batch, flipped and flipped back; batches are
// redelivered, and revived cases announced between them.
func sjStream(r *rand.Rand, nBatches, cases int) []sjBatch {
	type ver struct {
		label string
		seq   int64
	}
	var vs []ver
	as := int64(1)
	at := t0.Add(time.Hour)
	var out []sjBatch
	var sent []RunObservation
	for len(out) < nBatches {
		if len(out) > 0 && r.IntN(6) == 0 { // a redelivery of an earlier batch, maybe cut
			b := out[r.IntN(len(out))]
			b.obs = b.obs[:1+r.IntN(len(b.obs))]
			b.announce, b.half = r.IntN(3) == 0, r.IntN(2) == 0
			out = append(out, b)
			continue
		}
		var obs []RunObservation
		// Versions this batch uses: some existing, maybe a new one or two.
		var use []ver
		for range 1 + r.IntN(3) {
			if len(vs) == 0 || r.IntN(3) == 0 {
				lo, hi := int64(100), int64(100)
				for _, v := range vs {
					lo, hi = min(lo, v.seq), max(hi, v.seq)
				}
				var seq int64
				switch r.IntN(4) {
				case 0:
					seq = lo - 1 - r.Int64N(3)
				case 1:
					seq = hi + 1 + r.Int64N(3)
				case 2: // level with an existing version: the label breaks the tie
					seq = hi
					if len(vs) > 0 {
						seq = vs[r.IntN(len(vs))].seq
					}
				default:
					seq = lo + r.Int64N(hi-lo+1)
				}
				v := ver{fmt.Sprintf("v%c%d", 'a'+rune(r.IntN(26)), len(vs)), seq}
				vs = append(vs, v)
				use = append(use, v)
			} else {
				use = append(use, vs[r.IntN(len(vs))])
			}
		}
		for range 1 + r.IntN(8) {
			v := use[r.IntN(len(use))]
			seq := v.seq
			if r.IntN(40) == 0 { // an existing version moves up: the script recomputes
				seq += 1 + r.Int64N(5)
				for i := range vs {
					if vs[i].label == v.label {
						vs[i].seq = seq
					}
				}
			}
			o := sj(v.label, fmt.Sprint("c", r.IntN(cases)), r.Int64N(2), "ppffe"[r.IntN(5)], seq, as)
			if len(sent) > 0 && r.IntN(3) == 0 { // re-assess an earlier run
				o = sent[r.IntN(len(sent))]
				o.Record.Result, o.Record.Assessed = "ppffe"[r.IntN(5)], o.Record.Assessed+as*60e6
			}
			obs = append(obs, o)
			// Flip it and maybe flip it back, in the same batch.
			for f := r.IntN(3); f > 0; f-- {
				o.Record.Assessed += 60e6
				o.Record.Result = map[byte]byte{'p': 'f', 'f': 'p', 'e': 'p'}[o.Record.Result]
				if r.IntN(4) == 0 {
					o.Record.Result = 'e'
				}
				obs = append(obs, o)
			}
			as++
		}
		r.Shuffle(len(obs), func(i, j int) {
			// Keep each run's assessments in order only sometimes: stale ones are fine too.
			if r.IntN(2) == 0 {
				obs[i], obs[j] = obs[j], obs[i]
			}
		})
		sent = append(sent, obs...)
		at = at.Add(time.Minute)
		out = append(out, sjBatch{obs: obs, at: at, announce: r.IntN(3) == 0, half: r.IntN(2) == 0})
	}
	return out
}

// Random batches aimed at the rule, under every MinHistory 1 … 3 and judge window.
func TestSkipJudgeRandom(t *testing.T) {
	var total sjStats
	for _, mh := range []int{1, 2, 3} {
		for _, jl := range []int{0, mh, mh + 2} {
			for seed := range uint64(3) {
				cfg := Config{MinHistory: mh, JudgeLastVersions: jl, MissingAfter: 20 * time.Minute}
				t.Run(fmt.Sprintf("min %d last %d seed %d", mh, jl, seed), func(t *testing.T) {
					r := rand.New(rand.NewPCG(seed, uint64(mh*10+jl)))
					st := sjCompare(t, testenv.Redis(t), cfg, sjStream(r, 120, []int{2, 4, 8}[seed]))
					total.incremental += st.incremental
					total.recomputed += st.recomputed
					total.moved += st.moved
					total.announced += st.announced
				})
			}
		}
	}
	if !t.Failed() && (total.incremental == 0 || total.recomputed == 0 || total.moved == 0 || total.announced == 0) {
		t.Fatalf("%+v: the streams must take both paths, move revivals and announce", total)
	}
	t.Logf("%+v", total)
}
