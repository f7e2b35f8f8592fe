package suite

import (
	"context"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/repeatrate/repeatrate/internal/testenv"
)

// A batch encoded once, as the processor's Prepare does, and applied again (a retried Apply stage,
// later) gives what applying its runs does at each time: the missing-run deadline is the call's,
// never the one the encoding was first applied with.
func TestApplyEncodedTakesEachCallsTime(t *testing.T) {
	ctx := context.Background()
	client := testenv.Redis(t)
	cfg := Config{MinHistory: 2, MissingAfter: time.Hour}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	encoded, plain := newTestRedis(t, client, "encoded", cfg), newTestRedis(t, client, "plain", cfg)
	stream := randomRuns(rand.New(rand.NewPCG(3, 4)), 3000)
	at := t0
	for i := 0; i < len(stream); i += 500 {
		batch := stream[i:min(i+500, len(stream))]
		e := Encode(batch)
		// The second call is two hours later: cases whose runs are missing mature in between.
		for _, when := range []time.Time{at, at.Add(2 * time.Hour)} {
			got, err := encoded.ApplyEncoded(ctx, e, when)
			if err != nil {
				t.Fatal(err)
			}
			want, err := plain.Apply(ctx, batch, when)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("batch %d at %v:\nencoded %+v\nplain   %+v", i/500, when, got, want)
			}
		}
		at = at.Add(2 * time.Hour)
	}
}
