package aggregator

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/repeatrate/repeatrate/internal/testenv"
)

// TestComputedCallRefusedAfterRedisLostWhatItRead: Redis loses its recent writes (a failover to a
// replica behind, a restart) between a computed call's read and its store, and another writer
// writes again. The store must not take the state it then finds for the one the call read, in
// either layout-11 head: with the store's write count (the buckets' write stamp checked in their
// place) and without it (the buckets checked). Lost writes are played here by putting the
// aggregate's keys back as DUMP saved them.
func TestComputedCallRefusedAfterRedisLostWhatItRead(t *testing.T) {
	for _, withCount := range []bool{true, false} {
		name := map[bool]string{true: "head with a write count", false: "head without"}[withCount]
		t.Run(name+", buckets read after a write Redis then lost", func(t *testing.T) {
			lostBetweenHeadAndBuckets(t, withCount)
		})
		t.Run(name+", a write after the loss that leaves the head the call read", func(t *testing.T) {
			lostAndWrittenAgain(t, withCount)
		})
		t.Run(name+", a computed write after the loss that leaves the head the call read", func(t *testing.T) {
			lostAndComputedAgain(t, withCount, false)
		})
	}
	t.Run("head with a write count, the stamp ahead of Redis's clock: a write after the loss that repeats the lost stamp", func(t *testing.T) {
		lostAndStampedAgain(t)
	})
	// The build before left a head without the count and no stamp; this build's computed writes
	// leave heads with the count, and so must make a stamp as they do.
	t.Run("a head without the count, given one by a computed write that Redis lost and made again", func(t *testing.T) {
		lostAndComputedAgain(t, true, true)
	})
}

// lostWritesRig is three stores on one prefix in layout 11 (mine and computing compute their
// calls, other runs the script) and one aggregate k.
type lostWritesRig struct {
	c, mc                  *redis.Client
	mine, other, computing *Redis
	k                      Key
	occ                    int64
	at                     time.Time
	withoutCount           bool
}

func newLostWritesRig(t *testing.T, what string, withCount bool) *lostWritesRig {
	x := &lostWritesRig{c: testenv.Redis(t), mc: testenv.Redis(t), withoutCount: !withCount}
	prefix := testenv.Name(t, what)
	testenv.CleanPrefix(t, x.c, prefix)
	fp := testFingerprinter(t)
	open := func(c *redis.Client, compute bool) *Redis {
		s, err := NewRedis(c, RedisConfig{Prefix: prefix, Retention: 24 * time.Hour, ComputeCalls: compute, Fingerprint: fp})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	x.mine, x.other, x.computing = open(x.mc, true), open(x.c, false), open(x.c, true)
	x.k = Key{Scope: collisionScopes[0], CorrectionID: what, Source: Live}
	x.occ = Micros(t0) + 30*minuteUS
	x.at = time.UnixMicro(x.occ + 5e6)
	return x
}

func (x *lostWritesRig) ob(id string, occ, assessed int64) Observation {
	return Observation{Key: x.k, OpportunityID: id, Class: Passed, Occurred: occ, Assessed: assessed}
}

// otherApplies applies obs through the script and, for a head without the count, leaves the
// aggregate as the build before the count writes it.
func (x *lostWritesRig) otherApplies(t *testing.T, obs ...Observation) Applied {
	t.Helper()
	got, err := x.other.Apply(context.Background(), obs, x.at)
	if err != nil {
		t.Fatal(err)
	}
	if x.withoutCount {
		x.asBuildBefore()
	}
	return got
}

// asBuildBefore leaves the aggregate as the build before the count writes it: the head cut back
// to its first 24 numbers (which it returns), and no buckets' write stamp.
func (x *lostWritesRig) asBuildBefore() string {
	ctx, keys := context.Background(), x.mine.keys(x.k)
	h := x.c.HGet(ctx, keys[1], "H").Val()
	if len(h) == headBytesWC {
		h = h[:headBytes11]
		x.c.HSet(ctx, keys[1], "H", h)
	}
	x.c.HDel(ctx, keys[2], bucketsWritten)
	return h
}

// saved is the aggregate's keys as DUMP returned them ("" for one absent).
func (x *lostWritesRig) save(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, k := range x.mine.keys(x.k) {
		v, err := x.c.Dump(context.Background(), k).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatal(err)
		}
		out[k] = v
	}
	return out
}

