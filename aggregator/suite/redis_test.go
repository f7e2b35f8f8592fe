package suite

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/internal/testenv"
)

// randomRuns returns n graded runs over a few suites with duplicates, re-gradings (newer and
// older), versions arriving out of order, replies, and collision-prone names.
func randomRuns(r *rand.Rand, n int) []RunObservation {
	suites := []Key{{"ws", "s|1"}, {"ws|s", "1"}, {"w{s}", "suite 2"}}
	var out []RunObservation
	for len(out) < n {
		switch p := r.IntN(100); {
		case p < 20 && len(out) > 0:
			out = append(out, out[r.IntN(len(out))])
		case p < 30 && len(out) > 0:
			o := out[r.IntN(len(out))]
			o.Record.Result = "pfe"[r.IntN(3)]
			o.Record.Assessed += int64(r.IntN(7200)-1800) * 1e6
			o.Record.Seq = int64(r.IntN(3))
			out = append(out, o)
		default:
			v := r.IntN(12)
			runs := int64(5 + r.IntN(8)/7*3) // mostly 5, sometimes 8: planned runs grow
			o := RunObservation{
				Key: RunKey{Key: suites[r.IntN(len(suites))], Version: fmt.Sprintf("v%d", v),
					Case: fmt.Sprintf("case|%d", r.IntN(40)), RunIndex: r.Int64N(runs)},
				Record: RunRecord{Result: "ppppfe"[r.IntN(6)], VersionSeq: int64(v) + int64(r.IntN(60)/59*r.IntN(20)), Runs: runs,
					Occurred: aggregator.Micros(t0) + int64(r.IntN(3600))*1e6, Assessed: aggregator.Micros(t0) + int64(r.IntN(3600))*1e6},
			}
			if r.IntN(2) == 0 {
				o.Record.Reply, o.Record.Tokens, o.Record.GzipRatio = true, r.IntN(500), r.Float64()*20
				if r.IntN(10) == 0 {
					o.Record.Trigger = "repeat_pattern"
				}
			}
			out = append(out, o)
		}
	}
	return out
}

// The Redis store keeps the model's summaries batch after batch: on real Redis, and on the
// embedded Redis of `repeatrate dev` (another Lua: no bit library, for one).
func TestRedisSuitesMatchModel(t *testing.T) {
	t.Run("embedded", func(t *testing.T) {
		m := miniredis.RunT(t)
		matchModel(t, redis.NewClient(&redis.Options{Addr: m.Addr()}))
	})
	t.Run("redis", func(t *testing.T) { matchModel(t, testenv.Redis(t)) })
}

func matchModel(t *testing.T, client *redis.Client) {
	ctx := context.Background()
	configs := map[string]Config{
		"judge all":    {MinHistory: 3, MissingAfter: 20 * time.Minute},
		"judge last 4": {MinHistory: 3, JudgeLastVersions: 4, MissingAfter: 20 * time.Minute},
	}
	for name, cfg := range configs {
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		for _, seed := range []uint64{1, 2} {
			t.Run(fmt.Sprint(name, " seed ", seed), func(t *testing.T) {
				r := rand.New(rand.NewPCG(seed, 5))
				stream := randomRuns(r, 6000)
				store := newTestRedis(t, client, "suite", cfg)
				model := NewMemory(cfg)
				// Observation times move forward through the occurred times, so cases mature
				// (missing runs count) while the stream runs.
				at := t0
				reordered, missing, revived := 0, 0, 0
				for i := 0; i < len(stream); {
					batch := stream[i:min(i+1+r.IntN(400), len(stream))]
					i += len(batch)
					at = at.Add(time.Duration(r.IntN(240)) * time.Second)
					before := map[Key]orderState{}
					for _, o := range batch {
						before[o.Key.Key] = model.Model.orderState(o.Key.Key, cfg)
					}
					got, err := store.Apply(ctx, batch, at)
					if err != nil {
						t.Fatal(err)
					}
					want, _ := model.Apply(ctx, batch, at)
					for k := range before {
						if model.Model.reordered(k, before[k], cfg) {
							reordered++
						}
					}
					if !reflect.DeepEqual(got.Outcomes, want.Outcomes) || !reflect.DeepEqual(got.Suites, want.Suites) {
						t.Fatalf("outcomes differ before event %d", i)
					}
					for _, k := range got.Suites {
						g, w := got.Summaries[k], want.Summaries[k]
						if d := summaryDiff(g, w); d != "" {
							t.Fatalf("summary of %v differs after event %d: %s", k, i, d)
						}
						for _, v := range w.Versions {
							missing += len(v.Missing)
						}
						revived += len(w.Revived)
						// Announce some of them, on both stores.
						if len(w.Revived) > 0 && r.IntN(2) == 0 {
							c := []string{w.Revived[0].CaseID}
							if store.MarkAnnounced(ctx, k, c) != nil || model.MarkAnnounced(ctx, k, c) != nil {
								t.Fatal("mark announced")
							}
						}
					}
				}
				// The run was busy enough to exercise every rule.
				if reordered == 0 || missing == 0 || revived == 0 {
					t.Fatalf("reordered %d batches, listed %d missing cases, %d revived: the stream must exercise each", reordered, missing, revived)
				}
				for _, k := range model.Model.Suites() {
					if d, _ := model.Model.Discrimination(k, cfg); d.AlwaysPass+d.AlwaysFail+d.Discriminating == 0 {
						t.Fatalf("suite %v judged nothing", k)
					}
					// Read returns every version, as the model sums them.
					got, err := store.Read(ctx, k, at)
					if err != nil {
						t.Fatal(err)
					}
					want := model.Model.Summary(k, slices.Sorted(slices.Values(model.Model.Versions(k))), model.announced[k], cfg, at)
					if d := summaryDiff(got, &want); d != "" {
						t.Fatalf("read of %v differs: %s", k, d)
					}
				}
			})
		}
	}
}

