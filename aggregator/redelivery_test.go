package aggregator

import (
	"cmp"
	"context"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// applier is what the model and the Redis store share: apply a batch, read a tally.
type applier interface {
	Apply(ctx context.Context, obs []Observation, at time.Time) (Applied, error)
}

// deliver applies stream in random batches as a consumer would, and after some batches simulates
// a crash: every batch since the last commit is applied again, in order, as a redelivery does. A
// batch applied again must count nothing and leave every version where it was. It returns the
// observation time after the last batch.
func deliver(t *testing.T, s applier, r *rand.Rand, stream []Observation, crashEvery int) time.Time {
	t.Helper()
	ctx := context.Background()
	var batches [][]Observation
	for i := 0; i < len(stream); {
		n := 1 + r.IntN(300)
		batches = append(batches, stream[i:min(i+n, len(stream))])
		i += n
	}
	var maxOcc int64
	clock := func(b []Observation) time.Time {
		for _, o := range b {
			maxOcc = max(maxOcc, o.Occurred)
		}
		return time.UnixMicro(maxOcc + int64(r.IntN(120))*1e6)
	}
	versions := map[Key]int64{}
	committed, redelivered := 0, 0
	for k := range batches {
		got, err := s.Apply(ctx, batches[k], clock(batches[k]))
		if err != nil {
			t.Fatal(err)
		}
		for key, tl := range got.Tallies {
			versions[key] = tl.Version
		}
		if r.IntN(4) == 0 {
			committed = k + 1
		}
		if crashEvery == 0 || committed > k || r.IntN(crashEvery) != 0 {
			continue
		}
		// Redeliver from the committed offsets: a prefix of what was applied since, or all of it.
		upTo := committed + r.IntN(k+1-committed)
		for j := committed; j <= upTo; j++ {
			again, err := s.Apply(ctx, batches[j], clock(nil))
			if err != nil {
				t.Fatal(err)
			}
			redelivered++
			for i, o := range again.Outcomes {
				if o == Counted || o == Reassessed {
					t.Fatalf("batch %d applied again: event %d (%+v) was %v", j, i, batches[j][i], o)
				}
			}
			for key, tl := range again.Tallies {
				if tl.Version != versions[key] {
					t.Fatalf("batch %d applied again moved %s from version %d to %d", j, key, versions[key], tl.Version)
				}
			}
		}
	}
	if crashEvery > 0 && redelivered == 0 {
		t.Fatal("no batch was redelivered: the test tests nothing")
	}
	return clock(nil)
}

// counts returns the tallies of keys at time at without their versions, which count changing
// batches and so depend on how the stream was cut into batches.
func counts(t *testing.T, read func(Key, time.Time) (Tally, error), keys []Key, at time.Time) map[Key]Tally {
	t.Helper()
	out := make(map[Key]Tally, len(keys))
	for _, k := range keys {
		tl, err := read(k, at)
		if err != nil {
			t.Fatal(err)
		}
		tl.Version = 0
		out[k] = tl
	}
	return out
}

func sameCounts(t *testing.T, what string, got, want map[Key]Tally) {
	t.Helper()
	for k, w := range want {
		if got[k] != w {
			t.Fatalf("%s: %s\ngot  %+v\nwant %+v (one clean pass)", what, k, got[k], w)
		}
	}
}

// interleave merges the partitions' streams in a random order that keeps each partition's order.
func interleave(r *rand.Rand, parts [][]Observation) []Observation {
	var out []Observation
	for {
		var open []int
		for i, p := range parts {
			if len(p) > 0 {
				open = append(open, i)
			}
		}
		if len(open) == 0 {
			return out
		}
		i := open[r.IntN(len(open))]
		n := 1 + r.IntN(min(50, len(parts[i])))
		out = append(out, parts[i][:n]...)
		parts[i] = parts[i][n:]
	}
}

// partitionBy splits stream into n partitions by the hash of part(o), keeping the order in each.
func partitionBy(stream []Observation, n int, part func(Observation) string) [][]Observation {
	parts := make([][]Observation, n)
	for _, o := range stream {
		h := fnv.New32a()
		h.Write([]byte(part(o)))
		i := h.Sum32() % uint32(n)
		parts[i] = append(parts[i], o)
	}
	return parts
}

// consistent rewrites stream as a well-behaved producer would send it: every assessment of an
// opportunity carries the opportunity's first occurred time, and one (assessed_at, seq) of an
// opportunity always has the same class.
func consistent(stream []Observation) []Observation {
	type opp struct {
		k  Key
		id string
	}
	type asmt struct {
		opp
		a, s int64
	}
	occ := map[opp]int64{}
	class := map[asmt]Class{}
	out := slices.Clone(stream)
	for i := range out {
		o := &out[i]
		id := opp{o.Key, o.OpportunityID}
		if v, ok := occ[id]; ok {
			o.Occurred = v
		} else {
			occ[id] = o.Occurred
		}
		as := asmt{id, o.Assessed, o.Seq}
		if c, ok := class[as]; ok {
			o.Class = c
		} else {
			class[as] = o.Class
		}
	}
	return out
}

// TestRedeliveryAndReorderingEqualOneCleanPass holds the delivery promise of docs/semantics.md
// (#retention) on the model and on Redis: the same random streams, cut into batches with crashes
// that redeliver any prefix of the uncommitted batches, and with partitions interleaved
// differently, end in the counts of one clean pass. Retention is short, and re-assessments move
// occurred times across hours, so identities cross the retention cut all the time.
func TestRedeliveryAndReorderingEqualOneCleanPass(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		seed      uint64
		span      time.Duration
		retention time.Duration
		jumpEvery int
	}{
		{11, 10 * 24 * time.Hour, 3 * 24 * time.Hour, 0},
		{12, 12 * time.Hour, time.Hour, 0},
		{13, 2 * time.Hour, time.Hour, 700},
		{14, 10 * 24 * time.Hour, 24 * time.Hour, 500},
	} {
		t.Run(fmt.Sprint("seed", tc.seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(tc.seed, 5))
			stream := randomStreamOver(r, 6000, tc.span, tc.jumpEvery)
			clean := NewModel(tc.retention)
			at := deliver(t, clean, r, stream, 0)
			keys := clean.Keys()
			slices.SortFunc(keys, func(a, b Key) int { return cmp.Compare(a.String(), b.String()) })
			modelRead := func(m *Model) func(Key, time.Time) (Tally, error) {
				return func(k Key, at time.Time) (Tally, error) { return m.Tally(k, at), nil }
			}
			redisRead := func(s *Redis) func(Key, time.Time) (Tally, error) {
				return func(k Key, at time.Time) (Tally, error) { return s.Tally(ctx, k, at) }
			}
			want := counts(t, modelRead(clean), keys, at)
			// both delivers s with crashes to the model and to a Redis store of its own, and
			// requires each to end in want.
			both := func(what string, s []Observation, want map[Key]Tally) {
				t.Helper()
				m := NewModel(tc.retention)
				deliver(t, m, r, s, 3)
				sameCounts(t, "model, "+what, counts(t, modelRead(m), keys, at), want)
				store, _ := testStore(t, fmt.Sprint(strings.ReplaceAll(what, " ", "-"), tc.seed), RedisConfig{Retention: tc.retention})
				deliver(t, store, r, s, 3)
				sameCounts(t, "redis, "+what, counts(t, redisRead(store), keys, at), want)
			}

			// Redelivery, in the stream's order.
			both("redelivered", stream, want)

			// Partitions keyed by aggregate, as producers are asked to key, interleaved another way.
			both("partitions interleaved", interleave(r, partitionBy(stream, 4, func(o Observation) string { return o.Key.String() })), want)

			// Keys that do not follow aggregates: a well-behaved producer's stream in any order at all.
			good := consistent(stream)
			clean = NewModel(tc.retention)
			deliver(t, clean, r, good, 0)
			wantGood := counts(t, modelRead(clean), keys, at)
			shuffled := slices.Clone(good)
			r.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
			both("any order", shuffled, wantGood)
		})
	}
}
