package suite

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/internal/testenv"
	"github.com/repeatrate/repeatrate/schemas"
)

// The suite script takes a batch's runs grouped by (version, case) cell with per-group bounds
// and packed flags, and hands outcome codes back in group order. These tests feed the Redis store
// (real, and the embedded one of `repeatrate dev`) and the model the same hand-made and random
// batches aimed at that grouping, and compare outcomes, summaries, Read, Cases, the stored run
// records and every cell's counts and bitmap.

var advSuite = Key{"ws", "adv|suite"}

// adv builds a graded run of advSuite: assessed at minute as (sequence seq), occurred occ minutes
// after t0.
func adv(v, c string, idx int64, res byte, vseq, runs, occ, as, seq int64) RunObservation {
	return RunObservation{
		Key: RunKey{Key: advSuite, Version: v, Case: c, RunIndex: idx},
		Record: RunRecord{Result: res, VersionSeq: vseq, Runs: runs, Occurred: aggregator.Micros(t0) + occ*60e6,
			Assessed: aggregator.Micros(t0) + as*60e6, Seq: seq},
	}
}

// withReply gives o a reply of tok tokens, abnormal when trig is not "".
func withReply(o RunObservation, tok int, trig string) RunObservation {
	o.Record.Reply, o.Record.Tokens, o.Record.GzipRatio, o.Record.Trigger = true, tok, float64(tok%7)+0.5, trig
	return o
}

// advBatch is one delivery: its runs, the observation time, and, when set, the outcomes it must
// have (so that a scenario provably takes the paths it is named for).
type advBatch struct {
	obs  []RunObservation
	at   time.Time
	want string // one of N R D S per run, "" unchecked
}

// advCodes writes outcomes as the script does.
var advCodes = map[aggregator.Outcome]byte{aggregator.Counted: 'N', aggregator.Reassessed: 'R',
	aggregator.Duplicate: 'D', aggregator.Stale: 'S'}

func advOutcomes(outs []aggregator.Outcome) string {
	b := make([]byte, len(outs))
	for i, o := range outs {
		b[i] = advCodes[o]
	}
	return string(b)
}

// advBackends runs f on the embedded Redis (when embedded is set: it is about 50 times slower)
// and on the test Redis.
func advBackends(t *testing.T, embedded bool, f func(t *testing.T, client *redis.Client)) {
	if embedded {
		t.Run("embedded", func(t *testing.T) {
			m := miniredis.RunT(t)
			c := redis.NewClient(&redis.Options{Addr: m.Addr()})
			t.Cleanup(func() { c.Close() })
			f(t, c)
		})
	}
	t.Run("redis", func(t *testing.T) { f(t, testenv.Redis(t)) })
}

// advStats counts what a run of advCompare exercised: outcomes by code, batches that reordered a
// suite's versions (or moved its first judged version), revived cases and missing-run lists
// reported.
type advStats struct {
	codes                      map[string]int
	reordered, revived, missed int
}

