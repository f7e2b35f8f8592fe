package cluster

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/aggregator/suite"
	"github.com/repeatrate/repeatrate/internal/testenv"
)

// A suite whose slot is half moved is never applied. The suite script reads and writes keys per
// version beside its first two; declaring only those two, it ran on the source of a migrating
// slot and failed at the first key already moved, after writes Redis does not roll back: here
// the whole batch, since the moved key is only touched at the end, to refresh its expiry (and on
// the target, asked there, it read keys not yet moved as empty). Declaring every key it touches,
// it is refused on either side until the slot has moved: here the batch during the move must
// leave every key of the suite as it was, on both nodes, and once the move is done the batch
// applied again must give what the in-memory model gives.
func TestSuiteIsNotAppliedOnAHalfMovedSlot(t *testing.T) {
	ctx := context.Background()
	addrs := redisCluster(t)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, MaxRedirects: 8, ClusterStateReloadInterval: time.Hour,
		DialTimeout: time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second})
	t.Cleanup(func() { c.Close() })
	prefix := testenv.Name(t, "suitemove")
	cleanPrefix(t, c, prefix)
	cfg := suite.Config{MinHistory: 1, MissingAfter: time.Hour}
	store, err := suite.NewRedis(c, aggregator.RedisConfig{Prefix: prefix, Retention: 30 * 24 * time.Hour, Pending: aggregator.NewPending()}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	model := suite.NewMemory(cfg)
	k := suite.Key{Workspace: "w", Suite: prefix} // a slot of its own run (its keys' hash tag)
	runs := func(version string, seq int64, from int) []suite.RunObservation {
		var out []suite.RunObservation
		for i := range 6 {
			res := byte('p')
			if (from+i)%3 == 0 {
				res = 'f'
			}
			at := aggregator.Micros(t0.Add(time.Duration(from+i) * time.Second))
			out = append(out, suite.RunObservation{Key: suite.RunKey{Key: k, Version: version, Case: fmt.Sprintf("c%d", i), RunIndex: 0},
				Record: suite.RunRecord{Result: res, VersionSeq: seq, Runs: 2, Occurred: at, Assessed: at}})
		}
		return out
	}
	at := t0.Add(time.Hour)
	apply := func(obs []suite.RunObservation) (suite.Applied, error) { return store.Apply(ctx, obs, at) }
	for i, obs := range [][]suite.RunObservation{runs("v1", 1, 0), runs("v2", 2, 10)} {
		if err := until(t, "apply", func() error { _, err := apply(obs); return err }); err != nil {
			t.Fatalf("batch %d: %v", i, err)
		}
		model.Apply(ctx, obs, at)
	}

	// A revived case announced: the suite's announced set exists (an absent declared key alone
	// would have the script refused during the move).
	if err := store.MarkAnnounced(ctx, k, []string{"c0"}); err != nil {
		t.Fatal(err)
	}
	model.MarkAnnounced(ctx, k, []string{"c0"})

	// The suite's keys, and the slot they share.
	var base string
	nodes := map[string]*redis.Client{}
	c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
		nodes[n.Options().Addr] = n
		return nil
	})
	var keys []string
	for _, n := range nodes {
		ks, err := n.Keys(ctx, prefix+":*").Result()
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, ks...)
	}
	for _, key := range keys {
		if strings.HasSuffix(key, ":r") {
			base = strings.TrimSuffix(key, "r")
		}
	}
	if base == "" {
		t.Fatalf("no runs hash among %q", keys)
	}
	move := startSlotMove(t, c, base+"r")
	src := move.src
	dst := redis.NewClient(&redis.Options{Addr: move.to.addr})
	defer dst.Close()
	// Half moved: the sums of the first version, which the batch does not touch but whose expiry
	// it refreshes last, are on the target.
	move.migrate(base + "h1")
	dump := func() map[string]string {
		out := map[string]string{}
		for _, n := range []*redis.Client{src, dst} {
			ks, _ := n.Keys(ctx, base+"*").Result()
			for _, key := range ks {
				v, _ := n.Dump(ctx, key).Result()
				out[n.Options().Addr+" "+key] = v
			}
		}
		return out
	}
	before := dump()
	third := runs("v3", 3, 20)
	third = append(third, runs("v2", 2, 30)...)
	if _, err := apply(third); err == nil {
		t.Fatal("a batch on a half-moved suite was applied")
	} else {
		t.Logf("the batch during the move: %v", err)
	}
	if after := dump(); !reflect.DeepEqual(before, after) {
		for key := range after {
			if before[key] != after[key] {
				t.Errorf("%s changed", key)
			}
		}
		t.Fatalf("the refused batch wrote to the half-moved suite")
	}

	// The rest moves; the batch applied again counts as the model does.
	move.finish()
	var got suite.Applied
	if err := until(t, "batch after the move", func() (err error) { got, err = apply(third); return err }); err != nil {
		t.Fatal(err)
	}
	want, _ := model.Apply(ctx, third, at)
	g, w := *got.Summaries[k], *want.Summaries[k]
	g.SnapshotVersion, w.SnapshotVersion = 0, 0
	if !reflect.DeepEqual(g, w) {
		t.Fatalf("after the move the suite is\n%+v\nthe model's\n%+v", g, w)
	}
	t.Logf("slot %d moved from %s to %s in two steps; %d keys", move.slot, move.from.addr, move.to.addr, len(keys))
}
