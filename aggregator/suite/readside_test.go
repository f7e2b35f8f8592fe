package suite

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/internal/testenv"
)

// The read side (pages, /v1/suites/*, stream catch-ups) reads suites through the same store the
// processor writes with. A read must stay out of the processor's chain of pending tokens: that
// chain is the evidence that a batch's writes survived to its seal, and a token written by a
// reader at any moment would look to the next Seal like lost writes (a rewind of every batch in
// flight although Redis lost nothing) or, after a commit, like lost state.
func TestReadWritesNoPendingToken(t *testing.T) {
	ctx := context.Background()
	_, store, prefix := sharedChainStores(t, "readtoken")
	k := Key{"ws", "suite"}
	if _, err := store.Apply(ctx, readSideRuns(k, 0), t0); err != nil {
		t.Fatal(err)
	}
	before := pendingTokens(t, store, prefix)
	if len(before) == 0 {
		t.Fatal("a batch wrote no pending token: the test sees nothing")
	}
	for range 3 {
		if _, err := store.Read(ctx, k, t0.Add(time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	if after := pendingTokens(t, store, prefix); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("reads changed the pending tokens from %v to %v", before, after)
	}
}

// Readers looping beside the processor's apply → seal → verify cycle never make a seal or a
// verify report lost writes: on real Redis, with the token chain shared by both stores as `run`
// shares it.
func TestReadersBesideBatchesCauseNoRewind(t *testing.T) {
	ctx := context.Background()
	rates, suites, _ := sharedChainStores(t, "readrewind")
	k := Key{"ws", "suite"}
	if _, err := suites.Apply(ctx, readSideRuns(k, 0), t0); err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var reads sync.Map
	for r := range 4 {
		wg.Go(func() {
			n := 0
			for rctx.Err() == nil {
				if _, err := suites.Read(rctx, k, t0); err != nil && rctx.Err() == nil {
					t.Errorf("read: %v", err)
					return
				}
				n++
				reads.Store(r, n)
			}
		})
	}
	// Wait until every reader is under way, so the batches below meet them.
	for deadline := time.Now().Add(time.Minute); ; {
		n := 0
		reads.Range(func(_, _ any) bool { n++; return true })
		if n == 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d of 4 readers started in a minute", n)
		}
		time.Sleep(time.Millisecond)
	}
	for v := 1; v <= 150; v++ {
		if _, err := suites.Apply(ctx, readSideRuns(k, v), t0); err != nil {
			t.Fatalf("batch %d: apply: %v", v, err)
		}
		mark, err := rates.Seal(ctx, nil)
		if err != nil {
			t.Fatalf("batch %d: seal beside readers: %v", v, err)
		}
		if err := rates.Verify(ctx, mark, nil); err != nil {
			t.Fatalf("batch %d: verify beside readers: %v", v, err)
		}
	}
	stop()
	wg.Wait()
}

// sharedChainStores returns a rate store and a suite store on real Redis under a fresh prefix,
// sharing one chain of pending tokens as `run` shares it.
func sharedChainStores(t *testing.T, name string) (*aggregator.Redis, *Redis, string) {
	t.Helper()
	client := testenv.Redis(t)
	prefix := testenv.Name(t, name)
	testenv.CleanPrefix(t, client, prefix)
	rcfg := aggregator.RedisConfig{Prefix: prefix, Retention: time.Hour, Pending: aggregator.NewPending()}
	rates, err := aggregator.NewRedis(client, rcfg)
	if err != nil {
		t.Fatal(err)
	}
	suites, err := NewRedis(client, rcfg, Config{MinHistory: 2, MissingAfter: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return rates, suites, prefix
}

// readSideRuns returns a small batch of version v of suite k: three cases, two runs each.
func readSideRuns(k Key, v int) []RunObservation {
	var obs []RunObservation
	for c := range 3 {
		for run := range int64(2) {
			obs = append(obs, RunObservation{
				Key: RunKey{Key: k, Version: fmt.Sprintf("v%d", v), Case: fmt.Sprintf("c%d", c), RunIndex: run},
				Record: RunRecord{Result: "pf"[(c+v)%2], VersionSeq: int64(v), Runs: 2,
					Occurred: aggregator.Micros(t0), Assessed: aggregator.Micros(t0)},
			})
		}
	}
	return obs
}

// pendingTokens returns every pending-token key under prefix with its value.
func pendingTokens(t *testing.T, s *Redis, prefix string) map[string]string {
	t.Helper()
	ctx := context.Background()
	keys, err := s.client.Keys(ctx, prefix+":*pending*").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, key := range keys {
		out[key] = s.client.Get(ctx, key).Val()
	}
	return out
}
