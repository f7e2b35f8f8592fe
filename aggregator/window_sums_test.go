package aggregator

// The window sums (1h, 24h, 7d) the head caches are moved on as the observation time moves, and
// recomputed only up to the newest event: every tally the store returns, from Apply and from
// Tally reads, must equal the model's, and the stored sums and buckets must equal the model's
// after every batch, for streams inside the contract (events at most 10 minutes ahead of the
// observation time, the observation time at most 10 minutes behind an aggregate's newest event,
// retention >= 1h). Every test runs on the test Redis; the embedded Redis (gopher-lua, five times
// slower) runs the first case of the exact steps and of the read sweep.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/repeatrate/repeatrate/internal/testenv"
	"github.com/repeatrate/repeatrate/schemas"
)

const wsSkew = 10 * minuteUS

// wsBackends runs f on the test Redis and, when embedded, on the embedded Redis (gopher-lua).
func wsBackends(t *testing.T, embedded bool, f func(t *testing.T, c *redis.Client)) {
	t.Run("redis", func(t *testing.T) { f(t, testenv.Redis(t)) })
	if !embedded {
		return
	}
	t.Run("embedded", func(t *testing.T) {
		m := miniredis.RunT(t)
		c := redis.NewClient(&redis.Options{Addr: m.Addr()})
		t.Cleanup(func() { c.Close() })
		f(t, c)
	})
}

// wsRig applies batches and reads to a store and to the model side by side.
type wsRig struct {
	t      *testing.T
	c      *redis.Client
	prefix string
	s      *Redis
	m      *Model
	ret    time.Duration
	w      map[Key]int64 // newest occurred per aggregate (the model's watermark)
	hist   []string      // what was done, for the failure message
	r      *rand.Rand
	pool   []Observation // observations delivered so far (for duplicates and re-assessments)
	n      int           // opportunity ids made
	asd    int64         // assessed clock: re-assessments get later ones
	keys   []Key
	reads  int
	check  bool // after each batch, compare the stored head sums and buckets with the model too
}

func newWSRig(t *testing.T, c *redis.Client, ret time.Duration, seed uint64, nkeys int) *wsRig {
	prefix := testenv.Name(t, "wshift")
	testenv.CleanPrefix(t, c, prefix)
	s, err := NewRedis(c, RedisConfig{Prefix: prefix, Retention: ret})
	if err != nil {
		t.Fatal(err)
	}
	x := &wsRig{t: t, c: c, prefix: prefix, s: s, m: NewModel(ret), ret: ret, w: map[Key]int64{},
		r: rand.New(rand.NewPCG(seed, 4242)), asd: wsStart, check: true}
	for i := 0; i < nkeys; i++ {
		sc := schemas.Scope{Workspace: fmt.Sprintf("ws%d", i), Model: "m", Run: "r", Checkpoint: "c", Artifact: "a"}
		x.keys = append(x.keys, Key{Scope: sc, CorrectionID: "fix", Source: Source(1 + i%2)})
	}
	return x
}

// setRetention switches store and model to another retention, over the same prefix.
func (x *wsRig) setRetention(ret time.Duration) {
	s, err := NewRedis(x.c, RedisConfig{Prefix: x.prefix, Retention: ret})
	if err != nil {
		x.t.Fatal(err)
	}
	x.s, x.ret = s, ret
	x.m.retention = int64(ret / time.Microsecond)
	x.hist = append(x.hist, fmt.Sprintf("retention -> %v", ret))
}

func wsFmt(us int64) string {
	return fmt.Sprintf("%d (%s)", us, time.UnixMicro(us).UTC().Format("01-02T15:04:05.000000"))
}

func (x *wsRig) fail(format string, args ...any) {
	x.t.Helper()
	from := max(0, len(x.hist)-12)
	x.t.Fatalf("%s\nretention %v; last steps:\n%s", fmt.Sprintf(format, args...), x.ret, strings.Join(x.hist[from:], "\n"))
}

