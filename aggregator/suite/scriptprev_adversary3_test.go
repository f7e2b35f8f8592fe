package suite

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

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

// adv3PrevCommit is the commit whose scripts the current ones must behave exactly as:
// REPEATRATE_SCRIPT_PREV, empty when unset.
func adv3PrevCommit() string { return os.Getenv("REPEATRATE_SCRIPT_PREV") }

// adv3PrevSource returns file path (from the repository's root) as it was at adv3PrevCommit. The
// comparison is a check for a change meant to keep a script's behaviour (a refactoring), so it runs
// only when asked for: it is skipped without REPEATRATE_SCRIPT_PREV, and when git cannot show the
// file at that commit.
func adv3PrevSource(t *testing.T, path string) string {
	t.Helper()
	if adv3PrevCommit() == "" {
		t.Skip("set REPEATRATE_SCRIPT_PREV=<revision> to compare the script with that revision's (e.g. 1bc9c97, before its globals became locals)")
	}
	out, err := exec.Command("git", "show", adv3PrevCommit()+":"+path).Output()
	if err != nil || len(out) == 0 {
		t.Skipf("git show %s:%s: %v (no repository history here)", adv3PrevCommit(), path, err)
	}
	return string(out)
}

// adv3Hook makes a client run script prev wherever its commands name script cur (EVALSHA, EVAL,
// SCRIPT LOAD), and records the replies (or errors) of every call of either, in order.
type adv3Hook struct {
	cur, prev *redis.Script
	swap      bool
	mu        sync.Mutex
	replies   []string
}

func (h *adv3Hook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *adv3Hook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		mine := h.before(cmd)
		err := next(ctx, cmd)
		if mine {
			h.record(cmd)
		}
		return err
	}
}

func (h *adv3Hook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		mine := make([]bool, len(cmds))
		for i, c := range cmds {
			mine[i] = h.before(c)
		}
		err := next(ctx, cmds)
		for i, c := range cmds {
			if mine[i] {
				h.record(c)
			}
		}
		return err
	}
}

// before swaps the script of cmd when it is the current one (and h swaps), and reports whether
// cmd is a call of the script.
func (h *adv3Hook) before(cmd redis.Cmder) bool {
	args := cmd.Args()
	if len(args) < 2 {
		return false
	}
	name, _ := args[0].(string)
	switch strings.ToLower(name) {
	case "evalsha":
		if args[1] == h.cur.Hash() {
			if h.swap {
				args[1] = h.prev.Hash()
			}
			return true
		}
	case "eval":
		if args[1] == adv3Src(h.cur) {
			if h.swap {
				args[1] = adv3Src(h.prev)
			}
			return true
		}
	case "script":
		if len(args) == 3 && args[2] == adv3Src(h.cur) && h.swap {
			args[2] = adv3Src(h.prev)
		}
	}
	return false
}

func (h *adv3Hook) record(cmd redis.Cmder) {
	var s string
	if err := cmd.Err(); err != nil && err != redis.Nil {
		if strings.HasPrefix(err.Error(), "NOSCRIPT") {
			return // the store loads the script and calls again
		}
		s = "error: " + err.Error()
	} else {
		s = fmt.Sprintf("%#v", cmd.(*redis.Cmd).Val())
	}
	h.mu.Lock()
	h.replies = append(h.replies, s)
	h.mu.Unlock()
}

// take returns the replies recorded since the last take.
func (h *adv3Hook) take() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.replies
	h.replies = nil
	return r
}

// adv3Sources maps each script to its source (go-redis keeps it unexported).
var adv3Sources sync.Map

func adv3Script(src string) *redis.Script {
	s := redis.NewScript(src)
	adv3Sources.Store(s, src)
	return s
}

func adv3Src(s *redis.Script) string {
	v, _ := adv3Sources.Load(s)
	src, _ := v.(string)
	return src
}

