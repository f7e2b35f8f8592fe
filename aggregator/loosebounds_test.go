package aggregator

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/repeatrate/repeatrate/internal/testenv"
)

// TestLooseBoundsAreMadeExactWhenNeeded: a winner that leaves its hour at a bound leaves the hour's
// bounds loose and costs no scan of the index; once the hour holds the aggregate's first or last
// retained winner and that one is needed again (it left, or the cut passed the hour before), the
// bounds are made exact from the index. The head's first and last must equal the model's after
// every batch (retainedRig.check), under index groups of one hour (8h retention) and of 90 (30 days).
func TestLooseBoundsAreMadeExactWhenNeeded(t *testing.T) {
	for _, ret := range []time.Duration{8 * time.Hour, 30 * 24 * time.Hour} {
		t.Run(ret.String(), func(t *testing.T) {
			t.Run("redis", func(t *testing.T) { looseBounds(t, testenv.OwnRedis(t), ret, true) })
			t.Run("embedded", func(t *testing.T) {
				m := miniredis.RunT(t)
				looseBounds(t, redis.NewClient(&redis.Options{Addr: m.Addr()}), ret, false)
			})
		})
	}
}

func looseBounds(t *testing.T, c *redis.Client, ret time.Duration, stats bool) {
	x := newRetainedRig(t, c, "loose", ret)
	h := Micros(t0)/hourUS - 6 // hours h (first), h+1 (middle), h+2 (last)
	asd := (h + 20) * hourUS
	next := func(id string, occ int64) Observation {
		asd++
		return Observation{Key: keyLive, OpportunityID: id, Class: Class(1 + asd%3), Occurred: occ, Assessed: asd}
	}
	offsets := []int64{0, 10, 20, 30, hourUS - 1}
	var b []Observation
	for j := int64(0); j < 3; j++ {
		for i, o := range offsets {
			b = append(b, next(fmt.Sprint("o", j, "-", i), (h+j)*hourUS+o))
		}
	}
	at := time.UnixMicro((h + 3) * hourUS)
	x.apply("build", b, at)
	hmgets := func(what string, batch []Observation) int64 {
		t.Helper()
		if !stats {
			x.apply(what, batch, at)
			return 0
		}
		before := scriptCalls(t, c, "hmget")["hmget"]
		x.apply(what, batch, at)
		return scriptCalls(t, c, "hmget")["hmget"] - before
	}
	loose := func(what string, hour int64, want bool) {
		t.Helper()
		hv, err := retainedParseHour(c.HGet(t.Context(), x.s.keys(keyLive)[1], fmt.Sprint("h", hour)).Val())
		if err != nil || hv.loose != want {
			t.Fatalf("%s: hour %d %+v (%v), want loose %v", what, hour, hv, err, want)
		}
	}
	// A move from between the bounds of the middle hour to between those of the last: the
	// reference for what a move reads.
	plain := hmgets("middle to middle", []Observation{next("o1-2", (h+2)*hourUS+25)})
	// The middle hour's low bound holder leaves for the middle of the last hour: loose, no scan.
	atBound := hmgets("low bound holder leaves the middle hour", []Observation{next("o1-0", (h+2)*hourUS+15)})
	loose("a bound left", h+1, true)
	if atBound != plain {
		t.Errorf("a move at a bound read %d times (HMGET), a move between bounds %d: it scanned", atBound, plain)
	}
	// The first winner of the aggregate (hour h, offset 0) leaves for the middle of hour h: the
	// first is needed again, and hour h is made exact from the index.
	x.apply("first leaves", []Observation{next("o0-0", h*hourUS+5)}, at)
	loose("first left within its hour", h, false)
	// The last winner (hour h+2, HOUR-1) leaves for the middle hour: hour h+2 is made exact.
	x.apply("last leaves", []Observation{next("o2-4", (h+1)*hourUS+40)}, at)
	loose("last left", h+2, false)
	// Hour h empties (its winners move to the middle hour's inside): the middle hour, loose,
	// holds the first winner and is made exact.
	b = nil
	for _, i := range []int{0, 1, 2, 3, 4} {
		b = append(b, next(fmt.Sprint("o0-", i), (h+1)*hourUS+50+int64(i)))
	}
	x.apply("hour h empties", b, at)
	loose("the middle hour holds the first", h+1, false)
	// Hour h holds the first winner again; the middle hour's top bound holder leaves (loose, and
	// neither first nor last moves). Then the cut passes hour h under 8h retention (an event 9
	// hours later), or hour h's winner leaves under 30 days: either way the first is the middle
	// hour's, found exactly.
	x.apply("hour h again", []Observation{next("again", h*hourUS+7)}, at)
	x.apply("middle's top leaves", []Observation{next("o1-4", (h+2)*hourUS+60)}, at)
	loose("a bound left again", h+1, true)
	if ret < 24*time.Hour {
		late := (h + 9) * hourUS
		x.apply("the cut passes hour h", []Observation{next("late", late)}, time.UnixMicro(late))
	} else {
		x.apply("hour h's winner leaves", []Observation{next("again", (h+2)*hourUS+70)}, at)
	}
	loose("the middle hour holds the first", h+1, false)
	if x.seen["loose"] == 0 {
		t.Fatal("no loose hour was seen by the state check")
	}
}

