package cluster

import (
	"context"
	"maps"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/internal/testenv"
	"github.com/repeatrate/repeatrate/schemas"
)

// A batch's tokens go where its writes went, or the batch is applied again. Append picks the token
// shards from the writer's slot map while the pipeline is built, and go-redis reads the map again
// when it runs the pipeline; a reload in between (the one Append's own lookups start once the map
// is old, or one a MOVED of an earlier pipeline started) sent the writes by the new map and the
// tokens by the old one, and the batch was acknowledged with no token on the shard that took its
// write: that shard losing the write (a failover to a replica one batch behind) went unseen. The
// reload is forced into that window by a pipeline hook on the writer. The batch must be refused
// (the owners changed while it was written), and applied again it must count once and leave
// a token where its write is.
func TestTokenShardsComeFromTheMapTheWritesUse(t *testing.T) {
	ctx := context.Background()
	addrs := redisCluster(t)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, MaxRedirects: 8, ClusterStateReloadInterval: time.Hour,
		DialTimeout: time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second})
	t.Cleanup(func() { c.Close() })
	prefix := testenv.Name(t, "tokenmap")
	cleanPrefix(t, c, prefix)
	pend := aggregator.NewPending()
	store, err := aggregator.NewRedis(c, aggregator.RedisConfig{Prefix: prefix, Retention: 30 * 24 * time.Hour, Pending: pend})
	if err != nil {
		t.Fatal(err)
	}
	// The window is forced only if the writer's map still names the slot's old owner when the
	// batch is written; a reload that an earlier command's redirection started may land first
	// (the batch then writes and tokens by the new map, rightly acknowledged). Such an attempt
	// moves another aggregate's slot, up to five times.
	var k aggregator.Key
	var obs func(b int) []aggregator.Observation
	var move *slotMove
	var dst *redis.Client
	var dataKey string
	for attempt := 0; ; attempt++ {
		if attempt == 5 {
			t.Fatal("the writer's slot map had moved before the batch in five attempts: the window was never forced")
		}
		// An aggregate of this run only, so that its slot is (almost surely) ours to move.
		k = aggregator.Key{Scope: schemas.Scope{Workspace: prefix, Model: "m", Run: "r", Checkpoint: "c", Artifact: "a"},
			CorrectionID: "fix-" + strconv.Itoa(attempt), Source: aggregator.Live}
		obs = func(b int) []aggregator.Observation {
			at := aggregator.Micros(t0.Add(time.Duration(b) * time.Minute))
			return []aggregator.Observation{{Key: k, OpportunityID: "o" + string(rune('a'+b)), Class: aggregator.Confirmed, Occurred: at, Assessed: at}}
		}
		if err := until(t, "first batch", func() error { _, err := store.Apply(ctx, obs(0), t0.Add(time.Hour)); return err }); err != nil {
			t.Fatal(err)
		}
		if _, err := store.Seal(ctx, nil); err != nil {
			t.Fatal(err)
		}
		w := pend.Writer(c).(*redis.ClusterClient) // the very client the store's pipelines run on

		dataKey = prefix + ":{" + k.String() + "}:s"
		move = startSlotMove(t, c, dataKey)
		move.finish() // the slot is the target's now; the writer's map (and c's) still say the source

		if dst != nil {
			dst.Close()
		}
		dst = redis.NewClient(&redis.Options{Addr: move.to.addr})
		before := dumpNode(t, dst, prefix)

		if names, _ := mapNames(ctx, w, dataKey, move.to.addr); names {
			t.Logf("attempt %d: the writer's map showed the move before the batch; another slot", attempt+1)
			continue
		}
		// A reload of the writer's slot map lands after Append picked the token shards and before
		// the pipeline is mapped to nodes.
		armed, movedFirst := true, false
		w.AddHook(reloadBeforeExec{w: w, key: dataKey, want: move.to.addr, armed: &armed, movedFirst: &movedFirst, t: t})
		tokensBefore := dumpNode(t, dst, prefix+":{*}:pending:") // the node's tokens, by key
		_, err = store.Apply(ctx, obs(1), t0.Add(time.Hour))
		if err == nil && (movedFirst || !maps.Equal(dumpNode(t, dst, prefix+":{*}:pending:"), tokensBefore)) {
			// The writer's map named the new owner when the token shards were picked: a reload
			// landed after the check above (one an earlier redirection started, or one that asked
			// a node the move had reached while an earlier one asked a node it had not, so that the
			// map named the new owner, then the old, then the new again). Writes and tokens went
			// by one map, a token of the batch to the shard that took its write: rightly
			// acknowledged, and the window not forced.
			t.Logf("attempt %d: the writer's map showed the move when the batch's token shards were picked; another slot", attempt+1)
			continue
		}
		if err == nil {
			// The target shard loses what it took of this batch (a failover to a replica one batch
			// behind): its keys of the namespace go back to what they were before it.
			restoreNode(t, dst, prefix, before)
			_, err := store.Seal(ctx, nil)
			toks, _ := dst.Keys(ctx, prefix+":{*}:pending:*").Result()
			t.Fatalf("a batch whose slot map moved while it was written was acknowledged; its write on %s then lost, Seal found %v "+
				"(tokens there: %q)", move.to.addr, err, toks)
		}
		break
	}
	defer dst.Close()
	if !strings.Contains(err.Error(), "slot map changed") {
		t.Fatalf("the batch was refused for another reason: %v", err)
	}
	// Applied again on the new map, as the processor's stage retries it.
	var got aggregator.Applied
	if err := until(t, "batch applied again", func() (err error) { got, err = store.Apply(ctx, obs(1), t0.Add(time.Hour)); return err }); err != nil {
		t.Fatal(err)
	}
	if len(got.Outcomes) != 1 || got.Outcomes[0] != aggregator.Counted && got.Outcomes[0] != aggregator.Duplicate {
		t.Fatalf("the batch applied again: %v", got.Outcomes)
	}
	if _, err := store.Seal(ctx, nil); err != nil {
		t.Fatalf("seal after the batch applied again: %v", err)
	}
	if toks, _ := dst.Keys(ctx, prefix+":{*}:pending:*").Result(); len(toks) == 0 {
		t.Fatalf("no token of this process on %s, where the batch's write is", move.to.addr)
	}
}

