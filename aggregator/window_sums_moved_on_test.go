package aggregator

import (
	"fmt"
	"testing"
	"time"
)

// TestComputedCallsMoveTheWindowSumsOnWhenTheMinuteTurns: an aggregate's first call in a later
// minute, less than an hour of minutes after its last, is computed, its hour's sums moved on over
// the minutes that left the window and those that entered it as apply.lua moves them, byte for
// byte, with the model's counts, in the same hour or the next; a call an hour of minutes or more
// later is apply.lua's, and the next one is computed again.
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
		x.applyEachMinute(at, batch, []minuteStep{
			{10, false},  // a new aggregate: apply.lua makes it
			{11, true},   // a minute on
			{15, true},   // four
			{59, true},   // forty-four, the hour's last
			{60, true},   // the next hour: the day's and week's sums move on too
			{61, true},   // a minute into it
			{120, true},  // 59 minutes on, into the hour after
			{180, false}, // an hour of minutes on: apply.lua recomputes the sums
			{181, true},
		})
	})
}

// TestComputedCallsMoveTheDayAndWeekSumsOnWhenTheHourTurns: an aggregate that holds winners in
// every hour of its week, its calls' first in a new hour is computed, the day's and the week's sums
// moved on over the hours that left them and the one that entered, byte for byte against
// apply.lua (in layout 11 the hours are read from their days' fields) and with the model's counts.
func TestComputedCallsMoveTheDayAndWeekSumsOnWhenTheHourTurns(t *testing.T) {
	inBothLayouts(t, func(t *testing.T, fp *Fingerprinter) {
		x := newComputedSidesIn(t, "hour-turn", 30*24*time.Hour, 0, fp)
		k := Key{Scope: collisionScopes[0], CorrectionID: "hour-turn", Source: Live}
		hour := Micros(t0) / hourUS * hourUS
		ob, at := inMinutes(k, hour)
		n := 0
		next := func(m int64) Observation {
			n++
			o := ob(fmt.Sprint("op-", n), m)
			o.Class = Class(1 + n%3)
			return o
		}
		// The first call, apply.lua's, puts a winner in every hour of the week before and in
		// every minute of the hour before, so that every hour and minute that leaves a window
		// holds counts, and every index group the later calls list in exists.
		var first []Observation
		for m := int64(-168 * 60); m <= 10; m += 60 {
			first = append(first, next(m))
		}
		for m := int64(-60); m <= 10; m++ {
			first = append(first, next(m))
		}
		x.apply("minute 10", first, at(10))
		// New winners in the call's minute, its hour 23 and 167 hours back (they leave the day's
		// and the week's windows as the next hour turns) and 5 minutes ahead (in the next hour
		// when the call is in its hour's last 5 minutes: it enters the windows then).
		batch := func(m int64) []Observation {
			var b []Observation
			for _, back := range []int64{0, 23 * 60, 167 * 60, -5} {
				b = append(b, next(m-back))
			}
			return b
		}
		x.applyEachMinute(at, batch, []minuteStep{
			{59, true},
			{60, true},   // the hour turns a minute on
			{119, true},  // the minute turns within the hour
			{125, true},  // the hour turns six minutes on
			{184, true},  // and 59 minutes on
			{250, false}, // 66 minutes on: apply.lua recomputes the sums
			{251, true},
		})
	})
}

// TestHoursThatExpireWithWinnersGoToTheScript: the cut moves past an hour that holds a winner, whose
// counts leave every sum and whose fields go: apply.lua's, with the model's counts; the cut moving
// past empty hours is computed, and so is the call after apply.lua's.
func TestHoursThatExpireWithWinnersGoToTheScript(t *testing.T) {
	inBothLayouts(t, func(t *testing.T, fp *Fingerprinter) {
		// 16 hours: index groups of 2 hours, so the cut passes hour -16 without leaving its group
		// (-16 and -15) wholly expired.
		x := newComputedSidesIn(t, "expiring-winners", 16*time.Hour, 0, fp)
		k := Key{Scope: collisionScopes[0], CorrectionID: "expiring-winners", Source: Live}
		hour := Micros(t0) / hourUS * hourUS
		ob, at := inMinutes(k, hour)
		// Hour -16, the first retained once the watermark is at minute 5.
		x.apply("minute 10", []Observation{ob("a", -955), ob("b", 5)}, at(10))
		// Each call a new record 5 minutes before its minute.
		x.applyEachMinute(at, fiveMinutesBefore(ob), []minuteStep{
			{60, true},   // the watermark at minute 55: the cut stays at hour -16
			{100, false}, // at minute 95 the cut passes hour -16, which holds record a
			{101, true},
		})
	})
}

