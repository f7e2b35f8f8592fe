package aggregator

import (
	"context"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"
)

// A batch encoded once, as the processor's Prepare does, and applied again (a retried Apply stage,
// at a later observation time) gives what applying its observations does at each time: the
// observation time is the call's, never the one the encoding was first applied with.
func TestApplyEncodedTakesEachCallsTime(t *testing.T) {
	ctx := context.Background()
	cfg := RedisConfig{Retention: 30 * 24 * time.Hour}
	encoded, _ := testStore(t, "encoded", cfg)
	plain, _ := testStore(t, "plain", cfg)
	stream := randomStream(rand.New(rand.NewPCG(5, 8)), 3000)
	at := t0
	for i := 0; i < len(stream); i += 500 {
		batch := stream[i:min(i+500, len(stream))]
		e := encoded.Encode(batch)
		// The second call is three days later: the day and hour windows differ.
		for _, when := range []time.Time{at, at.Add(72 * time.Hour)} {
			got, err := encoded.ApplyEncoded(ctx, e, when)
			if err != nil {
				t.Fatal(err)
			}
			want, err := plain.Apply(ctx, batch, when)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got.Outcomes, want.Outcomes) || !reflect.DeepEqual(got.Tallies, want.Tallies) {
				t.Fatalf("batch %d at %v: encoded %+v, plain %+v", i/500, when, got.Tallies, want.Tallies)
			}
		}
		at = at.Add(72 * time.Hour)
	}
}

// An observation that cannot be stored fails the apply of its encoded batch, as Apply fails.
func TestApplyEncodedFailsLikeApply(t *testing.T) {
	store, _ := testStore(t, "encodedbad", RedisConfig{Retention: time.Hour})
	obs := randomStream(rand.New(rand.NewPCG(1, 2)), 3)
	obs[1].OpportunityID = string(make([]byte, maxIDBytes+1))
	_, want := store.Apply(context.Background(), obs, t0)
	_, got := store.ApplyEncoded(context.Background(), store.Encode(obs), t0)
	if want == nil || got == nil || got.Error() != want.Error() {
		t.Fatalf("encoded: %v, plain: %v", got, want)
	}
}