// lose puts the aggregate's keys back as saved: Redis lost every write since.
func (x *lostWritesRig) lose(t *testing.T, saved map[string]string) {
	t.Helper()
	for k, v := range saved {
		if err := x.c.Del(context.Background(), k).Err(); err != nil {
			t.Fatal(err)
		}
		if v != "" {
			if err := x.c.Restore(context.Background(), k, 0, v).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// mineApplies applies obs with mine computing, reading them afresh, and returns how many of its
// calls the store took and refused.
func (x *lostWritesRig) mineApplies(t *testing.T, obs ...Observation) (stored, refused int64) {
	t.Helper()
	s0, r0 := x.mine.ComputedCalls()
	x.mine.skipReads = 0
	if _, err := x.mine.Apply(context.Background(), obs, x.at); err != nil {
		t.Fatal(err)
	}
	x.mine.afterRead = nil
	s1, r1 := x.mine.ComputedCalls()
	return s1 - s0, r1 - r0
}

// lostBetweenHeadAndBuckets: with no shape cached, the processor reads the head in one round trip
// and the buckets in a second. Another writer counts x between them, and Redis then loses that
// write. The call read a head without x and a bucket with x: stored, it would write x's record
// back uncounted, and x, replayed by its writer after the loss, would be a duplicate.
func lostBetweenHeadAndBuckets(t *testing.T, withCount bool) {
	x := newLostWritesRig(t, "lost-skew", withCount)
	x.otherApplies(t, x.ob("r0", x.occ, x.occ))
	var saved map[string]string
	x.mc.AddHook(&beforeBucketsHook{key: x.mine.keys(x.k)[2], only: true, before: func() {
		saved = x.save(t)
		x.otherApplies(t, x.ob("x", x.occ, x.occ))
	}})
	x.mine.afterRead = func() {
		if saved == nil {
			t.Fatal("the buckets were not read in a round trip of their own")
		}
		x.lose(t, saved)
	}
	delete(x.mine.shapes, x.k)
	if stored, refused := x.mineApplies(t, x.ob("e", x.occ, x.occ)); stored != 0 || refused != 1 {
		t.Fatalf("the store took %d calls and refused %d; want the call refused", stored, refused)
	}
	if got := x.otherApplies(t, x.ob("x", x.occ, x.occ)); got.Outcomes[0] != Counted {
		t.Fatalf("x replayed after the loss: %v, want counted", got.Outcomes)
	}
	if tl, err := x.other.Tally(context.Background(), x.k, x.at); err != nil || tl.All.Passed != 3 {
		t.Fatalf("passed %d (%v), want 3: r0, e and x", tl.All.Passed, err)
	}
}

// lostAndWrittenAgain: a write that moves r1's horizon alone is read by the call and then lost;
// another that moves r2's horizon alone follows, from the same state. Both raise the write count
// from the same number at the same observation time, so the head is the one the call read: only
// the buckets' write stamp (or, without the count, the buckets) tell the store that its buckets
// are not. Stored, the call would drop r2's new horizon.
func lostAndWrittenAgain(t *testing.T, withCount bool) {
	x := newLostWritesRig(t, "lost-again", withCount)
	r1, r2 := x.ob("r1", x.occ-2e6, x.occ), x.ob("r2", x.occ-3e6, x.occ)
	x.otherApplies(t, x.ob("r0", x.occ, x.occ), r1, r2) // r0 holds the watermark
	saved := x.save(t)
	r1.Occurred, r1.Assessed = x.occ-1e6, x.occ-5e5 // older, occurred later: r1's horizon alone
	x.otherApplies(t, r1)
	st := x.mine.keys(x.k)[1]
	read := x.c.HGet(context.Background(), st, "H").Val()
	r2.Occurred, r2.Assessed = x.occ-15e5, x.occ-5e5
	x.mine.afterRead = func() {
		x.lose(t, saved)
		x.otherApplies(t, r2)
		if h := x.c.HGet(context.Background(), st, "H").Val(); h != read {
			t.Fatal("the head after the second write is not the one the call read: the test proves nothing")
		}
	}
	if stored, refused := x.mineApplies(t, x.ob("e", x.occ, x.occ)); stored != 0 || refused != 1 {
		t.Fatalf("the store took %d calls and refused %d; want the call refused", stored, refused)
	}
	for _, r := range fingerprintedRecords(t, x.c, x.mine, x.k) {
		if r.occurred == x.occ-3e6 && r.horizon != r2.Occurred {
			t.Fatalf("r2's horizon is %d, want %d: the second write was lost", r.horizon, r2.Occurred)
		}
	}
}

// lostAndComputedAgain: another processor's computed call counts p, which the call reads, and
// Redis loses it; the same processor then counts q from the same state. p and q are alike (class,
// occurrence, index group), so the head and every state field the call read are as it read them
// (its own record occurred in another index group): only the buckets' write stamp, which store.lua
// makes new, or the buckets tell the store that q is in them and p is not. Stored, the call would
// put p's record in q's place: q counted with no record, counted again when it comes again.
// fromOld starts from the head and store the build before the count left.
func lostAndComputedAgain(t *testing.T, withCount, fromOld bool) {
	x := newLostWritesRig(t, "lost-computed", withCount)
	early := x.occ - 6*hourUS // another index group, within the retention
	x.otherApplies(t, x.ob("r0", x.occ, x.occ), x.ob("r1", early, early))
	if fromOld {
		x.asBuildBefore()
	}
	computes := func(o Observation) {
		s0, _ := x.computing.ComputedCalls()
		x.computing.skipReads = 0
		if _, err := x.computing.Apply(context.Background(), []Observation{o}, x.at); err != nil {
			t.Fatal(err)
		}
		if s1, _ := x.computing.ComputedCalls(); s1 != s0+1 {
			t.Fatal("the other processor's call was not computed: the test proves nothing")
		}
		if x.withoutCount {
			x.asBuildBefore()
		}
	}
	saved := x.save(t)
	computes(x.ob("p", x.occ, x.occ))
	// The state but the id index, which lists p or q in their group, one the call does not read.
	st := x.mine.keys(x.k)[1]
	state := func() string {
		h := x.c.HGetAll(context.Background(), st).Val()
		for f := range h {
			if f[0] == 'i' {
				delete(h, f)
			}
		}
		return fmt.Sprint(h)
	}
	read := state()
	x.mine.afterRead = func() {
		x.lose(t, saved)
		computes(x.ob("q", x.occ, x.occ))
		if state() != read {
			t.Fatal("the state after q is not the one the call read: the test proves nothing")
		}
	}
	if stored, refused := x.mineApplies(t, x.ob("e", early, early)); stored != 0 || refused != 1 {
		t.Fatalf("the store took %d calls and refused %d; want the call refused", stored, refused)
	}
	if got := x.otherApplies(t, x.ob("q", x.occ, x.occ)); got.Outcomes[0] != Duplicate {
		t.Fatalf("q again: %v, want duplicate", got.Outcomes)
	}
}

// beforeBucketsHook runs before once, ahead of the first pipeline that reads key with HMGET (and
// nothing else, when only is set): the computed path's second round trip, which reads a call's
// buckets after its head, and with a call planned anew from that head (layout 11, readAgain) its
// state too.
type beforeBucketsHook struct {
	key    string
	only   bool
	before func()
}

func (h *beforeBucketsHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *beforeBucketsHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (h *beforeBucketsHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		reads, others := false, false
		for _, cmd := range cmds {
			if a := cmd.Args(); len(a) >= 2 && fmt.Sprint(a[0]) == "hmget" && fmt.Sprint(a[1]) == h.key {
				reads = true
			} else {
				others = true
			}
		}
		if reads && !(h.only && others) && h.before != nil {
			f := h.before
			h.before = nil
			f()
		}
		return next(ctx, cmds)
	}
}

// lostAndStampedAgain: the buckets' stamp runs ahead of Redis's clock, so every write makes it one
// more. The processor's call reads the stamp and token its last call left (c), and Redis then
// loses that last call; another writer counts e, whose stamp is the lost call's again, as is the
// store's shape. Only the lost call's token, gone with it, tells the store that the buckets are not
// those the call read: stored, the call would put c's record back uncounted and drop e's.
func lostAndStampedAgain(t *testing.T) {
	x := newLostWritesRig(t, "lost-stamped", true)
	ctx := context.Background()
	// d occurs in another index group than c and e, one the call reads without them.
	early := x.occ - 6*hourUS
	x.otherApplies(t, x.ob("r0", x.occ, x.occ), x.ob("r1", early, early))
	x.stampAhead(t)
	x.mineStores(t, "a")
	saved := x.save(t)
	x.mineStores(t, "c")
	lost := x.c.HGet(ctx, x.mine.keys(x.k)[2], bucketsWritten).Val()
	x.mine.afterRead = func() {
		x.lose(t, saved)
		x.otherApplies(t, x.ob("e", x.occ, x.occ))
		if again := x.c.HGet(ctx, x.mine.keys(x.k)[2], bucketsWritten).Val(); again != lost {
			t.Fatalf("the stamp after e is %s, the lost call's %s: the test proves nothing", again, lost)
		}
	}
	if stored, refused := x.mineApplies(t, x.ob("d", early, early)); stored != 0 || refused != 1 {
		t.Fatalf("the store took %d calls and refused %d; want the call refused", stored, refused)
	}
	if got := x.otherApplies(t, x.ob("e", x.occ, x.occ)); got.Outcomes[0] != Duplicate {
		t.Fatalf("e sent again: %v, want duplicate", got.Outcomes[0])
	}
	if tl, err := x.other.Tally(ctx, x.k, x.at); err != nil || tl.All.Passed != 5 {
		t.Fatalf("passed %d (%v), want 5: r0, r1, a, e and d", tl.All.Passed, err)
	}
}
