package alert

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/repeatrate/repeatrate/schemas"
)

// Sink delivers notifications: Kafka events, Alertmanager posts.
type Sink interface {
	// Name is the sink's stable name: it names its outbox in Redis.
	Name() string
	// Takes reports whether the sink delivers notifications of kind n.
	Takes(n Notify) bool
	// Send delivers notes (oldest first) and returns once they are accepted.
	Send(ctx context.Context, notes []Notification) error
}

// Metrics are the alerting metrics.
type Metrics struct {
	evaluations   *prometheus.CounterVec
	transitions   *prometheus.CounterVec
	notifications *prometheus.CounterVec
	errors        *prometheus.CounterVec
	conflicts     prometheus.Counter
	firing        *prometheus.GaugeVec
	refused       *prometheus.CounterVec
	unheld        prometheus.Counter
}

// NewMetrics registers the alerting metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		evaluations: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "repeatrate_alert_evaluations_total",
			Help: "Rule evaluations over every subject, by trigger (snapshot or schedule)."}, []string{"trigger"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "repeatrate_alert_transitions_total",
			Help: "Lifecycle steps written to Redis, by reason."}, []string{"reason"}),
		notifications: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "repeatrate_alert_notifications_total",
			Help: "Notifications delivered, by sink and kind."}, []string{"sink", "kind"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "repeatrate_alert_errors_total",
			Help: "Alerting failures, by stage (state, deliver, refused, subscribe: a Kafka read of the snapshot topics, retried)."}, []string{"stage"}),
		conflicts: prometheus.NewCounter(prometheus.CounterOpts{Name: "repeatrate_alert_conflicts_total",
			Help: "Compare-and-set conflicts: another evaluator changed a record or stepped a sequential detector first."}),
		firing: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "repeatrate_alerts_firing",
			Help: "Alerts this evaluator saw firing at its last evaluation, by rule."}, []string{"rule"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "repeatrate_alert_refused_total",
			Help: "Notifications a sink refused for good (an Alertmanager 4xx other than 408 and 429), dropped from the outbox, by sink and kind."},
			[]string{"sink", "kind"}),
		unheld: prometheus.NewCounter(prometheus.CounterOpts{Name: "repeatrate_alert_unheld_subjects_total",
			Help: "Records of subjects this evaluator's table does not hold, left as they are at an evaluation (not taken for gone: another evaluator may hold them)."}),
	}
	reg.MustRegister(m.evaluations, m.transitions, m.notifications, m.errors, m.conflicts, m.firing, m.refused, m.unheld)
	return m
}

// EvaluatorConfig configures an Evaluator.
type EvaluatorConfig struct {
	Rules Rules
	// Lease bounds one delivery attempt: a sender that has not acknowledged within it is taken
	// for dead and another may deliver. It must exceed the sinks' timeouts (default 1m).
	Lease time.Duration
	// DeliverEvery is how often each sink's outbox is polled (default 1s).
	DeliverEvery time.Duration
}

// Validate fills defaults and checks the configuration.
func (c *EvaluatorConfig) Validate() error {
	if len(c.Rules.Rules) == 0 {
		return errors.New("alert: no rules")
	}
	if c.Rules.EvaluationInterval <= 0 {
		c.Rules.EvaluationInterval = DefaultEvaluationInterval
	}
	if c.Lease <= 0 {
		c.Lease = time.Minute
	}
	if c.DeliverEvery <= 0 {
		c.DeliverEvery = time.Second
	}
	return nil
}

// Update is one subscribed snapshot, of exactly one kind, or the mark that the subscriber has
// caught up.
type Update struct {
	Snapshot       *schemas.Snapshot
	Discrimination *schemas.SuiteDiscrimination
	Stability      *schemas.SuiteStability
	Revived        *schemas.CaseRevived
	// CaughtUp says that every update published before the subscriber started has been sent:
	// the table is complete, and a subject it lacks is really gone.
	CaughtUp bool
}

