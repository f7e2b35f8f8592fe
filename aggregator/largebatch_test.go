package aggregator

import (
	"context"
	"math/rand/v2"
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
