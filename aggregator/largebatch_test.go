package aggregator

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// Batches reach 16 000 messages by default, all of one aggregate at worst: a script call of more
// observations than Lua unpacks at once (8 000) still equals the model.
func TestOneAggregateInALargeBatchMatchesModel(t *testing.T) {
	ctx := context.Background()
	r := rand.New(rand.NewPCG(11, 12))
	stream := randomStreamOver(r, 24000, 6*time.Hour, 0)
	for i := range stream {
		stream[i].Key = keyLive
	}
	store, _ := testStore(t, "largebatch", RedisConfig{Retention: 3 * 24 * time.Hour})
	model := NewModel(3 * 24 * time.Hour)
	var newest int64 // the observer's clock is never behind the events (MaxFutureSkew)
	for i, size := 0, 0; i < len(stream); i += size {
		size = min([]int{16000, 8001, 1}[(i/1000)%3], len(stream)-i)
		batch := stream[i : i+size]
		for _, o := range batch {
			newest = max(newest, o.Occurred)
		}
		at := time.UnixMicro(newest).Add(time.Minute)
		got, err := store.Apply(ctx, batch, at)
		if err != nil {
			t.Fatalf("batch of %d: %v", size, err)
		}
		want, _ := model.Apply(ctx, batch, at)
		for j := range batch {
			if got.Outcomes[j] != want.Outcomes[j] {
				t.Fatalf("batch of %d, event %d: redis %v, model %v", size, j, got.Outcomes[j], want.Outcomes[j])
			}
		}
		if got.Tallies[keyLive] != want.Tallies[keyLive] {
			t.Fatalf("batch of %d: redis %+v, model %+v", size, got.Tallies[keyLive], want.Tallies[keyLive])
		}
	}
}

// However many entries one batch adds to an index group, its chunks stay small: a batch of
// 4 000 new opportunities in one hour closes chunk after chunk instead of opening one of 100 KB,
// which every later batch touching the group would read and write whole.
func TestIndexChunksStaySmallAfterALargeBatch(t *testing.T) {
	ctx := context.Background()
	store, client := testStore(t, "bigchunks", RedisConfig{Retention: 3 * 24 * time.Hour})
	at := time.Now().Truncate(time.Hour).Add(30 * time.Minute)
	obs := make([]Observation, 4000)
	for i := range obs {
		obs[i] = Observation{Key: keyLive, OpportunityID: fmt.Sprintf("conversation-%08d", i), Class: Passed,
			Occurred: Micros(at) + int64(i), Assessed: Micros(at) + int64(i)}
	}
	if _, err := store.Apply(ctx, obs, at); err != nil {
		t.Fatal(err)
	}
	entries := indexEntries(t, store, keyLive)
	total := 0
	for _, n := range entries {
		total += n
	}
	if total != len(obs) {
		t.Fatalf("the index lists %d ids, want %d", total, len(obs))
	}
	fields := client.HGetAll(ctx, store.keys(keyLive)[1]).Val()
	for f, v := range fields {
		if (strings.HasPrefix(f, "i") || strings.HasPrefix(f, "h")) && len(v) > 600 {
			t.Errorf("index field %s holds %d bytes, want chunks of at most about 480", f, len(v))
		}
	}
	if len(entries) < 4000*24/480 {
		t.Errorf("%d chunks for 4 000 entries of 24 bytes: too few", len(entries))
	}
}
