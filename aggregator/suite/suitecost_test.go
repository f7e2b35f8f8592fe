package suite

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/internal/testenv"
)

// suiteCostStream returns the runs of the harness's eval shape in batches of size: one suite
// version filled case by case, 5 runs per case, each case's results by a profile (always pass,
// always fail, random, pass then fail) with 3 % errors, every run with a reply of 3 to 40 tokens;
// the clock moves 100 ms per batch. The processor decodes eval results into these observations.
func suiteCostStream(runs, size int) (batches [][]RunObservation, ats []time.Time) {
	r := rand.New(rand.NewPCG(7, uint64(runs)))
	k := Key{Workspace: "acme", Suite: "support-evals"}
	base := time.Now().Truncate(time.Second)
	var batch []RunObservation
	for i := 0; i < runs; i++ {
		c, idx := i/5, int64(i%5)
		res := byte('p')
		switch c % 4 {
		case 1:
			res = 'f'
		case 2:
			if r.IntN(2) == 0 {
				res = 'f'
			}
		case 3:
			if idx >= 3 {
				res = 'f'
			}
		}
		if r.IntN(100) < 3 {
			res = 'e'
		}
		at := aggregator.Micros(base.Add(time.Duration(len(batches)) * 100 * time.Millisecond))
		batch = append(batch, RunObservation{
			Key:    RunKey{Key: k, Version: "v1", Case: fmt.Sprintf("case-%07d", c), RunIndex: idx},
			Record: RunRecord{Result: res, VersionSeq: 1, Runs: 5, Occurred: at - 1e6, Assessed: at, Reply: true, Tokens: 3 + r.IntN(38)},
		})
		if len(batch) == size || i == runs-1 {
			batches = append(batches, batch)
			ats = append(ats, time.UnixMicro(at))
			batch = nil
		}
	}
	return batches, ats
}

// TestSuiteCost feeds the same batches of graded runs to the current suite script and, when one is
// named, to an earlier one taking the same arguments, alternating their order batch by batch, and
// reports Redis CPU per run of each; the two must return the same outcomes and summaries batch by
// batch. It measures a step of the suite script in one run (machines here are noisy):
//
//	git show <commit>:aggregator/suite/suite.lua > /tmp/suite-prev.lua
//	REPEATRATE_TEST_REDIS=127.0.0.1:16380 REPEATRATE_SUITE_COST=300000 REPEATRATE_SUITE_COST_PREV=/tmp/suite-prev.lua \
//	  go test -count=1 -run TestSuiteCost -v ./aggregator/suite
//
// (REPEATRATE_SUITE_COST_BATCH sets the batch size, 12 000 by default: the eval shape's batches
// under load.)
func TestSuiteCost(t *testing.T) {
	runs, _ := strconv.Atoi(os.Getenv("REPEATRATE_SUITE_COST"))
	if runs <= 0 {
		t.Skip("set REPEATRATE_SUITE_COST to the number of graded runs")
	}
	size := 12000
	if n, err := strconv.Atoi(os.Getenv("REPEATRATE_SUITE_COST_BATCH")); err == nil && n > 0 {
		size = n
	}
	ctx := context.Background()
	client := testenv.Redis(t)
	names := []string{"current"}
	var prev *redis.Script
	if f := os.Getenv("REPEATRATE_SUITE_COST_PREV"); f != "" {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		prev = redis.NewScript(string(src))
		if err := prev.Load(ctx, client).Err(); err != nil {
			t.Fatal(err)
		}
		names = append(names, "previous")
	}
	if err := suiteScript.Load(ctx, client).Err(); err != nil {
		t.Fatal(err)
	}
	stores := make([]*Redis, len(names))
	for i := range stores {
		prefix := testenv.Name(t, fmt.Sprint("suitecost", i))
		testenv.CleanPrefix(t, client, prefix)
		s, err := NewRedis(client, aggregator.RedisConfig{Prefix: prefix, Retention: 30 * 24 * time.Hour}, Config{})
		if err != nil {
			t.Fatal(err)
		}
		stores[i] = s
	}
	cpuOf := func() float64 { return redisCPU(ctx, client) }
	var info float64 // INFO's own cost, taken off each measurement
	for i := 0; i < 20; i++ {
		a := cpuOf()
		info += (cpuOf() - a) / 20
	}
	batches, ats := suiteCostStream(runs, size)
	cost := make([]float64, len(names))
	measuredRuns, warmup := 0, len(batches)/10
	for b, batch := range batches {
		e := Encode(batch)
		got := make([]Applied, len(names))
		for j := range names {
			which := (b + j) % len(names)
			s := stores[which]
			before := cpuOf()
			var replies []any
			var err error
			s.fill(e, ats[b])
			if which == 0 {
				replies, err = s.call(ctx, e.suites, true, func(k Key) []any { return e.args[k] })
			} else {
				replies = make([]any, len(e.suites))
				for n, k := range e.suites {
					runsKey, annKey := s.keys(k)
					if replies[n], err = prev.EvalSha(ctx, client, []string{runsKey, annKey}, e.args[k]...).Result(); err != nil {
						break
					}
				}
			}
			after := cpuOf()
			if err != nil {
				t.Fatalf("batch %d, %s: %v", b, names[which], err)
			}
			if b >= warmup {
				cost[which] += after - before - info
			}
			if got[which], err = e.applied(replies); err != nil {
				t.Fatalf("batch %d, %s: %v", b, names[which], err)
			}
		}
		if b >= warmup {
			measuredRuns += len(batch)
		}
		if len(names) > 1 && !reflect.DeepEqual(got[0], got[1]) {
			t.Fatalf("batch %d: current %+v, previous %+v", b, got[0], got[1])
		}
	}
	t.Logf("%d runs measured after %d, batches of %d", measuredRuns, warmup*size, size)
	for i, n := range names {
		t.Logf("  %-9s %.2f µs Redis CPU per run", n+":", cost[i]*1e6/float64(measuredRuns))
	}
	if len(names) > 1 {
		t.Logf("  current ÷ previous: %.3f", cost[0]/cost[1])
	}
}
