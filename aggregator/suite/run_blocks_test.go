package suite

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/internal/testenv"
	"github.com/repeatrate/repeatrate/schemas"
)

// Layout 6 keeps a suite's runs one hash field per (version id, case, block of 16 run indexes),
// named "<vid>|<case>|<block>" with the case unescaped, holding "<run_index> <assessed> <seq>
// <flags>;" entries; the cell's bitmap says which indexes are held. These tests aim at that
// layout with case names and version labels that look like field names, entries or ids (a '|',
// ';', spaces, digits, NUL, braces, '%', 512 bytes), run indexes at block edges and far apart,
// assessments at 1970 and 2200 and sequence numbers at the Lua limit, a run re-assessed many
// times inside one call, a cell sent as two groups of one call (splitEncode), and every call
// applied twice. After each call the outcomes and summaries must be the model's, the second
// application must leave every key as the first left it, and at the end the stored entries,
// cells and bitmaps must be the model's (advStored).

// blocksSuite has a workspace and suite name that need escaping in the hash tag.
var blocksSuite = Key{"w s|%", "{suite}|x"}

// blocksCases are case names aimed at the unescaped "<vid>|<case>|<block>" field names and at the
// entries' separators.
var blocksCases = []string{
	"a", "a|1", "a|1|0", "1|a", "1", "0", "16", "a|", "|", "||", "%", "%7C", "{", "}", "{x}|y", " ", "a b",
	"\x00", "\x00|\x00", ";", "a;b", "1 2 3 4;", "0 0 0 0;", "\n", strings.Repeat("é", 256), strings.Repeat("|", 512),
	strings.Repeat("9", 511) + "|",
}

// blocksVersions are labels that look like version ids (label "2" is usually given id 1).
var blocksVersions = []string{"2", "1", "v|1", "1|2", " "}

// maxMicros is the last accepted time (schemas: before 2200), in µs.
var maxMicros = aggregator.Micros(time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC)) - 1

// blocksRun is a run of blocksSuite with explicit assessed µs.
func blocksRun(v, c string, idx int64, res byte, vseq, runs int64, assessed, seq int64) RunObservation {
	return RunObservation{
		Key: RunKey{Key: blocksSuite, Version: v, Case: c, RunIndex: idx},
		Record: RunRecord{Result: res, VersionSeq: vseq, Runs: runs, Occurred: aggregator.Micros(t0) + idx*1e6,
			Assessed: assessed, Seq: seq},
	}
}

// blocksCall is one script call: its runs, time, whether its cells are sent as two groups each,
// and whether it is applied twice in a row.
type blocksCall struct {
	obs          []RunObservation
	at           time.Time
	split, twice bool
	want         string // outcomes of the first application, "" unchecked
}

// blocksDump is testenv.DumpKeys without the object encodings (a re-application may not change
// contents, and so no encoding either, but the comparison is of contents).
func blocksDump(t *testing.T, c *redis.Client, prefix string) map[string]string {
	t.Helper()
	d := testenv.DumpKeys(t, c, prefix, equivNoIgnore, equivNoNorm)
	for k, v := range d {
		if i := strings.Index(v, "\n  encoding "); i >= 0 {
			d[k] = v[:i]
		}
	}
	return d
}

