package alert

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/repeatrate/repeatrate/internal/testenv"
)

// BenchmarkEvaluateExampleRules is one evaluation of deploy/alert-rules.example.yaml, on real
// Redis, over a table of N aggregates per source (live and evaluation) of which 100 per source got
// a new snapshot since the last evaluation, none alerting but each with its recent rate above its
// baseline's (the change rules' costlier path): what an evaluator spends on the processor's cores
// at every evaluation. µs/update is that divided by the 200 new snapshots; an evaluation's cost
// should follow the updates, not N. scan/N is the evaluation once per evaluation interval at which
// not_measured_for looks at every subject.
//
//	REPEATRATE_TEST_REDIS=127.0.0.1:16379 go test -run '^$' -bench EvaluateExampleRules ./alert
func BenchmarkEvaluateExampleRules(b *testing.B) {
	rules, err := os.ReadFile("../deploy/alert-rules.example.yaml")
	if err != nil {
		b.Fatal(err)
	}
	const changed = 100
	for _, n := range []int{1_000, 10_000, 100_000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			rdb := testenv.Redis(b)
			prefix := testenv.Name(b, "alert")
			testenv.CleanPrefix(b, rdb, prefix)
			store, _ := NewRedis(rdb, prefix, []string{"am"})
			clk := &clock{t: t0}
			e := newTestEvaluator(b, store, string(rules), []Sink{&recordingSink{name: "am"}}, clk)
			put := func(i int, v int64) {
				for _, src := range []string{"live", "evaluation"} {
					s := snap(src, v, [2]int64{4, 300}, [2]int64{20, 2000}, t0)
					s.Aggregate.CorrectionID = fmt.Sprintf("fix-%06d", i)
					e.Apply(Update{Snapshot: s})
				}
			}
			for i := range n {
				put(i, 1)
			}
			ctx := context.Background()
			if err := e.Evaluate(ctx, t0); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := range b.N {
				b.StopTimer()
				for j := range changed {
					put((i*changed+j)%n, int64(2+i))
				}
				b.StartTimer()
				if err := e.Evaluate(ctx, t0.Add(time.Duration(i)*time.Second)); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/(2*changed), "µs/update")
		})
		b.Run(fmt.Sprint("scan/", n), func(b *testing.B) {
			rdb := testenv.Redis(b)
			prefix := testenv.Name(b, "alert")
			testenv.CleanPrefix(b, rdb, prefix)
			store, _ := NewRedis(rdb, prefix, []string{"am"})
			e := newTestEvaluator(b, store, string(rules), []Sink{&recordingSink{name: "am"}}, &clock{t: t0})
			for i := range n {
				s := snap("live", 1, [2]int64{4, 300}, [2]int64{20, 2000}, t0)
				s.Aggregate.CorrectionID = fmt.Sprintf("fix-%06d", i)
				e.Apply(Update{Snapshot: s})
			}
			ctx := context.Background()
			if err := e.Evaluate(ctx, t0); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := range b.N {
				if err := e.Evaluate(ctx, t0.Add(time.Duration(i+1)*e.cfg.Rules.EvaluationInterval)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
