package alert

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/repeatrate/repeatrate/internal/testenv"
)

// A sink removed from the configuration does not keep its queue forever: once no evaluator has
// been configured with it for SinkGrace, its outboxes and due set are dropped, and the remaining
// sinks' queues are untouched. Within the grace — a rolling restart, where an older evaluator
// does not yet know a sink a newer one added — nothing of it is dropped.
func TestRemovedSinkQueueIsDropped(t *testing.T) {
	rdb := testenv.Redis(t)
	prefix := testenv.Name(t, "alert")
	testenv.CleanPrefix(t, rdb, prefix)
	ctx := context.Background()
	clk := &clock{t: t0}
	am, hook := &recordingSink{name: "am", fail: true}, &recordingSink{name: "hook", fail: true}
	both, _ := NewRedis(rdb, prefix, []string{"am", "hook"})
	ev := newTestEvaluator(t, both, "rules:\n- {name: high, kind: threshold, window: 24h, value: 0.1, min_scored: 20}\n", []Sink{am, hook}, clk)
	ev.Apply(Update{Snapshot: snap("live", 1, [2]int64{30, 100}, [2]int64{30, 100}, t0)})
	if err := ev.Evaluate(ctx, t0); err != nil {
		t.Fatal(err)
	}
	if _, err := both.KeepSinks(ctx, t0); err != nil {
		t.Fatal(err)
	}
	queued := func(sink string) (outboxes, due int64) {
		t.Helper()
		keys, err := rdb.Keys(ctx, both.prefix+":ob:"+sink+":*").Result()
		if err != nil {
			t.Fatal(err)
		}
		n, err := rdb.ZCard(ctx, both.due(sink)).Result()
		if err != nil {
			t.Fatal(err)
		}
		return int64(len(keys)), n
	}
	if ob, due := queued("hook"); ob != 1 || due != 1 {
		t.Fatalf("the firing was not queued for hook: %d outboxes, %d due", ob, due)
	}
	// An evaluator configured without hook, within the grace: nothing of hook is dropped.
	amOnly, _ := NewRedis(rdb, prefix, []string{"am"})
	if forgot, err := amOnly.KeepSinks(ctx, t0.Add(SinkGrace/2)); err != nil || len(forgot) != 0 {
		t.Fatalf("within the grace: forgot %v (%v)", forgot, err)
	}
	if ob, due := queued("hook"); ob != 1 || due != 1 {
		t.Fatalf("within the grace hook's queue went: %d outboxes, %d due", ob, due)
	}
	// Past the grace since any evaluator had hook: its queue goes, am's stays.
	forgot, err := amOnly.KeepSinks(ctx, t0.Add(SinkGrace+time.Minute))
	if err != nil || !slices.Equal(forgot, []string{"hook"}) {
		t.Fatalf("past the grace: forgot %v (%v), want [hook]", forgot, err)
	}
	if ob, due := queued("hook"); ob != 0 || due != 0 {
		t.Errorf("hook's queue stayed: %d outboxes, %d due", ob, due)
	}
	if ob, due := queued("am"); ob != 1 || due != 1 {
		t.Errorf("am's queue was touched: %d outboxes, %d due", ob, due)
	}
	if n, _ := rdb.HLen(ctx, both.sinksKey()).Result(); n != 1 {
		t.Errorf("%d sinks remembered, want am alone", n)
	}
}
