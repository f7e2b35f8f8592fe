package suite

import (
	"context"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/repeatrate/repeatrate/internal/testenv"
)

// Batches reach 16 000 messages by default, all of one suite at worst: a script call of more
// runs than Lua unpacks at once (8 000) still equals the model.
func TestOneSuiteInALargeBatchMatchesModel(t *testing.T) {
	ctx := context.Background()
	client := testenv.Redis(t)
	cfg := Config{MinHistory: 3, MissingAfter: 20 * time.Minute}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(13, 14))
	stream := randomRuns(r, 32000)
	for i := range stream {
		stream[i].Key.Key = Key{"ws", "one"}
	}
	store := newTestRedis(t, client, "suitelarge", cfg)
	model := NewMemory(cfg)
	at := t0
	for i, size := 0, 0; i < len(stream); i += size {
		size = min([]int{16000, 9000, 7000}[(i/7000)%3], len(stream)-i)
		batch := stream[i : i+size]
		at = at.Add(10 * time.Minute)
		got, err := store.Apply(ctx, batch, at)
		if err != nil {
			t.Fatalf("batch of %d: %v", size, err)
		}
		want, _ := model.Apply(ctx, batch, at)
		if !reflect.DeepEqual(got.Outcomes, want.Outcomes) {
			t.Fatalf("batch of %d: outcomes differ", size)
		}
		for _, k := range want.Suites {
			if d := summaryDiff(got.Summaries[k], want.Summaries[k]); d != "" {
				t.Fatalf("batch of %d: summary of %v differs: %s", size, k, d)
			}
		}
	}
}