// Evaluator owns a Table fed by Updates, evaluates every rule on each change and on a schedule,
// steps the lifecycles in Redis and delivers their notifications through the sinks. Any number
// of evaluators may run on the same snapshots and Redis: compare-and-set makes each transition
// happen once, and the outbox lease makes each notification go out once.
type Evaluator struct {
	cfg     EvaluatorConfig
	store   *Redis
	sinks   []Sink
	now     func() time.Time
	log     *zap.Logger
	metrics *Metrics
	table   *Table
	rules   map[string]*Rule
	// caughtUp is set by the subscriber's CaughtUp update; until then nothing is evaluated.
	caughtUp bool
	// detectors are the sequential detectors as this evaluator last read or wrote them, by key:
	// a subject whose snapshot has not changed since is decided without a round trip.
	detectors map[string]cachedDetector
	// silenceScan is when not_measured_for rules last looked at every subject: they do at
	// least once per evaluation interval, and at other evaluations only at changed subjects and
	// records.
	silenceScan time.Time
	// evaluated is the time of the last evaluation: one whose time is before it (the clock was
	// set back) looks at every subject, since a window left at the later time is not at the
	// earlier one.
	evaluated time.Time
}

// NewEvaluator returns an evaluator; now is its clock.
func NewEvaluator(cfg EvaluatorConfig, store *Redis, sinks []Sink, now func() time.Time, log *zap.Logger, m *Metrics) (*Evaluator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	e := &Evaluator{cfg: cfg, store: store, sinks: sinks, now: now, log: log, metrics: m, table: NewTable(), rules: map[string]*Rule{},
		detectors: map[string]cachedDetector{}}
	for i := range cfg.Rules.Rules {
		e.rules[cfg.Rules.Rules[i].Name] = &cfg.Rules.Rules[i]
	}
	return e, nil
}

// Apply records an update in the table and reports whether it changed anything.
func (e *Evaluator) Apply(u Update) bool {
	switch {
	case u.CaughtUp:
		changed := !e.caughtUp
		e.caughtUp = true
		return changed
	case u.Snapshot != nil:
		return e.table.PutSnapshot(u.Snapshot)
	case u.Discrimination != nil:
		return e.table.PutDiscrimination(u.Discrimination)
	case u.Stability != nil:
		return e.table.PutStability(u.Stability)
	case u.Revived != nil:
		return e.table.PutRevived(u.Revived)
	}
	return false
}

// Run evaluates until ctx ends: after updates (at most once per second while they keep coming)
// and every evaluation interval, and delivers each sink's outbox in its own goroutine, so a slow
// or failing sink never holds up evaluation or the subscription. It returns once every goroutine
// it started has stopped.
func (e *Evaluator) Run(ctx context.Context, updates <-chan Update) error {
	done := make(chan struct{}, len(e.sinks))
	for _, s := range e.sinks {
		go func() {
			defer func() { done <- struct{}{} }()
			e.deliverLoop(ctx, s)
		}()
	}
	defer func() {
		for range e.sinks {
			<-done
		}
	}()
	// Its sinks are recorded before anything is committed for them, so no evaluator forgets a
	// sink this one has just been given back.
	e.keepSinks(ctx)
	tick := time.NewTicker(e.cfg.Rules.EvaluationInterval)
	defer tick.Stop()
	debounce := time.NewTimer(time.Hour)
	debounce.Stop()
	dirty := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case u, ok := <-updates:
			if !ok {
				updates = nil
				continue
			}
			if e.Apply(u) && !dirty {
				dirty = true
				debounce.Reset(time.Second)
			}
		case <-debounce.C:
			dirty = false
			e.evaluate(ctx, "snapshot")
		case <-tick.C:
			e.evaluate(ctx, "schedule")
			e.keepSinks(ctx)
		}
	}
}