// advCompare applies batches to a fresh Redis store and to the model and fails on the first
// difference; then it compares what the store holds with what the model holds.
func advCompare(t *testing.T, client *redis.Client, cfg Config, batches []advBatch) advStats {
	t.Helper()
	ctx := context.Background()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	store := newTestRedis(t, client, "advsuite", cfg)
	model := NewMemory(cfg)
	st := advStats{codes: map[string]int{}}
	at := t0
	for n, b := range batches {
		at = b.at
		before := map[Key]orderState{}
		for _, o := range b.obs {
			before[o.Key.Key] = model.Model.orderState(o.Key.Key, cfg)
		}
		got, err := store.Apply(ctx, b.obs, at)
		if err != nil {
			t.Fatalf("batch %d: %v", n, err)
		}
		want, _ := model.Apply(ctx, b.obs, at)
		g, w := advOutcomes(got.Outcomes), advOutcomes(want.Outcomes)
		if g != w {
			t.Fatalf("batch %d: outcomes %s, model %s", n, g, w)
		}
		if b.want != "" && w != b.want {
			t.Fatalf("batch %d: the model's outcomes are %s, the scenario expects %s", n, w, b.want)
		}
		for i := range len(w) {
			st.codes[w[i:i+1]]++
		}
		for k, o := range before {
			if model.Model.reordered(k, o, cfg) {
				st.reordered++
			}
		}
		if !reflect.DeepEqual(got.Suites, want.Suites) {
			t.Fatalf("batch %d: suites %v, model %v", n, got.Suites, want.Suites)
		}
		for _, k := range want.Suites {
			if d := summaryDiff(got.Summaries[k], want.Summaries[k]); d != "" {
				t.Fatalf("batch %d: summary of %v differs: %s", n, k, d)
			}
			st.revived += len(want.Summaries[k].Revived)
			for _, v := range want.Summaries[k].Versions {
				st.missed += len(v.Missing)
			}
		}
	}
	advReadAll(t, client, store, model, cfg, at)
	return st
}

