package readside

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/repeatrate/repeatrate/aggregator/suite"
	"github.com/repeatrate/repeatrate/internal/testenv"
	"github.com/repeatrate/repeatrate/schemas"
)

// recordBase is a minute's start, so that base+Ns stays in that minute for N < 60.
var recordBase = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func recordSnapshot(agg string, v int64, at time.Time) schemas.Snapshot {
	return schemas.Snapshot{Aggregate: schemas.Aggregate{Workspace: "w", Model: "m", Run: "r", Checkpoint: "c",
		Artifact: "a", CorrectionID: agg, Source: "live"}, Windows: schemas.Windows{All: schemas.Window{Passed: v}},
		ObservedAt: at, Version: v}
}

// feedTap subscribes to a catalog's channel; collect returns the events published since, in order.
type feedTap struct {
	t      *testing.T
	client *redis.Client
	cat    *Catalog
	ps     *redis.PubSub
}

func subscribeFeed(t *testing.T, client *redis.Client, cat *Catalog) *feedTap {
	t.Helper()
	ps := client.Subscribe(context.Background(), cat.Channel())
	if _, err := ps.Receive(context.Background()); err != nil { // the subscription's confirmation
		t.Fatal(err)
	}
	t.Cleanup(func() { ps.Close() })
	return &feedTap{t: t, client: client, cat: cat, ps: ps}
}

// collect publishes an end marker after what was recorded (Redis delivers in order) and returns
// the events before it.
func (f *feedTap) collect() []FeedEvent {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := f.client.Publish(ctx, f.cat.Channel(), "end").Err(); err != nil {
		f.t.Fatal(err)
	}
	var out []FeedEvent
	for {
		msg, err := f.ps.ReceiveMessage(ctx)
		if err != nil {
			f.t.Fatalf("feed: %v after %d events", err, len(out))
		}
		if msg.Payload == "end" {
			return out
		}
		var ev FeedEvent
		if err := json.Unmarshal([]byte(msg.Payload), &ev); err != nil {
			f.t.Fatalf("feed message %q: %v", msg.Payload, err)
		}
		out = append(out, ev)
	}
}

func feedIDs(evs []FeedEvent) []int64 {
	var ids []int64
	for _, ev := range evs {
		ids = append(ids, ev.ID)
	}
	return ids
}

// historyOf lists a history's (minute offset from recordBase, version) pairs.
func historyOf(t *testing.T, cat *Catalog, agg string) [][2]int64 {
	t.Helper()
	pts, err := cat.History(context.Background(), recordSnapshot(agg, 0, recordBase).Aggregate.ID(), false)
	if err != nil {
		t.Fatal(err)
	}
	var out [][2]int64
	for _, p := range pts {
		out = append(out, [2]int64{int64(p.ObservedAt.Sub(recordBase) / time.Minute), p.Version})
	}
	return out
}