// keepSinks records this evaluator's sinks and drops the outboxes of sinks no evaluator has had
// for SinkGrace (Redis.KeepSinks).
func (e *Evaluator) keepSinks(ctx context.Context) {
	forgot, err := e.store.KeepSinks(ctx)
	if err != nil && ctx.Err() == nil {
		e.metrics.errors.WithLabelValues("state").Inc()
		e.log.Warn("alert sinks bookkeeping", zap.Error(err))
	}
	for _, sink := range forgot {
		e.log.Info("dropped the queued notifications of a sink no evaluator has been configured with for an hour", zap.String("sink", sink))
	}
}

func (e *Evaluator) evaluate(ctx context.Context, trigger string) {
	if !e.caughtUp {
		return
	}
	if err := e.Evaluate(ctx, e.now()); err != nil && ctx.Err() == nil {
		e.metrics.errors.WithLabelValues("state").Inc()
		e.log.Warn("alert evaluation", zap.String("trigger", trigger), zap.Error(err))
	}
	e.metrics.evaluations.WithLabelValues(trigger).Inc()
}

// Evaluate evaluates every rule over the table at now and writes the lifecycle steps. Records of
// subjects the rule no longer selects, or that the table shows to be gone (Table.Gone), step as
// inactive; records of subjects the table does not hold are left as they are. Until the table has caught up (an Update
// with CaughtUp) it does nothing: after a restart a firing alert whose snapshot has not been read
// again yet would otherwise resolve, and fire again once it is read.
func (e *Evaluator) Evaluate(ctx context.Context, now time.Time) error {
	if !e.caughtUp {
		return nil
	}
	// Redis keeps times in µs: notifications carry them as stored, so a firing and its resolution
	// show the same fired_at.
	now = now.UTC().Truncate(time.Microsecond)
	idx, err := e.store.Keys(ctx)
	if err != nil {
		return err
	}
	// The aggregates whose snapshot changed: given back if this evaluation fails, so that none is
	// left unevaluated until its next snapshot.
	if now.Before(e.evaluated) {
		e.table.DirtyAll()
	}
	dirty := e.table.TakeDirty()
	if err := e.evaluateChanged(ctx, idx, dirty, now); err != nil {
		e.table.Redirty(dirty)
		return err
	}
	e.evaluated = now
	return nil
}