// TestCutThatLeavesAListedGroupExpiredGoesToTheScript: the cut moves past empty hours only, but
// leaves wholly expired an index group that still lists an id (its winner moved out of it), whose
// garbage apply.lua collects: the call is apply.lua's, with the model's counts, and the next one
// is computed.
func TestCutThatLeavesAListedGroupExpiredGoesToTheScript(t *testing.T) {
	inBothLayouts(t, func(t *testing.T, fp *Fingerprinter) {
		// 17 hours: index groups of 2 hours, and the cut leaves one wholly expired as the
		// watermark enters an odd hour, the second of its own group (a new group's first call is
		// apply.lua's whatever the cut does).
		x := newComputedSidesIn(t, "expired-group", 17*time.Hour, 0, fp)
		k := Key{Scope: collisionScopes[0], CorrectionID: "expired-group", Source: Live}
		hour := Micros(t0) / (2 * hourUS) * (2 * hourUS) // the first hour of a group
		ob, at := inMinutes(k, hour)
		// a occurred in hour -17 (group -9), then a later assessment moves it to minute 8: group
		// -9 still lists it, and no winner is left below hour 0.
		x.apply("minute 10", []Observation{ob("a", -990), ob("b", 5)}, at(10))
		moved := ob("a", 8)
		moved.Assessed = hour + 11*minuteUS
		x.apply("minute 11", []Observation{moved}, at(11))
		// Each call a new record 5 minutes before its minute.
		x.applyEachMinute(at, fiveMinutesBefore(ob), []minuteStep{
			{60, true},   // the watermark at minute 55: the cut stays at hour -17
			{100, false}, // at 95 it moves to hour -16: group -9 is wholly expired
			{101, true},
		})
	})
}

// TestMinutesPrunedByAComputedCallAreDeleted: a computed call whose watermark moves an hour of
// minutes past the last prune deletes the minutes below the new floor as apply.lua does, byte for
// byte: a minute the call bumped before its watermark passed it too, and both ranges of a call
// that prunes twice.
func TestMinutesPrunedByAComputedCallAreDeleted(t *testing.T) {
	inBothLayouts(t, func(t *testing.T, fp *Fingerprinter) {
		x := newComputedSidesIn(t, "pruned", 30*24*time.Hour, 0, fp)
		k := Key{Scope: collisionScopes[0], CorrectionID: "pruned", Source: Live}
		hour := Micros(t0) / hourUS * hourUS
		ob, at := inMinutes(k, hour)
		// The first call's watermark sets the floor at -60 (b first: a prune starts from the
		// floor the aggregate's first watermark set); at 40, it is at -30.
		x.apply("minute 10", []Observation{ob("b", 10), ob("a", -25)}, at(10))
		x.applyComputing("minute 40", []Observation{ob("c", 40)}, at(40), 1)
		// d bumps minute -20 (above the floor), then e moves the floor to 0: minutes -60 to -1
		// are pruned, -20 among them.
		x.applyComputing("minute 70", []Observation{ob("d", -20), ob("e", 70)}, at(70), 1)
		if n := x.rigs[1].c.HExists(t.Context(), x.stores[1].keys(k)[1], "m"+fmt.Sprint(hour/minuteUS-20)).Val(); n {
			t.Fatal("minute -20 kept after the prune passed it")
		}

		// Another aggregate whose events occurred hours before the observation time: one call
		// moves its floor twice, from -270 to -200 and on to -130.
		k2 := Key{Scope: collisionScopes[0], CorrectionID: "pruned-twice", Source: Live}
		ob2, _ := inMinutes(k2, hour)
		x.apply("minute 10, old events", []Observation{ob2("f", -210), ob2("g", -200)}, at(10))
		x.applyComputing("minute 20, older events", []Observation{ob2("h", -130), ob2("i", -60)}, at(20), 1)
	})
}

