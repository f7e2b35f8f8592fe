package suite

import (
	"context"
	"fmt"
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

// TestTotalArgsSumEveryRunAsNew checks the totals the processor sends against a direct count:
// every run of the call, passed or failed by its index, each reply and abnormal reply by its length
// (short and beyond the dense range), over versions that interleave.
func TestTotalArgsSumEveryRunAsNew(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	var obs []RunObservation
	for i := 0; i < 2000; i++ {
		rec := RunRecord{Result: "pfe"[r.IntN(3)], Reply: r.IntN(4) > 0, Tokens: r.IntN(40)}
		if r.IntN(10) == 0 {
			rec.Tokens = denseSums - 2 + r.IntN(4)
		}
		if r.IntN(3) == 0 {
			rec.Trigger = "loop"
		}
		obs = append(obs, RunObservation{Key: RunKey{Version: fmt.Sprint("v", r.IntN(3)), Case: "c", RunIndex: int64(r.IntN(9999))}, Record: rec})
	}
	want := map[string]int64{}
	for _, o := range obs {
		v, idx, tok := o.Key.Version, o.Key.RunIndex, o.Record.Tokens
		if o.Record.Result != 'e' {
			want[fmt.Sprintf("%s|n%d", v, idx)]++
		}
		if o.Record.Result == 'p' {
			want[fmt.Sprintf("%s|p%d", v, idx)]++
		}
		if o.Record.Reply {
			want[fmt.Sprintf("%s|l%d", v, tok)]++
			if o.Record.Trigger != "" {
				want[fmt.Sprintf("%s|a%d", v, tok)]++
			}
		}
	}
	idx := make([]int, len(obs))
	for i := range idx {
		idx[i] = i
	}
	args := totalArgs(nil, obs, idx)
	if args[0] != len(want) || len(args) != 1+3*len(want) {
		t.Fatalf("%v sums in %d arguments, want %d", args[0], len(args), len(want))
	}
	for j := 1; j < len(args); j += 3 {
		k := fmt.Sprintf("%s|%s", args[j], args[j+1])
		if c, ok := args[j+2].(int64); !ok || c != want[k] {
			t.Errorf("%s: %v, want %d", k, args[j+2], want[k])
		}
		delete(want, k)
	}
	if len(want) > 0 {
		t.Errorf("missing sums: %v", want)
	}
}