// evaluateChanged is Evaluate on the records idx and the aggregates dirty. A rate rule (threshold,
// change) is evaluated on the subjects of the dirty aggregates and those with a record: any other
// subject's condition was false at its last evaluation and time alone cannot make it true (its
// windows only go stale, as long as the clock goes forward). not_measured_for, which time alone
// makes true, also looks at every subject at least once per evaluation interval, cheaply; suite
// rules at every subject (there are few).
func (e *Evaluator) evaluateChanged(ctx context.Context, idx []string, dirty map[string]struct{}, now time.Time) error {
	recorded := e.store.recordSubjects(idx)
	// Half an interval: an evaluation on the clock a little late must not push the next one's
	// scan a whole interval further.
	scan := now.Sub(e.silenceScan) >= e.cfg.Rules.EvaluationInterval/2 || now.Before(e.silenceScan)
	type item struct {
		rule *Rule
		cond Condition
	}
	var work []item
	seen := map[string]bool{}
	var need []string
	for i := range e.cfg.Rules.Rules {
		r := &e.cfg.Rules.Rules[i]
		rec := recorded[r.Name]
		var conds []Condition
		switch {
		case r.Kind == KindChange && r.Sequential:
			// An error leaves this evaluation undone: a rule without its subjects' conditions
			// would take them for gone.
			var err error
			if conds, err = e.sequential(ctx, r, changedSubjects(r, e.table, dirty, rec), rec, now); err != nil {
				return err
			}
		case r.Kind == KindThreshold || r.Kind == KindChange:
			for _, c := range changedSubjects(r, e.table, dirty, rec) {
				// The evidence only for what is written: a true condition, or a record's.
				if _, ok := rec[c.subject.Key]; ok || rateActive(r, c.snap, now) {
					conds = append(conds, rateCondition(r, c.subject, c.snap, now))
				}
			}
		case r.Kind == KindNotMeasuredFor:
			conds = silentSubjects(r, e.table, dirty, rec, scan, now)
		default:
			conds = Evaluate(r, e.table, now)
		}
		for _, c := range conds {
			k, isKnown := rec[c.Subject.Key]
			if !isKnown {
				if !c.Active {
					continue
				}
				k = e.store.Key(r.Name, c.Subject.Key)
			}
			seen[k] = true
			work = append(work, item{r, c})
			need = append(need, k)
		}
	}
	gone := []string{}
	for _, k := range idx {
		if !seen[k] {
			gone = append(gone, k)
		}
	}
	recs, err := e.store.Load(ctx, append(need, gone...))
	if err != nil {
		return err
	}
	// A silence this evaluator times only from its first snapshot (just started, and the
	// compacted topic kept the latest snapshot, not the one that scored last) resumes from the
	// record's, when nothing was scored since: a firing alert does not resolve and fire again.
	for i, w := range work {
		st, sil := recs[e.store.Key(w.rule.Name, w.cond.Subject.Key)], w.cond.silence
		if sil != nil && e.table.RestoreSilence(sil.aggregate, st.Scored, st.SilentSince) {
			work[i].cond = silenceCondition(w.rule, sil.aggregate, e.table.rates[sil.aggregate], now)
		}
	}
	for _, k := range gone {
		st := recs[k]
		if st.Rev == 0 {
			continue
		}
		r, ok := e.rules[st.Rule]
		if !ok {
			// The rule left the rules file: its alerts resolve at once (a pending one clears),
			// with the kind and labels they fired with, rather than fire forever unseen.
			r = removedRule(st)
		} else if gone, held := e.table.Gone(st.Subject.Key, st.Subject.Fields); !gone && !held && r.selects(st.Subject) {
			// Not held here is not gone: another evaluator may hold it (lag, a partition this one
			// has not read, an event expired before it started). Stepping it inactive would
			// resolve what the other fires, and the two would flap. Left as it is; a subject the
			// rule no longer selects (its kind, source or matchers changed) steps inactive below,
			// held or not.
			e.metrics.unheld.Inc()
			continue
		}
		work = append(work, item{r, Condition{Subject: st.Subject, Evidence: schemas.AlertEvidence{EvaluatedAt: now}}})
	}
	firing := map[string]float64{}
	var errs []error
	for _, w := range work {
		k := e.store.Key(w.rule.Name, w.cond.Subject.Key)
		st, err := e.step(ctx, k, recs[k], w.rule, w.cond, now)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if st == StateFiring {
			firing[w.rule.Name]++
		}
	}
	for name := range e.rules {
		e.metrics.firing.WithLabelValues(name).Set(firing[name])
	}
	if len(errs) == 0 && scan {
		e.silenceScan = now
	}
	return errors.Join(errs...)
}

// removedRule stands for the rule of a record whose rule is no longer in the rules file: no
// keep_firing_for, no resends, and the kind, labels and annotations of its last firing.
func removedRule(st Stored) *Rule {
	r := &Rule{Name: st.Rule}
	if ep := st.Episode; ep != nil {
		for k, v := range kindNames {
			if v == ep.Kind {
				r.Kind = k
			}
		}
		r.Labels, r.Annotations = ep.Labels, ep.Annotations
	}
	return r
}

