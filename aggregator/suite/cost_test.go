package suite

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/internal/testenv"
)

// scriptCommands returns how many commands Redis ran inside scripts so far, from INFO
// commandstats (every command but the client's own EVALSHA, INFO and CONFIG).
func scriptCommands(ctx context.Context, c *redis.Client) int64 {
	var n int64
	for _, l := range strings.Split(c.Info(ctx, "commandstats").Val(), "\r\n") {
		name, rest, ok := strings.Cut(strings.TrimPrefix(l, "cmdstat_"), ":calls=")
		if !ok || strings.HasPrefix(name, "eval") || name == "info" || strings.HasPrefix(name, "config") ||
			name == "get" || name == "hello" || name == "client|setinfo" {
			continue
		}
		calls, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
		n += calls
	}
	return n
}

// A batch costs what it changes, not what the suite holds: the commands Redis runs for a batch of
// 500 new runs of one version are the same whether the version holds 500 runs or 20 000. Counted on
// a Redis of the test's own: on the shared one, other packages' tests add to the counters.
func TestSuiteApplyCostDoesNotGrowWithTheSuite(t *testing.T) {
	client := testenv.OwnRedis(t)
	ctx := context.Background()
	prefix := testenv.Name(t, "suitecost")
	testenv.CleanPrefix(t, client, prefix)
	cfg := Config{}
	cfg.Validate()
	store, err := NewRedis(client, aggregator.RedisConfig{Prefix: prefix, Retention: time.Hour}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	batch := func(b int) []RunObservation {
		var obs []RunObservation
		for i := range 500 {
			n := b*500 + i
			obs = append(obs, RunObservation{Key: RunKey{Key: Key{"w", "s"}, Version: "v1", Case: fmt.Sprint("case-", n/5), RunIndex: int64(n % 5)},
				Record: RunRecord{Result: "pf"[n%3/2], VersionSeq: 1, Runs: 5, Occurred: aggregator.Micros(t0), Assessed: aggregator.Micros(t0),
					Reply: true, Tokens: 3 + n%40}})
		}
		return obs
	}
	var costs []int64
	for b := range 40 {
		before := scriptCommands(ctx, client)
		if _, err := store.Apply(ctx, batch(b), t0.Add(2*time.Hour)); err != nil {
			t.Fatal(err)
		}
		costs = append(costs, scriptCommands(ctx, client)-before)
	}
	first, last := costs[1], costs[len(costs)-1]
	if last > first+first/100 {
		t.Fatalf("commands per batch grew with the suite: %d at 1 000 runs, %d at 20 000 (all: %v)", first, last, costs)
	}
	t.Logf("commands per 500-run batch: %v", costs)
}

// Every key the suite store writes expires with the suite: none is left without a TTL, so an idle
// suite leaves nothing behind.
func TestSuiteKeysAllExpire(t *testing.T) {
	client := testenv.Redis(t)
	ctx := context.Background()
	prefix := testenv.Name(t, "suitettl")
	testenv.CleanPrefix(t, client, prefix)
	cfg := Config{MinHistory: 2, MissingAfter: time.Minute}
	cfg.Validate()
	store, err := NewRedis(client, aggregator.RedisConfig{Prefix: prefix, Retention: time.Hour}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	k := Key{"w", "s"}
	var obs []RunObservation
	for v := range 4 {
		for c := range 6 {
			for i := range int64(2) { // of 3 planned: every case misses a run
				obs = append(obs, RunObservation{Key: RunKey{Key: k, Version: fmt.Sprint("v", v), Case: fmt.Sprint("c", c), RunIndex: i},
					// v0–v2 pass, v3 fails: every case is revived.
					Record: RunRecord{Result: "pf"[min(v/3, 1)], VersionSeq: int64(v), Runs: 3, Occurred: aggregator.Micros(t0) + int64(c)*1e9,
						Assessed: aggregator.Micros(t0), Reply: true, Tokens: 10, Trigger: "gzip_ratio"}})
			}
		}
	}
	applied, err := store.Apply(ctx, obs, t0.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if s := applied.Summaries[k]; len(s.Revived) == 0 || s.Versions[0].MissingTotal == 0 {
		t.Fatalf("the batch must leave revived cases and missing runs: %+v", s)
	}
	if err := store.MarkAnnounced(ctx, k, []string{applied.Summaries[k].Revived[0].CaseID}); err != nil {
		t.Fatal(err)
	}
	keys := client.Keys(ctx, prefix+"*").Val()
	if len(keys) < 10 {
		t.Fatalf("only %d keys: %v", len(keys), keys)
	}
	for _, key := range keys {
		if ttl := client.PTTL(ctx, key).Val(); ttl <= 0 || ttl > time.Hour {
			t.Errorf("key %q has TTL %v, want within the idle TTL of 1h", key, ttl)
		}
	}
}
