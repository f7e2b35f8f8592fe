package aggregator

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/repeatrate/repeatrate/internal/testenv"
	"github.com/repeatrate/repeatrate/schemas"
)

// collisionScopes are scopes whose naive concatenations meet; their aggregates must stay apart.
var collisionScopes = []schemas.Scope{
	{Workspace: "a:b", Model: "c", Run: "r", Checkpoint: "k", Artifact: "x"},
	{Workspace: "a", Model: "b:c", Run: "r", Checkpoint: "k", Artifact: "x"},
	{Workspace: "a|b", Model: "c", Run: "r", Checkpoint: "k", Artifact: "x"},
	{Workspace: "a", Model: "b|c", Run: "r", Checkpoint: "k", Artifact: "x"},
	{Workspace: "a}b", Model: "{c", Run: "r", Checkpoint: "k", Artifact: "x"},
	{Workspace: "a%7Cb", Model: "c", Run: "r", Checkpoint: "k", Artifact: "x"},
}

// randomStream returns n observations with duplicates, re-assessments (some moving the
// opportunity's occurred time), stale re-assessments, late and far-too-late events, in shuffled
// order, over a clock that moves about 10 days.
func randomStream(r *rand.Rand, n int) []Observation {
	return randomStreamOver(r, n, 10*24*time.Hour, 0)
}

// randomStreamOver is randomStream with the clock moving over span instead of 10 days, and with
// one event in jumpEvery (0: none) occurring far ahead of the clock, so that its aggregate's
// watermark leaps and everything it held expires at once.
func randomStreamOver(r *rand.Rand, n int, span time.Duration, jumpEvery int) []Observation {
	var keys []Key
	for _, sc := range collisionScopes {
		for _, corr := range []string{"fix-1", "fix|2"} {
			keys = append(keys, Key{Scope: sc, CorrectionID: corr, Source: Live}, Key{Scope: sc, CorrectionID: corr, Source: Evaluation})
		}
	}
	base := Micros(t0)
	step := int64(span/time.Microsecond) / int64(n)
	var out []Observation
	for i := 0; len(out) < n; i++ {
		clock := base + int64(i)*step
		switch p := r.IntN(100); {
		case p < 20 && len(out) > 0: // byte-identical duplicate of an earlier event
			out = append(out, out[r.IntN(len(out))])
		case p < 30 && len(out) > 0: // re-assessment: newer or older than the held one
			o := out[r.IntN(len(out))]
			o.Class = Class(1 + r.IntN(3))
			o.Assessed += int64(r.IntN(7200)-1800) * 1e6
			o.Seq = int64(r.IntN(3))
			if r.IntN(3) == 0 { // the correction moved the attempt's time, often across an hour
				o.Occurred += int64(r.IntN(4*3600)-2*3600) * 1e6
			}
			out = append(out, o)
		default:
			back := int64(r.ExpFloat64() * float64(20*time.Minute/time.Microsecond))
			if r.IntN(50) == 0 {
				back = int64(r.IntN(6*24)) * int64(time.Hour/time.Microsecond) // days late
			}
			occ := clock - back
			if jumpEvery > 0 && r.IntN(jumpEvery) == 0 {
				occ = clock + int64(span/time.Microsecond)/3
			}
			out = append(out, Observation{
				Key:           keys[r.IntN(len(keys))],
				OpportunityID: fmt.Sprintf("o%d", r.IntN(n/3+1)),
				Class:         Class(1 + r.IntN(3)),
				Occurred:      occ,
				Assessed:      occ + int64(r.IntN(600))*1e6,
				Seq:           int64(r.IntN(2)),
			})
		}
	}
	// Local shuffle: out of order, but the clock still moves forward overall.
	for i := range out {
		j := i + r.IntN(min(200, len(out)-i))
		out[i], out[j] = out[j], out[i]
	}
	return out
}

// testStore returns a store on the test Redis under a fresh, emptied prefix named after what
// (cfg.Prefix is set here), and the client it uses.
func testStore(t testing.TB, what string, cfg RedisConfig) (*Redis, *redis.Client) {
	t.Helper()
	return storeOn(t, testenv.Redis(t), what, cfg)
}