// apply applies batch at at to both and compares outcomes and tallies.
func (x *wsRig) apply(batch []Observation, at int64) {
	x.t.Helper()
	ctx := context.Background()
	var b strings.Builder
	fmt.Fprintf(&b, "apply at %s:", wsFmt(at))
	for _, o := range batch {
		fmt.Fprintf(&b, "\n   %s/%s %v occ %s asd %d seq %d", o.Key.Scope.Workspace, o.OpportunityID, o.Class, wsFmt(o.Occurred), o.Assessed, o.Seq)
		if o.Occurred > at+wsSkew {
			x.t.Fatalf("test bug: event %+v more than the skew ahead of %d", o, at)
		}
	}
	x.hist = append(x.hist, b.String())
	for _, o := range batch {
		if w, ok := x.w[o.Key]; !ok || o.Occurred > w {
			x.w[o.Key] = o.Occurred
		}
	}
	for _, o := range batch {
		if at < x.w[o.Key]-wsSkew {
			x.t.Fatalf("test bug: at %d more than the skew behind %s's newest event %d", at, o.Key, x.w[o.Key])
		}
	}
	got, err := x.s.Apply(ctx, batch, time.UnixMicro(at))
	if err != nil {
		x.fail("apply: %v", err)
	}
	want, _ := x.m.Apply(ctx, batch, time.UnixMicro(at))
	for j := range batch {
		if got.Outcomes[j] != want.Outcomes[j] {
			x.fail("event %d (%+v): redis %v, model %v", j, batch[j], got.Outcomes[j], want.Outcomes[j])
		}
	}
	for _, k := range want.Keys {
		if got.Tallies[k] != want.Tallies[k] {
			x.fail("apply at %s, %s:\nredis %+v\nmodel %+v", wsFmt(at), k.Scope.Workspace, got.Tallies[k], want.Tallies[k])
		}
	}
	x.pool = append(x.pool, batch...)
	if x.check {
		for _, k := range want.Keys {
			x.checkState(k)
		}
	}
}

// checkState compares the stored state of k with the model: the head's window sums with the
// buckets of its cached minute and hour, every hour bucket with the model's hour, and every minute
// bucket an in-contract 1h window can still reach with the model's minute.
func (x *wsRig) checkState(k Key) {
	x.t.Helper()
	st, err := x.c.HGetAll(context.Background(), x.s.keys(k)[1]).Result()
	if err != nil {
		x.t.Fatal(err)
	}
	a := x.m.aggs[k]
	hd, err := headNumbers(st["H"])
	if err != nil {
		x.fail("%s: %v", k.Scope.Workspace, err)
	}
	// w,pm,f,l,cm,ch,rt,g,C,P,U,x1..x9,k; the first eight stored plus one.
	if hd[4] == 0 || hd[5] == 0 {
		x.fail("%s: head without cached minute and hour", k.Scope.Workspace)
	}
	hcm, hch := hd[4]-1, hd[5]-1
	mins, hours := map[int64][3]int64{}, map[int64][3]int64{}
	for f, v := range st {
		switch {
		case strings.HasPrefix(f, "m"):
			n, err := strconv.ParseInt(f[1:], 10, 64)
			if err != nil {
				x.fail("field %q", f)
			}
			xs, err := minuteNumbers(v)
			if err != nil {
				x.fail("%s: %v", f, err)
			}
			mins[n] = [3]int64{xs[0], xs[1], xs[2]}
		case strings.HasPrefix(f, "h"):
			n, err := strconv.ParseInt(f[1:], 10, 64)
			if err != nil {
				x.fail("field %q", f)
			}
			hv, err := retainedParseHour(v)
			if err != nil {
				x.fail("%s: %v", f, err)
			}
			hours[n] = [3]int64{hv.c, hv.p, hv.u}
		}
	}
	var sums [9]int64
	for m := hcm - 59; m <= hcm; m++ {
		for j := 0; j < 3; j++ {
			sums[j] += mins[m][j]
		}
	}
	for h := hch - 167; h <= hch; h++ {
		for j := 0; j < 3; j++ {
			sums[6+j] += hours[h][j]
			if h >= hch-23 {
				sums[3+j] += hours[h][j]
			}
		}
	}
	for i := 0; i < 9; i++ {
		if sums[i] != hd[11+i] {
			x.fail("%s: head caches sums %v for minute %d hour %d, the buckets give %v", k.Scope.Workspace, hd[11:20], hcm, hch, sums)
		}
	}
	mm, mhs := map[int64][3]int64{}, map[int64][3]int64{}
	for _, r := range a.opps {
		if r.occ < a.cut {
			continue
		}
		j := int(r.class) - 1
		m, h := floorDiv(r.occ, minuteUS), floorDiv(r.occ, hourUS)
		c := mm[m]
		c[j]++
		mm[m] = c
		c = mhs[h]
		c[j]++
		mhs[h] = c
	}
	for h, c := range hours {
		if mhs[h] != c {
			x.fail("%s: hour %d holds %v, the model %v", k.Scope.Workspace, h, c, mhs[h])
		}
	}
	for h, c := range mhs {
		if hours[h] != c {
			x.fail("%s: hour %d holds %v, the model %v", k.Scope.Workspace, h, hours[h], c)
		}
	}
	reach := floorDiv(a.watermark, minuteUS) - 69 // the lowest minute an in-contract window reaches
	for m, c := range mins {
		if m >= reach && mm[m] != c {
			x.fail("%s: minute %d holds %v, the model %v (watermark %s)", k.Scope.Workspace, m, c, mm[m], wsFmt(a.watermark))
		}
	}
	for m, c := range mm {
		if m >= reach && mins[m] != c {
			x.fail("%s: minute %d holds %v, the model %v (watermark %s)", k.Scope.Workspace, m, mins[m], c, wsFmt(a.watermark))
		}
	}
}

