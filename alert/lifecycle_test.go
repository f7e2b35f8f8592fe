package alert

import (
	"testing"
	"time"
)

func TestStep(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	at := func(m int) time.Time { return t0.Add(time.Duration(m) * time.Minute) }
	type look struct {
		min    int // minutes after t0
		active bool
		state  State
		notify Notify
		reason Reason
	}
	tests := []struct {
		name   string
		timing Timing
		looks  []look
	}{
		{
			// for: 0 fires at the first true evaluation and resolves at the first false one.
			name:   "no for",
			timing: Timing{ResendInterval: time.Hour},
			looks: []look{
				{0, false, StateInactive, NotifyNone, ReasonInactive},
				{1, true, StateFiring, NotifyFiring, ReasonFired},
				{2, true, StateFiring, NotifyNone, ReasonStillFiring},
				{3, false, StateResolved, NotifyResolved, ReasonResolved},
				{4, false, StateResolved, NotifyNone, ReasonInactive},
			},
		},
		{
			// for: 10m waits out ten minutes of truth; a false look while pending drops it silently.
			name:   "pending then cleared, then fired",
			timing: Timing{For: 10 * time.Minute, ResendInterval: time.Hour},
			looks: []look{
				{0, true, StatePending, NotifyNone, ReasonBecamePending},
				{9, true, StatePending, NotifyNone, ReasonStillPending},
				{10, false, StateInactive, NotifyNone, ReasonPendingClear},
				{11, true, StatePending, NotifyNone, ReasonBecamePending},
				{21, true, StateFiring, NotifyFiring, ReasonFired},
			},
		},
		{
			// keep_firing_for: a short dip does not resolve; a long one does, counted from the last truth.
			name:   "keep firing for",
			timing: Timing{KeepFiringFor: 15 * time.Minute, ResendInterval: time.Hour},
			looks: []look{
				{0, true, StateFiring, NotifyFiring, ReasonFired},
				{5, false, StateFiring, NotifyNone, ReasonKeptFiring},
				{10, true, StateFiring, NotifyNone, ReasonStillFiring},
				{24, false, StateFiring, NotifyNone, ReasonKeptFiring},
				{25, false, StateResolved, NotifyResolved, ReasonResolved},
			},
		},
		{
			// The resend interval counts from the last send, also while kept firing.
			name:   "resend",
			timing: Timing{KeepFiringFor: 2 * time.Hour, ResendInterval: time.Hour},
			looks: []look{
				{0, true, StateFiring, NotifyFiring, ReasonFired},
				{59, true, StateFiring, NotifyNone, ReasonStillFiring},
				{60, true, StateFiring, NotifyResend, ReasonResend},
				{119, false, StateFiring, NotifyNone, ReasonKeptFiring},
				{120, false, StateFiring, NotifyResend, ReasonResend},
				{180, false, StateResolved, NotifyResolved, ReasonResolved},
			},
		},
		{
			// A resolved alert that holds again starts a new episode: pending, then a new firing.
			name:   "refire after resolve",
			timing: Timing{For: 5 * time.Minute, ResendInterval: time.Hour},
			looks: []look{
				{0, true, StatePending, NotifyNone, ReasonBecamePending},
				{5, true, StateFiring, NotifyFiring, ReasonFired},
				{6, false, StateResolved, NotifyResolved, ReasonResolved},
				{7, true, StatePending, NotifyNone, ReasonBecamePending},
				{12, true, StateFiring, NotifyFiring, ReasonFired},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var r Record
			var firedAt []time.Time
			for _, l := range tc.looks {
				var n Notify
				var why Reason
				r, n, why = Step(r, l.active, at(l.min), tc.timing)
				if r.State != l.state || n != l.notify || why != l.reason {
					t.Fatalf("minute %d active=%v: got %s/%s/%s, want %s/%s/%s", l.min, l.active,
						r.State, n, why, l.state, l.notify, l.reason)
				}
				if n == NotifyFiring {
					firedAt = append(firedAt, r.FiredAt)
				}
			}
			for i := 1; i < len(firedAt); i++ {
				if !firedAt[i].After(firedAt[i-1]) {
					t.Errorf("episodes share fired_at %s: notifications would share an id", firedAt[i])
				}
			}
		})
	}
}
