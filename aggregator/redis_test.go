package aggregator

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/repeatrate/repeatrate/internal/testenv"
	"github.com/repeatrate/repeatrate/schemas"
)

// collisionScopes are scopes whose naive concatenations meet; their aggregates must stay apart.
var collisionScopes = []schemas.Scope{
	{Workspace: "a:b", Model: "c", Run: "r", Checkpoint: "k", Artifact: "x"},
	{Workspace: "a", Model: "b:c", Run: "r", Checkpoint: "k", Artifact: "x"},
	{Workspace: "a|b", Model: "c", Run: "r", Checkpoint: "k", Artifact: "x"},
	{Workspace: "a", Model: "b|c", Run: "r", Checkpoint: "k", Artifact: "x"},
	{Workspace: "a}b", Model: "{c", Run: "r", Checkpoint: "k", Artifact: "x"},
	{Workspace: "a%7Cb", Model: "c", Run: "r", Checkpoint: "k", Artifact: "x"},
}

// randomStream returns n observations with duplicates, re-assessments, stale re-assessments,
// late and far-too-late events, in shuffled order, over a clock that moves about 10 days.
func randomStream(r *rand.Rand, n int) []Observation {
	return randomStreamOver(r, n, 10*24*time.Hour)
}

// randomStreamOver is randomStream with the clock moving over span instead of 10 days.
func randomStreamOver(r *rand.Rand, n int, span time.Duration) []Observation {
	var keys []Key
	for _, sc := range collisionScopes {
		for _, corr := range []string{"fix-1", "fix|2"} {
			keys = append(keys, Key{Scope: sc, CorrectionID: corr, Source: Live}, Key{Scope: sc, CorrectionID: corr, Source: Evaluation})
		}
	}
	base := Micros(t0)
	step := int64(span/time.Microsecond) / int64(n)
	var out []Observation
	for i := 0; len(out) < n; i++ {
		clock := base + int64(i)*step
		switch p := r.IntN(100); {
		case p < 20 && len(out) > 0: // byte-identical duplicate of an earlier event
			out = append(out, out[r.IntN(len(out))])
		case p < 30 && len(out) > 0: // re-assessment: newer or older than the held one
			o := out[r.IntN(len(out))]
			o.Class = Class(1 + r.IntN(3))
			o.Assessed += int64(r.IntN(7200)-1800) * 1e6
			o.Seq = int64(r.IntN(3))
			out = append(out, o)
		default:
			back := int64(r.ExpFloat64() * float64(20*time.Minute/time.Microsecond))
			if r.IntN(50) == 0 {
				back = int64(r.IntN(6*24)) * int64(time.Hour/time.Microsecond) // days late
			}
			occ := clock - back
			out = append(out, Observation{
				Key:           keys[r.IntN(len(keys))],
				OpportunityID: fmt.Sprintf("o%d", r.IntN(n/3+1)),
				Class:         Class(1 + r.IntN(3)),
				Occurred:      occ,
				Assessed:      occ + int64(r.IntN(600))*1e6,
				Seq:           int64(r.IntN(2)),
			})
		}
	}
	// Local shuffle: out of order, but the clock still moves forward overall.
	for i := range out {
		j := i + r.IntN(min(200, len(out)-i))
		out[i], out[j] = out[j], out[i]
	}
	return out
}