// read reads k at at from both and compares. A read more than the skew behind k's newest event
// is outside the contract and is moved up to it.
func (x *wsRig) read(k Key, at int64) {
	x.t.Helper()
	if w, ok := x.w[k]; ok && at < w-wsSkew {
		at = w - wsSkew
	}
	x.reads++
	got, err := x.s.Tally(context.Background(), k, time.UnixMicro(at))
	if err != nil {
		x.fail("read: %v", err)
	}
	if want := x.m.Tally(k, time.UnixMicro(at)); got != want {
		x.hist = append(x.hist, fmt.Sprintf("read %s at %s", k.Scope.Workspace, wsFmt(at)))
		x.fail("read at %s, %s:\nredis %+v\nmodel %+v", wsFmt(at), k.Scope.Workspace, got, want)
	}
}

// readAll reads every aggregate at at.
func (x *wsRig) readAll(at int64) {
	x.t.Helper()
	for _, k := range x.keys {
		if _, ok := x.w[k]; ok {
			x.read(k, at)
		}
	}
}

// minAt is the least observation time the contract allows for a batch or read of every aggregate.
func (x *wsRig) minAt() int64 {
	var m int64
	for _, w := range x.w {
		m = max(m, w-wsSkew)
	}
	return m
}

// occNear returns an occurred time for a new event observed at at: often at a minute or hour
// boundary of the windows, sometimes ahead (within the skew), sometimes hours or days late.
func (x *wsRig) occNear(at int64) int64 {
	r := x.r
	retUS := int64(x.ret / time.Microsecond)
	M, H := floorDiv(at, minuteUS), floorDiv(at, hourUS)
	var occ int64
	switch p := r.IntN(100); {
	case p < 12: // ahead, within the skew
		occ = at + r.Int64N(wsSkew+1)
	case p < 40: // the last 70 minutes
		occ = at - r.Int64N(70*minuteUS)
	case p < 50: // window edges of the minute and hour of at
		edges := []int64{
			(M - 59) * minuteUS, (M-59)*minuteUS - 1, (M - 60) * minuteUS, M * minuteUS, (M+1)*minuteUS - 1,
			H * hourUS, H*hourUS - 1, (H - 23) * hourUS, (H-23)*hourUS - 1, (H - 167) * hourUS, (H-167)*hourUS - 1,
			(M + 1) * minuteUS, (H + 1) * hourUS, (M + 10) * minuteUS,
		}
		occ = edges[r.IntN(len(edges))]
	case p < 70: // hours late
		occ = at - r.Int64N(min(retUS, 30*hourUS)+1)
	case p < 80: // days late, up to the retention and past it
		occ = at - r.Int64N(min(retUS+2*hourUS, 9*24*hourUS)+1)
	default: // near the cut
		w := at
		for _, ww := range x.w {
			w = max(w, ww)
		}
		cut := floorDiv(w-retUS, hourUS) * hourUS
		occ = cut + r.Int64N(2*hourUS) - hourUS
	}
	return min(occ, at+wsSkew)
}

