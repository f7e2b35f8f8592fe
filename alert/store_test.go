package alert

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/repeatrate/repeatrate/internal/testenv"
)

// recordingSink remembers what it was sent, by id, across evaluators.
type recordingSink struct {
	name string
	mu   sync.Mutex
	sent []Notification
	fail bool
}

func (s *recordingSink) Name() string        { return s.name }
func (s *recordingSink) Takes(n Notify) bool { return n != NotifyResend || s.name == "am" }
func (s *recordingSink) Send(_ context.Context, notes []Notification) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail {
		return context.DeadlineExceeded
	}
	s.sent = append(s.sent, notes...)
	return nil
}

func (s *recordingSink) kinds() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, n := range s.sent {
		out = append(out, n.Kind)
	}
	return out
}

// clock is a settable time shared by the evaluators of a test.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) set(t time.Time) { c.mu.Lock(); c.t = t; c.mu.Unlock() }

func newTestEvaluator(t testing.TB, store *Redis, rules string, sinks []Sink, clk *clock) *Evaluator {
	t.Helper()
	rs, err := Parse([]byte(rules))
	if err != nil {
		t.Fatal(err)
	}
	e, err := NewEvaluator(EvaluatorConfig{Rules: rs, Lease: time.Minute}, store, sinks, clk.now, zap.NewNop(), NewMetrics(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	e.Apply(Update{CaughtUp: true})
	return e
}

// newAlertTest returns a store under a prefix of the test's own on the test Redis, a recording
// Alertmanager sink "am" and a clock at t0.
func newAlertTest(t *testing.T) (*Redis, *recordingSink, *clock) {
	t.Helper()
	rdb := testenv.Redis(t)
	prefix := testenv.Name(t, "alert")
	testenv.CleanPrefix(t, rdb, prefix)
	store, _ := NewRedis(rdb, prefix, []string{"am"})
	return store, &recordingSink{name: "am"}, &clock{t: t0}
}

const raceRules = "rules:\n- {name: high, kind: threshold, window: 24h, value: 0.1, min_scored: 20, for: 5m}\n"

// TestTwoEvaluatorsRace runs two evaluators on the same snapshots and Redis, evaluating and
// delivering concurrently at every step: each transition and each notification happens once.
func TestTwoEvaluatorsRace(t *testing.T) {
	rdb := testenv.Redis(t)
	prefix := testenv.Name(t, "alert")
	testenv.CleanPrefix(t, rdb, prefix)
	ctx := context.Background()
	kafka, am := &recordingSink{name: "kafka"}, &recordingSink{name: "am"}
	clk := &clock{t: t0}
	var evs []*Evaluator
	for range 2 {
		store, err := NewRedis(rdb, prefix, []string{"kafka", "am"})
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, newTestEvaluator(t, store, raceRules, []Sink{kafka, am}, clk))
	}
	both := func(f func(e *Evaluator) error) {
		var wg sync.WaitGroup
		for _, e := range evs {
			wg.Go(func() {
				for range 5 {
					if err := f(e); err != nil {
						t.Error(err)
					}
				}
			})
		}
		wg.Wait()
	}
	round := func(at time.Duration) {
		clk.set(t0.Add(at))
		both(func(e *Evaluator) error { return e.Evaluate(ctx, clk.now()) })
		both(func(e *Evaluator) error { return e.Deliver(ctx, kafka) })
		both(func(e *Evaluator) error { return e.Deliver(ctx, am) })
	}
	high := snap("live", 1, [2]int64{30, 100}, [2]int64{30, 100}, t0)
	low := snap("live", 2, [2]int64{30, 400}, [2]int64{30, 400}, t0.Add(6*time.Hour))
	for _, e := range evs {
		e.Apply(Update{Snapshot: high})
	}
	round(0)                              // pending
	round(5 * time.Minute)                // fires
	round(5*time.Minute + 30*time.Second) // still firing: nothing new
	round(6 * time.Minute)                // resend interval (1m default) over: Alertmanager only
	for _, e := range evs {
		e.Apply(Update{Snapshot: low})
	}
	round(6*time.Minute + 30*time.Second) // resolves
	round(7 * time.Minute)
	if got := kafka.kinds(); len(got) != 2 || got[0] != "firing" || got[1] != "resolved" {
		t.Errorf("kafka got %v, want [firing resolved]", got)
	}
	if got := am.kinds(); len(got) != 3 || got[0] != "firing" || got[1] != "resend" || got[2] != "resolved" {
		t.Errorf("alertmanager got %v, want [firing resend resolved]", got)
	}
	if k := kafka.sent; len(k) == 2 && (k[0].ID == k[1].ID || k[0].Alert.FiredAt != t0.Add(5*time.Minute) || k[1].Alert.ResolvedAt == nil) {
		t.Errorf("notifications %+v", k)
	}
	// At rest: the record lingers with a TTL and has left the index.
	keys, err := evs[0].store.Keys(ctx)
	if err != nil || len(keys) != 0 {
		t.Errorf("index %v, %v", keys, err)
	}
}

// TestRestartNeitherDropsNorDuplicates: an evaluator that committed a firing and died before
// delivering leaves it in the outbox, where a fresh evaluator (empty table) delivers it; a sender
// that died after claiming holds the lease until it ends, then the next one delivers; a failed
// send is retried after its backoff.
func TestRestartNeitherDropsNorDuplicates(t *testing.T) {
	rdb := testenv.Redis(t)
	prefix := testenv.Name(t, "alert")
	testenv.CleanPrefix(t, rdb, prefix)
	ctx := context.Background()
	kafka := &recordingSink{name: "kafka"}
	clk := &clock{t: t0}
	store, _ := NewRedis(rdb, prefix, []string{"kafka"})
	rules := "rules:\n- {name: high, kind: threshold, window: 24h, value: 0.1, min_scored: 20}\n"

	first := newTestEvaluator(t, store, rules, []Sink{kafka}, clk)
	first.Apply(Update{Snapshot: snap("live", 1, [2]int64{30, 100}, [2]int64{30, 100}, t0)})
	if err := first.Evaluate(ctx, t0); err != nil {
		t.Fatal(err)
	}
	// first dies here, without delivering. A sender claims and dies too.
	if _, err := store.Claim(ctx, "kafka", t0, time.Minute, 10); err != nil {
		t.Fatal(err)
	}
	second := newTestEvaluator(t, store, rules, []Sink{kafka}, clk)
	second.Apply(Update{Snapshot: snap("live", 1, [2]int64{30, 100}, [2]int64{30, 100}, t0)})
	clk.set(t0.Add(30 * time.Second))
	if err := second.Evaluate(ctx, clk.now()); err != nil {
		t.Fatal(err)
	}
	if err := second.Deliver(ctx, kafka); err != nil {
		t.Fatal(err)
	}
	if got := kafka.kinds(); len(got) != 0 {
		t.Fatalf("delivered %v within the dead sender's lease", got)
	}
	// The lease is over; the sink fails once, then works after the backoff.
	kafka.fail = true
	clk.set(t0.Add(time.Minute))
	if err := second.Deliver(ctx, kafka); err != nil {
		t.Fatal(err)
	}
	kafka.fail = false
	if err := second.Deliver(ctx, kafka); err != nil {
		t.Fatal(err)
	}
	if got := kafka.kinds(); len(got) != 0 {
		t.Fatalf("delivered %v during the backoff", got)
	}
	clk.set(t0.Add(time.Minute + 2*time.Second))
	for range 3 {
		if err := second.Deliver(ctx, kafka); err != nil {
			t.Fatal(err)
		}
	}
	if got := kafka.kinds(); len(got) != 1 || got[0] != "firing" {
		t.Fatalf("delivered %v, want one firing", got)
	}
}

// TestRestartBeforeCaughtUp: an evaluator restarted while an alert fires must not evaluate before
// its subscriber has read the snapshot topics up to where they ended at its start; the alert's
// subject is missing from its table until then, and stepping it as gone would resolve the alert
// and fire it again once the snapshot arrives (with keep_firing_for 0 that is one evaluation).
func TestRestartBeforeCaughtUp(t *testing.T) {
	rdb := testenv.Redis(t)
	prefix := testenv.Name(t, "alert")
	testenv.CleanPrefix(t, rdb, prefix)
	ctx := context.Background()
	kafka := &recordingSink{name: "kafka"}
	clk := &clock{t: t0}
	store, _ := NewRedis(rdb, prefix, []string{"kafka"})
	rules := "rules:\n- {name: high, kind: threshold, window: 24h, value: 0.1, min_scored: 20}\n"
	high := snap("live", 1, [2]int64{30, 100}, [2]int64{30, 100}, t0)

	first := newTestEvaluator(t, store, rules, []Sink{kafka}, clk)
	first.Apply(Update{Snapshot: high})
	if err := first.Evaluate(ctx, t0); err != nil {
		t.Fatal(err)
	}
	if err := first.Deliver(ctx, kafka); err != nil {
		t.Fatal(err)
	}
	// first stops; second starts with an empty table, its subscriber still reading.
	second := newTestEvaluator(t, store, rules, []Sink{kafka}, clk)
	second.caughtUp = false
	clk.set(t0.Add(time.Minute))
	if err := second.Evaluate(ctx, clk.now()); err != nil {
		t.Fatal(err)
	}
	second.Apply(Update{Snapshot: high})
	second.Apply(Update{CaughtUp: true})
	clk.set(t0.Add(2 * time.Minute))
	if err := second.Evaluate(ctx, clk.now()); err != nil {
		t.Fatal(err)
	}
	if err := second.Deliver(ctx, kafka); err != nil {
		t.Fatal(err)
	}
	if got := kafka.kinds(); len(got) != 1 || got[0] != "firing" {
		t.Fatalf("delivered %v across the restart, want the one firing", got)
	}
}

// An outbox is bounded while its sink is down: a condition that flaps 100 times before anything is
// delivered leaves the newest 64 transitions queued, the last one the newest state, so a sink
// that comes back delivers where the alert is now, from a list that did not grow without end.
func TestOutboxIsBoundedWhileItsSinkIsDown(t *testing.T) {
	rdb := testenv.Redis(t)
	prefix := testenv.Name(t, "alert")
	testenv.CleanPrefix(t, rdb, prefix)
	ctx := context.Background()
	store, _ := NewRedis(rdb, prefix, []string{"am"})
	subj := Subject{Key: "a|acme|m|r|c|a|fix|live", Fields: map[string]string{"workspace": "acme"}}
	key := store.Key("high", subj.Key)
	all := func(string, Notify) bool { return true }
	commit := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			at := t0.Add(time.Duration(i) * time.Minute)
			rec, kind := Record{State: StateFiring, ActiveAt: at, FiredAt: at}, "firing"
			if i%2 == 1 {
				rec, kind = Record{State: StateResolved, ResolvedAt: at}, "resolved"
			}
			note := &Notification{ID: fmt.Sprintf("n%d", i), Kind: kind, At: at}
			if ok, err := store.Commit(ctx, key, int64(i), "high", subj, rec, note, nil, all, at); err != nil || !ok {
				t.Fatalf("commit %d: %v %v", i, ok, err)
			}
		}
	}
	commit(0, 100)
	n, err := rdb.LLen(ctx, store.outbox(key, "am")).Result()
	if err != nil || n != 64 {
		t.Fatalf("the outbox holds %d notifications (%v), want the newest 64", n, err)
	}
	last, _ := rdb.LIndex(ctx, store.outbox(key, "am"), -1).Result()
	var note Notification
	if err := json.Unmarshal([]byte(last), &note); err != nil || note.ID != "n99" {
		t.Fatalf("the last queued notification is %s, want the newest (n99)", last)
	}
	// A sender delivers the 64 queued while 10 more transitions trim the front: its
	// acknowledgement removes what is left of what it delivered, and exactly that.
	commit(100, 110)
	if err := store.Ack(ctx, "am", key, 64, "n36", "n99", t0); err != nil {
		t.Fatal(err)
	}
	left, _ := rdb.LRange(ctx, store.outbox(key, "am"), 0, -1).Result()
	if len(left) != 10 || !strings.Contains(left[0], `"n100"`) || !strings.Contains(left[9], `"n109"`) {
		t.Fatalf("after the acknowledgement the outbox holds %d: %v", len(left), left)
	}
}