// TestRecorderCoalesces: many batches of the same aggregates and suites between two writes leave
// one history point per minute holding that minute's last version, every aggregate and suite in
// the index, and one feed event per subject — its latest snapshot, encoded exactly as
// json.Marshal encodes it. A second interval in the same minute replaces the minute's point.
func TestRecorderCoalesces(t *testing.T) {
	client := testenv.Redis(t)
	prefix := testenv.Name(t, "coalesce")
	testenv.CleanPrefix(t, client, prefix)
	cat := NewCatalog(client, prefix, time.Hour)
	rec := NewRecorder(nopPublisher{}, cat, nil, zap.NewNop())
	f := subscribeFeed(t, client, cat)
	ctx := context.Background()
	aggs := []string{"x", "y", "z"}
	var latest map[string]schemas.Snapshot
	publish := func(from, to int64) {
		latest = map[string]schemas.Snapshot{}
		for v := from; v <= to; v++ {
			var batch []schemas.Snapshot
			for i, a := range aggs {
				s := recordSnapshot(a, v*10+int64(i), recordBase.Add(time.Duration(v)*time.Second))
				batch = append(batch, s)
				latest[s.Aggregate.ID()] = s
			}
			if err := rec.Publish(ctx, batch); err != nil {
				t.Fatal(err)
			}
			at := recordBase.Add(time.Duration(v) * time.Second)
			err := rec.PublishSuites(ctx, suite.Output{
				Discrimination: []schemas.SuiteDiscrimination{{Workspace: "w", Suite: "s", VersionsSeen: int(v), ObservedAt: at}},
				Stability: []schemas.SuiteStability{{Workspace: "w", Suite: "s", Version: "1", Runs: v, ObservedAt: at},
					{Workspace: "w", Suite: "s", Version: "2", Runs: 100 + v, ObservedAt: at}}}, at)
			if err != nil {
				t.Fatal(err)
			}
		}
		if err := rec.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	check := func(round string, last int64) {
		t.Helper()
		evs := f.collect()
		seen := map[string]int{}
		for _, ev := range evs {
			seen[ev.Kind+"/"+ev.Subject+"/"+ev.Version]++
			switch ev.Kind {
			case "snapshot":
				want, _ := json.Marshal(latest[ev.Subject])
				if ev.ID != latest[ev.Subject].Version {
					t.Errorf("%s: feed carries %s version %d, want the latest %d", round, ev.Subject, ev.ID, latest[ev.Subject].Version)
				} else if !bytes.Equal(ev.Data, want) {
					t.Errorf("%s: feed data %s, want json.Marshal's %s", round, ev.Data, want)
				}
			case "discrimination":
				var d schemas.SuiteDiscrimination
				if json.Unmarshal(ev.Data, &d) != nil || d.VersionsSeen != int(last) || ev.ID != recordBase.Add(time.Duration(last)*time.Second).UnixMicro() {
					t.Errorf("%s: discrimination id %d versions_seen %d, want the latest (versions_seen %d)", round, ev.ID, d.VersionsSeen, last)
				}
			case "stability":
				var s schemas.SuiteStability
				want := last
				if ev.Version == "2" {
					want += 100
				}
				if json.Unmarshal(ev.Data, &s) != nil || s.Runs != want || s.Version != ev.Version {
					t.Errorf("%s: stability of %s with %d runs, want the latest (runs %d)", round, ev.Version, s.Runs, want)
				}
			}
		}
		if len(evs) != len(aggs)+3 {
			t.Errorf("%s: %d feed events %v, want one per subject: %d", round, len(evs), seen, len(aggs)+3)
		}
		for k, n := range seen {
			if n != 1 {
				t.Errorf("%s: %d feed events of %s, want 1", round, n, k)
			}
		}
		for i, a := range aggs {
			if h, want := historyOf(t, cat, a), [][2]int64{{0, last*10 + int64(i)}}; !slices.Equal(h, want) {
				t.Errorf("%s: history of %s %v, want %v (one point: the minute's last version)", round, a, h, want)
			}
		}
		pg, err := cat.Aggregates(ctx, "w", "", "", 10)
		if err != nil || len(pg.Items) != len(aggs) {
			t.Errorf("%s: index %v %v, want the %d aggregates", round, pg.Items, err, len(aggs))
		}
		if pg, err := cat.Suites(ctx, "w", "", 10); err != nil || !slices.Equal(pg.Items, []string{"s"}) {
			t.Errorf("%s: suites %v %v, want [s]", round, pg.Items, err)
		}
	}
	publish(1, 20)
	check("first interval", 20)
	publish(21, 40) // the same minute: the point is replaced, not added
	check("second interval", 40)
}

// TestRecorderKeepsEachMinutesLastPoint: an interval that spans minutes writes each minute's last
// snapshot as its history point while the feed carries only the latest; a later interval whose
// snapshot falls in a minute already written (a clock that went back) replaces that point.
func TestRecorderKeepsEachMinutesLastPoint(t *testing.T) {
	client := testenv.Redis(t)
	prefix := testenv.Name(t, "minutes")
	testenv.CleanPrefix(t, client, prefix)
	cat := NewCatalog(client, prefix, time.Hour)
	rec := NewRecorder(nopPublisher{}, cat, nil, zap.NewNop())
	f := subscribeFeed(t, client, cat)
	ctx := context.Background()
	steps := []struct {
		v  int64
		at time.Duration
	}{{1, 10 * time.Second}, {2, 50 * time.Second}, {3, 65 * time.Second}, {4, 120 * time.Second}, {5, 150 * time.Second}}
	for _, s := range steps {
		if err := rec.Publish(ctx, []schemas.Snapshot{recordSnapshot("x", s.v, recordBase.Add(s.at))}); err != nil {
			t.Fatal(err)
		}
	}
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if h, want := historyOf(t, cat, "x"), [][2]int64{{0, 2}, {1, 3}, {2, 5}}; !slices.Equal(h, want) {
		t.Errorf("history %v, want each minute's last version %v", h, want)
	}
	if ids := feedIDs(f.collect()); !slices.Equal(ids, []int64{5}) {
		t.Errorf("feed ids %v, want only version 5", ids)
	}
	for _, s := range []struct {
		v  int64
		at time.Duration
	}{{6, 180 * time.Second}, {7, 170 * time.Second}} {
		if err := rec.Publish(ctx, []schemas.Snapshot{recordSnapshot("x", s.v, recordBase.Add(s.at))}); err != nil {
			t.Fatal(err)
		}
	}
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if h, want := historyOf(t, cat, "x"), [][2]int64{{0, 2}, {1, 3}, {2, 7}, {3, 6}}; !slices.Equal(h, want) {
		t.Errorf("history after a clock went back %v, want %v", h, want)
	}
	if ids := feedIDs(f.collect()); !slices.Equal(ids, []int64{7}) {
		t.Errorf("feed ids %v, want only version 7 (the last published)", ids)
	}
}

// TestPendingCoalesces: what the pending set keeps of a sequence of snapshots of one aggregate —
// the last one, and the last of each other minute — and how many points it counts.
func TestPendingCoalesces(t *testing.T) {
	for _, tc := range []struct {
		name    string
		seconds []int   // observation times after recordBase; versions count from 1
		earlier []int64 // versions kept for the history only, in order
		latest  int64
	}{
		// One minute: only the last.
		{"one minute", []int{1, 2, 59}, nil, 3},
		// Each minute's last stays for the history.
		{"three minutes", []int{1, 59, 60, 119, 120}, []int64{2, 4}, 5},
		// Back into a minute held for the history: the newer replaces it there.
		{"clock back", []int{1, 61, 2}, []int64{2}, 3},
		// Back into the latest's minute from another: plain replacement.
		{"same minute again", []int{61, 1, 62}, []int64{2}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPending()
			for i, s := range tc.seconds {
				p.add(recordJob{snaps: []schemas.Snapshot{recordSnapshot("x", int64(i+1), recordBase.Add(time.Duration(s)*time.Second))}})
			}
			if len(p.aggs) != 1 {
				t.Fatalf("%d aggregates pending, want 1", len(p.aggs))
			}
			var earlier []int64
			for _, s := range p.aggs[0].earlier {
				earlier = append(earlier, s.Version)
			}
			if !slices.Equal(earlier, tc.earlier) || p.aggs[0].latest.Version != tc.latest {
				t.Errorf("earlier %v latest %d, want %v %d", earlier, p.aggs[0].latest.Version, tc.earlier, tc.latest)
			}
			if p.points != len(tc.earlier)+1 || p.batches != len(tc.seconds) {
				t.Errorf("points %d batches %d, want %d %d", p.points, p.batches, len(tc.earlier)+1, len(tc.seconds))
			}
			p.reset()
			if !p.empty() || p.batches != 0 || len(p.aggAt) != 0 {
				t.Errorf("after reset: %+v", p)
			}
		})
	}
}

