package aggregator

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// TestCallsComputedSideBySideAreThoseComputedInTurn holds computeCalls's answer to the order it
// computes in: before every batch of a random stream (duplicates, reassessments, late and early
// events, long ids), a store computing every chunk's calls side by side and one computing them in
// turn read the same state and must return the same calls, argument for argument, and the same
// counts of records read and computed. The stream is then applied, so the state grows batch by
// batch. On the embedded server: nothing else writes, and it needs no service.
func TestCallsComputedSideBySideAreThoseComputedInTurn(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(max(2, runtime.GOMAXPROCS(0))))
	ctx := context.Background()
	inBothLayouts(t, func(t *testing.T, fp *Fingerprinter) {
		m := miniredis.RunT(t)
		c := redis.NewClient(&redis.Options{Addr: m.Addr()})
		cfg := RedisConfig{Prefix: "sbs", Retention: 3 * 24 * time.Hour, ComputeCalls: true, Fingerprint: fp}
		sideBySide, inTurn := mustStore(t, c, cfg), mustStore(t, c, cfg)
		sideBySide.parallelFrom, inTurn.parallelFrom = 1, 1<<40
		same := func() string { return "token" } // layout 11's random tokens, the same on both
		sideBySide.tokens, inTurn.tokens = same, same
		r := rand.New(rand.NewPCG(7, 11))
		clock, compared := t0, 0
		for i, b := range computedStream(r, 12, 120, 80, cfg.Retention) {
			var top int64
			for _, o := range b {
				top = max(top, o.Occurred)
			}
			if at := time.UnixMicro(top + int64(r.IntN(30))*1e6); at.After(clock) {
				clock = at
			}
			packed := fp != nil
			// The in-turn store applies nothing: it expects the window sums where the other's
			// stored calls left them (sumsMinutes), as it reads the state they left.
			inTurn.sums = maps.Clone(sideBySide.sums)
			got, readA, hitA := sideBySide.computeCalls(ctx, sideBySide.Encode(b), clock, packed)
			want, readB, hitB := inTurn.computeCalls(ctx, inTurn.Encode(b), clock, packed)
			if readA != readB || hitA != hitB {
				t.Fatalf("batch %d: side by side read %d records and computed %d, in turn %d and %d", i, readA, hitA, readB, hitB)
			}
			if !reflect.DeepEqual(withoutCacheState(got), withoutCacheState(want)) {
				t.Fatalf("batch %d: side by side computed %s, in turn %s", i, callsOf(got), callsOf(want))
			}
			compared += len(got)
			if _, err := sideBySide.Apply(ctx, b, clock); err != nil {
				t.Fatal(err)
			}
		}
		if compared < 500 {
			t.Fatalf("only %d calls computed and compared: the test proves little", compared)
		}
		t.Logf("%d computed calls compared", compared)
	})
}

// withoutCacheState returns calls without what the bucket cache would keep of them: the side by
// side store stores its calls and caches their buckets, the in-turn one reads every bucket from
// Redis, so a call that writes no bucket keeps its buckets on one side alone (bucketCache).
func withoutCacheState(calls map[Key]*computedCall) map[Key]computedCall {
	out := make(map[Key]computedCall, len(calls))
	for k, cc := range calls {
		c := *cc
		c.buckets, c.readStamp, c.readToken = nil, "", ""
		if len(c.records) == 0 && len(c.deletes) == 0 {
			c.token = "" // the token read, kept only with the buckets
		}
		out[k] = c
	}
	return out
}

// mustStore is a store on c under cfg.
func mustStore(t *testing.T, c *redis.Client, cfg RedisConfig) *Redis {
	t.Helper()
	s, err := NewRedis(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// callsOf names the aggregates of a computation's calls, with how many arguments each stores.
func callsOf(calls map[Key]*computedCall) string {
	s := ""
	for k, cc := range calls {
		s += fmt.Sprintf("%s:%d ", k, len(cc.args))
	}
	return s
}

// TestInParallelCallsEachOnceAndWaits holds what computeCalls relies on when it computes a chunk's
// calls side by side: every index is computed exactly once, whether the calls hold fewer records
// than the threshold (one goroutine) or more, and inParallel returns only once every computation
// has.
func TestInParallelCallsEachOnceAndWaits(t *testing.T) {
	for _, n := range []int{0, 1, 2, 3, 17, 300} {
		for _, records := range []int{0, 255, 256, 10_000} {
			counts := make([]atomic.Int32, n)
			inParallel(n, records, minParallelRecords, func(i int) { counts[i].Add(1) })
			for i := range counts {
				if c := counts[i].Load(); c != 1 {
					t.Fatalf("n %d, records %d: index %d computed %d times", n, records, i, c)
				}
			}
		}
	}

	// One computation held back: inParallel must not return before it does. Two goroutines at
	// least, so that the others are computed meanwhile, on a machine of one core too.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(max(2, runtime.GOMAXPROCS(0))))
	release, returned := make(chan struct{}), make(chan struct{})
	var others atomic.Int32
	const n = 40
	go func() {
		defer close(returned)
		inParallel(n, 1000, minParallelRecords, func(i int) {
			if i == 0 {
				<-release
				return
			}
			others.Add(1)
		})
	}()
	deadline := time.Now().Add(30 * time.Second)
	for others.Load() < n-1 {
		if time.Now().After(deadline) {
			close(release)
			t.Fatalf("%d of the other %d computations done in 30 s", others.Load(), n-1)
		}
		runtime.Gosched()
	}
	select {
	case <-returned:
		t.Fatal("inParallel returned before its held-back computation did")
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	<-returned
}

// TestInParallelComputesSideBySide holds that calls past the threshold are computed on more than
// one goroutine where there is more than one core: the first waits until the second has begun,
// which one goroutine computing them in turn would never do. Two goroutines at least, so that it
// holds on a machine of one core too.
func TestInParallelComputesSideBySide(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(max(2, runtime.GOMAXPROCS(0))))
	second := make(chan struct{})
	failed := make(chan string, 1)
	inParallel(2, minParallelRecords, minParallelRecords, func(i int) {
		if i == 1 {
			close(second)
			return
		}
		select {
		case <-second:
		case <-time.After(30 * time.Second):
			failed <- "the second computation had not begun 30 s after the first"
		}
	})
	select {
	case msg := <-failed:
		t.Fatal(msg)
	default:
	}
}
