package cluster

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/internal/testenv"
)

// A write that a reshard redirects is never acknowledged outside a pending token. go-redis
// follows a MOVED (or ASK) by re-sending the command after the rest of its pipeline, so the write
// reached its new shard after the pipeline's token writes, which its stale slot map had sent to
// the old shard: no token vouched for it there, and a failover of that shard to a lagging replica
// could lose it unseen. Here the slot of an aggregate moves to another primary while the store's
// client still maps it to the old one: the batch that writes it must fail (before: it was
// acknowledged, written on the new shard after every token of its pipeline), and applied again,
// as the processor's stage retries it, count once and leave a token of this process on the new
// shard. (On the importing side of a slot still migrating, the scripts never run: they declare
// keys that do not all exist, which Redis answers TRYAGAIN.)
func TestRedirectedWriteIsAppliedAgainUnderItsShardsToken(t *testing.T) {
	ctx := context.Background()
	addrs := redisCluster(t)
	// No periodic reload of the slot map: the move below stays unseen until a MOVED.
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, MaxRedirects: 8, ClusterStateReloadInterval: time.Hour,
		DialTimeout: time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second})
	t.Cleanup(func() { c.Close() })
	prefix := testenv.Name(t, "redirect")
	cleanPrefix(t, c, prefix)
	store := newStore(t, c, prefix)
	model := aggregator.NewModel(30 * 24 * time.Hour)
	apply := func(b int) (aggregator.Applied, error) { return store.Apply(ctx, batch(b, 1), t0.Add(time.Hour)) }
	if err := until(t, "first batch", func() error { _, err := apply(0); return err }); err != nil {
		t.Fatal(err)
	}
	model.Apply(ctx, batch(0, 1), t0.Add(time.Hour))
	if _, err := store.Seal(ctx, nil); err != nil {
		t.Fatal(err)
	}

	key := prefix + ":{" + aggKey(0).String() + "}:s"
	move := startSlotMove(t, c, key)
	keys, err := move.src.ClusterGetKeysInSlot(ctx, int(move.slot), 10000).Result()
	if err != nil || len(keys) == 0 {
		t.Fatalf("keys of slot %d: %v %v", move.slot, keys, err)
	}
	move.migrate(keys...)
	move.finish()
	// The slot is the target's; the store's client still maps it to the source.
	if _, err := apply(1); err == nil || !strings.Contains(err.Error(), "MOVED") {
		t.Fatalf("a batch whose write was redirected (MOVED) to %s: %v; want it refused, not written after its pipeline's tokens", move.to.addr, err)
	}
	// Applied again, as the processor's stage retries it, once the client follows the new map.
	var got aggregator.Applied
	if err := until(t, "batch after the move", func() (err error) { got, err = apply(1); return err }); err != nil {
		t.Fatal(err)
	}
	want, _ := model.Apply(ctx, batch(1, 1), t0.Add(time.Hour))
	talliesOfModel(t, "after the move", got, want)
	m, err := store.Seal(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := until(t, "verify", func() error { return store.Verify(ctx, m, nil) }); err != nil {
		t.Fatal(err)
	}
	dst := redis.NewClient(&redis.Options{Addr: move.to.addr})
	defer dst.Close()
	tokens, err := dst.Keys(ctx, prefix+":{*}:pending:*").Result()
	if err != nil || len(tokens) == 0 {
		t.Fatalf("no pending token of this process on %s, the aggregate's shard now: %v %v", move.to.addr, tokens, err)
	}
	t.Logf("slot %d (%d keys) moved from %s to %s; tokens there: %s", move.slot, len(keys), move.from.addr, move.to.addr, fmt.Sprint(tokens))
}