// suiteStores returns the in-memory store and a Redis store under a fresh prefix.
func suiteStores(t *testing.T, cfg aggregator.RedisConfig, sc Config) map[string]interface {
	Apply(context.Context, []RunObservation, time.Time) (Applied, error)
} {
	client := testenv.Redis(t)
	cfg.Prefix = testenv.Name(t, "suite")
	testenv.CleanPrefix(t, client, cfg.Prefix)
	rs, err := NewRedis(client, cfg, sc)
	if err != nil {
		t.Fatal(err)
	}
	return map[string]interface {
		Apply(context.Context, []RunObservation, time.Time) (Applied, error)
	}{"memory": NewMemory(sc), "redis": rs}
}

// Every output a batch causes is caused again when the same batch is applied again (a redelivery
// after a crash past the suite apply, or a script call re-run by a client retry), abnormal
// samples included, although every run of the second apply is a duplicate.
func TestSuiteRedeliveryRepublishes(t *testing.T) {
	ctx := context.Background()
	cfg := Config{MinHistory: 3}
	cfg.Validate()
	for name, store := range suiteStores(t, aggregator.RedisConfig{Retention: time.Hour}, cfg) {
		t.Run(name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(7, 7))
			stream := randomRuns(r, 3000)
			at := t0.Add(3 * time.Hour)
			abnormal := 0
			for i := 0; i < len(stream); {
				batch := stream[i:min(i+1+r.IntN(200), len(stream))]
				i += len(batch)
				first, err := store.Apply(ctx, batch, at)
				if err != nil {
					t.Fatal(err)
				}
				want := BuildOutput(first, batch, cfg, at)
				again, err := store.Apply(ctx, batch, at)
				if err != nil {
					t.Fatal(err)
				}
				for j, o := range again.Outcomes {
					if o != aggregator.Duplicate && o != aggregator.Stale {
						t.Fatalf("second apply of event %d: outcome %v", i-len(batch)+j, o)
					}
				}
				if got := BuildOutput(again, batch, cfg, at); !reflect.DeepEqual(got, want) {
					t.Fatalf("outputs of the batch ending at event %d differ when applied again:\nabnormal %+v\nwant     %+v\nrevived %+v\nwant    %+v",
						i, got.Abnormal, want.Abnormal, got.Revived, want.Revived)
				}
				abnormal += len(want.Abnormal)
			}
			if abnormal == 0 {
				t.Fatal("the stream raised no abnormal sample: the test checks nothing")
			}
		})
	}
}

