package suite

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/internal/testenv"
)

// redisCPU returns the Redis server's CPU seconds (user + system, main process).
func redisCPU(ctx context.Context, c *redis.Client) float64 {
	var sum float64
	for _, l := range strings.Split(c.Info(ctx, "cpu").Val(), "\r\n") {
		for _, p := range []string{"used_cpu_user:", "used_cpu_sys:"} {
			if v, ok := strings.CutPrefix(l, p); ok {
				f, _ := strconv.ParseFloat(v, 64)
				sum += f
			}
		}
	}
	return sum
}

// BenchmarkRedisApply feeds one suite version batches of graded runs (5 runs per case, a short
// reply each), as the eval shape of the harness does, and reports Redis CPU per run, at the batch
// bounds of `repeatrate dev` (2 000) and of `run` (16 000). The suite grows by b.N runs: the cost
// must not grow with it, nor with the batch. With split, each case's last two runs come 3 200
// cases later, so every case is touched by two batches, as when its runs reach the processor
// through different partitions: that costs about twice as much per run (a cell touched again is
// read, judged before and after, and written back).
func BenchmarkRedisApply(b *testing.B) {
	for _, batch := range []int{2000, 16000} {
		b.Run(fmt.Sprint("batch=", batch), func(b *testing.B) { benchmarkRedisApply(b, batch, 0) })
	}
	b.Run("batch=16000/split", func(b *testing.B) { benchmarkRedisApply(b, 16000, 3200) })
}

func benchmarkRedisApply(b *testing.B, batch, lag int) {
	client := testenv.Redis(b)
	ctx := context.Background()
	prefix := testenv.Name(b, "suitebench")
	testenv.CleanPrefix(b, client, prefix)
	b.Cleanup(func() { testenv.CleanPrefix(b, client, prefix) })
	cfg := Config{}
	cfg.Validate()
	store, err := NewRedis(client, aggregator.RedisConfig{Prefix: prefix, Retention: time.Hour}, cfg)
	if err != nil {
		b.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	run := func(c, i int) RunObservation {
		return RunObservation{Key: RunKey{Key: Key{"w", "s"}, Version: "v1", Case: fmt.Sprint("case-", c), RunIndex: int64(i)},
			Record: RunRecord{Result: "pf"[r.IntN(2)], VersionSeq: 1, Runs: 5, Occurred: aggregator.Micros(t0),
				Assessed: aggregator.Micros(t0), Reply: true, Tokens: 3 + r.IntN(38), GzipRatio: 1.5}}
	}
	// Runs 0–2 of case c, then runs 3 and 4 of case c-lag.
	seq := make([]RunObservation, 0, b.N+5)
	for c := 0; len(seq) < b.N; c++ {
		seq = append(seq, run(c, 0), run(c, 1), run(c, 2))
		if c >= lag {
			seq = append(seq, run(c-lag, 3), run(c-lag, 4))
		}
	}
	obs := make([]RunObservation, 0, batch)
	cpu0 := redisCPU(ctx, client)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		obs = append(obs, seq[i])
		if len(obs) == batch || i == b.N-1 {
			if _, err := store.Apply(ctx, obs, t0); err != nil {
				b.Fatal(err)
			}
			obs = obs[:0]
		}
	}
	b.StopTimer()
	b.ReportMetric((redisCPU(ctx, client)-cpu0)*1e6/float64(b.N), "redis-cpu-µs/run")
}