// mapNames says whether w's slot map names addr as the primary of key.
func mapNames(ctx context.Context, w *redis.ClusterClient, key, addr string) (bool, error) {
	m, err := w.MasterForKey(ctx, key)
	return err == nil && m.Options().Addr == addr, err
}

// reloadBeforeExec reloads w's slot map before the first pipeline it runs once armed, until the
// map names want as key's owner; movedFirst records that it already did before the reload.
type reloadBeforeExec struct {
	w          *redis.ClusterClient
	key        string
	want       string
	armed      *bool
	movedFirst *bool
	t          *testing.T
}

func (h reloadBeforeExec) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h reloadBeforeExec) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return next
}
func (h reloadBeforeExec) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if *h.armed {
			*h.armed = false
			*h.movedFirst, _ = mapNames(ctx, h.w, h.key, h.want)
			h.w.ReloadState(ctx)
			deadline := time.Now().Add(10 * time.Second)
			for {
				names, err := mapNames(ctx, h.w, h.key, h.want)
				if names {
					break
				}
				if time.Now().After(deadline) {
					h.t.Errorf("writer map never showed the move: %v", err)
					break
				}
				time.Sleep(10 * time.Millisecond)
				h.w.ReloadState(ctx)
			}
		}
		return next(ctx, cmds)
	}
}

func dumpNode(t *testing.T, c *redis.Client, prefix string) map[string]string {
	t.Helper()
	ctx := context.Background()
	keys, err := c.Keys(ctx, prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, k := range keys {
		v, err := c.Dump(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		out[k] = v
	}
	return out
}

func restoreNode(t *testing.T, c *redis.Client, prefix string, dumped map[string]string) {
	t.Helper()
	ctx := context.Background()
	keys, err := c.Keys(ctx, prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if _, ok := dumped[k]; !ok {
			c.Del(ctx, k)
		}
	}
	for k, v := range dumped {
		if err := c.RestoreReplace(ctx, k, 0, v).Err(); err != nil {
			t.Fatal(err)
		}
	}
}
