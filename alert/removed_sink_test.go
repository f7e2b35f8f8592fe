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
	both.serverTime = serverAt(t0)
	if _, err := both.KeepSinks(ctx); err != nil {
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
	amOnly.serverTime = serverAt(t0.Add(SinkGrace / 2))
	if forgot, err := amOnly.KeepSinks(ctx); err != nil || len(forgot) != 0 {
		t.Fatalf("within the grace: forgot %v (%v)", forgot, err)
	}
	if ob, due := queued("hook"); ob != 1 || due != 1 {
		t.Fatalf("within the grace hook's queue went: %d outboxes, %d due", ob, due)
	}
	// Past the grace since any evaluator had hook: its queue goes, am's stays.
	amOnly.serverTime = serverAt(t0.Add(SinkGrace + time.Minute))
	forgot, err := amOnly.KeepSinks(ctx)
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

// A resolved alert whose only undelivered notifications were for a forgotten sink is put at rest
// as a delivery would: it lingers, leaves the index and is listed as recently resolved, not as a
// record kept forever.
func TestForgottenSinkPutsItsResolvedRecordsAtRest(t *testing.T) {
	rdb := testenv.Redis(t)
	prefix := testenv.Name(t, "alert")
	testenv.CleanPrefix(t, rdb, prefix)
	ctx := context.Background()
	clk := &clock{t: t0}
	am, hook := &recordingSink{name: "am"}, &recordingSink{name: "hook", fail: true}
	both, _ := NewRedis(rdb, prefix, []string{"am", "hook"})
	ev := newTestEvaluator(t, both, "rules:\n- {name: high, kind: threshold, window: 24h, value: 0.1, min_scored: 20}\n", []Sink{am, hook}, clk)
	ev.Apply(Update{Snapshot: snap("live", 1, [2]int64{30, 100}, [2]int64{30, 100}, t0)})
	evaluateAndDeliver(t, ev, clk, am, t0)
	ev.Apply(Update{Snapshot: snap("live", 2, [2]int64{1, 100}, [2]int64{1, 100}, t0.Add(time.Hour))})
	evaluateAndDeliver(t, ev, clk, am, t0.Add(time.Hour))
	ev.Deliver(ctx, hook) // fails: hook's outbox keeps the firing and the resolution
	keys, _ := rdb.SMembers(ctx, both.index()).Result()
	if len(keys) != 1 {
		t.Fatalf("records indexed: %v", keys)
	}
	both.serverTime = serverAt(t0)
	both.KeepSinks(ctx)
	amOnly, _ := NewRedis(rdb, prefix, []string{"am"})
	amOnly.serverTime = serverAt(t0.Add(SinkGrace + time.Minute))
	if forgot, err := amOnly.KeepSinks(ctx); err != nil || len(forgot) != 1 {
		t.Fatalf("forgot %v (%v), want hook", forgot, err)
	}
	if n, _ := rdb.SCard(ctx, both.index()).Result(); n != 0 {
		t.Errorf("the resolved record is still indexed")
	}
	if ttl, _ := rdb.PTTL(ctx, keys[0]).Result(); ttl <= 0 || ttl > 24*time.Hour {
		t.Errorf("the resolved record's TTL is %v, want it to linger a day", ttl)
	}
	if _, err := rdb.ZScore(ctx, both.recent(), keys[0]).Result(); err != nil {
		t.Errorf("the resolved record is not listed as recently resolved: %v", err)
	}
}

// A pending alert shows no kind and no evidence of an earlier episode of the same rule and
// subject: it has not fired in this one.
func TestPendingAlertShowsNoEarlierEpisode(t *testing.T) {
	rdb := testenv.Redis(t)
	prefix := testenv.Name(t, "alert")
	testenv.CleanPrefix(t, rdb, prefix)
	ctx := context.Background()
	clk := &clock{t: t0}
	am := &recordingSink{name: "am"}
	store, _ := NewRedis(rdb, prefix, []string{"am"})
	ev := newTestEvaluator(t, store, "rules:\n- {name: high, kind: threshold, window: 24h, value: 0.1, min_scored: 20, for: 5m}\n", []Sink{am}, clk)
	ev.Apply(Update{Snapshot: snap("live", 1, [2]int64{30, 100}, [2]int64{30, 100}, t0)})
	evaluateAndDeliver(t, ev, clk, am, t0)
	evaluateAndDeliver(t, ev, clk, am, t0.Add(6*time.Minute)) // fires
	ev.Apply(Update{Snapshot: snap("live", 2, [2]int64{1, 100}, [2]int64{1, 100}, t0.Add(7*time.Minute))})
	evaluateAndDeliver(t, ev, clk, am, t0.Add(7*time.Minute)) // resolves
	ev.Apply(Update{Snapshot: snap("live", 3, [2]int64{90, 200}, [2]int64{90, 200}, t0.Add(8*time.Minute))})
	evaluateAndDeliver(t, ev, clk, am, t0.Add(8*time.Minute)) // pending again
	store.now = clk.now
	got, err := store.CurrentAlerts(ctx, "acme", 10)
	if err != nil || len(got) != 1 || got[0].State != "pending" {
		t.Fatalf("current alerts: %+v %v (notifications %v)", got, err, am.kinds())
	}
	if got[0].Kind != "" || got[0].Evidence != nil || got[0].FiredAt != nil {
		t.Errorf("a pending alert shows an earlier episode: kind %q, evidence %+v, fired %v", got[0].Kind, got[0].Evidence, got[0].FiredAt)
	}
}

// serverAt is a Redis clock stopped at t, for Redis.serverTime.
func serverAt(t time.Time) func(context.Context) (time.Time, error) {
	return func(context.Context) (time.Time, error) { return t, nil }
}