// blocksCompare applies calls to a fresh store and to the model, compares after every call, and
// compares the stored state at the end; it returns the outcome codes seen.
func blocksCompare(t *testing.T, client *redis.Client, cfg Config, calls []blocksCall) map[string]int {
	t.Helper()
	ctx := context.Background()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	prefix := testenv.Name(t, "blocksRig")
	testenv.CleanPrefix(t, client, prefix)
	store, err := NewRedis(client, aggregator.RedisConfig{Prefix: prefix, Retention: time.Hour}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	model := NewMemory(cfg)
	codes := map[string]int{}
	at := t0
	apply := func(n int, c blocksCall, what string) {
		t.Helper()
		enc := Encode(c.obs)
		if c.split {
			enc = splitEncode(c.obs)
		}
		got, err := store.ApplyEncoded(ctx, enc, c.at)
		if err != nil {
			t.Fatalf("call %d (%s): %v", n, what, err)
		}
		want, _ := model.Apply(ctx, c.obs, c.at)
		g, w := advOutcomes(got.Outcomes), advOutcomes(want.Outcomes)
		if g != w {
			t.Fatalf("call %d (%s, split %v): outcomes\n%s, model\n%s", n, what, c.split, g, w)
		}
		if what == "first" && c.want != "" && w != c.want {
			t.Fatalf("call %d: the model's outcomes are %s, the scenario expects %s", n, w, c.want)
		}
		for i := range len(w) {
			codes[w[i:i+1]]++
		}
		for _, k := range want.Suites {
			if d := summaryDiff(got.Summaries[k], want.Summaries[k]); d != "" {
				t.Fatalf("call %d (%s, split %v): summary differs: %s", n, what, c.split, d)
			}
		}
	}
	for n, c := range calls {
		at = c.at
		apply(n, c, "first")
		if c.twice {
			before := blocksDump(t, client, prefix)
			apply(n, c, "again")
			testenv.SameDumps(t, fmt.Sprintf("call %d applied again", n), blocksDump(t, client, prefix), before)
		}
	}
	advReadAll(t, client, store, model, cfg, at)
	return codes
}

// TestBlockFieldsOfAwkwardNames: every awkward case in every awkward version, at block
// edges and far blocks, then re-assessed, stale and duplicated, in calls sent whole and split,
// each applied twice.
func TestBlockFieldsOfAwkwardNames(t *testing.T) {
	idxs := []int64{0, 15, 16, 17, 31, 32, 255, 256, 9983, 9984, 9998, 9999}
	late := t0.Add(10 * time.Hour)
	var first, second, third []RunObservation
	for vi, v := range blocksVersions {
		for ci, c := range blocksCases {
			for j, idx := range idxs {
				if (vi+ci+j)%3 == 0 {
					continue // leave holes: missing runs, and blocks with fewer entries
				}
				res := "pfe"[(vi+ci+j)%3]
				o := blocksRun(v, c, idx, res, int64(vi), schemas.MaxRuns, int64(ci), int64(j))
				if j%4 == 1 {
					o = withReply(o, 1<<16+j, []string{"", "gzip_ratio"}[ci%2])
				}
				first = append(first, o)
				// Second call: re-assessed at 2200 (R), at 1970 (S), or the same again (D).
				switch (vi + ci + j) % 3 {
				case 1:
					r := o
					r.Record.Result, r.Record.Assessed, r.Record.Seq = "fep"[(vi+ci+j)%3], maxMicros, schemas.MaxAssessmentSeq-1
					second = append(second, r)
					// Third call: greater by one in seq at the limit (R), then equal (D).
					r2 := r
					r2.Record.Result, r2.Record.Seq = 'p', schemas.MaxAssessmentSeq
					third = append(third, r2, r2)
				case 2:
					s := o
					s.Record.Result, s.Record.Assessed, s.Record.Seq = 'p', 0, schemas.MaxAssessmentSeq
					second = append(second, s, o)
				}
			}
		}
	}
	// Calls of about the dev bound: cut the first into pieces of 1 500.
	var calls []blocksCall
	for i := 0; i < len(first); i += 1500 {
		calls = append(calls, blocksCall{obs: first[i:min(i+1500, len(first))], at: t0, split: i%3000 == 0, twice: true})
	}
	calls = append(calls, blocksCall{obs: second, at: late, split: true, twice: true},
		blocksCall{obs: third, at: late, twice: true, want: strings.Repeat("RD", len(third)/2)})
	cfg := Config{MinHistory: 2, MissingAfter: 20 * time.Minute}
	advBackends(t, true, func(t *testing.T, client *redis.Client) {
		codes := blocksCompare(t, client, cfg, calls)
		for _, c := range []string{"N", "R", "D", "S"} {
			if codes[c] == 0 {
				t.Fatalf("outcomes %v: the calls must produce each of N R D S", codes)
			}
		}
	})
}

// TestRunReassessedManyTimesInOneCall: runs appended in the call, then re-assessed
// up and down dozens of times in the same call, in cells of more than 16 runs spread over far
// blocks, with the cell split in two groups; and the same again on runs held from an earlier call.
func TestRunReassessedManyTimesInOneCall(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 55))
	idxs := []int64{0, 1, 15, 16, 47, 48, 5000, 9999}
	mk := func(c string, base int64) []RunObservation {
		// Each index: a new run, then 30 more assessments, mostly newer than the last one, else one
		// seen before (a duplicate) or an older one (stale); the indexes' sequences interleaved at
		// random, each in its own order.
		seqs := make([][]RunObservation, len(idxs))
		for n, idx := range idxs {
			var seen [][2]int64
			cur := [2]int64{base, 0}
			for range 31 {
				as := cur
				switch p := r.IntN(10); {
				case p < 6 || len(seen) == 0:
					if r.IntN(2) == 0 {
						cur[0] += 60e6
					} else {
						cur[1]++
					}
					as = cur
				case p < 8:
					as = seen[r.IntN(len(seen))]
				default:
					as = [2]int64{base - 60e6*int64(1+r.IntN(3)), int64(r.IntN(3))}
				}
				seen = append(seen, as)
				o := blocksRun("1", c, idx, "pfe"[r.IntN(3)], 1, schemas.MaxRuns, as[0], as[1])
				if r.IntN(2) == 0 {
					o = withReply(o, r.IntN(5000), []string{"", "repeat_pattern"}[r.IntN(2)])
				}
				seqs[n] = append(seqs[n], o)
			}
			// The last assessment at the limits of time and sequence.
			last := blocksRun("1", c, idx, 'p', 1, schemas.MaxRuns, maxMicros, schemas.MaxAssessmentSeq)
			seqs[n] = append(seqs[n], last, last)
		}
		var obs []RunObservation
		for len(obs) < len(idxs)*33 {
			n := r.IntN(len(idxs))
			if len(seqs[n]) == 0 {
				continue
			}
			obs, seqs[n] = append(obs, seqs[n][0]), seqs[n][1:]
		}
		return obs
	}
	base := aggregator.Micros(t0)
	var calls []blocksCall
	for n, c := range []string{"a|1", "a", "1 2 3 4;"} {
		calls = append(calls, blocksCall{obs: mk(c, base), at: t0, split: n%2 == 0, twice: true})
	}
	// Held from the first calls, re-assessed many times again, whole and split.
	for n, c := range []string{"a|1", "a", "1 2 3 4;"} {
		calls = append(calls, blocksCall{obs: mk(c, base+60e6), at: t0.Add(time.Hour), split: n%2 == 1, twice: true})
	}
	// All three cases in one call, every cell split.
	all := append(append(mk("a|1", base+120e6), mk("a", base+120e6)...), mk("1 2 3 4;", base+120e6)...)
	calls = append(calls, blocksCall{obs: all, at: t0.Add(2 * time.Hour), split: true, twice: true})
	advBackends(t, true, func(t *testing.T, client *redis.Client) {
		codes := blocksCompare(t, client, Config{MinHistory: 2, MissingAfter: 20 * time.Minute}, calls)
		if codes["R"] < 100 || codes["S"] < 100 || codes["D"] < 20 {
			t.Fatalf("outcomes %v: the calls must re-assess, repeat and go stale many times", codes)
		}
		t.Logf("outcomes %v over %d calls", codes, len(calls))
	})
}

