package alert

import "time"

// State is where one (rule, subject) alert is in its lifecycle.
type State uint8

// Lifecycle states, as Prometheus has them; Resolved is inactive with a resolved notification to
// deliver.
const (
	StateInactive State = iota
	StatePending
	StateFiring
	StateResolved
)

// String names the state as logs and Redis show it.
func (s State) String() string {
	switch s {
	case StatePending:
		return "pending"
	case StateFiring:
		return "firing"
	case StateResolved:
		return "resolved"
	}
	return "inactive"
}

// parseState is the inverse of String.
func parseState(s string) State {
	switch s {
	case "pending":
		return StatePending
	case "firing":
		return StateFiring
	case "resolved":
		return StateResolved
	}
	return StateInactive
}

// Timing is the part of a rule the lifecycle reads.
type Timing struct {
	// For is how long the condition must hold before the alert fires.
	For time.Duration
	// KeepFiringFor keeps a firing alert firing this long after its condition last held.
	KeepFiringFor time.Duration
	// ResendInterval is how often a firing alert is sent to Alertmanager again.
	ResendInterval time.Duration
}

// Record is the lifecycle state of one (rule, subject). Times are zero when unset.
type Record struct {
	State State
	// ActiveAt is when the condition started to hold (pending began).
	ActiveAt time.Time
	// FiredAt is when the alert fired; it identifies the firing episode.
	FiredAt time.Time
	// LastTrueAt is the last evaluation at which the condition held.
	LastTrueAt time.Time
	// ResolvedAt is when a firing alert resolved.
	ResolvedAt time.Time
	// LastSentAt is when Alertmanager was last scheduled to receive the firing alert.
	LastSentAt time.Time
}

// Notify is what a transition asks the sinks to deliver.
type Notify uint8

// Notifications: Kafka gets firing and resolved; Alertmanager gets all three.
const (
	NotifyNone Notify = iota
	NotifyFiring
	NotifyResend
	NotifyResolved
)

// String names the notification.
func (n Notify) String() string {
	switch n {
	case NotifyFiring:
		return "firing"
	case NotifyResend:
		return "resend"
	case NotifyResolved:
		return "resolved"
	}
	return "none"
}

// Reason names why a step did what it did, for logs, metrics and tests.
type Reason uint8

// Step reasons.
const (
	ReasonInactive      Reason = iota // condition false, nothing held
	ReasonBecamePending               // condition true, waiting out `for`
	ReasonStillPending                // condition true, `for` not yet over
	ReasonPendingClear                // condition false while pending: dropped without notice
	ReasonFired                       // `for` over (or zero): firing, notify
	ReasonStillFiring                 // firing, sent recently enough
	ReasonResend                      // firing, resend interval over: send again
	ReasonKeptFiring                  // condition false within keep_firing_for
	ReasonResolved                    // condition false past keep_firing_for: resolved, notify
)

var reasonNames = [...]string{"inactive", "became_pending", "still_pending", "pending_cleared", "fired",
	"still_firing", "resend", "kept_firing", "resolved"}

// String names the reason as logs and metrics show it.
func (r Reason) String() string {
	if int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return "unknown"
}

// Step moves a lifecycle given whether the condition holds at now. It is pure: the caller stores
// the returned record (atomically, against the one it read) and delivers the notification.
func Step(r Record, active bool, now time.Time, t Timing) (Record, Notify, Reason) {
	switch r.State {
	case StateInactive, StateResolved:
		if !active {
			return r, NotifyNone, ReasonInactive
		}
		n := Record{State: StatePending, ActiveAt: now, LastTrueAt: now}
		if t.For <= 0 {
			n.State, n.FiredAt, n.LastSentAt = StateFiring, now, now
			return n, NotifyFiring, ReasonFired
		}
		return n, NotifyNone, ReasonBecamePending
	case StatePending:
		if !active {
			return Record{}, NotifyNone, ReasonPendingClear
		}
		r.LastTrueAt = now
		if now.Sub(r.ActiveAt) >= t.For {
			r.State, r.FiredAt, r.LastSentAt = StateFiring, now, now
			return r, NotifyFiring, ReasonFired
		}
		return r, NotifyNone, ReasonStillPending
	case StateFiring:
		if active {
			r.LastTrueAt = now
		} else if now.Sub(r.LastTrueAt) >= t.KeepFiringFor {
			r.State, r.ResolvedAt = StateResolved, now
			return r, NotifyResolved, ReasonResolved
		}
		if t.ResendInterval > 0 && now.Sub(r.LastSentAt) >= t.ResendInterval {
			r.LastSentAt = now
			return r, NotifyResend, ReasonResend
		}
		if !active {
			return r, NotifyNone, ReasonKeptFiring
		}
		return r, NotifyNone, ReasonStillFiring
	}
	return r, NotifyNone, ReasonInactive
}