// batch returns n observations for keys ks observed at at: new ones, re-assessments (some moving
// the time), duplicates and stale ones.
func (x *wsRig) batch(at int64, n int, ks []Key) []Observation {
	r := x.r
	var out []Observation
	for len(out) < n {
		x.asd += 1 + r.Int64N(5e6)
		switch p := r.IntN(100); {
		case p < 15 && len(x.pool) > 0: // duplicate
			o := x.pool[r.IntN(len(x.pool))]
			if o.Occurred <= at+wsSkew {
				out = append(out, o)
			}
		case p < 35 && len(x.pool) > 0: // re-assessment, newer or older
			o := x.pool[r.IntN(len(x.pool))]
			o.Class = Class(1 + r.IntN(3))
			if r.IntN(4) == 0 {
				o.Assessed -= 1 + r.Int64N(1e6)
			} else {
				o.Assessed = x.asd
			}
			o.Seq = r.Int64N(3)
			if r.IntN(2) == 0 {
				o.Occurred = x.occNear(at)
			}
			out = append(out, o)
		default:
			x.n++
			occ := x.occNear(at)
			out = append(out, Observation{Key: ks[r.IntN(len(ks))], OpportunityID: fmt.Sprintf("o%d", x.n),
				Class: Class(1 + r.IntN(3)), Occurred: occ, Assessed: x.asd, Seq: r.Int64N(2)})
		}
	}
	return out
}

// readsAfter reads every aggregate at at plus each given offset, and at a few random minutes.
func (x *wsRig) readsAfter(at int64, offs ...time.Duration) {
	x.t.Helper()
	for _, d := range offs {
		x.readAll(at + int64(d/time.Microsecond))
	}
	for i := 0; i < 2; i++ {
		x.readAll(at + x.r.Int64N(130*minuteUS))
	}
}

var wsStart = Micros(time.Date(2026, 3, 1, 22, 59, 30, 0, time.UTC))

var wsRets = []time.Duration{time.Hour, 2 * time.Hour, 3 * time.Hour, 25 * time.Hour, 8 * 24 * time.Hour, 30 * 24 * time.Hour}

// TestWindowSumsExactSteps moves the observation time by exactly 59, 60 and 61 minutes (and 1
// minute, 1 µs, 58, 119, 120 minutes), from instants just before and on minute, hour and day
// boundaries, writing a batch at each and reading at later minutes in between.
func TestWindowSumsExactSteps(t *testing.T) {
	steps := []time.Duration{59 * time.Minute, 60 * time.Minute, 61 * time.Minute, time.Minute, 59 * time.Minute,
		time.Microsecond, 59*time.Minute + 59*time.Second + 999999*time.Microsecond, 58 * time.Minute,
		119 * time.Minute, 120 * time.Minute, 61 * time.Minute, 30 * time.Second, 59 * time.Minute}
	for i, ret := range wsRets {
		t.Run(ret.String(), func(t *testing.T) {
			wsBackends(t, i == 0, func(t *testing.T, c *redis.Client) {
				x := newWSRig(t, c, ret, uint64(100+i), 3)
				at := wsStart
				for s := 0; s < 220; s++ {
					x.apply(x.batch(at, 1+x.r.IntN(12), x.keys), at)
					x.readsAfter(at, 0, time.Minute, 59*time.Minute, 60*time.Minute, 61*time.Minute)
					at += int64(steps[s%len(steps)] / time.Microsecond)
				}
				t.Logf("%d reads", x.reads)
			})
		})
	}
}

