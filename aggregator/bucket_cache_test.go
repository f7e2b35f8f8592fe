package aggregator

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestLayout11CallsTakeTheBucketsTheyLeftFromTheCache: once a processor has stored a call on an
// aggregate, its next calls read the buckets' token and write stamp alone in place of the buckets
// its stored calls read and left, and read the others with them; every call stores what apply.lua
// stores, byte for byte, on Redis and on the embedded server.
func TestLayout11CallsTakeTheBucketsTheyLeftFromTheCache(t *testing.T) {
	x := newComputedSidesIn(t, "bucket-cache", 24*time.Hour, 0, testFingerprinter(t))
	base := floorDiv(Micros(t0), hourUS)*hourUS + 30*minuteUS
	at := time.UnixMicro(base + 60e6)
	var sent []Observation
	batch := func(k Key, n int) []Observation {
		var b []Observation
		for range n {
			b = append(b, Observation{Key: k, OpportunityID: fmt.Sprint("o-", len(sent)), Class: Class(1 + len(sent)%3), Occurred: base, Assessed: base})
			sent = append(sent, b[len(b)-1])
		}
		return b
	}
	reads := func() (read, cached [2]int64) {
		for i, s := range x.stores[1:] {
			read[i], cached[i] = s.BucketReads()
		}
		return read, cached
	}
	small := Key{Scope: collisionScopes[0], CorrectionID: "bucket-cache", Source: Live}
	x.apply("the aggregate", batch(small, 3), at)
	x.apply("its first computed call", batch(small, 3), at)
	read0, cached0 := reads()
	for i := range read0 {
		if read0[i] == 0 || cached0[i] != 0 {
			t.Fatalf("%s, before any call was stored: %d buckets read, %d cached; want some read, none cached", x.names[i+1], read0[i], cached0[i])
		}
	}
	// A store of 6 records has one bucket: the call that stored it left it.
	x.apply("a call on the bucket the last call left", batch(small, 2), at)
	read1, cached1 := reads()
	for i := range read1 {
		if read1[i] != read0[i] || cached1[i] != 1 {
			t.Fatalf("%s: %d buckets read from Redis and %d taken from the cache, want 0 and 1", x.names[i+1], read1[i]-read0[i], cached1[i])
		}
	}
	// An aggregate apply.lua made with 400 records in about 60 buckets: the computed calls meet
	// buckets they read or left before and buckets they have not met, in one call.
	big := Key{Scope: collisionScopes[1], CorrectionID: "bucket-cache", Source: Live}
	x.apply("an aggregate of 400 records", batch(big, 400), at)
	both := 0
	for i := range 30 {
		r0, c0 := reads()
		// with two duplicates: records the calls find in their buckets
		x.apply(fmt.Sprint("call ", i), append(batch(big, 3), sent[3*i], sent[3*i+1]), at)
		r1, c1 := reads()
		if r1[0]-r0[0] != r1[1]-r0[1] || c1[0]-c0[0] != c1[1]-c0[1] {
			t.Fatalf("call %d: the computed sides read %v and took %v from the cache", i, r1, c1)
		}
		if r1[0] > r0[0] && c1[0] > c0[0] {
			both++
		}
	}
	for i, s := range x.stores[1:] {
		stored, refused := s.ComputedCalls()
		read, cached := s.BucketReads()
		t.Logf("%s: %d calls stored, %d refused; %d buckets read, %d cached", x.names[i+1], stored, refused, read, cached)
		if refused != 0 || stored < 30 {
			t.Fatalf("%s: %d calls stored, %d refused: want every call stored", x.names[i+1], stored, refused)
		}
	}
	if both < 10 {
		t.Fatalf("only %d calls read buckets and took others from the cache, want most", both)
	}
}

// TestCachedBucketsGiveWayToAnotherWritersStamp: another writer moves r1's horizon alone in an
// aggregate whose buckets the processor holds from its last call, which leaves the store's shape
// as it was. The processor's next call, a new record in r1's bucket, finds another stamp and reads
// the bucket again. Taking the cached bucket, it would write r1's record back without its horizon,
// and store.lua, which checks the stamp the call read, would not know.
func TestCachedBucketsGiveWayToAnotherWritersStamp(t *testing.T) {
	x := newLostWritesRig(t, "cache-other", true)
	r1 := x.ob("r1", x.occ-2e6, x.occ)
	x.otherApplies(t, x.ob("r0", x.occ, x.occ), r1) // r0 holds the watermark
	x.mineStores(t, "a")
	x.mineStores(t, "c")
	_, cached := x.mine.BucketReads()
	if cached == 0 {
		t.Fatal("no bucket was taken from the cache: the test proves nothing")
	}
	r1.Occurred, r1.Assessed = x.occ-1e6, x.occ-5e5 // older, occurred later: r1's horizon alone
	x.otherApplies(t, r1)
	x.mineStores(t, "d") // a store of 5 records has one bucket: r1's
	if _, now := x.mine.BucketReads(); now != cached {
		t.Fatalf("%d buckets taken from the cache after another writer's stamp, want none", now-cached)
	}
	for _, r := range fingerprintedRecords(t, x.c, x.mine, x.k) {
		if r.occurred == x.occ-2e6 && r.horizon != r1.Occurred {
			t.Fatalf("r1's horizon is %d, want %d: the other writer's write was lost", r.horizon, r1.Occurred)
		}
	}
}