// ownStore is testStore on a Redis of the test's own, for tests that count commands in INFO
// commandstats (server-wide: other packages' tests would add to them on the shared Redis).
func ownStore(t testing.TB, what string, cfg RedisConfig) (*Redis, *redis.Client) {
	t.Helper()
	return storeOn(t, testenv.OwnRedis(t), what, cfg)
}

func storeOn(t testing.TB, client *redis.Client, what string, cfg RedisConfig) (*Redis, *redis.Client) {
	t.Helper()
	cfg.Prefix = testenv.Name(t, what)
	testenv.CleanPrefix(t, client, cfg.Prefix)
	store, err := NewRedis(client, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return store, client
}

// modelCase is a random stream TestRedisMatchesModel holds a store to the model on.
type modelCase struct {
	seed      uint64
	span      time.Duration // how far the stream's clock moves
	retention time.Duration
	jumpEvery int
	embedded  bool // on the embedded Redis of `repeatrate dev` (gopher-lua), not the real one
	events    int  // 10 000 when 0
}

var modelCases = []modelCase{
	// Days: expiry, pruning, every window boundary; the observation minute changes every batch.
	{1, 10 * 24 * time.Hour, 3 * 24 * time.Hour, 0, false, 0}, {2, 10 * 24 * time.Hour, 3 * 24 * time.Hour, 0, false, 0},
	{3, 10 * 24 * time.Hour, 3 * 24 * time.Hour, 0, false, 0},
	// Minutes: many batches share an observation minute, so the cached window sums are used
	// and updated in place.
	{4, 20 * time.Minute, 3 * 24 * time.Hour, 0, false, 0}, {5, 3 * time.Hour, 3 * 24 * time.Hour, 0, false, 0},
	// A week and more in steps of half an hour on average, under a month's retention: the window
	// sums move on minute by minute and hour by hour, and the hours that leave the week's
	// window still hold counts.
	{9, 9 * 24 * time.Hour, 30 * 24 * time.Hour, 0, false, 60000},
	// Watermark leaps: whole aggregates expire at once, then fill again.
	{6, 10 * 24 * time.Hour, 3 * 24 * time.Hour, 500, false, 0},
	// The shortest retention: hours expire inside the 24h window and while their minute
	// buckets still exist.
	{7, 12 * time.Hour, time.Hour, 0, false, 0}, {8, 2 * time.Hour, time.Hour, 700, false, 0},
	// The embedded Redis runs another Lua, whose tables behave differently (an hour number as
	// a key once cost seconds per call there).
	{1, 10 * 24 * time.Hour, 3 * 24 * time.Hour, 0, true, 0}, {8, 2 * time.Hour, time.Hour, 700, true, 0},
}

func TestRedisMatchesModel(t *testing.T) {
	for _, tc := range modelCases {
		t.Run(fmt.Sprint("seed", tc.seed, map[bool]string{true: " embedded"}[tc.embedded]), func(t *testing.T) {
			matchModel(t, tc, nil)
		})
	}
}

// matchModel applies tc's stream in random batches to a store (of layout 11 when fp is set) and
// to the model, and requires the same outcome for every event and the same tally for every
// aggregate after every batch, and after the stream when read. It returns the store, its client
// and the aggregates the stream made.
func matchModel(t *testing.T, tc modelCase, fp *Fingerprinter) (*Redis, *redis.Client, []Key) {
	ctx := context.Background()
	seed := tc.seed
	r := rand.New(rand.NewPCG(seed, 99))
	events := tc.events
	if events == 0 {
		events = 10000
	}
	stream := randomStreamOver(r, events, tc.span, tc.jumpEvery)
	retention := tc.retention // short, so expiry happens inside the stream
	var store *Redis
	var client *redis.Client
	if tc.embedded {
		client = redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
		t.Cleanup(func() { client.Close() })
		var err error
		if store, err = NewRedis(client, RedisConfig{Prefix: "model", Retention: retention, Fingerprint: fp}); err != nil {
			t.Fatal(err)
		}
	} else {
		store, client = testStore(t, "model", RedisConfig{Retention: retention, Fingerprint: fp})
	}
	model := NewModel(retention)
	var maxOcc int64
	counts := map[Outcome]int{}
	for i := 0; i < len(stream); {
		n := 1 + r.IntN(300)
		batch := stream[i:min(i+n, len(stream))]
		i += len(batch)
		for _, o := range batch {
			maxOcc = max(maxOcc, o.Occurred)
		}
		at := time.UnixMicro(maxOcc + int64(r.IntN(120))*1e6)
		if r.IntN(4) == 0 { // events slightly ahead of the observer's clock (within the skew the minute buckets keep)
			at = time.UnixMicro(maxOcc - int64(r.IntN(9*60))*1e6)
		}
		got, err := store.Apply(ctx, batch, at)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := model.Apply(ctx, batch, at)
		for j := range batch {
			counts[want.Outcomes[j]]++
			if got.Outcomes[j] != want.Outcomes[j] {
				t.Fatalf("event %d (%+v): redis %v, model %v", i-len(batch)+j, batch[j], got.Outcomes[j], want.Outcomes[j])
			}
		}
		for _, k := range want.Keys {
			if got.Tallies[k] != want.Tallies[k] {
				t.Fatalf("after event %d, %s:\nredis %+v\nmodel %+v", i, k, got.Tallies[k], want.Tallies[k])
			}
		}
	}
	for _, o := range []Outcome{Counted, Reassessed, Duplicate, Stale, Expired} {
		if counts[o] == 0 && (o != Expired || tc.span > retention) {
			t.Errorf("the stream never produced %v: it does not test it", o)
		}
	}
	t.Logf("outcomes %v", counts)
	readsMatchModel(t, store, model, maxOcc)
	return store, client, model.Keys()
}

// readsMatchModel fails unless reading every aggregate agrees with the model: in the minute of
// the newest event (maxOcc), and 90 minutes and 50 hours later, where a read recomputes its windows
// from the minutes and hours it reads.
func readsMatchModel(t *testing.T, store *Redis, model *Model, maxOcc int64) {
	t.Helper()
	for _, later := range []time.Duration{0, 90 * time.Minute, 50 * time.Hour} {
		at := time.UnixMicro(maxOcc).Add(later)
		for _, k := range model.Keys() {
			got, err := store.Tally(context.Background(), k, at)
			if err != nil {
				t.Fatal(err)
			}
			if want := model.Tally(k, at); got != want {
				t.Fatalf("%s, read %v after the newest event: redis %+v, model %+v", k, later, got, want)
			}
		}
	}
}

func TestRedisApplyTwiceIsApplyOnce(t *testing.T) {
	// A retried script (go-redis after a lost reply) or a redelivered batch runs the same arguments
	// again: it must change nothing, not even the version.
	ctx := context.Background()
	store, _ := testStore(t, "twice", RedisConfig{Retention: 30 * 24 * time.Hour})
	batch := randomStream(rand.New(rand.NewPCG(7, 7)), 500)
	at := t0.Add(11 * 24 * time.Hour)
	first, err := store.Apply(ctx, batch, at)
	if err != nil {
		t.Fatal(err)
	}
	second, err := store.Apply(ctx, batch, at)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range first.Keys {
		if first.Tallies[k] != second.Tallies[k] {
			t.Fatalf("%s changed on the second apply:\n%+v\n%+v", k, first.Tallies[k], second.Tallies[k])
		}
	}
	for i, o := range second.Outcomes {
		if o == Counted || o == Reassessed {
			t.Fatalf("event %d was %v on the second apply", i, o)
		}
	}
}

func TestRedisKeysShareOneHashTag(t *testing.T) {
	s, _ := NewRedis(nil, RedisConfig{Retention: time.Hour})
	for _, sc := range collisionScopes {
		ks := s.keys(Key{Scope: sc, CorrectionID: "c", Source: Live})
		tag := func(k string) string {
			i := indexByte(k, '{')
			j := indexByte(k[i:], '}')
			return k[i+1 : i+j]
		}
		for _, k := range ks[1:] {
			if tag(k) != tag(ks[0]) {
				t.Fatalf("%q and %q hash differently", ks[0], k)
			}
		}
	}
}

func indexByte(s string, c byte) int {
	for i := 0; i < len(s); i++ {
		if s[i] == c {
			return i
		}
	}
	return -1
}

func TestRedisShortRetentionExpiresInsideTheHourWindow(t *testing.T) {
	// Retention 1h: 14:05 expires hour 12, whose last minute is still inside the 1h window of an
	// observer at 13:58 (seven minutes behind the newest event). Its minute bucket must go too.
	ctx := context.Background()
	store, _ := testStore(t, "short", RedisConfig{Retention: time.Hour})
	model := NewModel(time.Hour)
	h, m := time.Hour, time.Minute
	for _, step := range []struct {
		obs []Observation
		at  time.Duration
	}{
		{[]Observation{obs("a", Confirmed, 59*m+30*time.Second, h, 0), obs("b", Passed, 58*m, h, 0)}, h},
		{[]Observation{obs("c", Passed, 2*h+5*m, 2*h+5*m, 0)}, h + 58*m},
		{[]Observation{obs("d", Confirmed, 2*h+6*m, 2*h+6*m, 0)}, 2*h + 6*m},
	} {
		got, err := store.Apply(ctx, step.obs, t0.Add(step.at))
		if err != nil {
			t.Fatal(err)
		}
		want, _ := model.Apply(ctx, step.obs, t0.Add(step.at))
		if got.Tallies[keyLive] != want.Tallies[keyLive] {
			t.Fatalf("at %v:\nredis %+v\nmodel %+v", step.at, got.Tallies[keyLive], want.Tallies[keyLive])
		}
	}
}

func TestRedisCollectsExpiredRecords(t *testing.T) {
	// Ten hours of 300 opportunities each under 2h retention: by the end, the records of the
	// expired hours are gone from the record hash and their id lists are gone, while every list
	// left carries a TTL.
	ctx := context.Background()
	store, client := testStore(t, "gc", RedisConfig{Retention: 2 * time.Hour, IdleTTL: 24 * time.Hour})
	model := NewModel(2 * time.Hour)
	var last Observation
	for hour := 0; hour < 10; hour++ {
		for b := 0; b < 3; b++ {
			var batch []Observation
			for i := 0; i < 100; i++ {
				occ := time.Duration(hour)*time.Hour + time.Duration(b*100+i)*10*time.Second
				last = obs(fmt.Sprintf("o%d-%d", hour, b*100+i), Class(1+i%3), occ, occ, 0)
				batch = append(batch, last)
			}
			at := time.UnixMicro(last.Occurred)
			got, err := store.Apply(ctx, batch, at)
			if err != nil {
				t.Fatal(err)
			}
			if want, _ := model.Apply(ctx, batch, at); got.Tallies[keyLive] != want.Tallies[keyLive] {
				t.Fatalf("hour %d: redis %+v, model %+v", hour, got.Tallies[keyLive], want.Tallies[keyLive])
			}
		}
	}
	keys := store.keys(keyLive)
	retained := model.Tally(keyLive, t0).Retained()
	// Hours 7, 8, 9 are retained (the cut is the hour of 9:49:50 − 2h); the garbage of the
	// expired hours is collected a batch-sized amount at a time, so at most a few hundred remain.
	if retained != 900 {
		t.Fatalf("model retains %d, want 900", retained)
	}
	n, err := client.HLen(ctx, keys[0]).Result()
	if err != nil {
		t.Fatal(err)
	}
	if n < retained || n > retained+300 {
		t.Fatalf("record hash holds %d records for %d retained opportunities", n, retained)
	}
	lists, err := client.Keys(ctx, keys[2]+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(lists) > 4 {
		t.Fatalf("%d id lists remain (%v), want at most the 3 retained hours and one being collected", len(lists), lists)
	}
	for _, k := range lists {
		if ttl := client.PTTL(ctx, k).Val(); ttl <= 24*time.Hour {
			t.Fatalf("list %s has TTL %v, want more than the idle TTL", k, ttl)
		}
	}
}
