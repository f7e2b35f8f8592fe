package aggregator

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// A commit's record ages with its batch. Redis that loses only its newest writes — everything
// after a batch's seal, which is what AOF everysec or a failover to a slightly lagging replica
// loses once the commit delay has aged the batch — still holds the record of the offsets the
// group then commits, so the next generation does not stop with a false "state lost". Before the
// seal recorded the offsets, the record was Verify's write right before the commit, the newest of
// all, and CheckOffsets failed here with ErrStateLost.
func TestCommitRecordAgesWithItsBatch(t *testing.T) {
	ctx := context.Background()
	a, client := testStore(t, "commitrecord", RedisConfig{Retention: time.Hour, Group: "g"})
	m1, err := a.Seal(ctx, Offsets{"in": {0: 10}})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Verify(ctx, m1, Offsets{"in": {0: 10}}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Apply(ctx, []Observation{obs("x", Confirmed, 0, 0, 0)}, t0); err != nil {
		t.Fatal(err)
	}
	m2, err := a.Seal(ctx, Offsets{"in": {0: 20}, "other": {3: 5}})
	if err != nil {
		t.Fatal(err)
	}
	sealed := dumpPrefix(t, client, a.cfg.Prefix)
	// Right before the commit: the check and its own record, then the commit (of 20 and 5).
	if err := a.Verify(ctx, m2, Offsets{"in": {0: 20}, "other": {3: 5}}); err != nil {
		t.Fatal(err)
	}
	// Redis loses everything after the seal.
	restorePrefix(t, client, a.cfg.Prefix, sealed)
	b, err := NewRedis(client, a.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.CheckOffsets(ctx, Offsets{"in": {0: 20}, "other": {3: 5}}); err != nil {
		t.Fatalf("only the commit's check was lost, the batch survived: %v", err)
	}
	// A loss that reaches the batch still stops the processor.
	if err := b.CheckOffsets(ctx, Offsets{"in": {0: 21}}); !errors.Is(err, ErrStateLost) {
		t.Fatalf("committed past the sealed batch: %v, want ErrStateLost", err)
	}

	// A seal that finds the previous mark lost records nothing of its batch.
	client.Set(ctx, a.sealKey, m1, 0)
	if _, err := a.Seal(ctx, Offsets{"in": {0: 99}}); !errors.Is(err, ErrWritesLost) && !errors.Is(err, ErrStateLost) {
		t.Fatalf("seal after a loss: %v", err)
	}
	if got, _ := client.HGet(ctx, a.offsetsKey(), "in/0").Result(); got != "20" {
		t.Fatalf("a seal that found a loss recorded in/0 = %s, want 20 kept", got)
	}
}

// dumpPrefix returns every key of the namespace, serialized.
func dumpPrefix(t *testing.T, client *redis.Client, prefix string) map[string]string {
	t.Helper()
	ctx := context.Background()
	keys, err := client.Keys(ctx, prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]string, len(keys))
	for _, k := range keys {
		v, err := client.Dump(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		out[k] = v
	}
	return out
}

// restorePrefix puts the namespace back as dumped: keys written since are deleted.
func restorePrefix(t *testing.T, client *redis.Client, prefix string, dumped map[string]string) {
	t.Helper()
	ctx := context.Background()
	keys, err := client.Keys(ctx, prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if _, ok := dumped[k]; !ok {
			client.Del(ctx, k)
		}
	}
	for k, v := range dumped {
		if err := client.RestoreReplace(ctx, k, 0, v).Err(); err != nil {
			t.Fatal(err)
		}
	}
}