// step moves one lifecycle, retrying on compare-and-set conflicts with the record re-read.
func (e *Evaluator) step(ctx context.Context, key string, st Stored, r *Rule, c Condition, now time.Time) (State, error) {
	for attempt := 0; ; attempt++ {
		next, notify, reason := Step(st.Record, c.Active, now, r.Timing())
		if next == st.Record && notify == NotifyNone {
			return next.State, nil
		}
		var note *Notification
		if notify != NotifyNone {
			note = e.notification(r, c, next, notify, now, st.Episode)
		}
		ok, err := e.store.Commit(ctx, key, st.Rev, r.Name, c.Subject, next, note, c.silence, e.takes, now)
		if err != nil {
			return st.State, err
		}
		if ok {
			e.metrics.transitions.WithLabelValues(reason.String()).Inc()
			if notify != NotifyNone || next.State != st.State {
				e.log.Info("alert", zap.String("rule", r.Name), zap.String("subject", c.Subject.Key),
					zap.Stringer("from", st.State), zap.Stringer("to", next.State), zap.Stringer("reason", reason),
					zap.Stringer("notify", notify), zap.Time("at", now))
			}
			return next.State, nil
		}
		e.metrics.conflicts.Inc()
		if attempt == 4 {
			return st.State, fmt.Errorf("alert %s: record keeps changing under compare-and-set", key)
		}
		recs, err := e.store.Load(ctx, []string{key})
		if err != nil {
			return st.State, err
		}
		st = recs[key]
	}
}

func (e *Evaluator) takes(sink string, n Notify) bool {
	for _, s := range e.sinks {
		if s.Name() == sink {
			return s.Takes(n)
		}
	}
	return false
}

// notification builds the message of a step. A resend or resolution repeats the kind, labels and
// annotations the alert fired with (ep), even if the rule's changed since: Alertmanager knows an
// alert by its labels, and a resolution under new ones would leave the old alert firing there.
func (e *Evaluator) notification(r *Rule, c Condition, rec Record, n Notify, now time.Time, ep *Episode) *Notification {
	labels, annotations, kind := r.Labels, r.Annotations, r.Kind.String()
	if ep != nil && n != NotifyFiring {
		labels, annotations = ep.Labels, ep.Annotations
		if ep.Kind != "" {
			kind = ep.Kind // a label in Alertmanager too
		}
	}
	a := schemas.Alert{Rule: r.Name, Kind: kind, Subject: c.Subject.Key, Fields: maps.Clone(c.Subject.Fields),
		Labels: maps.Clone(labels), Annotations: maps.Clone(annotations), State: "firing",
		ActiveAt: rec.ActiveAt, FiredAt: rec.FiredAt, Evidence: c.Evidence}
	if a.Fields == nil {
		a.Fields = map[string]string{}
	}
	if a.Labels == nil {
		a.Labels = map[string]string{}
	}
	if a.Annotations == nil {
		a.Annotations = map[string]string{}
	}
	if n == NotifyResolved {
		a.State, a.ResolvedAt = "resolved", &rec.ResolvedAt
	}
	return &Notification{ID: notificationID(r.Name, c.Subject.Key, n, rec.FiredAt, now), Kind: n.String(), At: now, Alert: a}
}