// advReadAll reads every suite of model back from store at time at and requires the model's
// summary, its stored runs and cells (advStored) and its case table.
func advReadAll(t *testing.T, client *redis.Client, store *Redis, model *Memory, cfg Config, at time.Time) {
	t.Helper()
	ctx := context.Background()
	for _, k := range model.Model.Suites() {
		got, err := store.Read(ctx, k, at)
		if err != nil {
			t.Fatal(err)
		}
		want := model.Model.Summary(k, slices.Sorted(slices.Values(model.Model.Versions(k))), model.announced[k], cfg, at)
		if d := summaryDiff(got, &want); d != "" {
			t.Fatalf("read of %v differs: %s", k, d)
		}
		advStored(t, client, store, model.Model, k)
		table, err := store.Cases(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		// A case with errored runs only is never judged: the store may list it, as none.
		table.Cases = slices.DeleteFunc(table.Cases, func(c CaseRow) bool { return c.Class == ClassNone })
		wt := casesFromRuns(model.Model, k, cfg)
		if !reflect.DeepEqual(table.Versions, wt.Versions) || len(table.Cases) != len(wt.Cases) {
			t.Fatalf("cases of %v: versions %v, %d cases; model %v, %d cases", k, table.Versions, len(table.Cases), wt.Versions, len(wt.Cases))
		}
		for i := range wt.Cases {
			if !reflect.DeepEqual(table.Cases[i], wt.Cases[i]) {
				t.Fatalf("cases of %v: %+v, model %+v", k, table.Cases[i], wt.Cases[i])
			}
		}
	}
}

// storedRun is what the store keeps of a run (suite.lua, B..'r'): what the re-assessment rule
// compares and what a replaced run takes back.
type storedRun struct {
	key              RunKey
	result           byte
	assessed, seq    int64
	reply, triggered bool
	tokens           int
}

func storedOf(e RunEntry) storedRun {
	r := &e.Record
	return storedRun{e.Key, r.Result, r.Assessed, r.Seq, r.Reply, r.Trigger != "", r.Tokens}
}

// decodeBlock reads one field of a suite's runs hash, "<vid>|<case>|<block>" → entries
// "<run_index> <assessed> <seq> <flags>;", naming versions by labels (vid → label), and checks
// that every entry belongs to the field's block and none repeats.
func decodeBlock(sk Key, labels map[string]string, field, value string) ([]storedRun, error) {
	vid, rest, ok1 := strings.Cut(field, "|")
	i := strings.LastIndexByte(rest, '|')
	label, ok2 := labels[vid]
	if !ok1 || i < 0 || !ok2 {
		return nil, fmt.Errorf("run field %q", field)
	}
	c := rest[:i]
	blk, err := strconv.ParseInt(rest[i+1:], 10, 64)
	if err != nil || !strings.HasSuffix(value, ";") {
		return nil, fmt.Errorf("run field %q = %q", field, value)
	}
	var out []storedRun
	seen := map[int64]bool{}
	for _, e := range strings.Split(strings.TrimSuffix(value, ";"), ";") {
		var n [4]int64
		f := strings.Fields(e)
		if len(f) != 4 {
			return nil, fmt.Errorf("run field %q: entry %q", field, e)
		}
		for j := range n {
			if n[j], err = strconv.ParseInt(f[j], 10, 64); err != nil {
				return nil, fmt.Errorf("run field %q: entry %q: %w", field, e, err)
			}
		}
		if n[0]/16 != blk || seen[n[0]] {
			return nil, fmt.Errorf("run field %q: entry %q outside its block or repeated", field, e)
		}
		seen[n[0]] = true
		fl := n[3]
		out = append(out, storedRun{key: RunKey{Key: sk, Version: label, Case: c, RunIndex: n[0]}, result: "pfe"[fl/4%4],
			assessed: n[1], seq: n[2], reply: fl/2%2 == 1, triggered: fl%2 == 1, tokens: int(fl / 16)})
	}
	return out, nil
}

// advStored compares the runs and the cells the store holds for suite k with the model's runs:
// each run's entry (in the field of its cell and block), each cell's pass/fail/error counts,
// planned runs, first occurrence, and its bitmap byte for byte (bit i set exactly for the stored
// run indexes, no longer than the greatest needs).
func advStored(t *testing.T, client *redis.Client, store *Redis, m *Model, k Key) {
	t.Helper()
	ctx := context.Background()
	runsKey, _ := store.keys(k)
	b := strings.TrimSuffix(runsKey, "r")
	labels, err := client.HGetAll(ctx, b+"vx").Result()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := client.HGetAll(ctx, runsKey).Result()
	if err != nil {
		t.Fatal(err)
	}
	got := map[RunKey]storedRun{}
	for f, v := range raw {
		es, err := decodeBlock(k, labels, f, v)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range es {
			got[e.key] = e
		}
	}
	want := m.Runs(k)
	if len(got) != len(want) {
		t.Fatalf("%v: %d stored runs, model %d", k, len(got), len(want))
	}
	for _, w := range want {
		if g := got[w.Key]; g != storedOf(w) {
			t.Fatalf("%v: stored run %+v, model %+v", k, g, storedOf(w))
		}
	}
	cells, err := client.HGetAll(ctx, b+"m").Result()
	if err != nil {
		t.Fatal(err)
	}
	type cellWant struct {
		p, f, e int64
		bm      []byte
	}
	wc := map[cellKey]*cellWant{}
	for _, e := range want {
		ck := cellKey{e.Key.Version, e.Key.Case}
		x := wc[ck]
		if x == nil {
			x = &cellWant{}
			wc[ck] = x
		}
		switch e.Record.Result {
		case 'p':
			x.p++
		case 'f':
			x.f++
		default:
			x.e++
		}
		i := e.Key.RunIndex
		for int64(len(x.bm)) <= i/8 {
			x.bm = append(x.bm, 0)
		}
		x.bm[i/8] |= 1 << (i % 8)
	}
	s := m.suites[k]
	if len(cells) != len(wc) {
		t.Fatalf("%v: %d cells stored, model %d", k, len(cells), len(wc))
	}
	for f, v := range cells {
		id, c, _ := strings.Cut(f, "|")
		ck := cellKey{labels[id], c}
		x := wc[ck]
		if x == nil {
			t.Fatalf("%v: stored cell %q (version %q) the model does not have", k, f, labels[id])
		}
		head, bm, ok := strings.Cut(v, "|")
		wantHead := fmt.Sprintf("%d %d %d %d %d", x.p, x.f, x.e, s.planned[ck], s.first[ck])
		if !ok || head != wantHead {
			t.Fatalf("%v: cell %v is %q, model %q", k, ck, head, wantHead)
		}
		if !bytes.Equal([]byte(bm), x.bm) {
			t.Fatalf("%v: cell %v bitmap %x (%d bytes), model %x (%d bytes)", k, ck, bm, len(bm), x.bm, len(x.bm))
		}
	}
}

// Hand-made batches, one rule each.
func TestGroupArgsScenarios(t *testing.T) {
	min2 := Config{MinHistory: 2, MissingAfter: 20 * time.Minute}
	late := t0.Add(10 * time.Hour) // every case matured: missing runs listed
	scenarios := []struct {
		name    string
		cfg     Config
		batches []advBatch
	}{
		{"same run repeated in one batch", min2, []advBatch{{at: late, want: "NDNRNSNRSDND", obs: []RunObservation{
			adv("v1", "x", 0, 'p', 1, 3, 0, 1, 0), adv("v1", "x", 0, 'p', 1, 3, 0, 1, 0),
			adv("v1", "y", 0, 'p', 1, 3, 0, 1, 0), withReply(adv("v1", "y", 0, 'f', 1, 3, 0, 2, 0), 9, "gzip_ratio"),
			adv("v1", "z", 1, 'f', 1, 3, 0, 5, 0), adv("v1", "z", 1, 'p', 1, 3, 0, 3, 0),
			adv("v1", "w", 2, 'p', 1, 3, 0, 1, 0), adv("v1", "w", 2, 'e', 1, 3, 0, 1, 2),
			adv("v1", "w", 2, 'f', 1, 3, 0, 1, 1), adv("v1", "w", 2, 'e', 1, 3, 0, 1, 2),
			// Equal (assessed, seq) with another record: a duplicate, the held record stays.
			withReply(adv("v1", "u", 0, 'p', 1, 3, 0, 1, 0), 10, ""), withReply(adv("v1", "u", 0, 'f', 1, 3, 0, 1, 0), 99, "repeat_pattern"),
		}}}},
		{"re-assessments change result, reply, tokens, trigger", min2, []advBatch{
			{at: t0, want: "NNNNNN", obs: []RunObservation{
				withReply(adv("v1", "a", 0, 'p', 1, 2, 0, 1, 0), 10, ""),
				withReply(adv("v1", "a", 1, 'f', 1, 2, 0, 1, 0), 20, "gzip_ratio"),
				adv("v1", "b", 0, 'e', 1, 2, 0, 1, 0),
				withReply(adv("v1", "b", 1, 'p', 1, 2, 0, 1, 0), 1<<20, "repeat_pattern"),
				withReply(adv("v2", "a", 0, 'p', 2, 2, 0, 1, 0), 0, ""),
				// A reply flag off with tokens and trigger left over: neither counts.
				func() RunObservation {
					o := adv("v2", "a", 1, 'f', 2, 2, 0, 1, 0)
					o.Record.Tokens, o.Record.Trigger = 77, "gzip_ratio"
					return o
				}(),
			}},
			{at: t0.Add(time.Minute), want: "RRRRRR", obs: []RunObservation{
				adv("v1", "a", 0, 'e', 1, 2, 0, 2, 0),
				withReply(adv("v1", "a", 1, 'p', 1, 2, 0, 2, 0), 1<<20, ""),
				withReply(adv("v1", "b", 0, 'f', 1, 2, 0, 2, 0), 5, "gzip_ratio"),
				withReply(adv("v1", "b", 1, 'p', 1, 2, 0, 1, 1), 1<<20, ""),
				withReply(adv("v2", "a", 0, 'f', 2, 2, 0, 2, 0), 0, "repeat_pattern"),
				withReply(adv("v2", "a", 1, 'p', 2, 2, 0, 2, 0), 77, "gzip_ratio"),
			}},
			{at: late, want: "RSDRRR", obs: []RunObservation{
				withReply(adv("v1", "a", 0, 'p', 1, 2, 0, 3, 0), 10, "gzip_ratio"),
				adv("v1", "a", 1, 'f', 1, 2, 0, 1, 5),
				withReply(adv("v1", "b", 0, 'f', 1, 2, 0, 2, 0), 5, "gzip_ratio"),
				adv("v1", "b", 1, 'p', 1, 2, 0, 1, 2),
				withReply(adv("v2", "a", 0, 'p', 2, 2, 0, 3, 0), 1<<20+1, "repeat_pattern"),
				adv("v2", "a", 1, 'e', 2, 2, 0, 3, 0),
			}},
		}},
		{"interleaved cells, outcomes mapped back to their runs", min2, []advBatch{
			{at: t0, want: "NNN", obs: []RunObservation{
				adv("v1", "A", 0, 'p', 1, 4, 0, 1, 0), adv("v1", "B", 0, 'f', 1, 4, 0, 1, 0), adv("v2", "A", 0, 'p', 2, 4, 0, 1, 0)}},
			{at: t0.Add(time.Minute), want: "NDSNRDSNRN", obs: []RunObservation{
				adv("v1", "A", 1, 'f', 1, 4, 0, 1, 0),
				adv("v1", "B", 0, 'f', 1, 4, 0, 1, 0),
				adv("v2", "A", 0, 'f', 2, 4, 0, 0, 0),
				adv("v1", "C", 3, 'e', 1, 4, 0, 1, 0),
				adv("v1", "B", 0, 'p', 1, 4, 0, 2, 0),
				adv("v1", "A", 1, 'f', 1, 4, 0, 1, 0),
				adv("v1", "C", 3, 'p', 1, 4, 0, 0, 9),
				adv("v2", "B", 2, 'p', 2, 4, 0, 1, 0),
				adv("v1", "A", 0, 'f', 1, 4, 0, 3, 0),
				adv("v1", "C", 2, 'p', 1, 4, 0, 1, 0),
			}},
		}},
		{"a cell split across batches; planned grows, first occurrence moves back", min2, []advBatch{
			{at: t0, want: "NN", obs: []RunObservation{adv("v1", "A", 0, 'p', 1, 3, 30, 40, 0), adv("v1", "B", 0, 'p', 1, 3, 30, 40, 0)}},
			{at: t0.Add(45 * time.Minute), want: "NN", obs: []RunObservation{adv("v1", "B", 1, 'p', 1, 3, 31, 41, 0), adv("v1", "A", 2, 'f', 1, 3, 35, 41, 0)}},
			// Planned 8 for one run only, an earlier occurrence for another: the group's bounds.
			{at: t0.Add(50 * time.Minute), want: "NNDN", obs: []RunObservation{
				adv("v1", "C", 0, 'p', 1, 3, 50, 51, 0), adv("v1", "A", 5, 'p', 1, 8, 40, 51, 0),
				adv("v1", "A", 0, 'p', 1, 3, 30, 40, 0), adv("v1", "A", 7, 'e', 1, 3, 5, 52, 0)}},
			{at: t0.Add(2 * time.Hour), want: "NS", obs: []RunObservation{adv("v1", "B", 2, 'p', 1, 3, 31, 41, 0), adv("v1", "A", 2, 'p', 1, 3, 35, 40, 0)}},
		}},
		{"versions reordered by a greater version_seq arriving later", Config{MinHistory: 2, JudgeLastVersions: 3, MissingAfter: 20 * time.Minute}, []advBatch{
			{at: t0, obs: []RunObservation{
				adv("v1", "a", 0, 'p', 1, 1, 0, 1, 0), adv("v2", "a", 0, 'p', 2, 1, 0, 1, 0), adv("v3", "a", 0, 'f', 3, 1, 0, 1, 0),
				adv("v4", "a", 0, 'p', 4, 1, 0, 1, 0), adv("v1", "b", 0, 'f', 1, 1, 0, 1, 0), adv("v2", "b", 0, 'f', 2, 1, 0, 1, 0),
				adv("v3", "b", 0, 'p', 3, 1, 0, 1, 0)}},
			// v1 moves last; its greater seq comes with the group's second run, after a run of
			// another case whose version v5 is new and sits in between.
			{at: t0.Add(time.Minute), want: "NNNN", obs: []RunObservation{
				adv("v5", "b", 0, 'p', 3, 1, 0, 1, 1), adv("v1", "c", 0, 'p', 0, 1, 0, 1, 0),
				adv("v1", "c", 1, 'f', 9, 2, 0, 1, 0), adv("v4", "b", 0, 'p', 4, 1, 0, 1, 0)}},
			// A lower seq for v1 changes nothing; v2 moves past v4 through a stale run.
			{at: t0.Add(2 * time.Minute), want: "SDN", obs: []RunObservation{
				adv("v2", "a", 0, 'f', 7, 1, 0, 0, 0), adv("v1", "c", 0, 'p', 0, 1, 0, 1, 0), adv("v6", "a", 0, 'f', 8, 1, 0, 1, 0)}},
			{at: late, want: "RN", obs: []RunObservation{
				adv("v3", "a", 0, 'p', 3, 1, 0, 2, 0), adv("v0", "a", 0, 'f', 1, 1, 0, 2, 0)}},
		}},
		{"sequence numbers at the exact limit of Lua numbers", min2, []advBatch{
			{at: t0, want: "NNN", obs: []RunObservation{
				adv("hi", "a", 0, 'p', schemas.MaxAssessmentSeq, 1, 0, 1, schemas.MaxAssessmentSeq-1),
				adv("lo", "a", 0, 'f', schemas.MaxAssessmentSeq-3, 1, 0, 1, 0),
				adv("mid", "a", 0, 'p', schemas.MaxAssessmentSeq-2, 1, 0, 1, 0)}},
			{at: t0, want: "RSDN", obs: []RunObservation{
				adv("hi", "a", 0, 'f', schemas.MaxAssessmentSeq, 1, 0, 1, schemas.MaxAssessmentSeq),
				adv("hi", "a", 0, 'p', schemas.MaxAssessmentSeq, 1, 0, 1, schemas.MaxAssessmentSeq-1),
				adv("hi", "a", 0, 'f', schemas.MaxAssessmentSeq, 1, 0, 1, schemas.MaxAssessmentSeq),
				// The earliest version moves past "mid" by one.
				adv("lo", "b", 0, 'p', schemas.MaxAssessmentSeq-1, 1, 0, 1, 0)}},
		}},
		{"errors only, replies with and without trigger", min2, []advBatch{
			{at: late, want: "NNNNRN", obs: []RunObservation{
				adv("v1", "e", 0, 'e', 1, 2, 0, 1, 0), withReply(adv("v1", "e", 1, 'e', 1, 2, 0, 1, 0), 3, "repeat_pattern"),
				withReply(adv("v1", "r", 0, 'p', 1, 2, 0, 1, 0), 3, ""), withReply(adv("v1", "r", 1, 'p', 1, 2, 0, 1, 0), 3, "gzip_ratio"),
				adv("v1", "e", 1, 'e', 1, 2, 0, 2, 0), adv("v2", "e", 0, 'e', 2, 2, 0, 1, 0)}},
		}},
		{"run indexes up to MaxRuns-1", min2, func() []advBatch {
			const top = schemas.MaxRuns - 1
			var bs []advBatch
			bs = append(bs, advBatch{at: t0, want: "NNN", obs: []RunObservation{
				adv("v1", "big", top, 'p', 1, schemas.MaxRuns, 0, 1, 0), adv("v1", "big", 0, 'f', 1, schemas.MaxRuns, 0, 1, 0),
				adv("v1", "small", 3, 'p', 1, 10, 0, 1, 0)}})
			// A cell whose 1250-byte bitmap exists, then bits below, inside and at its end.
			bs = append(bs, advBatch{at: late, want: "NNNRNDN", obs: []RunObservation{
				adv("v1", "big", 8, 'p', 1, schemas.MaxRuns, 0, 1, 0), adv("v1", "big", 7, 'p', 1, schemas.MaxRuns, 0, 1, 0),
				adv("v1", "big", top-1, 'e', 1, schemas.MaxRuns, 0, 1, 0), adv("v1", "big", top, 'f', 1, schemas.MaxRuns, 0, 2, 0),
				adv("v1", "small", 9, 'p', 1, 10, 0, 1, 0), adv("v1", "big", 8, 'p', 1, schemas.MaxRuns, 0, 1, 0),
				adv("v1", "new", top, 'p', 1, schemas.MaxRuns, 0, 1, 0)}})
			// Fill the big cell completely (in batches of the dev bound) but for a few.
			all := make([]int64, 0, schemas.MaxRuns)
			for i := range int64(schemas.MaxRuns) {
				if i != 4 && i != 5000 && i != 9000 {
					all = append(all, i)
				}
			}
			r := rand.New(rand.NewPCG(3, 4))
			r.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
			for len(all) > 0 {
				n := min(2000, len(all))
				var obs []RunObservation
				for _, i := range all[:n] {
					obs = append(obs, withReply(adv("v1", "big", i, "pf"[i%2], 1, schemas.MaxRuns, 0, 3, 0), int(i), ""))
				}
				all = all[n:]
				bs = append(bs, advBatch{at: late, obs: obs})
			}
			return bs
		}()},
		{"dev batch bound: 2000 runs, one cell each or all in one cell", min2, func() []advBatch {
			var spread, one, again []RunObservation
			for i := range int64(2000) {
				spread = append(spread, withReply(adv(fmt.Sprint("v", i%3), fmt.Sprint("c", i), i%5, "pfe"[i%3], i%3, 5, 0, 1, 0), int(i), ""))
				one = append(one, withReply(adv("v9", "one", i*5, "pf"[i%2], 9, schemas.MaxRuns, 0, 1, 0), int(i)*1000, "gzip_ratio"))
				again = append(again, adv("v9", "one", i*5, "pf"[(i+1)%2], 9, schemas.MaxRuns, 0, 2, 0))
			}
			return []advBatch{{at: t0, obs: spread}, {at: t0, obs: one}, {at: late, obs: again, want: strings.Repeat("R", 2000)}}
		}()},
	}
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			advBackends(t, true, func(t *testing.T, client *redis.Client) { advCompare(t, client, sc.cfg, sc.batches) })
		})
	}
}

