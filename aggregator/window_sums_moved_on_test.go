package aggregator

import (
	"fmt"
	"testing"
	"time"
)

// TestComputedCallsMoveTheWindowSumsOnWhenTheMinuteTurns: an aggregate's first call in a later
// minute of the same hour is computed, its hour's sums moved on over the minutes that left the
// window and those that entered it as apply.lua moves them, byte for byte, with the model's
// counts; a call in a new hour is apply.lua's, and the next one is computed again.
func TestComputedCallsMoveTheWindowSumsOnWhenTheMinuteTurns(t *testing.T) {
	inBothLayouts(t, func(t *testing.T, fp *Fingerprinter) {
		x := newComputedSidesIn(t, "turn", 24*time.Hour, 0, fp)
		k := Key{Scope: collisionScopes[0], CorrectionID: "turn", Source: Live}
		hour := Micros(t0) / hourUS * hourUS
		n := 0
		// batch is a record in each of the 60 minutes before minute m of the hour (and one in m),
		// new: every minute that leaves the window as the sums move on holds counts.
		batch := func(m int64) []Observation {
			var b []Observation
			for back := int64(0); back <= 60; back++ {
				occ := hour + (m-back)*minuteUS + 5e6
				b = append(b, Observation{Key: k, OpportunityID: fmt.Sprint("op-", n), Class: Class(1 + n%3), Occurred: occ, Assessed: occ + 1e6})
				n++
			}
			return b
		}
		_, at := inMinutes(k, hour)
		computed := func() int64 { c, _ := x.stores[1].ComputedCalls(); return c }
		for _, step := range []struct {
			minute   int64 // of the hour
			computed bool
		}{
			{10, false},  // a new aggregate: apply.lua makes it
			{11, true},   // a minute on
			{15, true},   // four
			{59, true},   // forty-four, the hour's last
			{60, false},  // the next hour: apply.lua recomputes the day's and week's sums
			{61, true},   // a minute into it
			{120, false}, // an hour on: apply.lua
		} {
			was := computed()
			x.apply(fmt.Sprint("minute ", step.minute), batch(step.minute), at(step.minute))
			if got := computed() - was; got != map[bool]int64{false: 0, true: 1}[step.computed] {
				t.Fatalf("minute %d: %d calls computed, want computed %v", step.minute, got, step.computed)
			}
		}
	})
}

// TestSumsOfAnotherWritersMinuteGoToTheScript: when another processor wrote the aggregate in a
// minute between, the minutes this one read to move the sums on are not the ones that do: the call
// is apply.lua's, with the model's counts, and the processor's next call is computed again.
func TestSumsOfAnotherWritersMinuteGoToTheScript(t *testing.T) {
	inBothLayouts(t, func(t *testing.T, fp *Fingerprinter) {
		x := newComputedSidesIn(t, "other-minute", 24*time.Hour, 0, fp)
		other, err := NewRedis(x.rigs[1].c, RedisConfig{Prefix: x.prefixes[1], Retention: 24 * time.Hour, Fingerprint: fp})
		if err != nil {
			t.Fatal(err)
		}
		k := Key{Scope: collisionScopes[0], CorrectionID: "other-minute", Source: Live}
		hour := Micros(t0) / hourUS * hourUS
		ob, at := inMinutes(k, hour)
		x.apply("minute 10", []Observation{ob("a", 10), ob("b", 9)}, at(10))
		x.apply("minute 11", []Observation{ob("c", 11)}, at(11))
		stored, _ := x.stores[1].ComputedCalls()
		// The other writer, on the computed side's store, in minute 12; its model and the other
		// sides see its event too.
		between := []Observation{ob("d", 12)}
		if _, err := other.Apply(t.Context(), between, at(12)); err != nil {
			t.Fatal(err)
		}
		x.rigs[1].m.Apply(t.Context(), between, at(12))
		for i, rig := range x.rigs {
			if i != 1 {
				rig.applyChecked("the other writer's event", between, at(12), false)
			}
		}
		x.same("the other writer's event")
		x.apply("minute 13", []Observation{ob("e", 13)}, at(13))
		if now, _ := x.stores[1].ComputedCalls(); now != stored {
			t.Fatalf("%d calls computed over sums another writer moved on", now-stored)
		}
		x.apply("minute 14", []Observation{ob("f", 14)}, at(14))
		if now, _ := x.stores[1].ComputedCalls(); now != stored+1 {
			t.Fatalf("%d calls computed after apply.lua's, want 1", now-stored)
		}
	})
}

// TestSumsThatWouldFallBelowZeroGoToTheScript: a minute that leaves the window holding more than
// the hour's sums (a field written by hand) would leave them below zero once moved on; apply.lua
// recomputes them from the minutes instead, and so the call is its, with the model's counts.
func TestSumsThatWouldFallBelowZeroGoToTheScript(t *testing.T) {
	inBothLayouts(t, func(t *testing.T, fp *Fingerprinter) {
		x := newComputedSidesIn(t, "below-zero", 24*time.Hour, 0, fp)
		k := Key{Scope: collisionScopes[0], CorrectionID: "below-zero", Source: Live}
		hour := Micros(t0) / hourUS * hourUS
		ob, at := inMinutes(k, hour)
		x.apply("minute 10", []Observation{ob("a", 10), ob("b", -49)}, at(10))
		// Minute -49 leaves the hour's window when the minute turns: by hand, it holds 8 counts,
		// more than the window's 2.
		leaving := "m" + fmt.Sprint(hour/minuteUS-49)
		v := appendLittleEndian(appendLittleEndian(appendLittleEndian([]byte{0}, 8, 5), 0, 5), 0, 5)
		for i, rig := range x.rigs {
			if err := rig.c.HSet(t.Context(), x.stores[i].keys(k)[1], leaving, string(v)).Err(); err != nil {
				t.Fatal(err)
			}
		}
		stored, _ := x.stores[1].ComputedCalls()
		x.apply("minute 11", []Observation{ob("c", 11)}, at(11))
		if now, _ := x.stores[1].ComputedCalls(); now != stored {
			t.Fatalf("%d calls computed whose sums would fall below zero", now-stored)
		}
	})
}

// inMinutes returns, for aggregate k and the hour that begins at hour (µs), ob(id, m): a new
// confirmed repeat occurred 5 s into minute m of the hour; and at(m): 30 s into minute m.
func inMinutes(k Key, hour int64) (ob func(id string, m int64) Observation, at func(m int64) time.Time) {
	ob = func(id string, m int64) Observation {
		occ := hour + m*minuteUS + 5e6
		return Observation{Key: k, OpportunityID: id, Class: Confirmed, Occurred: occ, Assessed: occ + 1e6}
	}
	at = func(m int64) time.Time { return time.UnixMicro(hour + m*minuteUS + 30e6) }
	return ob, at
}