// runRecorder runs rec until the returned stop is called; stop waits for Run to return.
func runRecorder(t *testing.T, rec *Recorder) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rec.Run(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Fatal("Run did not return after its context ended")
		}
	}
	t.Cleanup(stop)
	return stop
}

// TestRecorderWritesOnShutdown: what is pending when Run's context ends is written before Run
// returns (the interval never elapsed), so a graceful stop leaves the latest recorded.
func TestRecorderWritesOnShutdown(t *testing.T) {
	client := testenv.Redis(t)
	prefix := testenv.Name(t, "shutdown")
	testenv.CleanPrefix(t, client, prefix)
	cat := NewCatalog(client, prefix, time.Hour)
	rec := NewRecorder(nopPublisher{}, cat, nil, zap.NewNop())
	rec.interval = time.Hour
	stop := runRecorder(t, rec)
	for v := int64(1); v <= 3; v++ {
		if err := rec.Publish(context.Background(), []schemas.Snapshot{recordSnapshot("x", v, recordBase.Add(time.Duration(v)*time.Second))}); err != nil {
			t.Fatal(err)
		}
	}
	stop()
	if h := historyOf(t, cat, "x"); !slices.Equal(h, [][2]int64{{0, 3}}) {
		t.Errorf("history after a graceful stop %v, want [[0 3]]", h)
	}
	if pg, err := cat.Aggregates(context.Background(), "w", "", "", 10); err != nil || len(pg.Items) != 1 {
		t.Errorf("index after a graceful stop %v %v, want the aggregate", pg.Items, err)
	}
}