// TestSumsOfAnotherWritersMinuteAreMovedOnFromIt: when another processor wrote the aggregate in a
// minute between, the minutes this one read to move the sums on are not the ones that do. In layout
// 10 the call is apply.lua's; in layout 11, whose buckets the other writer changed, the call reads
// them again and, with them, its state as planned from the minute the head it read says: it is
// computed. Either way with the model's counts, and the processor's next call is computed.
func TestSumsOfAnotherWritersMinuteAreMovedOnFromIt(t *testing.T) {
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
		// Over sums another writer moved on: computed in layout 11 only.
		x.applyComputing("minute 13", []Observation{ob("e", 13)}, at(13), map[bool]int64{false: 0, true: 1}[fp != nil])
		x.applyComputing("minute 14", []Observation{ob("f", 14)}, at(14), 1)
	})
}

// TestANewProcessorMovesOnTheSumsItFindsInLayout11: a processor that has not met an aggregate
// does not know the minute its sums are for. In layout 11 it reads the aggregate's buckets after
// its head (it does not know their shape either), and with them its state as planned from the
// head's minute: its first call in a later minute, or hour, is computed, byte for byte with
// apply.lua's and with the model's counts. In layout 10, which reads no head first, it is
// apply.lua's, and the next is computed.
func TestANewProcessorMovesOnTheSumsItFindsInLayout11(t *testing.T) {
	inBothLayouts(t, func(t *testing.T, fp *Fingerprinter) {
		x := newComputedSidesIn(t, "new-processor", 24*time.Hour, 0, fp)
		k := Key{Scope: collisionScopes[0], CorrectionID: "new-processor", Source: Live}
		hour := Micros(t0) / hourUS * hourUS
		ob, at := inMinutes(k, hour)
		x.apply("minute 50", []Observation{ob("a", 50), ob("b", 49)}, at(50))
		for _, m := range []int64{55, 65} { // a later minute; the next hour
			// Restarted: the computing sides forget what they knew of the aggregate.
			for i := 1; i < len(x.stores); i++ {
				s := x.stores[i]
				s.sealMu.Lock()
				s.sums, s.shapes = nil, nil
				s.buckets.drop(k)
				s.sealMu.Unlock()
			}
			x.applyComputing(fmt.Sprint("minute ", m, ", restarted"), []Observation{ob(fmt.Sprint("at-", m), m)}, at(m),
				map[bool]int64{false: 0, true: 1}[fp != nil])
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
		x.applyComputing("minute 11, sums that would fall below zero", []Observation{ob("c", 11)}, at(11), 0)
	})
}

// minuteStep is a call in a minute of the hour, and whether the computing side computes it.
type minuteStep struct {
	minute   int64
	computed bool
}

// applyEachMinute applies batch(m) at at(m) for each step's minute m, every side byte for byte with
// the others and with the model, and requires the computing side to have computed the call or
// left it to apply.lua as the step says.
func (x *computedSides) applyEachMinute(at func(m int64) time.Time, batch func(m int64) []Observation, steps []minuteStep) {
	x.t.Helper()
	for _, step := range steps {
		x.applyComputing(fmt.Sprint("minute ", step.minute), batch(step.minute), at(step.minute), map[bool]int64{false: 0, true: 1}[step.computed])
	}
}

// applyComputing applies b at at on every side, as apply does, and fails unless the computing side
// computed want of its calls (the others ran apply.lua).
func (x *computedSides) applyComputing(what string, b []Observation, at time.Time, want int64) {
	x.t.Helper()
	was, _ := x.stores[1].ComputedCalls()
	x.apply(what, b, at)
	if now, _ := x.stores[1].ComputedCalls(); now-was != want {
		x.t.Fatalf("%s: %d calls computed, want %d", what, now-was, want)
	}
}

// fiveMinutesBefore is a batch for applyEachMinute: a new record, occurred 5 minutes before the call's
// minute.
func fiveMinutesBefore(ob func(id string, m int64) Observation) func(m int64) []Observation {
	return func(m int64) []Observation { return []Observation{ob(fmt.Sprint("at-", m), m-5)} }
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
