package suite

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/repeatrate/repeatrate/internal/testenv"
)

// A suite's snapshots carry a version with the aggregates' rule, so that subscribers order them
// by Redis's order of changes and not by a processor's clock: a call that changes the suite sets
// the greater of the last version + 1 and its observation time in µs (so a clock stepped back, or
// a processor behind another, still moves it up); a call that changes nothing (a redelivered
// batch) and a read leave it, so a re-published snapshot repeats its version. The in-memory store
// of replay keeps the same versions. On real Redis and on the embedded one of `repeatrate dev`.
func TestSuiteSnapshotVersionIsMonotonic(t *testing.T) {
	t.Run("embedded", func(t *testing.T) {
		m := miniredis.RunT(t)
		snapshotVersions(t, redis.NewClient(&redis.Options{Addr: m.Addr()}))
	})
	t.Run("redis", func(t *testing.T) { snapshotVersions(t, testenv.Redis(t)) })
}

func snapshotVersions(t *testing.T, client *redis.Client) {
	ctx := context.Background()
	cfg := Config{MinHistory: 2, MissingAfter: time.Minute}
	store := newTestRedis(t, client, "snapver", cfg)
	model := NewMemory(cfg)
	k := Key{"ws", "suite"}
	steps := []struct {
		name string
		runs []RunObservation
		at   time.Time
		want func(prev int64) int64
	}{
		// The first change takes its observation time.
		{"first batch", readSideRuns(k, 1), t0, func(int64) int64 { return t0.UnixMicro() }},
		// A redelivered batch changes nothing: the same version.
		{"redelivered", readSideRuns(k, 1), t0.Add(time.Minute), func(p int64) int64 { return p }},
		// A later change at a later time takes that time.
		{"later change", readSideRuns(k, 2), t0.Add(time.Hour), func(int64) int64 { return t0.Add(time.Hour).UnixMicro() }},
		// A change observed by a clock an hour behind still moves the version up.
		{"clock stepped back", readSideRuns(k, 3), t0, func(p int64) int64 { return p + 1 }},
	}
	prev := int64(0)
	for _, st := range steps {
		got, err := store.Apply(ctx, st.runs, st.at)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := model.Apply(ctx, st.runs, st.at)
		v := got.Summaries[k].SnapshotVersion
		if w := st.want(prev); v != w {
			t.Fatalf("%s: snapshot version %d, want %d (previous %d)", st.name, v, w, prev)
		}
		if m := want.Summaries[k].SnapshotVersion; m != v {
			t.Fatalf("%s: the in-memory store says %d, Redis %d", st.name, m, v)
		}
		if out := BuildOutput(got, st.runs, cfg, st.at); out.Discrimination[0].SnapshotVersion != v || out.Stability[0].SnapshotVersion != v {
			t.Fatalf("%s: snapshots carry %d and %d, want %d", st.name, out.Discrimination[0].SnapshotVersion, out.Stability[0].SnapshotVersion, v)
		}
		r, err := store.Read(ctx, k, st.at.Add(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		if r.SnapshotVersion != v {
			t.Fatalf("%s: a read says version %d, the apply %d", st.name, r.SnapshotVersion, v)
		}
		prev = v
	}
}