// TestRetentionChangeKeepsTheIndexGroups: an aggregate keeps the index group span it was created
// with when the processor restarts with another retention (its groups are then read twice in a
// batch: first under the new retention's span, then under its own), and everything still equals
// the model: outcomes, tallies, the stored state (retainedRig.check, which also requires the head's span
// to be the creation's), and garbage collection once a later event expires it all. The events lie
// within 10 hours of the watermark, inside both retentions, so that the model (which forgets
// identities only as its watermark moves) and the store agree on what either retention keeps.
func TestRetentionChangeKeepsTheIndexGroups(t *testing.T) {
	for _, tc := range []struct{ from, to time.Duration }{
		{30 * 24 * time.Hour, 20 * time.Hour}, // span 90 → 2
		{16 * time.Hour, 30 * 24 * time.Hour}, // span 2 → 90
		{24 * time.Hour, 40 * time.Hour},      // span 3 → 5
	} {
		t.Run(tc.from.String()+"→"+tc.to.String(), func(t *testing.T) {
			retainedBackends(t, true, func(t *testing.T, c *redis.Client) {
				x := newRetainedRig(t, c, "retchange", tc.from)
				r := rand.New(rand.NewPCG(uint64(tc.from), uint64(tc.to)))
				w := (Micros(t0)/hourUS - 100) * hourUS
				asd := w + 200*hourUS
				batch := func(n int) []Observation {
					var b []Observation
					for range n {
						asd++
						occ := w - 10*hourUS + r.Int64N(10*hourUS)
						a := asd
						if r.IntN(8) == 0 { // an older assessment: stale when its opportunity holds a newer one
							a -= 5000
						}
						b = append(b, Observation{Key: keyLive, OpportunityID: fmt.Sprint("o", r.IntN(300)), Class: Class(1 + r.IntN(3)), Occurred: occ, Assessed: a})
					}
					return b
				}
				at := time.UnixMicro(w)
				for i := range 5 {
					x.apply(fmt.Sprint("before ", i), batch(80), at)
				}
				// The restart: the same prefix, another retention (the model's too).
				s, err := NewRedis(c, RedisConfig{Prefix: x.s.cfg.Prefix, Retention: tc.to})
				if err != nil {
					t.Fatal(err)
				}
				x.s, x.ret = s, int64(tc.to/time.Microsecond)
				x.m.retention = x.ret
				for i := range 8 {
					x.apply(fmt.Sprint("after ", i), batch(80), at)
				}
				x.tallies(at)
				// Everything expires: one event far later; the garbage goes group by group.
				late := w + int64(tc.from+tc.to)/1e3 + 100*hourUS
				x.apply("late", []Observation{{Key: keyLive, OpportunityID: "late", Class: Passed, Occurred: late, Assessed: late}}, time.UnixMicro(late))
				x.collect(keyLive, time.UnixMicro(late), 40)
				if x.outs[Reassessed] == 0 || x.outs[Stale] == 0 || x.seen["closed chunks"] == 0 {
					t.Fatalf("the stream reached no re-assessment, stale event or closed chunk: %v %v", x.outs, x.seen)
				}
			})
		})
	}
}