// TestWindowSumsBackAndForth moves the observation time back (up to the skew behind the newest
// event) and forward again by 1 to 61 minutes, with batches of duplicates only (they write the
// head without changing counts) and of expired events among them.
func TestWindowSumsBackAndForth(t *testing.T) {
	for i, ret := range wsRets {
		t.Run(ret.String(), func(t *testing.T) {
			wsBackends(t, false, func(t *testing.T, c *redis.Client) {
				x := newWSRig(t, c, ret, uint64(200+i), 2)
				at := wsStart
				for s := 0; s < 300; s++ {
					switch p := x.r.IntN(10); {
					case p < 3 && len(x.pool) > 0: // duplicates only
						var b []Observation
						for j := 0; j < 1+x.r.IntN(4); j++ {
							o := x.pool[x.r.IntN(len(x.pool))]
							if o.Occurred <= at+wsSkew {
								b = append(b, o)
							}
						}
						if len(b) > 0 {
							x.apply(b, at)
						}
					default:
						x.apply(x.batch(at, 1+x.r.IntN(8), x.keys), at)
					}
					x.readsAfter(at, 0, 59*time.Minute, 60*time.Minute)
					if x.r.IntN(3) == 0 {
						// back, as far as the contract allows
						lo := x.minAt()
						if lo < at {
							at = lo + x.r.Int64N(at-lo+1)
						}
					} else {
						at += []int64{59, 60, 61, 1, 2, 30, 58}[x.r.IntN(7)]*minuteUS + x.r.Int64N(minuteUS) - minuteUS/2
					}
					at = max(at, x.minAt())
				}
			})
		})
	}
}

// TestWindowSumsIdleGapsThenReads lets aggregates idle for gaps around the windows' lengths,
// reads them at every minute of the two hours after the gap, then writes again (late events too).
func TestWindowSumsIdleGapsThenReads(t *testing.T) {
	gaps := []time.Duration{59 * time.Minute, 61 * time.Minute, 2 * time.Hour, 23 * time.Hour, 24 * time.Hour,
		25 * time.Hour, 167 * time.Hour, 168 * time.Hour, 169 * time.Hour, 8 * 24 * time.Hour, 5 * time.Minute}
	for i, ret := range wsRets {
		t.Run(ret.String(), func(t *testing.T) {
			wsBackends(t, false, func(t *testing.T, c *redis.Client) {
				x := newWSRig(t, c, ret, uint64(300+i), 2)
				at := wsStart
				for _, gap := range gaps {
					for s := 0; s < 8; s++ {
						x.apply(x.batch(at, 1+x.r.IntN(10), x.keys), at)
						at += x.r.Int64N(20 * minuteUS)
						at = max(at, x.minAt())
					}
					at += int64(gap / time.Microsecond)
					for m := int64(0); m < 130; m++ {
						x.readAll(at + m*minuteUS + x.r.Int64N(minuteUS))
					}
					at += x.r.Int64N(130 * minuteUS)
				}
				t.Logf("%d reads", x.reads)
			})
		})
	}
}

// TestWindowSumsReadSweep writes once (events over nine days and a few minutes ahead), then
// reads at every minute for 26 hours and every 7 minutes for nine days, with no write between.
func TestWindowSumsReadSweep(t *testing.T) {
	for i, ret := range []time.Duration{time.Hour, 3 * time.Hour, 30 * 24 * time.Hour} {
		t.Run(ret.String(), func(t *testing.T) {
			wsBackends(t, i == 0, func(t *testing.T, c *redis.Client) {
				x := newWSRig(t, c, ret, uint64(400+i), 2)
				at := wsStart
				// Several batches, so that the hours hold counts all over the week.
				for s := 0; s < 30; s++ {
					x.apply(x.batch(at, 20, x.keys), at)
					at += x.r.Int64N(30 * minuteUS)
				}
				for m := int64(0); m < 26*60; m++ {
					x.readAll(at + m*minuteUS)
				}
				for m := int64(0); m < 9*24*60; m += 7 {
					x.readAll(at + m*minuteUS + 13*1e6)
				}
				// Then a write 59 minutes after the last one, and the sweep again.
				at += 59 * minuteUS
				x.apply(x.batch(at, 20, x.keys), at)
				for m := int64(0); m < 3*60; m++ {
					x.readAll(at + m*minuteUS)
				}
			})
		})
	}
}