// TestRecorderWritesAtTheBound: with the interval far away, Run writes as soon as the pending set
// holds its bound.
func TestRecorderWritesAtTheBound(t *testing.T) {
	client := testenv.Redis(t)
	prefix := testenv.Name(t, "bound")
	testenv.CleanPrefix(t, client, prefix)
	cat := NewCatalog(client, prefix, time.Hour)
	rec := NewRecorder(nopPublisher{}, cat, nil, zap.NewNop())
	rec.interval, rec.bound = time.Hour, 3
	runRecorder(t, rec)
	for i, a := range []string{"x", "y", "z"} {
		if err := rec.Publish(context.Background(), []schemas.Snapshot{recordSnapshot(a, 1, recordBase.Add(time.Duration(i)*time.Second))}); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		pg, err := cat.Aggregates(context.Background(), "w", "", "", 10)
		if err == nil && len(pg.Items) == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("index %v %v: the full pending set was not written", pg.Items, err)
		}
		time.Sleep(20 * time.Millisecond) // waiting for Run's write, not for speed
	}
}

// TestRecorderCountsDrops: a batch that finds the queue full is dropped and counted, and a write
// that fails counts every batch it coalesced.
func TestRecorderCountsDrops(t *testing.T) {
	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: time.Second})
	defer dead.Close()
	reg := prometheus.NewRegistry()
	rec := NewRecorder(nopPublisher{}, NewCatalog(dead, "dead", time.Hour), reg, zap.NewNop())
	ctx := context.Background()
	for i := range recorderQueue + 5 {
		snap := recordSnapshot(fmt.Sprint(i%7), int64(i+1), recordBase)
		if err := rec.Publish(ctx, []schemas.Snapshot{snap}); err != nil {
			t.Fatal(err)
		}
	}
	if got := testutil.ToFloat64(rec.dropped); got != 5 {
		t.Fatalf("dropped %v with the queue full, want 5", got)
	}
	if err := rec.Flush(ctx); err == nil {
		t.Fatal("Flush to an unreachable Redis succeeded")
	}
	if got := testutil.ToFloat64(rec.dropped); got != recorderQueue+5 {
		t.Errorf("dropped %v after a failed write, want %d (every batch it coalesced)", got, recorderQueue+5)
	}
}

// TestHourlyHistoryKeepsEachHoursLastPoint: the hourly history a week's chart reads holds, per
// hour, the last snapshot recorded in it — whether the hour's minutes reached the recorder in one
// write or in several — and no more than HourlyPoints hours, the oldest dropped first.
func TestHourlyHistoryKeepsEachHoursLastPoint(t *testing.T) {
	client := testenv.Redis(t)
	prefix := testenv.Name(t, "hourly")
	testenv.CleanPrefix(t, client, prefix)
	cat := NewCatalog(client, prefix, 30*24*time.Hour)
	rec := NewRecorder(nopPublisher{}, cat, nil, zap.NewNop())
	ctx := context.Background()
	id := recordSnapshot("x", 0, recordBase).Aggregate.ID()
	want := map[int64]int64{} // hour offset -> last version
	v := int64(0)
	const hours = HourlyPoints + 5
	for h := range int64(hours) {
		// Three minutes of each hour; every other hour in one write, the others a write each.
		for _, m := range []int64{7, 31, 59} {
			v++
			at := recordBase.Add(time.Duration(h)*time.Hour + time.Duration(m)*time.Minute)
			if err := rec.Publish(ctx, []schemas.Snapshot{recordSnapshot("x", v, at)}); err != nil {
				t.Fatal(err)
			}
			if h%2 == 1 {
				if err := rec.Flush(ctx); err != nil {
					t.Fatal(err)
				}
			}
		}
		want[h] = v
		if err := rec.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	pts, err := cat.History(ctx, id, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(pts) != HourlyPoints {
		t.Fatalf("%d hourly points, want %d (the newest hours)", len(pts), HourlyPoints)
	}
	for i, p := range pts {
		h := int64(hours - HourlyPoints + i)
		if off := int64(p.ObservedAt.Sub(recordBase) / time.Hour); off != h || p.Version != want[h] {
			t.Fatalf("point %d: hour %d version %d, want hour %d version %d (the hour's last)", i, off, p.Version, h, want[h])
		}
	}
	minutes, err := cat.History(ctx, id, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(minutes) != 3*hours || minutes[len(minutes)-1].Version != v {
		t.Fatalf("minute history: %d points ending at version %d, want %d ending at %d", len(minutes), minutes[len(minutes)-1].Version, 3*hours, v)
	}
}