// TestRandomDeliveries: a random stream over awkward names, cut into calls at random,
// redelivered from an earlier call, each call sent whole or split at random and often twice.
func TestRandomDeliveries(t *testing.T) {
	for _, seed := range []uint64{7, 8} {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 5))
			idxs := []int64{0, 1, 15, 16, 31, 32, 1000, 9984, 9999}
			asd := []int64{0, 1, aggregator.Micros(t0), aggregator.Micros(t0) + 60e6, maxMicros - 1, maxMicros}
			seqs := []int64{0, 1, schemas.MaxAssessmentSeq - 1, schemas.MaxAssessmentSeq}
			var stream []RunObservation
			for len(stream) < 1200 {
				if len(stream) > 0 && r.IntN(3) == 0 {
					o := stream[r.IntN(len(stream))]
					if r.IntN(2) == 0 {
						o.Record.Result, o.Record.Assessed, o.Record.Seq = "pfe"[r.IntN(3)], asd[r.IntN(len(asd))], seqs[r.IntN(len(seqs))]
						o.Record.VersionSeq += int64(r.IntN(2))
					}
					stream = append(stream, o)
					continue
				}
				vi := r.IntN(len(blocksVersions))
				o := blocksRun(blocksVersions[vi], blocksCases[r.IntN(len(blocksCases))], idxs[r.IntN(len(idxs))], "ppfe"[r.IntN(4)],
					int64(vi), schemas.MaxRuns, asd[r.IntN(len(asd))], seqs[r.IntN(len(seqs))])
				if r.IntN(3) == 0 {
					o = withReply(o, r.IntN(70000), []string{"", "gzip_ratio"}[r.IntN(2)])
				}
				stream = append(stream, o)
			}
			var calls []blocksCall
			var starts []int
			at := t0
			for i := 0; i < len(stream); {
				end := min(len(stream), i+1+r.IntN([]int{5, 60, 400}[r.IntN(3)]))
				starts = append(starts, i)
				at = at.Add(time.Duration(r.IntN(15)) * time.Minute)
				calls = append(calls, blocksCall{obs: stream[i:end], at: at, split: r.IntN(2) == 0, twice: r.IntN(2) == 0})
				if r.IntN(4) == 0 {
					from := starts[r.IntN(len(starts))]
					for j := from; j < end; {
						m := min(end, j+1+r.IntN(300))
						calls = append(calls, blocksCall{obs: stream[j:m], at: at, split: r.IntN(2) == 0, twice: r.IntN(3) == 0})
						j = m
					}
				}
				i = end
			}
			advBackends(t, seed == 7, func(t *testing.T, client *redis.Client) {
				codes := blocksCompare(t, client, Config{MinHistory: 2, JudgeLastVersions: 3, MissingAfter: 30 * time.Minute}, calls)
				for _, c := range []string{"N", "R", "D", "S"} {
					if codes[c] == 0 {
						t.Fatalf("outcomes %v: the stream must produce each of N R D S", codes)
					}
				}
				t.Logf("outcomes %v over %d calls", codes, len(calls))
			})
		})
	}
}