// deliverLoop polls sink's outbox until ctx ends.
func (e *Evaluator) deliverLoop(ctx context.Context, s Sink) {
	t := time.NewTicker(e.cfg.DeliverEvery)
	defer t.Stop()
	for {
		if err := e.Deliver(ctx, s); err != nil && ctx.Err() == nil {
			e.metrics.errors.WithLabelValues("deliver").Inc()
			e.log.Warn("alert delivery", zap.String("sink", s.Name()), zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Deliver claims what is due for s, sends it and acknowledges it; a failed send is retried after
// a backoff that doubles with each failure of the record, up to five minutes. A batch the sink
// refuses for good (ErrRefused) is sent again one notification at a time, and each one refused
// alone is dropped from the outbox, counted and logged: it would be refused forever, while the
// others keep flowing.
func (e *Evaluator) Deliver(ctx context.Context, s Sink) error {
	now := e.now()
	claimed, err := e.store.Claim(ctx, s.Name(), now, e.cfg.Lease, 100)
	if err != nil {
		return err
	}
	var errs []error
	for key, notes := range claimed {
		if len(notes) == 0 {
			if err := e.store.Ack(ctx, s.Name(), key, 0, "", "", now); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		// Records are sent one after another under one lease: a send may start and run only
		// within it, since once it ends another sender may claim the record and send it too.
		// A record not reached waits for its lease to end.
		if e.cfg.Lease*3/4-e.now().Sub(now) <= 0 {
			break
		}
		done, err := e.sendRecord(ctx, s, notes, now)
		if done > 0 {
			e.store.rdb.HDel(ctx, key, "attempts:"+s.Name())
			if err := e.store.Ack(ctx, s.Name(), key, done, notes[0].ID, notes[done-1].ID, now); err != nil {
				errs = append(errs, err)
				continue
			}
		}
		if err != nil && !errors.Is(err, errLeaseOver) {
			n, _ := e.store.rdb.HIncrBy(ctx, key, "attempts:"+s.Name(), 1).Result()
			backoff := min(time.Second<<min(n, 16), 5*time.Minute)
			e.metrics.errors.WithLabelValues("deliver").Inc()
			e.log.Warn("alert send", zap.String("sink", s.Name()), zap.String("key", key), zap.Int64("attempt", n),
				zap.Duration("backoff", backoff), zap.Error(err))
			if rerr := e.store.Retry(ctx, s.Name(), key, now.Add(backoff)); rerr != nil {
				errs = append(errs, rerr)
			}
		}
	}
	return errors.Join(errs...)
}

// errLeaseOver stops a record's sends when the delivery lease is (nearly) over: what is left
// waits for the lease to end, when any sender may claim it.
var errLeaseOver = errors.New("delivery lease over")

// sendRecord sends one record's notes within the lease taken at claimed and returns how many of
// the first ones are done (delivered, or refused and dropped) and the error that stopped it.
func (e *Evaluator) sendRecord(ctx context.Context, s Sink, notes []Notification, claimed time.Time) (int, error) {
	send := func(batch []Notification) error {
		left := e.cfg.Lease*3/4 - e.now().Sub(claimed)
		if left <= 0 {
			return errLeaseOver
		}
		sctx, cancel := context.WithTimeout(ctx, left)
		defer cancel()
		return s.Send(sctx, batch)
	}
	err := send(notes)
	if err == nil {
		e.sent(s, notes)
		return len(notes), nil
	}
	if !errors.Is(err, ErrRefused) {
		return 0, err
	}
	if len(notes) > 1 {
		// Find the refused ones: each alone.
		for i := range notes {
			if err = send(notes[i : i+1]); err == nil {
				e.sent(s, notes[i:i+1])
				continue
			}
			if !errors.Is(err, ErrRefused) {
				return i, err
			}
			e.refused(s, &notes[i], err)
		}
		return len(notes), nil
	}
	e.refused(s, &notes[0], err)
	return 1, nil
}

func (e *Evaluator) sent(s Sink, notes []Notification) {
	for _, n := range notes {
		e.metrics.notifications.WithLabelValues(s.Name(), n.Kind).Inc()
		e.log.Info("alert sent", zap.String("sink", s.Name()), zap.String("rule", n.Alert.Rule),
			zap.String("subject", n.Alert.Subject), zap.String("kind", n.Kind), zap.String("id", n.ID))
	}
}

// refused counts and logs a notification the sink refused for good; the caller drops it. It counts
// as an error too (stage refused), so what alerts on alerting errors hears of the drop.
func (e *Evaluator) refused(s Sink, n *Notification, err error) {
	e.metrics.refused.WithLabelValues(s.Name(), n.Kind).Inc()
	e.metrics.errors.WithLabelValues("refused").Inc()
	e.log.Error("alert refused, dropped", zap.String("sink", s.Name()), zap.String("rule", n.Alert.Rule),
		zap.String("subject", n.Alert.Subject), zap.String("kind", n.Kind), zap.String("id", n.ID), zap.Error(err))
}