// TestWindowSumsRetentionSwitches changes the retention between batches (a new store over the
// same prefix, the model's retention switched too), among short ones that expire hours inside the
// 24h and 1h windows and long ones, reading right after each switch and after each batch.
func TestWindowSumsRetentionSwitches(t *testing.T) {
	rets := []time.Duration{time.Hour, 2 * time.Hour, 3 * time.Hour, 6 * time.Hour, 25 * time.Hour, 7 * 24 * time.Hour, 8 * 24 * time.Hour, 30 * 24 * time.Hour}
	for seed := uint64(1); seed <= 4; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			wsBackends(t, false, func(t *testing.T, c *redis.Client) {
				x := newWSRig(t, c, 30*24*time.Hour, 500+seed, 3)
				at := wsStart
				for s := 0; s < 400; s++ {
					if x.r.IntN(8) == 0 {
						x.setRetention(rets[x.r.IntN(len(rets))])
						x.readsAfter(at, 0, 59*time.Minute, 61*time.Minute)
					}
					x.apply(x.batch(at, 1+x.r.IntN(10), x.keys), at)
					x.readsAfter(at, 0, time.Minute, 60*time.Minute)
					at += []int64{1, 59, 60, 61, 5, 119, 600, 1500}[x.r.IntN(8)]*minuteUS + x.r.Int64N(minuteUS)
					at = max(at, x.minAt())
				}
			})
		})
	}
}

// TestWindowSumsManyAggregates runs a long random stream over 24 aggregates, each batch touching
// a few of them, with observation times moving by 1 to 61 minutes (sometimes back within the
// skew), and reads of aggregates the batch did not touch.
func TestWindowSumsManyAggregates(t *testing.T) {
	for i, ret := range []time.Duration{time.Hour, 2 * time.Hour, 26 * time.Hour, 30 * 24 * time.Hour} {
		t.Run(ret.String(), func(t *testing.T) {
			wsBackends(t, false, func(t *testing.T, c *redis.Client) {
				x := newWSRig(t, c, ret, uint64(600+i), 24)
				at := wsStart
				for s := 0; s < 600; s++ {
					ks := make([]Key, 1+x.r.IntN(4))
					for j := range ks {
						ks[j] = x.keys[x.r.IntN(len(x.keys))]
					}
					x.apply(x.batch(at, 1+x.r.IntN(15), ks), at)
					for j := 0; j < 3; j++ {
						x.read(x.keys[x.r.IntN(len(x.keys))], at+x.r.Int64N(90*minuteUS))
					}
					if x.r.IntN(6) == 0 {
						at -= x.r.Int64N(10 * minuteUS)
					} else {
						at += (1 + x.r.Int64N(61)) * minuteUS
					}
					at = max(at, x.minAt())
				}
			})
		})
	}
}

// TestWindowSumsStateLateThenBack keeps the observation time far ahead of the newest event (only
// late events) for a while, then brings it back to the skew behind that event, and forward again in
// steps of 59 to 61 minutes, checking the stored head sums and buckets after every batch.
func TestWindowSumsStateLateThenBack(t *testing.T) {
	for i, ret := range wsRets {
		t.Run(ret.String(), func(t *testing.T) {
			wsBackends(t, false, func(t *testing.T, c *redis.Client) {
				x := newWSRig(t, c, ret, uint64(700+i), 2)
				x.check = true
				at := wsStart
				for s := 0; s < 250; s++ {
					var b []Observation
					switch p := x.r.IntN(10); {
					case p < 4: // only late events: the watermark stays behind
						b = x.batch(at, 1+x.r.IntN(6), x.keys)
						for j := range b {
							if b[j].Occurred > at-20*minuteUS {
								b[j].Occurred = at - 20*minuteUS - x.r.Int64N(3*hourUS)
							}
						}
					default:
						b = x.batch(at, 1+x.r.IntN(6), x.keys)
					}
					x.apply(b, at)
					x.readsAfter(at, 0, 59*time.Minute, 61*time.Minute)
					switch p := x.r.IntN(10); {
					case p < 2: // back to the skew behind the newest event
						at = x.minAt() + x.r.Int64N(minuteUS)
					case p < 5:
						at += []int64{59, 60, 61}[x.r.IntN(3)] * minuteUS
					default:
						at += x.r.Int64N(3 * hourUS)
					}
					at = max(at, x.minAt())
				}
			})
		})
	}
}
