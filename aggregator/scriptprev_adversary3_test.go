package aggregator

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

// adv3ApplyBackends runs f on the test Redis and, when embedded, on an embedded one.
func adv3ApplyBackends(t *testing.T, embedded bool, f func(t *testing.T, addr string)) {
	if embedded {
		t.Run("embedded", func(t *testing.T) { f(t, miniredis.RunT(t).Addr()) })
	}
	t.Run("redis", func(t *testing.T) { f(t, testenv.RedisAddr(t)) })
}

// adv3NormState hides the server-clock stamp of the state's head (the seventh number, the last
// TTL refresh of the hours' sorted set, in seconds): the two scripts run a moment apart.
func adv3NormState(key, field, v string) string {
	if strings.HasSuffix(key, "}:s") && field == "H" {
		p := strings.Split(v, ",")
		if len(p) == 20 {
			p[6] = "rt"
			return strings.Join(p, ",")
		}
	}
	return v
}

func adv3IgnorePending(name string) bool { return strings.Contains(name, "}:pending:") }

// adv3Batch is one delivery of observations at an observation time.
type adv3Batch struct {
	obs []Observation
	at  time.Time
}

// adv3Compare applies batches to two stores under fresh prefixes on addr, one running the
// current apply script and one the previous, and fails on the first reply or stored key that
// differs; at the end it reads every aggregate back with Tally at a few times.
func adv3Compare(t *testing.T, addr string, cfg RedisConfig, batches []adv3Batch) map[Outcome]int {
	t.Helper()
	ctx := context.Background()
	cur, prev, hc, hp := adv3Clients(t, addr, applySource, adv3PrevSource(t, "aggregator/apply.lua"))
	cc, cp := cfg, cfg
	cc.Prefix, cp.Prefix = testenv.Name(t, "adv3cur"), testenv.Name(t, "adv3prev")
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
		for _, k := range gc.Keys {
			keys[k] = true
		}
		// The whole state, now and then and at the end (a dump costs a read of every key).
		if n%max(7, len(batches)/12) == 0 || n == len(batches)-1 {
			adv3SameDumps(t, fmt.Sprint("after batch ", n),
				adv3Dump(t, cur, cc.Prefix, adv3IgnorePending, adv3NormState),
				adv3Dump(t, cur, cp.Prefix, adv3IgnorePending, adv3NormState))
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
			rc, rp := hc.take(), hp.take()
			if tc != tp || len(rc) != 1 || !reflect.DeepEqual(rc, rp) {
				t.Fatalf("tally of %s at %v: current %+v %v, previous %+v %v", k, at, tc, rc, tp, rp)
			}
		}
	}
	adv3SameDumps(t, "after the reads", adv3Dump(t, cur, cc.Prefix, adv3IgnorePending, adv3NormState),
		adv3Dump(t, cur, cp.Prefix, adv3IgnorePending, adv3NormState))
	t.Logf("%d batches, %d script calls, %d aggregates, outcomes %v", len(batches), calls, len(keys), outcomes)
	return outcomes
}

// adv3Cut cuts stream into batches of random sizes (up to maxBatch) at an observation time near
// the greatest occurred time so far (sometimes behind it), and now and then delivers again from
// an earlier batch's start.
func adv3Cut(r *rand.Rand, stream []Observation, maxBatch int) []adv3Batch {
	var out []adv3Batch
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
		out = append(out, adv3Batch{stream[i:end], at})
		if r.IntN(6) == 0 { // a redelivery of what was applied since an earlier batch, cut anew
			for j := starts[r.IntN(len(starts))]; j < end; {
				m := min(j+1+r.IntN(maxBatch), end)
				out = append(out, adv3Batch{stream[j:m], at})
				j = m
			}
		}
		i = end
	}
	return out
}

// adv3Wide is a batch of one aggregate whose n observations spread over hours hours and their
// minutes, many of them re-assessments and duplicates of each other: more fields to read than a
// command takes at once (CHUNK), many hours, index chunks closed.
func adv3Wide(r *rand.Rand, n, hours int, end time.Time) []Observation {
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
func TestAdversary3ApplyScriptSameAsPrevious(t *testing.T) {
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
			batches := adv3Cut(r, randomStreamOver(r, tc.n, tc.span, tc.jumpEvery), tc.maxBatch)
			adv3ApplyBackends(t, tc.embedded, func(t *testing.T, addr string) {
				got := adv3Compare(t, addr, RedisConfig{Retention: tc.retention}, batches)
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
		var batches []adv3Batch
		// Past CHUNK fields and hours and minutes to read; then the same again (duplicates and
		// stale), later ones that expire most of it and collect its records, and small ones.
		wide := adv3Wide(r, 9000, 200, end)
		batches = append(batches, adv3Batch{wide, end}, adv3Batch{wide[:5000], end})
		for i := 1; i <= 6; i++ {
			at := end.Add(time.Duration(i) * 40 * time.Hour)
			batches = append(batches, adv3Batch{adv3Wide(r, 1500, 100, at), at})
		}
		adv3ApplyBackends(t, false, func(t *testing.T, addr string) {
			adv3Compare(t, addr, RedisConfig{Retention: 3 * 24 * time.Hour}, batches)
		})
	})
}