// TestCachedBucketsForgottenWhenRedisLosesTheWriteThatMadeThem: Redis loses the processor's last
// stored call, which counted c (a failover to a replica behind), and another writer then counts e,
// which leaves the store's shape the one the processor's call left. The processor's buckets hold
// c and not e; Redis's hold e and not c. Sent again, c is counted, and e is a duplicate.
func TestCachedBucketsForgottenWhenRedisLosesTheWriteThatMadeThem(t *testing.T) {
	x := newLostWritesRig(t, "cache-lost", true)
	x.otherApplies(t, x.ob("r0", x.occ, x.occ))
	x.mineStores(t, "a")
	saved := x.save(t)
	x.mineStores(t, "c")
	x.lose(t, saved)
	x.otherApplies(t, x.ob("e", x.occ, x.occ))
	_, cached := x.mine.BucketReads()
	stored0, _ := x.mine.ComputedCalls()
	got, err := x.mine.Apply(context.Background(), []Observation{x.ob("c", x.occ, x.occ)}, x.at)
	if err != nil {
		t.Fatal(err)
	}
	if got.Outcomes[0] != Counted {
		t.Fatalf("c sent again after Redis lost it: %v, want counted", got.Outcomes[0])
	}
	if stored, _ := x.mine.ComputedCalls(); stored != stored0+1 {
		t.Fatal("the call after the loss was not computed: the test proves nothing")
	}
	if _, now := x.mine.BucketReads(); now != cached {
		t.Fatalf("%d buckets taken from the cache after the loss, want none", now-cached)
	}
	if got := x.otherApplies(t, x.ob("e", x.occ, x.occ)); got.Outcomes[0] != Duplicate {
		t.Fatalf("e sent again: %v, want duplicate", got.Outcomes[0])
	}
	if tl, err := x.other.Tally(context.Background(), x.k, x.at); err != nil || tl.All.Passed != 4 {
		t.Fatalf("passed %d (%v), want 4: r0, a, c and e", tl.All.Passed, err)
	}
}

// mineStores has mine compute and store a call counting id, or fails the test.
func (x *lostWritesRig) mineStores(t *testing.T, id string) {
	t.Helper()
	if stored, refused := x.mineApplies(t, x.ob(id, x.occ, x.occ)); stored != 1 || refused != 0 {
		t.Fatalf("%s: the store took %d calls and refused %d; want it stored", id, stored, refused)
	}
}

