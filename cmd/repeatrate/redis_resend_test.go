package main

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
	"github.com/repeatrate/repeatrate/schemas"
)

// A batch's pipeline slower than the client's old 3 s read timeout is not re-sent by the client:
// Redis runs each apply script once, and the batch's new opportunities come back counted, not as
// duplicates. Here Redis is busy for 4 s with another client's script while the batch is on its
// way. Before, the client (ReadTimeout 3 s, MaxRetries 5) sent the pipeline again after 3 s and
// Redis ran it twice, the second run finding every opportunity a duplicate.
func TestSlowPipelineIsNotResent(t *testing.T) {
	srv := testenv.StartRedis(t)
	rdb, err := newRedisClient(RedisConfig{Addrs: []string{srv.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	ctx := context.Background()
	store, err := aggregator.NewRedis(rdb, aggregator.RedisConfig{Prefix: "resend", Retention: 30 * 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	var obs []aggregator.Observation
	for i := range 50 {
		obs = append(obs, aggregator.Observation{Key: aggregator.Key{Scope: schemas.Scope{Workspace: "w", Model: fmt.Sprint("m", i), Run: "r",
			Checkpoint: "c", Artifact: "a"}, CorrectionID: "fix", Source: aggregator.Live},
			OpportunityID: "o", Class: aggregator.Passed, Occurred: aggregator.Micros(at), Assessed: aggregator.Micros(at)})
	}
	// Loaded first, so that the timed apply is one pipeline of 50 script calls.
	if _, err := store.Apply(ctx, obs[:1], at); err != nil {
		t.Fatal(err)
	}
	srv.Client.ConfigResetStat(ctx)
	// Redis busy for 4 s (a script of another client): the pipeline waits in its socket and runs
	// after, even if the client gave up on it meanwhile.
	busy := make(chan error, 1)
	go func() {
		busy <- srv.Client.Eval(ctx, "local function now() local t = redis.call('TIME') return t[1] + t[2] / 1e6 end local s = now() while now() - s < 4 do end return 1", nil).Err()
	}()
	probe := redis.NewClient(&redis.Options{Addr: srv.Addr, ReadTimeout: 50 * time.Millisecond, MaxRetries: -1})
	defer probe.Close()
	for probe.Ping(ctx).Err() == nil {
		select {
		case err := <-busy:
			t.Fatalf("the busy script ended before Redis was seen busy: %v", err)
		default:
		}
	}
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	got, err := store.Apply(actx, obs[1:], at)
	if err != nil {
		t.Fatalf("a pipeline slowed by 4 s: %v", err)
	}
	if err := <-busy; err != nil {
		t.Fatal(err)
	}
	for i, o := range got.Outcomes {
		if o != aggregator.Counted {
			t.Fatalf("observation %d: %s, want counted (new opportunities)", i+1, o)
		}
	}
	stats, err := srv.Client.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	if n := evalCalls(stats); n != len(obs)-1 {
		t.Fatalf("Redis ran %d apply scripts for %d aggregates: the pipeline was sent again", n, len(obs)-1)
	}
}

// evalCalls reads the calls of EVALSHA from INFO commandstats.
func evalCalls(stats string) int {
	for _, line := range strings.Split(stats, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:calls="); ok {
			n, _ := strconv.Atoi(strings.SplitN(rest, ",", 2)[0])
			return n
		}
	}
	return 0
}
