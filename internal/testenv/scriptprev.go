package testenv

// Comparing a script with an earlier revision of itself: for a change meant to keep a Lua script's
// behaviour (a refactoring), tests run the current script and the one at REPEATRATE_SCRIPT_PREV side
// by side under two key prefixes of one Redis and compare replies and stored keys.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
)

// ScriptPrevCommit is the commit whose scripts the current ones must behave exactly as:
// REPEATRATE_SCRIPT_PREV, empty when unset.
func ScriptPrevCommit() string { return os.Getenv("REPEATRATE_SCRIPT_PREV") }

// ScriptPrevSource returns file path (from the repository's root) as it was at ScriptPrevCommit. The
// comparison is a check for a change meant to keep a script's behaviour (a refactoring), so it runs
// only when asked for: it is skipped without REPEATRATE_SCRIPT_PREV, and when git cannot show the
// file at that commit.
func ScriptPrevSource(t testing.TB, path string) string {
	t.Helper()
	if ScriptPrevCommit() == "" {
		t.Skip("set REPEATRATE_SCRIPT_PREV=<revision> to compare the script with that revision's (e.g. 1bc9c97, before its globals became locals)")
	}
	out, err := exec.Command("git", "show", ScriptPrevCommit()+":"+path).Output()
	if err != nil || len(out) == 0 {
		t.Skipf("git show %s:%s: %v (no repository history here)", ScriptPrevCommit(), path, err)
	}
	return string(out)
}

// ScriptSwap makes a client run script prev wherever its commands name script cur (EVALSHA, EVAL,
// SCRIPT LOAD), and records the replies (or errors) of every call of either, in order.
type ScriptSwap struct {
	cur, prev *redis.Script
	swap      bool
	mu        sync.Mutex
	replies   []string
}

// DialHook implements redis.Hook; dialling is left as it is.
func (h *ScriptSwap) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook: it swaps and records the script's lone calls.
func (h *ScriptSwap) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		mine := h.before(cmd)
		err := next(ctx, cmd)
		if mine {
			h.record(cmd)
		}
		return err
	}
}

// ProcessPipelineHook implements redis.Hook: it swaps and records the script's pipelined calls.
func (h *ScriptSwap) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
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
func (h *ScriptSwap) before(cmd redis.Cmder) bool {
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
		if args[1] == scriptSource(h.cur) {
			if h.swap {
				args[1] = scriptSource(h.prev)
			}
			return true
		}
	case "script":
		if len(args) == 3 && args[2] == scriptSource(h.cur) && h.swap {
			args[2] = scriptSource(h.prev)
		}
	}
	return false
}

func (h *ScriptSwap) record(cmd redis.Cmder) {
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

// Take returns the replies recorded since the last Take.
func (h *ScriptSwap) Take() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.replies
	h.replies = nil
	return r
}

// scriptSources maps each script to its source (go-redis keeps it unexported).
var scriptSources sync.Map

func newScript(src string) *redis.Script {
	s := redis.NewScript(src)
	scriptSources.Store(s, src)
	return s
}

func scriptSource(s *redis.Script) string {
	v, _ := scriptSources.Load(s)
	src, _ := v.(string)
	return src
}

// ScriptClients returns two clients on addr: cur runs the scripts as they are, prev runs prevSrc in
// place of curSrc; each records the replies of that script's calls.
func ScriptClients(t testing.TB, addr, curSrc, prevSrc string) (cur, prev *redis.Client, hc, hp *ScriptSwap) {
	t.Helper()
	cs, ps := newScript(curSrc), newScript(prevSrc)
	if cs.Hash() == ps.Hash() {
		t.Fatalf("the script at %s is the current one: nothing to compare", ScriptPrevCommit())
	}
	hc, hp = &ScriptSwap{cur: cs, prev: ps}, &ScriptSwap{cur: cs, prev: ps, swap: true}
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

// DumpKeys returns every key under prefix (renamed "P"), as type, contents and whether it
// expires, skipping the keys named by ignore. norm rewrites a hash field's value before it is
// compared. The object encoding is included where the server reports it.
func DumpKeys(t testing.TB, c *redis.Client, prefix string, ignore func(string) bool, norm func(key, field, v string) string) map[string]string {
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

// SameDumps fails on the first key whose dumps differ.
func SameDumps(t testing.TB, what string, cur, prev map[string]string) {
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

// NormStateHead is a DumpKeys normaliser that hides the server-clock stamp in an aggregate
// state's head (field H of a key ending "}:s": a marker byte, the index group byte, then 21
// numbers of 7 bytes, of which the seventh is the second of the last TTL refresh of the hours'
// sorted set, Redis TIME). Two stores written a moment apart, across a second, stamp differently
// while holding the same state.
func NormStateHead(key, field, v string) string {
	const headLen = 2 + 21*7
	if strings.HasSuffix(key, "}:s") && field == "H" && len(v) == headLen {
		return v[:2+6*7] + "rt....." + v[2+7*7:]
	}
	return v
}