// adv3Clients returns two clients on addr: cur runs the scripts as they are, prev runs prevSrc in
// place of curSrc; each records the replies of that script's calls.
func adv3Clients(t *testing.T, addr, curSrc, prevSrc string) (cur, prev *redis.Client, hc, hp *adv3Hook) {
	t.Helper()
	cs, ps := adv3Script(curSrc), adv3Script(prevSrc)
	if cs.Hash() == ps.Hash() {
		t.Fatalf("the script at %s is the current one: nothing to compare", adv3PrevCommit())
	}
	hc, hp = &adv3Hook{cur: cs, prev: ps}, &adv3Hook{cur: cs, prev: ps, swap: true}
	cur, prev = redis.NewClient(&redis.Options{Addr: addr}), redis.NewClient(&redis.Options{Addr: addr})
	cur.AddHook(hc)
	prev.AddHook(hp)
	t.Cleanup(func() { cur.Close(); prev.Close() })
	ctx := context.Background()
	// Loaded ahead, so that no call meets NOSCRIPT. (Not cs through prev: Load takes the hash
	// Redis replies, which would then be the previous script's.)
	if err := cs.Load(ctx, cur).Err(); err != nil {
		t.Fatal(err)
	}
	if err := ps.Load(ctx, cur).Err(); err != nil {
		t.Fatal(err)
	}
	if ok, err := prev.ScriptExists(ctx, ps.Hash()).Result(); err != nil || !ok[0] {
		t.Fatalf("the previous script is not loaded through the swapping client: %v %v", ok, err)
	}
	return cur, prev, hc, hp
}