func TestRedisMatchesModel(t *testing.T) {
	client := testenv.Redis(t)
	ctx := context.Background()
	for _, tc := range []struct {
		seed uint64
		span time.Duration // how far the stream's clock moves
	}{
		// Days: expiry, pruning, every window boundary; the observation minute changes every batch.
		{1, 10 * 24 * time.Hour}, {2, 10 * 24 * time.Hour}, {3, 10 * 24 * time.Hour},
		// Minutes: many batches share an observation minute, so the cached window sums are used
		// and updated in place.
		{4, 20 * time.Minute}, {5, 3 * time.Hour},
	} {
		seed := tc.seed
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 99))
			stream := randomStreamOver(r, 10000, tc.span)
			prefix := testenv.Name(t, "model")
			testenv.CleanPrefix(t, client, prefix)
			retention := 3 * 24 * time.Hour // short, so expiry happens inside the stream
			store, err := NewRedis(client, RedisConfig{Prefix: prefix, Retention: retention})
			if err != nil {
				t.Fatal(err)
			}
			model := NewModel(retention)
			var maxOcc int64
			counts := map[Outcome]int{}
			for i := 0; i < len(stream); {
				n := 1 + r.IntN(300)
				batch := stream[i:min(i+n, len(stream))]
				i += len(batch)
				for _, o := range batch {
					maxOcc = max(maxOcc, o.Occurred)
				}
				at := time.UnixMicro(maxOcc + int64(r.IntN(120))*1e6)
				got, err := store.Apply(ctx, batch, at)
				if err != nil {
					t.Fatal(err)
				}
				want, _ := model.Apply(ctx, batch, at)
				for j := range batch {
					counts[want.Outcomes[j]]++
					if got.Outcomes[j] != want.Outcomes[j] {
						t.Fatalf("event %d (%+v): redis %v, model %v", i-len(batch)+j, batch[j], got.Outcomes[j], want.Outcomes[j])
					}
				}
				for _, k := range want.Keys {
					if got.Tallies[k] != want.Tallies[k] {
						t.Fatalf("after event %d, %s:\nredis %+v\nmodel %+v", i, k, got.Tallies[k], want.Tallies[k])
					}
				}
			}
			for _, o := range []Outcome{Counted, Reassessed, Duplicate, Stale, Expired} {
				if counts[o] == 0 && (o != Expired || tc.span > retention) {
					t.Errorf("the stream never produced %v: it does not test it", o)
				}
			}
			t.Logf("outcomes %v", counts)
			// Reading changes nothing and agrees with the model.
			at := time.UnixMicro(maxOcc)
			for _, k := range model.Keys() {
				got, err := store.Tally(ctx, k, at)
				if err != nil {
					t.Fatal(err)
				}
				if want := model.Tally(k, at); got != want {
					t.Fatalf("%s: redis %+v, model %+v", k, got, want)
				}
			}
		})
	}
}

func TestRedisApplyTwiceIsApplyOnce(t *testing.T) {
	// A retried script (go-redis after a lost reply) or a redelivered batch runs the same arguments
	// again: it must change nothing, not even the version.
	client := testenv.Redis(t)
	ctx := context.Background()
	prefix := testenv.Name(t, "twice")
	testenv.CleanPrefix(t, client, prefix)
	store, err := NewRedis(client, RedisConfig{Prefix: prefix, Retention: 30 * 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	batch := randomStream(rand.New(rand.NewPCG(7, 7)), 500)
	at := t0.Add(11 * 24 * time.Hour)
	first, err := store.Apply(ctx, batch, at)
	if err != nil {
		t.Fatal(err)
	}
	second, err := store.Apply(ctx, batch, at)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range first.Keys {
		if first.Tallies[k] != second.Tallies[k] {
			t.Fatalf("%s changed on the second apply:\n%+v\n%+v", k, first.Tallies[k], second.Tallies[k])
		}
	}
	for i, o := range second.Outcomes {
		if o == Counted || o == Reassessed {
			t.Fatalf("event %d was %v on the second apply", i, o)
		}
	}
}

func TestRedisKeysShareOneHashTag(t *testing.T) {
	s, _ := NewRedis(nil, RedisConfig{Retention: time.Hour})
	for _, sc := range collisionScopes {
		ks := s.keys(Key{Scope: sc, CorrectionID: "c", Source: Live})
		tag := func(k string) string {
			i := indexByte(k, '{')
			j := indexByte(k[i:], '}')
			return k[i+1 : i+j]
		}
		for _, k := range ks[1:] {
			if tag(k) != tag(ks[0]) {
				t.Fatalf("%q and %q hash differently", ks[0], k)
			}
		}
	}
}

func indexByte(s string, c byte) int {
	for i := 0; i < len(s); i++ {
		if s[i] == c {
			return i
		}
	}
	return -1
}
