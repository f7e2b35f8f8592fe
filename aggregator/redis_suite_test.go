package aggregator

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/repeatrate/repeatrate/internal/testenv"
)

// randomRuns returns n graded runs over a few suites with duplicates, re-gradings (newer and
// older), versions arriving out of order, replies, and collision-prone names.
func randomRuns(r *rand.Rand, n int) []RunObservation {
	suites := []SuiteKey{{"ws", "s|1"}, {"ws|s", "1"}, {"w{s}", "suite 2"}}
	var out []RunObservation
	for len(out) < n {
		switch p := r.IntN(100); {
		case p < 20 && len(out) > 0:
			out = append(out, out[r.IntN(len(out))])
		case p < 30 && len(out) > 0:
			o := out[r.IntN(len(out))]
			o.Record.Result = "pfe"[r.IntN(3)]
			o.Record.Assessed += int64(r.IntN(7200)-1800) * 1e6
			o.Record.Seq = int64(r.IntN(3))
			out = append(out, o)
		default:
			v := r.IntN(12)
			o := RunObservation{
				Key: RunKey{SuiteKey: suites[r.IntN(len(suites))], Version: fmt.Sprintf("v%d", v),
					Case: fmt.Sprintf("case|%d", r.IntN(40)), RunIndex: int64(r.IntN(5))},
				Record: RunRecord{Result: "ppppfe"[r.IntN(6)], VersionSeq: int64(v), Runs: 5,
					Occurred: Micros(t0) + int64(r.IntN(3600))*1e6, Assessed: Micros(t0) + int64(r.IntN(3600))*1e6},
			}
			if r.IntN(2) == 0 {
				o.Record.Reply, o.Record.Tokens, o.Record.GzipRatio = true, r.IntN(500), r.Float64()*20
				if r.IntN(10) == 0 {
					o.Record.Trigger = "repeat_pattern"
				}
			}
			out = append(out, o)
		}
	}
	return out
}

func TestRedisSuitesMatchModel(t *testing.T) {
	client := testenv.Redis(t)
	ctx := context.Background()
	cfg := SuiteConfig{MinHistory: 3}
	cfg.Validate()
	for _, seed := range []uint64{1, 2} {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 5))
			stream := randomRuns(r, 6000)
			prefix := testenv.Name(t, "suite")
			testenv.CleanPrefix(t, client, prefix)
			store, err := NewRedisSuites(client, RedisConfig{Prefix: prefix, Retention: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			model := NewSuiteModel()
			at := t0.Add(3 * time.Hour)
			for i := 0; i < len(stream); {
				batch := stream[i:min(i+1+r.IntN(400), len(stream))]
				i += len(batch)
				got, err := store.Apply(ctx, batch)
				if err != nil {
					t.Fatal(err)
				}
				want := model.Apply(batch)
				if !reflect.DeepEqual(got.Outcomes, want) {
					t.Fatalf("outcomes differ before event %d", i)
				}
				for _, k := range got.Suites {
					if !reflect.DeepEqual(got.Runs[k], model.Runs(k)) {
						t.Fatalf("runs of %v differ after event %d", k, i)
					}
					gd, _ := Discrimination(k, got.Runs[k], cfg, at)
					wd, _ := Discrimination(k, model.Runs(k), cfg, at)
					if !reflect.DeepEqual(gd, wd) {
						t.Fatalf("discrimination of %v differs:\n%+v\n%+v", k, gd, wd)
					}
					gs := Stability(k, "v3", VersionRuns(got.Runs[k], "v3"), cfg, at)
					ws := Stability(k, "v3", VersionRuns(model.Runs(k), "v3"), cfg, at)
					if !reflect.DeepEqual(gs, ws) {
						t.Fatalf("stability of %v differs", k)
					}
				}
			}
			// The run was busy enough to exercise every rule.
			for _, k := range model.Suites() {
				if d, _ := Discrimination(k, model.Runs(k), cfg, at); d.Judged == 0 {
					t.Fatalf("suite %v judged nothing", k)
				}
			}
			// Announcements persist.
			k := model.Suites()[0]
			if err := store.MarkAnnounced(ctx, k, []string{"case|1"}); err != nil {
				t.Fatal(err)
			}
			got, err := store.Apply(ctx, stream[:1])
			if err != nil || (got.Suites[0] == k && !got.Announced[k]["case|1"]) {
				t.Fatalf("announced = %+v %v", got.Announced, err)
			}
		})
	}
}

// suiteStores returns the in-memory store and a Redis store under a fresh prefix.
func suiteStores(t *testing.T, cfg RedisConfig) map[string]interface {
	Apply(context.Context, []RunObservation) (SuiteApplied, error)
} {
	client := testenv.Redis(t)
	cfg.Prefix = testenv.Name(t, "suite")
	testenv.CleanPrefix(t, client, cfg.Prefix)
	rs, err := NewRedisSuites(client, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return map[string]interface {
		Apply(context.Context, []RunObservation) (SuiteApplied, error)
	}{"memory": NewMemorySuites(), "redis": rs}
}

// Every output a batch causes is caused again when the same batch is applied again (a redelivery
// after a crash past the suite apply, or a script call re-run by a client retry), abnormal
// samples included, although every run of the second apply is a duplicate.
func TestSuiteRedeliveryRepublishes(t *testing.T) {
	ctx := context.Background()
	cfg := SuiteConfig{MinHistory: 3}
	cfg.Validate()
	for name, store := range suiteStores(t, RedisConfig{Retention: time.Hour}) {
		t.Run(name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(7, 7))
			stream := randomRuns(r, 3000)
			at := t0.Add(3 * time.Hour)
			abnormal := 0
			for i := 0; i < len(stream); {
				batch := stream[i:min(i+1+r.IntN(200), len(stream))]
				i += len(batch)
				first, err := store.Apply(ctx, batch)
				if err != nil {
					t.Fatal(err)
				}
				want := BuildSuiteOutput(first, batch, cfg, at)
				again, err := store.Apply(ctx, batch)
				if err != nil {
					t.Fatal(err)
				}
				for j, o := range again.Outcomes {
					if o != Duplicate && o != Stale {
						t.Fatalf("second apply of event %d: outcome %v", i-len(batch)+j, o)
					}
				}
				if got := BuildSuiteOutput(again, batch, cfg, at); !reflect.DeepEqual(got, want) {
					t.Fatalf("outputs of the batch ending at event %d differ when applied again:\nabnormal %+v\nwant     %+v\nrevived %+v\nwant    %+v",
						i, got.Abnormal, want.Abnormal, got.Revived, want.Revived)
				}
				abnormal += len(want.Abnormal)
			}
			if abnormal == 0 {
				t.Fatal("the stream raised no abnormal sample: the test checks nothing")
			}
		})
	}
}
