package aggregator

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/repeatrate/repeatrate/schemas"
)

// newInOneHour is a batch of n new opportunities of one aggregate, all occurred in one hour, with
// ids of size bytes (distinct, and with bytes that need escaping elsewhere).
func newInOneHour(n, size int) []Observation {
	batch := make([]Observation, n)
	for i := range batch {
		head := fmt.Sprintf("%05d|%%{}\x00é", i)
		id := head + strings.Repeat("\xff", size-len(head))
		occ := time.Duration(i%3000) * time.Second
		batch[i] = obs(id, Class(1+i%3), occ, occ+time.Minute, int64(i))
	}
	return batch
}

// evalshaMicros is the Redis CPU the server has spent in EVALSHA so far (INFO commandstats).
func evalshaMicros(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(l), "cmdstat_evalsha:"); ok {
			for _, kv := range strings.Split(rest, ",") {
				if v, ok := strings.CutPrefix(kv, "usec="); ok {
					n, _ := strconv.ParseInt(v, 10, 64)
					return n
				}
			}
		}
	}
	return 0
}

// The default batch bound (16 000 messages) lets one aggregate's script call carry 16 000 new
// opportunities of one hour (a burst on one correction, a backfill). Redis runs a script alone:
// while it runs every other client waits, and past lua-time-limit (5 s) gets BUSY. The call must
// cost about what the batch holds, not its square: the hour's index appends were built by
// concatenating each id onto the hour's growing string (apply.lua push), 4.9 s of Redis for ids of
// 24 bytes, 11.8 s for 64 bytes, ~90 s for 512 (2 000 ids of 512 bytes: 1.4 s).
func TestLargeBatchOfNewIDsInOneHourCostsLinearTime(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store, client := ownStore(t, "linear", RedisConfig{Retention: 3 * 24 * time.Hour})
	if err := applyScript.Load(ctx, client).Err(); err != nil {
		t.Fatal(err)
	}
	small := newInOneHour(1000, 64)
	for i := range small {
		small[i].OpportunityID = "s" + small[i].OpportunityID
	}
	before := evalshaMicros(t, client)
	if _, err := store.Apply(ctx, small, t0.Add(2*time.Hour)); err != nil {
		t.Fatal(err)
	}
	perSmall := evalshaMicros(t, client) - before
	before = evalshaMicros(t, client)
	if _, err := store.Apply(ctx, newInOneHour(16000, 64), t0.Add(2*time.Hour)); err != nil {
		t.Fatal(err)
	}
	perLarge := evalshaMicros(t, client) - before
	t.Logf("1 000 new ids: %d µs of Redis; 16 000: %d µs", perSmall, perLarge)
	// 16× the ids; linear cost with generous slack for a shared machine is at most 48×, and never
	// near lua-time-limit.
	if perLarge > 48*max(perSmall, 5000) || perLarge > 2_000_000 {
		t.Errorf("16 000 new ids of one hour cost Redis %d µs in one script call, 1 000 cost %d µs: not linear", perLarge, perSmall)
	}
}

// The worst-case script arguments the batch bounds allow: 16 000 opportunity ids of
// MaxIdentityBytes (~9 MB of ARGV) in one aggregate, applied and then redelivered, equal the model.
func TestLargestIDsInALargeBatchMatchModel(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store, _ := ownStore(t, "largeids", RedisConfig{Retention: 3 * 24 * time.Hour})
	model := NewModel(3 * 24 * time.Hour)
	batch := newInOneHour(16000, schemas.MaxIdentityBytes)
	at := t0.Add(2 * time.Hour)
	for round := range 2 {
		got, err := store.Apply(ctx, batch, at)
		if err != nil {
			t.Fatalf("round %d: %d observations of %d-byte ids: %v", round, len(batch), schemas.MaxIdentityBytes, err)
		}
		want, _ := model.Apply(ctx, batch, at)
		for j := range batch {
			if got.Outcomes[j] != want.Outcomes[j] {
				t.Fatalf("round %d, event %d: redis %v, model %v", round, j, got.Outcomes[j], want.Outcomes[j])
			}
		}
		if got.Tallies[keyLive] != want.Tallies[keyLive] {
			t.Fatalf("round %d: redis %+v, model %+v", round, got.Tallies[keyLive], want.Tallies[keyLive])
		}
	}
}
