package cluster

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/internal/testenv"
)

// A namespace on Redis Cluster migrates from state layout 10 to 11 while batches keep coming
// (aggregator.Migrate walks every primary): the store computes what the model computes after every
// batch, before, during and after the migration, and every aggregate, on every shard, ends in
// layout 11 with no record hash left.
func TestMigrationOnRedisClusterMatchesModel(t *testing.T) {
	ctx := context.Background()
	addrs := redisCluster(t)
	c := clusterClient(t, addrs)
	prefix := testenv.Name(t, "clustermigrate")
	cleanPrefix(t, c, prefix)
	state, err := aggregator.OpenStateIn(ctx, c, prefix, false, aggregator.Layout10)
	if err != nil {
		t.Fatal(err)
	}
	store, err := aggregator.NewRedis(c, aggregator.RedisConfig{Prefix: state.Namespace, Retention: 30 * 24 * time.Hour,
		Epoch: state.Epoch, Pending: aggregator.NewPending()})
	if err != nil {
		t.Fatal(err)
	}
	model := aggregator.NewModel(30 * 24 * time.Hour)
	var wg sync.WaitGroup
	var migrated aggregator.MigrateProgress
	var migErr error
	for b := range 60 {
		if b == 20 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				migrated, migErr = aggregator.Migrate(ctx, c, prefix, nil)
			}()
		}
		if b == 40 {
			wg.Wait()
			if migErr != nil {
				t.Fatal(migErr)
			}
			// Every aggregate existed before the migration began: none is left for the
			// processors to convert as stragglers.
			for i := range 40 {
				if h := c.HGet(ctx, state.Namespace+":{"+aggKey(i).String()+"}:s", "H").Val(); h == "" || h[0] != 11 {
					t.Fatalf("aggregate %d is not in layout 11 when the migration returns", i)
				}
			}
		}
		obs := batch(b, 40)
		if b%4 == 3 {
			obs = append(obs, batch(b-3, 40)...) // redelivered: duplicates change nothing
		}
		at := t0.Add(time.Duration(b)*time.Minute + time.Second)
		var got aggregator.Applied
		err := until(t, "apply", func() (err error) {
			got, err = store.Apply(ctx, obs, at)
			return err
		})
		if err != nil {
			t.Fatalf("batch %d: %v", b, err)
		}
		want, _ := model.Apply(ctx, obs, at)
		talliesOfModel(t, fmt.Sprintf("batch %d", b), got, want)
	}
	// Every pass visits every aggregate (SCAN on each primary returns every key it holds).
	if migrated.Converted == 0 || !strings.HasSuffix(migrated.Epoch, "/layout11") || migrated.Aggregates < 40*migrated.Passes {
		t.Fatalf("migration: %+v, want every pass to visit the 40 aggregates", migrated)
	}
	shards := map[string]bool{}
	for i := range 40 {
		base := state.Namespace + ":{" + aggKey(i).String() + "}:"
		if h := c.HGet(ctx, base+"s", "H").Val(); h == "" || h[0] != 11 {
			t.Fatalf("aggregate %d is not in layout 11 after the migration", i)
		}
		if c.Exists(ctx, base+"o").Val() != 0 {
			t.Fatalf("aggregate %d keeps its record hash of layout 10", i)
		}
		n, err := c.MasterForKey(ctx, base+"s")
		if err != nil {
			t.Fatal(err)
		}
		shards[n.Options().Addr] = true
	}
	if len(shards) != 3 {
		t.Fatalf("the aggregates live on %d shards, want all 3", len(shards))
	}
	t.Logf("migration %+v", migrated)
}