// advStream returns n runs over the cells of a few versions and cases of two suites: many repeats (equal, newer, older, equal
// assessment with another record), re-assessments that change result, reply, tokens and trigger,
// version_seq that grows later, run indexes up to MaxRuns-1 and large token counts.
func advStream(r *rand.Rand, n, versions, cases int) []RunObservation {
	idxs := []int64{0, 1, 7, 8, 9, 15, 16, 63, 64, 4999, schemas.MaxRuns - 2, schemas.MaxRuns - 1}
	// Large lengths are rare: the embedded Redis's Lua holds a table keyed by length as an array
	// up to its greatest key, so each costs it milliseconds.
	toks := []int{0, 1, 15, 16, 255, 4096, 0, 1, 15, 16, 255, 4096, 0, 1, 15, 1 << 20, 1<<20 + 3}
	var out []RunObservation
	for len(out) < n {
		switch p := r.IntN(100); {
		case p < 15 && len(out) > 0:
			out = append(out, out[r.IntN(len(out))])
		case p < 40 && len(out) > 0:
			o := out[r.IntN(len(out))]
			o.Record.Result = "pfe"[r.IntN(3)]
			o.Record.Assessed += int64(r.IntN(5)-2) * 1e6
			o.Record.Seq = int64(r.IntN(3))
			o.Record.VersionSeq += int64(r.IntN(10) / 8 * r.IntN(6))
			o.Record.Runs = max(o.Record.Runs, o.Key.RunIndex+1+int64(r.IntN(3)))
			o.Record.Occurred += int64(r.IntN(600)-300) * 1e6
			switch r.IntN(3) {
			case 0:
				o.Record.Reply, o.Record.Tokens, o.Record.Trigger = false, 0, ""
			case 1:
				o.Record.Reply, o.Record.Tokens, o.Record.GzipRatio = true, toks[r.IntN(len(toks))], r.Float64()*9
				o.Record.Trigger = []string{"", "gzip_ratio", "repeat_pattern"}[r.IntN(3)]
			}
			out = append(out, o)
		default:
			v := r.IntN(versions)
			idx := idxs[r.IntN(len(idxs))]
			runs := []int64{5, 10, 16, 65, schemas.MaxRuns}[r.IntN(5)]
			runs = max(runs, idx+1)
			o := adv(fmt.Sprint("v", v), fmt.Sprint("c", r.IntN(cases)), idx, "ppfe"[r.IntN(4)], int64(v+r.IntN(2)), runs,
				int64(r.IntN(120)), int64(r.IntN(3)), int64(r.IntN(2)))
			if r.IntN(4) == 0 { // another suite in the same batch, with colliding names
				o.Key.Key = Key{"ws|adv", "suite"}
			}
			if r.IntN(2) == 0 {
				o = withReply(o, toks[r.IntN(len(toks))], []string{"", "", "gzip_ratio"}[r.IntN(3)])
			}
			out = append(out, o)
		}
	}
	return out
}

