package suite

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/internal/testenv"
)

// Read (the read API, the pages, the stream's catch-up and rebuild call it) is not read-only: it
// moves each version's missing-run deadline and moves the cases that mature by then from the
// pending set B..'i'<vid> to the matured set B..'x'<vid>. When no case of the version had matured
// before, that ZADD creates B..'x'<vid>, and Read (ttl 0) gives it no TTL. These tests require
// what TestSuiteKeysAllExpire requires of Apply: every key the store writes expires with the
// suite; and that a suite that expired after such a Read starts a new history that applies.

// readTTLSetup applies one run of three planned (its case not matured yet) under an idle TTL of
// idle, then reads the suite two hours later, when the case has matured.
func readTTLSetup(t *testing.T, client *redis.Client, idle time.Duration) (*Redis, string, Key) {
	t.Helper()
	ctx := context.Background()
	prefix := testenv.Name(t, "readttl")
	testenv.CleanPrefix(t, client, prefix)
	cfg := Config{MinHistory: 2, MissingAfter: time.Minute}
	store, err := NewRedis(client, aggregator.RedisConfig{Prefix: prefix, Retention: time.Hour, IdleTTL: idle}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	k := Key{"w", "s"}
	old := RunObservation{Key: RunKey{Key: k, Version: "v1", Case: "old", RunIndex: 0},
		Record: RunRecord{Result: 'p', VersionSeq: 1, Runs: 3, Occurred: aggregator.Micros(t0), Assessed: aggregator.Micros(t0)}}
	applied, err := store.Apply(ctx, []RunObservation{old}, t0)
	if err != nil {
		t.Fatal(err)
	}
	if n := applied.Summaries[k].Versions[0].MissingTotal; n != 0 {
		t.Fatalf("the case must not have matured at the apply: %d missing", n)
	}
	sum, err := store.Read(ctx, k, t0.Add(2*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if len(sum.Versions) != 1 || sum.Versions[0].MissingTotal != 2 {
		t.Fatalf("the read must list the matured case with 2 missing runs: %+v", sum.Versions)
	}
	return store, prefix, k
}

// TestReadLeavesNoKeyWithoutTTL: after a Read that matures a case, every key of the
// suite still expires within the idle TTL.
func TestReadLeavesNoKeyWithoutTTL(t *testing.T) {
	advBackends(t, true, func(t *testing.T, client *redis.Client) {
		ctx := context.Background()
		_, prefix, _ := readTTLSetup(t, client, time.Hour)
		keys := client.Keys(ctx, prefix+"*").Val()
		if len(keys) < 5 {
			t.Fatalf("only %d keys: %v", len(keys), keys)
		}
		for _, key := range keys {
			if ttl := client.PTTL(ctx, key).Val(); ttl <= 0 || ttl > time.Hour {
				t.Errorf("key %q has TTL %v after a Read, want within the idle TTL of 1h", key, ttl)
			}
		}
	})
}

// TestNewHistoryAfterReadAndExpiry: a suite read once its case matured, then idle past
// its TTL, starts a new history: the next batch applies and lists only the new history's cases.
// The matured set left without a TTL outlived the suite, its version id is handed out again
// (the id counter expired), and the new version's read-back reads the old case's cell, which no
// longer exists.
func TestNewHistoryAfterReadAndExpiry(t *testing.T) {
	ctx := context.Background()
	check := func(t *testing.T, client *redis.Client, store *Redis, prefix string, k Key) {
		t.Helper()
		runsKey, _ := store.keys(k)
		if n := client.Exists(ctx, runsKey).Val(); n != 0 {
			t.Fatalf("the suite's runs did not expire")
		}
		left := client.Keys(ctx, prefix+"*").Val()
		fresh := RunObservation{Key: RunKey{Key: k, Version: "w1", Case: "new", RunIndex: 0},
			Record: RunRecord{Result: 'f', VersionSeq: 1, Runs: 1, Occurred: aggregator.Micros(t0), Assessed: aggregator.Micros(t0)}}
		at := t0.Add(5 * time.Hour)
		applied, err := store.Apply(ctx, []RunObservation{fresh}, at)
		if err != nil {
			t.Fatalf("the first batch of the suite's new history fails (keys left after expiry: %v): %v", left, err)
		}
		for _, v := range applied.Summaries[k].Versions {
			for _, m := range v.Missing {
				t.Errorf("version %s lists case %q of the expired history as missing %d runs", v.Version, m.CaseID, m.Count)
			}
		}
	}
	t.Run("embedded", func(t *testing.T) {
		m := miniredis.RunT(t)
		client := redis.NewClient(&redis.Options{Addr: m.Addr()})
		t.Cleanup(func() { client.Close() })
		store, prefix, k := readTTLSetup(t, client, time.Hour)
		m.FastForward(2 * time.Hour)
		check(t, client, store, prefix, k)
	})
	t.Run("redis", func(t *testing.T) {
		client := testenv.Redis(t)
		const idle = 800 * time.Millisecond
		store, prefix, k := readTTLSetup(t, client, idle)
		runsKey, _ := store.keys(k)
		// Real expiry: wait for the runs hash to go (at most a few seconds).
		deadline := time.Now().Add(10 * idle)
		for client.Exists(ctx, runsKey).Val() != 0 && time.Now().Before(deadline) {
			time.Sleep(idle / 8)
		}
		check(t, client, store, prefix, k)
	})
}
