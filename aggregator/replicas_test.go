package aggregator

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/repeatrate/repeatrate/internal/testenv"
)

// With WaitReplicas, a commit is verified only once the replica acknowledged every write before
// it: what Verify vouches for is on the replica when it returns; a stopped replica makes Verify
// report ErrReplicasBehind (the commit waits) without calling the writes lost, and once the
// replica is back the same Verify passes. A check alone (upTo 0) does not wait.
func TestVerifyWaitsForReplicas(t *testing.T) {
	ctx := context.Background()
	primary, replica := testenv.StartReplicated(t)
	cfg := RedisConfig{Prefix: "rr", Retention: 30 * 24 * time.Hour, Group: "g", WaitReplicas: 1, WaitTimeout: 200 * time.Millisecond}
	store, err := NewRedis(primary.Client, cfg)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	apply := func(b int) int64 {
		t.Helper()
		obs := []Observation{{Key: keyLive, OpportunityID: fmt.Sprint("o", b), Class: Confirmed, Occurred: Micros(now), Assessed: Micros(now)}}
		if _, err := store.Apply(ctx, obs, now); err != nil {
			t.Fatal(err)
		}
		mark, err := store.Seal(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		return mark
	}
	commit := func(off int64) Offsets { return Offsets{"in": {0: off}} }

	mark := apply(0)
	if err := store.Verify(ctx, mark, commit(1)); err != nil {
		t.Fatalf("replica in sync: %v", err)
	}
	// Acknowledged means on the replica now: the aggregate's state and the recorded commit.
	if n := replica.Client.HLen(ctx, store.keys(keyLive)[0]).Val(); n != 1 {
		t.Errorf("replica holds %d records after Verify, want 1", n)
	}
	if off := replica.Client.HGet(ctx, store.offsetsKey(), "in/0").Val(); off != "1" {
		t.Errorf("replica's recorded commit is %q after Verify, want 1", off)
	}

	if err := replica.Proc.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	mark = apply(1)
	begin := time.Now()
	err = store.Verify(ctx, mark, commit(2))
	if !errors.Is(err, ErrReplicasBehind) || errors.Is(err, ErrWritesLost) || !strings.Contains(err.Error(), "0 of 1 replicas") {
		t.Fatalf("replica stopped: Verify returned %v, want ErrReplicasBehind with 0 of 1 replicas", err)
	}
	if took := time.Since(begin); took < cfg.WaitTimeout || took > 25*cfg.WaitTimeout {
		t.Errorf("Verify took %v with a wait timeout of %v", took, cfg.WaitTimeout)
	}
	if err := store.Verify(ctx, 0, nil); err != nil {
		t.Fatalf("a check alone waits for nothing: %v", err)
	}
	if err := replica.Proc.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for err = store.Verify(ctx, mark, commit(2)); err != nil; err = store.Verify(ctx, mark, commit(2)) {
		if !errors.Is(err, ErrReplicasBehind) || time.Now().After(deadline) {
			t.Fatalf("replica back: %v", err)
		}
	}
	if n := replica.Client.HLen(ctx, store.keys(keyLive)[0]).Val(); n != 2 {
		t.Errorf("replica holds %d records, want 2", n)
	}

	// More replicas than there are: never acknowledged, and the error says how many did.
	two := cfg
	two.WaitReplicas = 2
	store2, err := NewRedis(primary.Client, two)
	if err != nil {
		t.Fatal(err)
	}
	store2.cfg.Pending, store2.sealKey, store2.sealSeq = store.cfg.Pending, store.sealKey, store.sealSeq
	if err := store2.Verify(ctx, mark, commit(2)); !errors.Is(err, ErrReplicasBehind) || !strings.Contains(err.Error(), "1 of 2 replicas") {
		t.Fatalf("two replicas wanted, one there: %v", err)
	}
}

// The verify script and WAIT share a pipeline on the marks' primary; a Redis that lost its script
// cache (a restart, SCRIPT FLUSH) still verifies.
func TestVerifyAndWaitLoadsTheScript(t *testing.T) {
	ctx := context.Background()
	primary, _ := testenv.StartReplicated(t)
	store, err := NewRedis(primary.Client, RedisConfig{Prefix: "rr", Retention: time.Hour, WaitReplicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if _, err := store.Apply(ctx, []Observation{{Key: keyLive, OpportunityID: "o", Class: Passed, Occurred: Micros(now), Assessed: Micros(now)}}, now); err != nil {
		t.Fatal(err)
	}
	mark, err := store.Seal(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := primary.Client.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := store.Verify(ctx, mark, nil); err != nil {
		t.Fatal(err)
	}
	if n, err := primary.Client.Do(ctx, "SCRIPT", "EXISTS", verifyScript.Hash()).Slice(); err != nil || n[0] != int64(1) {
		t.Fatalf("verify script loaded: %v %v", n, err)
	}
}