// Random streams over few cells, cut into batches at random, with deliveries starting again from
// an earlier batch (a redelivery of any prefix of what was applied since a commit, cut anew); one
// of them on the embedded Redis too.
func TestGroupArgsRandom(t *testing.T) {
	for _, cfg := range []Config{
		{MinHistory: 2, MissingAfter: 30 * time.Minute},
		{MinHistory: 2, JudgeLastVersions: 3, MissingAfter: 30 * time.Minute},
	} {
		for _, seed := range []uint64{1, 2, 3} {
			t.Run(fmt.Sprint("judge last ", cfg.JudgeLastVersions, " seed ", seed), func(t *testing.T) {
				r := rand.New(rand.NewPCG(seed, 99))
				// Few versions and more cases, or more versions and few cases.
				stream := advStream(r, 1500, []int{4, 9, 4}[seed-1], []int{5, 3, 12}[seed-1])
				var batches []advBatch
				at := t0
				var cuts [][2]int
				for i := 0; i < len(stream); {
					n := 1 + r.IntN([]int{3, 40, 300}[r.IntN(3)])
					end := min(i+n, len(stream))
					cuts = append(cuts, [2]int{i, end})
					at = at.Add(time.Duration(r.IntN(20)) * time.Minute)
					batches = append(batches, advBatch{obs: stream[i:end], at: at})
					if r.IntN(4) == 0 {
						// Redeliver from the start of an earlier batch up to here, cut anew.
						from := cuts[r.IntN(len(cuts))][0]
						for j := from; j < end; {
							m := min(j+1+r.IntN(200), end)
							batches = append(batches, advBatch{obs: stream[j:m], at: at})
							j = m
						}
					}
					i = end
				}
				advBackends(t, seed == 1 && cfg.JudgeLastVersions > 0, func(t *testing.T, client *redis.Client) {
					st := advCompare(t, client, cfg, batches)
					// The stream took every path.
					if st.codes["N"] == 0 || st.codes["R"] == 0 || st.codes["D"] == 0 || st.codes["S"] == 0 ||
						st.reordered == 0 || st.revived == 0 || st.missed == 0 {
						t.Fatalf("outcomes %v, %d batches reordered, %d revived, %d missing lists: the stream must exercise each",
							st.codes, st.reordered, st.revived, st.missed)
					}
					t.Logf("outcomes %v, %d batches reordered, %d revived, %d missing lists", st.codes, st.reordered, st.revived, st.missed)
				})
			})
		}
	}
}