// TestBucketCacheStaysBounded: past its bound the cache forgets other aggregates' buckets, whole,
// counts each as evicted and never holds more than the bound; an aggregate's buckets under a stamp
// other than the one its call read are forgotten before the call's are kept.
func TestBucketCacheStaysBounded(t *testing.T) {
	c := bucketCache{max: 20_000}
	bucket := func(b int64, n int) storeBucket { return storeBucket{b: b, read: strings.Repeat("r", n)} }
	check := func(what string) {
		t.Helper()
		var sum int64
		for _, s := range c.stores {
			own := int64(cachedStoreOverhead)
			for _, v := range s.buckets {
				own += int64(len(v)) + cachedBucketOverhead
			}
			if own != s.bytes {
				t.Fatalf("%s: a store counts %d bytes, holds %d", what, s.bytes, own)
			}
			sum += own
		}
		if sum != c.bytes || c.bytes > c.max || c.held.Load() != c.bytes {
			t.Fatalf("%s: the cache counts %d bytes, reports %d, holds %d, bound %d", what, c.bytes, c.held.Load(), sum, c.max)
		}
	}
	for i := range 500 {
		k := Key{CorrectionID: fmt.Sprint(i)}
		c.keep(k, "1", "t1", "2", "t2", []storeBucket{bucket(0, 250), bucket(1, 200), {b: 2, read: "x", now: []byte("yy"), changed: true}})
		check(fmt.Sprint("aggregate ", i))
		if s := c.at(k); s == nil || s.stamp != "2" || s.buckets[2] != "yy" || len(s.buckets[0]) != 250 {
			t.Fatalf("aggregate %d: the buckets just kept are not cached as the call left them", i)
		}
	}
	if len(c.stores) > 40 || len(c.stores) < 20 {
		t.Fatalf("%d aggregates cached under a bound of %d bytes", len(c.stores), c.max)
	}
	evicted := c.evicted.Load()
	if evicted != int64(500-len(c.stores)) {
		t.Fatalf("%d aggregates counted as evicted, %d forgotten for room", evicted, 500-len(c.stores))
	}
	k := Key{CorrectionID: "499"}
	c.keep(k, "2", "t2", "3", "t3", []storeBucket{bucket(5, 10)})
	if s := c.at(k); len(s.buckets) != 4 || s.stamp != "3" {
		t.Fatalf("a call under the cached stamp: %d buckets under %q, want the 3 cached and its own under 3", len(s.buckets), s.stamp)
	}
	c.keep(k, "7", "t3", "8", "t8", []storeBucket{bucket(6, 10)})
	if s := c.at(k); len(s.buckets) != 1 || s.stamp != "8" {
		t.Fatalf("a call under another stamp: %d buckets under %q, want its own alone under 8", len(s.buckets), s.stamp)
	}
	check("after another stamp")
	c.keep(k, "8", "t7", "9", "t9", []storeBucket{bucket(7, 10)})
	if s := c.at(k); len(s.buckets) != 1 || s.token != "t9" {
		t.Fatalf("a call under another token: %d buckets under %q, want its own alone under t9", len(s.buckets), s.token)
	}
	check("after another token")
	if c.evicted.Load() != evicted {
		t.Fatalf("buckets forgotten for another stamp or token counted as evicted for room: %d, want %d", c.evicted.Load(), evicted)
	}
	c.keep(k, "9", "t9", "10", "t10", []storeBucket{bucket(8, 30_000)})
	if c.at(k) != nil {
		t.Fatal("one aggregate's buckets past the bound alone are cached")
	}
	if len(c.stores) == 0 || c.evicted.Load() != evicted+1 {
		t.Fatalf("one aggregate's buckets past the bound alone: %d aggregates cached, %d counted as evicted, want the others kept and %d", len(c.stores), c.evicted.Load(), evicted+1)
	}
	check("after buckets past the bound")
	for other := range c.stores {
		c.drop(other)
		break
	}
	check("after dropping an aggregate")
	c.drop(Key{CorrectionID: "no such aggregate"})
	check("after dropping an aggregate not cached")
}

// TestCachedBucketsForgottenWhenALostWriteIsStampedAgain: the buckets' stamp runs ahead of
// Redis's clock (a failover to a host whose clock is behind, a clock stepped back), so every write
// makes it one more. Redis loses the processor's last stored call, which counted c, and another
// writer counts e: its stamp is the lost call's again, and so is the store's shape. Only the lost
// call's token, gone with it, tells the processor that its cached buckets (c, not e) are not
// Redis's: c sent again is counted, and a call after it keeps e's record.
func TestCachedBucketsForgottenWhenALostWriteIsStampedAgain(t *testing.T) {
	x := newLostWritesRig(t, "cache-clock", true)
	ctx := context.Background()
	x.otherApplies(t, x.ob("r0", x.occ, x.occ))
	x.stampAhead(t)
	x.mineStores(t, "a")
	saved := x.save(t)
	x.mineStores(t, "c")
	lost := x.c.HGet(ctx, x.mine.keys(x.k)[2], bucketsWritten).Val()
	x.lose(t, saved)
	x.otherApplies(t, x.ob("e", x.occ, x.occ))
	if again := x.c.HGet(ctx, x.mine.keys(x.k)[2], bucketsWritten).Val(); again != lost {
		t.Fatalf("the stamp after e is %s, the lost call's %s: the test proves nothing", again, lost)
	}
	got, err := x.mine.Apply(ctx, []Observation{x.ob("c", x.occ, x.occ)}, x.at)
	if err != nil {
		t.Fatal(err)
	}
	x.lostCountedAndOthersKept(t, "c", got.Outcomes[0], "r0, a, c, e and f")
}

