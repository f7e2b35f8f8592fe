package suite

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/internal/testenv"
)

// splitEncode encodes obs (runs of one suite) as Encode does, except that each cell's runs are
// sent as two groups: the first half where the cell first appears, the rest after every other
// cell. The processor never sends a cell twice in one call; the script must give the same result
// when something does.
func splitEncode(obs []RunObservation) *Encoded {
	type cell struct{ v, c string }
	var cells []cell
	byCell := map[cell][]int{}
	for i := range obs {
		k := cell{obs[i].Key.Version, obs[i].Key.Case}
		if _, ok := byCell[k]; !ok {
			cells = append(cells, k)
		}
		byCell[k] = append(byCell[k], i)
	}
	var first, rest []int
	for _, k := range cells {
		idx := byCell[k]
		h := (len(idx) + 1) / 2
		first, rest = append(first, idx[:h]...), append(rest, idx[h:]...)
	}
	e := &Encoded{n: len(obs), suites: []Key{obs[0].Key.Key}, args: map[Key][]any{}, orders: map[Key][]int{}}
	args := totalArgs(make([]any, headArgs), obs, append(append([]int(nil), first...), rest...))
	var order []int
	for _, part := range [][]int{first, rest} {
		if len(part) == 0 {
			continue
		}
		var o []int
		args, o = groupArgs(args, obs, cellGroups(obs, part), len(part))
		order = append(order, o...)
	}
	e.args[obs[0].Key.Key], e.orders[obs[0].Key.Key] = args, order
	return e
}

// heldAtStream returns batches of runs of one suite in which runs come back within a batch: the
// same record again, a newer and an older assessment, over small cells and cells of more than 16
// runs in one batch.
func heldAtStream(r *rand.Rand) [][]RunObservation {
	var batches [][]RunObservation
	var all []RunObservation
	for b := 0; b < 12; b++ {
		var batch []RunObservation
		for len(batch) < 120 {
			switch p := r.IntN(100); {
			case p < 20 && len(batch) > 0: // the same run again in this batch
				batch = append(batch, batch[r.IntN(len(batch))])
			case p < 45 && len(batch) > 0: // re-assessed, newer or older, in this batch
				o := batch[r.IntN(len(batch))]
				o.Record.Result = "pfe"[r.IntN(3)]
				o.Record.Assessed += int64(r.IntN(5)-2) * 60e6
				o.Record.Seq = int64(r.IntN(3))
				batch = append(batch, o)
			case p < 55 && len(all) > 0: // a run of an earlier batch
				o := all[r.IntN(len(all))]
				o.Record.Assessed += int64(r.IntN(3)-1) * 60e6
				batch = append(batch, o)
			default:
				// Case "big" collects many runs per batch (a group over SCAN runs); the others few.
				c := fmt.Sprint("c", r.IntN(6))
				idx := int64(r.IntN(8))
				if r.IntN(3) == 0 {
					c, idx = "big", int64(r.IntN(40))
				}
				batch = append(batch, adv(fmt.Sprint("v", r.IntN(2)), c, idx, "ppfe"[r.IntN(4)], 1, 40, int64(r.IntN(30)), int64(r.IntN(20)), 0))
			}
		}
		all = append(all, batch...)
		batches = append(batches, batch)
	}
	return batches
}

// TestHeldRecordsWithinACall feeds the same batches to the suite script grouped as the processor
// groups them and with every cell split in two groups, and requires equal outcomes per run, equal
// reads and equal stored keys after every batch: a run that comes back within a call holds what
// its earlier occurrence left, whichever way the script finds it.
func TestHeldRecordsWithinACall(t *testing.T) {
	batches := heldAtStream(rand.New(rand.NewPCG(21, 4)))
	var repeats, big int
	for _, b := range batches {
		seen := map[RunKey]bool{}
		cells := map[[2]string]int{}
		for _, o := range b {
			if seen[o.Key] {
				repeats++
			}
			seen[o.Key] = true
			cells[[2]string{o.Key.Version, o.Key.Case}]++
		}
		for _, n := range cells {
			if n > 16 {
				big++
			}
		}
	}
	if repeats < 100 || big < 12 {
		t.Fatalf("the stream has %d runs repeated within a batch and %d groups over 16 runs: it does not test them", repeats, big)
	}
	for _, backend := range []string{"redis", "embedded"} {
		t.Run(backend, func(t *testing.T) {
			addr := testenv.RedisAddr(t)
			if backend == "embedded" {
				addr = miniredis.RunT(t).Addr()
			}
			c := redis.NewClient(&redis.Options{Addr: addr})
			t.Cleanup(func() { c.Close() })
			ctx := context.Background()
			cfg := Config{MinHistory: 2, MissingAfter: 30 * time.Minute}
			pw, ps := testenv.Name(t, "held-whole"), testenv.Name(t, "held-split")
			testenv.CleanPrefix(t, c, pw)
			testenv.CleanPrefix(t, c, ps)
			whole, err := NewRedis(c, aggregator.RedisConfig{Prefix: pw, Retention: time.Hour}, cfg)
			if err != nil {
				t.Fatal(err)
			}
			split, err := NewRedis(c, aggregator.RedisConfig{Prefix: ps, Retention: time.Hour}, cfg)
			if err != nil {
				t.Fatal(err)
			}
			counts := map[aggregator.Outcome]int{}
			for i, b := range batches {
				at := t0.Add(time.Duration(i) * 10 * time.Minute)
				gw, err := whole.ApplyEncoded(ctx, Encode(b), at)
				if err != nil {
					t.Fatal(err)
				}
				gs, err := split.ApplyEncoded(ctx, splitEncode(b), at)
				if err != nil {
					t.Fatal(err)
				}
				for j := range b {
					counts[gw.Outcomes[j]]++
					if gw.Outcomes[j] != gs.Outcomes[j] {
						t.Fatalf("batch %d, run %d %+v: %v grouped by cell, %v with cells split", i, j, b[j].Key, gw.Outcomes[j], gs.Outcomes[j])
					}
				}
				k := b[0].Key.Key
				rw, err := whole.Read(ctx, k, at)
				if err != nil {
					t.Fatal(err)
				}
				rs, err := split.Read(ctx, k, at)
				if err != nil {
					t.Fatal(err)
				}
				if fmt.Sprint(rw) != fmt.Sprint(rs) {
					t.Fatalf("batch %d: reads differ\ngrouped: %+v\nsplit:   %+v", i, rw, rs)
				}
				testenv.SameDumps(t, fmt.Sprint("batch ", i), testenv.DumpKeys(t, c, pw, equivNoIgnore, equivNoNorm),
					testenv.DumpKeys(t, c, ps, equivNoIgnore, equivNoNorm))
			}
			for _, o := range []aggregator.Outcome{aggregator.Counted, aggregator.Reassessed, aggregator.Duplicate, aggregator.Stale} {
				if counts[o] == 0 {
					t.Errorf("the stream never produced %v: it does not test it", o)
				}
			}
		})
	}
}