// adv3Dump returns every key under prefix (renamed "P"), as type, contents and whether it
// expires, skipping the keys named by ignore. norm rewrites a hash field's value before it is
// compared. The object encoding is included where the server reports it.
func adv3Dump(t *testing.T, c *redis.Client, prefix string, ignore func(string) bool, norm func(key, field, v string) string) map[string]string {
	t.Helper()
	ctx := context.Background()
	out := map[string]string{}
	var keys []string
	iter := c.Scan(ctx, 0, prefix+":*", 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		name := "P" + strings.TrimPrefix(k, prefix)
		if ignore(name) {
			continue
		}
		typ, err := c.Type(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		b.WriteString(typ)
		switch typ {
		case "hash":
			h, err := c.HGetAll(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range slices.Sorted(func(yield func(string) bool) {
				for f := range h {
					if !yield(f) {
						return
					}
				}
			}) {
				fmt.Fprintf(&b, "\n  %q = %q", f, norm(name, f, h[f]))
			}
		case "zset":
			z, err := c.ZRangeWithScores(ctx, k, 0, -1).Result()
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range z {
				fmt.Fprintf(&b, "\n  %q %v", m.Member, m.Score)
			}
		case "set":
			s, err := c.SMembers(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			slices.Sort(s)
			fmt.Fprintf(&b, "\n  %q", s)
		case "string":
			s, err := c.Get(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&b, "\n  %q", s)
		default:
			t.Fatalf("key %s of type %s", k, typ)
		}
		ttl, err := c.PTTL(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "\n  expires %v", ttl > 0)
		if enc, err := c.ObjectEncoding(ctx, k).Result(); err == nil {
			fmt.Fprintf(&b, "\n  encoding %s", enc)
		}
		out[name] = b.String()
	}
	return out
}

// adv3SameDumps fails on the first key whose dumps differ.
func adv3SameDumps(t *testing.T, what string, cur, prev map[string]string) {
	t.Helper()
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range cur {
			if !yield(k) {
				return
			}
		}
		for k := range prev {
			if _, ok := cur[k]; !ok && !yield(k) {
				return
			}
		}
	}) {
		if cur[k] != prev[k] {
			t.Fatalf("%s: key %s differs\ncurrent script:  %s\nprevious script: %s", what, k, cur[k], prev[k])
		}
	}
}

// adv3Batch is one delivery of graded runs at an observation time; announce marks the revived
// cases the batch reports as published before the next one (as the processor does).
type adv3Batch struct {
	obs      []RunObservation
	at       time.Time
	announce bool
}

func adv3NoIgnore(string) bool         { return false }
func adv3NoNorm(_, _, v string) string { return v }

// adv3Compare applies batches to two stores under fresh prefixes on addr, one running the
// current suite script and one the previous, and fails on the first reply or stored key that
// differs; every few batches and at the end it reads every suite back with Read.
func adv3Compare(t *testing.T, addr string, cfg Config, batches []adv3Batch) map[aggregator.Outcome]int {
	t.Helper()
	ctx := context.Background()
	cur, prev, hc, hp := adv3Clients(t, addr, suiteSource, adv3PrevSource(t, "aggregator/suite/suite.lua"))
	pc, pp := testenv.Name(t, "adv3cur"), testenv.Name(t, "adv3prev")
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
		adv3SameDumps(t, what, adv3Dump(t, cur, pc, adv3NoIgnore, adv3NoNorm), adv3Dump(t, cur, pp, adv3NoIgnore, adv3NoNorm))
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
			rc, rp := hc.take(), hp.take()
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
		rc, rp := hc.take(), hp.take()
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

// adv3Cut cuts stream into batches of random sizes at a clock moving a few minutes each, with
// redeliveries from an earlier batch's start, announcing revived cases after most batches.
func adv3Cut(r *rand.Rand, stream []RunObservation) []adv3Batch {
	var out []adv3Batch
	var starts []int
	at := t0
	for i := 0; i < len(stream); {
		end := min(i+1+r.IntN([]int{3, 40, 300}[r.IntN(3)]), len(stream))
		at = at.Add(time.Duration(r.IntN(20)) * time.Minute)
		starts = append(starts, i)
		out = append(out, adv3Batch{stream[i:end], at, r.IntN(3) > 0})
		if r.IntN(4) == 0 {
			for j := starts[r.IntN(len(starts))]; j < end; {
				m := min(j+1+r.IntN(200), end)
				out = append(out, adv3Batch{stream[j:m], at, r.IntN(3) > 0})
				j = m
			}
		}
		i = end
	}
	return out
}

// adv3Wide is a batch of runs of one suite past the script's chunk of arguments (CHUNK, 1000):
// more runs, cases and cells than one command takes, more runs to write than one HSET takes.
func adv3Wide(r *rand.Rand, n, cases int, as int64) []RunObservation {
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
func TestAdversary3SuiteScriptSameAsPrevious(t *testing.T) {
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
			batches := adv3Cut(r, advStream(r, 1500, tc.versions, tc.cases))
			adv3Backends(t, tc.embedded, func(t *testing.T, addr string) {
				got := adv3Compare(t, addr, tc.cfg, batches)
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
		first := adv3Wide(r, 2000, 1500, 1)
		again := slices.Clone(first)
		for i := range again {
			if i%3 == 0 {
				again[i].Record.Assessed += 60e6
				again[i].Record.Result = "pfe"[(i/3)%3]
			}
		}
		batches := []adv3Batch{{first, t0, true}, {again, t0.Add(time.Hour), true}, {adv3Wide(r, 1800, 1200, 3), t0.Add(2 * time.Hour), true},
			{[]RunObservation{adv("wv9", "w1", 0, 'p', 0, schemas.MaxRuns, 0, 5, 0)}, t0.Add(3 * time.Hour), true}}
		adv3Backends(t, true, func(t *testing.T, addr string) {
			adv3Compare(t, addr, Config{MinHistory: 2, JudgeLastVersions: 2, MissingAfter: 30 * time.Minute}, batches)
		})
	})
}

// adv3Backends runs f on the test Redis and, when embedded, on an embedded one.
func adv3Backends(t *testing.T, embedded bool, f func(t *testing.T, addr string)) {
	if embedded {
		t.Run("embedded", func(t *testing.T) { f(t, miniredis.RunT(t).Addr()) })
	}
	t.Run("redis", func(t *testing.T) { f(t, testenv.RedisAddr(t)) })
}