// TestBucketsCachedOnlyUnderATokenAndStampOneCallWrote: a call that writes no bucket (a duplicate)
// reads the token an earlier computed call left beside a stamp apply.lua made since, for another
// writer's record b. Redis loses that write, and another writer's next write makes the same stamp
// (the stamps run ahead of Redis's clock) and leaves the same token. Had the duplicate's call cached
// its buckets under that pair, the processor would take b for a duplicate and, writing on, drop
// the other writer's record.
func TestBucketsCachedOnlyUnderATokenAndStampOneCallWrote(t *testing.T) {
	x := newLostWritesRig(t, "cache-apply-lost", true)
	ctx := context.Background()
	packed := x.mine.keys(x.k)[2]
	x.otherApplies(t, x.ob("r0", x.occ, x.occ))
	x.stampAhead(t)
	x.mineStores(t, "a")
	token := x.c.HGet(ctx, packed, bucketsToken).Val()
	saved := x.save(t)
	x.otherApplies(t, x.ob("b", x.occ, x.occ))
	lost := x.c.HGet(ctx, packed, bucketsWritten).Val()
	x.mineStores(t, "a") // a duplicate: stored, no bucket written
	x.lose(t, saved)
	x.otherApplies(t, x.ob("e", x.occ, x.occ))
	if s, tk := x.c.HGet(ctx, packed, bucketsWritten).Val(), x.c.HGet(ctx, packed, bucketsToken).Val(); s != lost || tk != token {
		t.Fatalf("after e: stamp %s, token %q; want the lost write's %s and %q: the test proves nothing", s, tk, lost, token)
	}
	got, err := x.mine.Apply(ctx, []Observation{x.ob("b", x.occ, x.occ)}, x.at)
	if err != nil {
		t.Fatal(err)
	}
	x.lostCountedAndOthersKept(t, "b", got.Outcomes[0], "r0, a, b, e and f")
}

// stampAhead makes the aggregate's buckets' write stamp an hour ahead of Redis's clock, as a
// failover to a host whose clock is behind leaves it: every write then makes it one more.
func (x *lostWritesRig) stampAhead(t *testing.T) {
	t.Helper()
	ahead := strconv.FormatInt(time.Now().Add(time.Hour).UnixMicro(), 10)
	if err := x.c.HSet(context.Background(), x.mine.keys(x.k)[2], bucketsWritten, ahead).Err(); err != nil {
		t.Fatal(err)
	}
}

// lostCountedAndOthersKept requires that lost, a record Redis lost and mine sent again, was
// counted (got), that the other writer's e, counted after the loss, is still a duplicate once mine
// has written f on, and that the aggregate counts five passed: want names them.
func (x *lostWritesRig) lostCountedAndOthersKept(t *testing.T, lost string, got Outcome, want string) {
	t.Helper()
	if got != Counted {
		t.Fatalf("%s sent again after Redis lost it: %v, want counted", lost, got)
	}
	x.mineStores(t, "f")
	if again := x.otherApplies(t, x.ob("e", x.occ, x.occ)); again.Outcomes[0] != Duplicate {
		t.Fatalf("e sent again: %v, want duplicate (its record kept)", again.Outcomes[0])
	}
	if tl, err := x.other.Tally(context.Background(), x.k, x.at); err != nil || tl.All.Passed != 5 {
		t.Fatalf("passed %d (%v), want 5: %s", tl.All.Passed, err, want)
	}
}

// TestBucketCacheBoundIsTheSetting: RedisConfig.BucketCacheBytes is the cache's bound (0 the
// default, a negative one refused), and an aggregate's buckets exactly at the bound stay cached
// where one byte more are forgotten.
func TestBucketCacheBoundIsTheSetting(t *testing.T) {
	for _, tc := range []struct {
		set, want int64
	}{{0, DefaultBucketCacheBytes}, {1 << 20, 1 << 20}, {5 << 30, 5 << 30}} {
		s, err := NewRedis(nil, RedisConfig{Retention: time.Hour, BucketCacheBytes: tc.set})
		if err != nil || s.buckets.max != tc.want {
			t.Fatalf("BucketCacheBytes %d: bound %v, %v; want %d", tc.set, s.buckets.max, err, tc.want)
		}
	}
	if _, err := NewRedis(nil, RedisConfig{Retention: time.Hour, BucketCacheBytes: -1}); err == nil {
		t.Fatal("a negative BucketCacheBytes accepted")
	}
	const records = 1000
	at := int64(cachedStoreOverhead + cachedBucketOverhead + records)
	for _, tc := range []struct {
		bound  int64
		cached bool
	}{{at, true}, {at - 1, false}} {
		c := bucketCache{max: tc.bound}
		k := Key{CorrectionID: "a"}
		c.keep(k, "1", "t1", "2", "t2", []storeBucket{{b: 0, read: strings.Repeat("r", records)}})
		if got := c.at(k) != nil; got != tc.cached || c.held.Load() > tc.bound {
			t.Fatalf("buckets of %d bytes under a bound of %d: cached %v, holding %d", at, tc.bound, got, c.held.Load())
		}
	}
}