// The announced set lives exactly as long as the suite's runs: applies without new announcements
// refresh both, so on an active suite the set never expires first and no revived case is announced
// again. The idle TTL is a parameter: two stores on one prefix with different TTLs stand in for
// time passing (the set marked under a 1 h TTL must take the 10 h one the later applies give the
// runs), and a short real TTL shows the set surviving past its own first expiry.
func TestRedisSuitesAnnouncedExpiresWithRuns(t *testing.T) {
	ctx := context.Background()
	client := testenv.Redis(t)
	prefix := testenv.Name(t, "suite")
	testenv.CleanPrefix(t, client, prefix)
	store := func(ttl time.Duration) *Redis {
		s, err := NewRedis(client, aggregator.RedisConfig{Prefix: prefix, Retention: time.Hour, IdleTTL: ttl}, Config{})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	k := Key{"ws", "ttl"}
	obs := func(i int) []RunObservation {
		return []RunObservation{{Key: RunKey{Key: k, Version: fmt.Sprint("v", i), Case: "c"},
			Record: RunRecord{Result: 'p', VersionSeq: int64(i), Runs: 1, Assessed: int64(i)}}}
	}
	runsKey, annKey := store(time.Hour).keys(k)
	pttl := func() (runs, ann time.Duration) {
		return client.PTTL(ctx, runsKey).Val(), client.PTTL(ctx, annKey).Val()
	}
	// Within a second of each other: the two keys' TTLs are set a few commands apart, and read by
	// two commands (the set's second, so it reads lower by the time between them). It may read a
	// few milliseconds higher: Redis 7.0 reads its clock afresh for each command inside a script,
	// so the PEXPIRE that copies the runs' PTTL can land a millisecond after the PTTL (CI saw
	// 59m59.999s against 1h0m0s). That is the safe side: the set never expires before the runs.
	tied := func(step string, atLeast time.Duration) {
		t.Helper()
		runs, ann := pttl()
		if runs < atLeast || ann < runs-time.Second || ann > runs+50*time.Millisecond {
			t.Fatalf("%s: runs PTTL %v, announced PTTL %v: want both at least %v and the set's within a second below the runs' (or 50 ms above)", step, runs, ann, atLeast)
		}
	}

	short, long := store(time.Hour), store(10*time.Hour)
	if _, err := short.Apply(ctx, obs(1), t0); err != nil {
		t.Fatal(err)
	}
	if err := short.MarkAnnounced(ctx, k, []string{"c"}); err != nil {
		t.Fatal(err)
	}
	tied("announced under 1h", 59*time.Minute)
	// Applies without announcements refresh the set with the runs.
	for i := 2; i <= 3; i++ {
		if _, err := long.Apply(ctx, obs(i), t0); err != nil {
			t.Fatal(err)
		}
		tied(fmt.Sprint("apply ", i, " under 10h"), 9*time.Hour)
	}
	// An announcement under a shorter TTL does not cut the set below the runs' lifetime.
	if err := short.MarkAnnounced(ctx, k, []string{"d"}); err != nil {
		t.Fatal(err)
	}
	tied("announced again under 1h", 9*time.Hour)

	// Real expiry, small TTL: announced at 0, applied at about 0.6 s, read at about 1.2 s: the set
	// would have expired at 1 s had the apply not refreshed it.
	testenv.CleanPrefix(t, client, prefix)
	quick := store(time.Second)
	if _, err := quick.Apply(ctx, obs(1), t0); err != nil {
		t.Fatal(err)
	}
	if err := quick.MarkAnnounced(ctx, k, []string{"c"}); err != nil {
		t.Fatal(err)
	}
	for i := 2; i <= 3; i++ {
		time.Sleep(600 * time.Millisecond)
		if _, err := quick.Apply(ctx, obs(i), t0); err != nil {
			t.Fatal(err)
		}
		if !client.SIsMember(ctx, annKey, "c").Val() {
			runs, ann := pttl()
			t.Fatalf("apply %d: case c is no longer announced (runs PTTL %v, announced PTTL %v): it would be announced again", i, runs, ann)
		}
	}
	// A suite left idle drops its runs and its announcements together.
	if err := client.PExpire(ctx, runsKey, time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	if err := quick.MarkAnnounced(ctx, k, []string{"e"}); err != nil {
		t.Fatal(err)
	}
	if n := client.Exists(ctx, runsKey, annKey).Val(); n != 0 {
		t.Fatalf("%d keys of a dropped suite remain", n)
	}
}

// replyStream is randomRuns with the reply analysis filled in as FromEvalRun fills it, and some
// re-gradings that bring another reply (abnormal or not) for a run seen before.
func replyStream(r *rand.Rand, n int) []RunObservation {
	out := randomRuns(r, n)
	for i := range out {
		if i > 0 && r.IntN(10) == 0 {
			o := out[r.IntN(i)]
			o.Record.Assessed += int64(r.IntN(7200)-1800) * 1e6
			o.Record.Reply, o.Record.Tokens, o.Record.GzipRatio = true, r.IntN(500), r.Float64()*20
			o.Record.Trigger = []string{"", "gzip_ratio", "repeat_pattern"}[r.IntN(3)]
			out[i] = o
		}
		o := &out[i]
		o.Stats = ReplyStats{Tokens: o.Record.Tokens, GzipRatio: o.Record.GzipRatio, Trigger: o.Record.Trigger}
	}
	return out
}

// TestSuiteAlertsIndependentOfDelivery: random streams delivered as the consumer may deliver them —
// cut into batches at random, and after a crash between a batch's suite apply and its publish
// delivered again from the last committed position, cut anew — publish the same set of
// abnormal-sample alert ids as one batch per result without a crash, in both reply modes and on
// both stores.
func TestSuiteAlertsIndependentOfDelivery(t *testing.T) {
	ctx := context.Background()
	type store = interface {
		Apply(context.Context, []RunObservation, time.Time) (Applied, error)
	}
	// deliver applies stream to s as r cuts (into batches of up to maxBatch) and crashes it, and
	// returns the alert ids published; r nil delivers one result per batch without a crash.
	deliver := func(t *testing.T, s store, stream []RunObservation, cfg Config, r *rand.Rand, maxBatch int) map[string]bool {
		published := map[string]bool{}
		committed, pos, crashes := 0, 0, 0
		for pos < len(stream) {
			n := 1
			if r != nil {
				n += r.IntN(maxBatch)
			}
			batch := stream[pos:min(pos+n, len(stream))]
			applied, err := s.Apply(ctx, batch, t0)
			if err != nil {
				t.Fatal(err)
			}
			out := BuildOutput(applied, batch, cfg, t0)
			if r != nil && crashes < 40 && r.IntN(4) == 0 {
				crashes++
				pos = committed // the outputs are lost; delivery starts again where it was committed
				continue
			}
			for _, a := range out.Abnormal {
				published[alertID(a)] = true
			}
			if pos += len(batch); r == nil || r.IntN(3) == 0 {
				committed = pos
			}
		}
		return published
	}
	for _, mode := range []ReplyMode{ReplyDefault, ReplyOpenCompass} {
		for _, seed := range []uint64{1, 2, 3} {
			t.Run(fmt.Sprintf("%v seed %d", mode, seed), func(t *testing.T) {
				cfg := Config{MinHistory: 3, ReplyMode: mode}
				if err := cfg.Validate(); err != nil {
					t.Fatal(err)
				}
				stream := replyStream(rand.New(rand.NewPCG(seed, 11)), 1500)
				want := deliver(t, NewMemory(cfg), stream, cfg, nil, 0)
				perRun := map[RunKey]int{}
				for _, o := range stream {
					if o.Record.Trigger != "" {
						perRun[o.Key]++
					}
				}
				if len(want) == 0 || len(want) == len(perRun) {
					t.Fatalf("%d alerts for %d runs: the stream must raise alerts, some runs more than one", len(want), len(perRun))
				}
				for name := range suiteStores(t, aggregator.RedisConfig{Retention: time.Hour}, cfg) {
					for cut := range uint64(3) {
						s := suiteStores(t, aggregator.RedisConfig{Retention: time.Hour}, cfg)[name] // fresh
						got := deliver(t, s, stream, cfg, rand.New(rand.NewPCG(seed, cut)), []int{20, 150, 600}[cut])
						if !maps.Equal(got, want) {
							var missing, extra []string
							for id := range want {
								if !got[id] {
									missing = append(missing, id)
								}
							}
							for id := range got {
								if !want[id] {
									extra = append(extra, id)
								}
							}
							t.Fatalf("%s, cut %d: %d alerts, want %d; missing %v; extra %v", name, cut, len(got), len(want), missing, extra)
						}
					}
				}
			})
		}
	}
}

// orderState is what decides whether a batch reorders a suite (and so makes the Redis store
// recompute every case): the seq of every version, and the first judged version.
type orderState struct {
	vseq   map[string]int64
	judged string
}

func (m *Model) orderState(k Key, cfg Config) orderState {
	st := orderState{vseq: map[string]int64{}}
	if s := m.suites[k]; s != nil {
		maps.Copy(st.vseq, s.vseq)
		st.judged = judgedFrom(m.Versions(k), cfg)
	}
	return st
}

// reordered reports whether the order changed since before: a version that existed then has a
// greater seq, or the first judged version moved.
func (m *Model) reordered(k Key, before orderState, cfg Config) bool {
	now := m.orderState(k, cfg)
	for v, q := range before.vseq {
		if now.vseq[v] != q {
			return true
		}
	}
	return now.judged != before.judged
}

// summaryDiff names the first part in which two summaries differ, "" when they are equal.
func summaryDiff(got, want *Summary) string {
	if !reflect.DeepEqual(got.Discrimination, want.Discrimination) {
		return fmt.Sprintf("discrimination\n got %+v\nwant %+v", got.Discrimination, want.Discrimination)
	}
	if !reflect.DeepEqual(got.Revived, want.Revived) {
		return fmt.Sprintf("revived\n got %+v\nwant %+v", got.Revived, want.Revived)
	}
	if len(got.Versions) != len(want.Versions) {
		return fmt.Sprintf("%d versions, want %d", len(got.Versions), len(want.Versions))
	}
	for i := range got.Versions {
		if g, w := got.Versions[i], want.Versions[i]; !reflect.DeepEqual(g, w) {
			return fmt.Sprintf("version %s\n got %+v\nwant %+v", w.Version, g, w)
		}
	}
	return ""
}
