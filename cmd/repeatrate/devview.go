package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/repeatrate/repeatrate/consumer"
	"github.com/repeatrate/repeatrate/schemas"
)

// demoView is what `dev --demo` shows a person: every few seconds, how much traffic went in, what
// was quarantined and why, which alerts fired, and the busiest corrections with Live and
// Evaluation side by side. It follows the output topics as any subscriber would.
type demoView struct {
	sent atomic.Int64 // events the demo produced

	mu          sync.Mutex
	latest      map[string]schemas.Snapshot // newest snapshot by aggregate ID
	snapshots   int
	deadLetters map[string]int    // by reason
	alerts      map[string]int    // by event type
	recent      []string          // the last few alerts, newest last
	firing      map[string]string // alerting rules' alerts firing now, by event subject

	// outcomes, when set, returns the processor's observations so far by outcome (counted,
	// duplicate, …): what deduplication did, which the output topics do not show.
	outcomes func() map[string]int
	// input, when set, returns the events the processor has decoded so far, from any source (the
	// demo, /v1/events, produce): what the header's rate counts; without it, what the demo sent.
	input func() int64
}

// inputSoFar is the count the header's rate is taken from.
func (v *demoView) inputSoFar() int64 {
	if v.input != nil {
		return v.input()
	}
	return v.sent.Load()
}

func newDemoView() *demoView {
	return &demoView{latest: map[string]schemas.Snapshot{}, deadLetters: map[string]int{}, alerts: map[string]int{}}
}

// follow reads the snapshot, dead-letter and alert topics into the view until ctx ends.
func (v *demoView) follow(ctx context.Context, kc *kafkaClients) error {
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for topic, fn := range map[string]func(kafka.Message){
		TopicSnapshots: v.snapshot, TopicDLQ: v.deadLetter, TopicAlerts: v.alert,
	} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := tail(ctx, kc, topic, 24*time.Hour, func(m kafka.Message) error { fn(m); return nil })
			if err != nil && ctx.Err() == nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

func (v *demoView) snapshot(m kafka.Message) {
	var ev struct {
		Data schemas.Snapshot `json:"data"`
	}
	if json.Unmarshal(m.Value, &ev) != nil {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.snapshots++
	id := ev.Data.Aggregate.ID()
	if cur, ok := v.latest[id]; !ok || ev.Data.Version >= cur.Version {
		v.latest[id] = ev.Data
	}
	if len(v.latest) > viewMaxAggregates {
		v.dropQuietest()
	}
}

// viewMaxAggregates bounds the aggregates the view holds: the demo has a few dozen, but anything
// posted to dev's ingest shows up too, and a view of every aggregate ever seen grew without end.
const viewMaxAggregates = 4096

// dropQuietest keeps the busiest three quarters of viewMaxAggregates (by events scored), which
// are the rows the view can show; one that comes back returns with its next snapshot.
func (v *demoView) dropQuietest() {
	ids := slices.Collect(maps.Keys(v.latest))
	slices.SortFunc(ids, func(a, b string) int {
		return cmp.Or(cmp.Compare(v.latest[a].Windows.All.Scored, v.latest[b].Windows.All.Scored), strings.Compare(a, b))
	})
	for _, id := range ids[:len(ids)-viewMaxAggregates*3/4] {
		delete(v.latest, id)
	}
}

func (v *demoView) deadLetter(m kafka.Message) {
	reason := "unknown"
	for _, h := range m.Headers {
		if h.Key == consumer.HeaderDLQReason {
			reason = string(h.Value)
		}
	}
	v.mu.Lock()
	v.deadLetters[reason]++
	v.mu.Unlock()
}

func (v *demoView) alert(m kafka.Message) {
	var ev struct {
		Type    string        `json:"type"`
		Subject string        `json:"subject"`
		Time    string        `json:"time"`
		Data    schemas.Alert `json:"data"`
	}
	if json.Unmarshal(m.Value, &ev) != nil {
		return
	}
	kind := strings.TrimSuffix(strings.TrimPrefix(ev.Type, "repeatrate."), ".v1")
	v.mu.Lock()
	defer v.mu.Unlock()
	v.alerts[kind]++
	// An alerting rule's alert stays on view while it fires.
	switch ev.Type {
	case schemas.TypeAlertFiring:
		if v.firing == nil {
			v.firing = map[string]string{}
		}
		v.firing[ev.Subject] = ruleAlertText(&ev.Data)
		return
	case schemas.TypeAlertResolved:
		delete(v.firing, ev.Subject)
		return
	}
	// The subject is escaped identity text; show it whole but never raw control bytes.
	v.recent = append(v.recent, kind+" "+show(ev.Subject))
	if len(v.recent) > 3 {
		v.recent = v.recent[1:]
	}
}

// print writes the view every period until ctx ends.
func (v *demoView) print(ctx context.Context, out io.Writer, period time.Duration) {
	tick := time.NewTicker(period)
	defer tick.Stop()
	last := int64(0)
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			sent := v.inputSoFar()
			io.WriteString(out, v.render(now, sent-last, period, 8))
			last = sent
		}
	}
}

// render is one block of the view: a summary line, then up to top corrections by scored
// opportunities, each with its Live and Evaluation all-time rate (never pooled).
func (v *demoView) render(now time.Time, sent int64, period time.Duration, top int) string {
	v.mu.Lock()
	defer v.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "%s  %.1f events/s in, %d snapshots out\n", now.Format("15:04:05"), float64(sent)/period.Seconds(), v.snapshots)
	if v.outcomes != nil {
		fmt.Fprintf(&b, "          opportunities: %s\n", counts(v.outcomes()))
	}
	fmt.Fprintf(&b, "          dead letters: %s\n          alerts: %s\n", counts(v.deadLetters), counts(v.alerts))
	for _, a := range v.recent {
		fmt.Fprintf(&b, "          alert: %s\n", a)
	}
	for i, k := range slices.Sorted(maps.Keys(v.firing)) {
		if i == 5 {
			fmt.Fprintf(&b, "          firing: … %d more\n", len(v.firing)-i)
			break
		}
		fmt.Fprintf(&b, "          firing: %s\n", v.firing[k])
	}
	type row struct {
		name       string
		live, eval *schemas.Snapshot
		scored     int64
	}
	rows := map[string]*row{}
	for _, s := range v.latest {
		a := s.Aggregate
		name := strings.Join([]string{show(a.Workspace), show(a.Model), show(a.Run), show(a.Checkpoint), show(a.Artifact), show(a.CorrectionID)}, " ")
		r := rows[name]
		if r == nil {
			r = &row{name: name}
			rows[name] = r
		}
		if a.Source == "live" {
			r.live = &s
		} else {
			r.eval = &s
		}
		r.scored += s.Windows.All.Scored
	}
	list := make([]*row, 0, len(rows))
	for _, r := range rows {
		list = append(list, r)
	}
	// The busiest rows are shown, in name order: a row keeps its line from one redraw to the next
	// unless another overtakes it.
	slices.SortFunc(list, func(a, b *row) int {
		return cmp.Or(cmp.Compare(b.scored, a.scored), strings.Compare(a.name, b.name))
	})
	list = list[:min(top, len(list))]
	slices.SortFunc(list, func(a, b *row) int { return strings.Compare(a.name, b.name) })
	if len(list) > 0 {
		fmt.Fprintf(&b, "  %-40s  %-36s  %s\n", "scope (workspace … artifact) correction", "live, all time", "evaluation, all time")
	}
	for _, r := range list {
		fmt.Fprintf(&b, "  %-40s  %-36s  %s\n", clip(r.name, 40), rateText(r.live), rateText(r.eval))
	}
	return b.String()
}

// clip shortens s to n runes, its middle replaced by "…", so that a long scope keeps its columns
// and both its workspace and its correction stay readable.
func clip(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	head := (n - 1) / 2
	return string(r[:head]) + "…" + string(r[len(r)-(n-1-head):])
}

// rateText is a window's rate with its 95 % interval and counts, or what is missing.
func rateText(s *schemas.Snapshot) string {
	if s == nil {
		return "no events"
	}
	w := s.Windows.All
	if w.Status != schemas.StatusMeasured {
		return fmt.Sprintf("not measured (%d unscored)", w.Unscored)
	}
	return fmt.Sprintf("%5.1f%% of %d [%.0f–%.0f%%] +%d unscored", *w.Percentage, w.Scored, 100*w.CI95.Low, 100*w.CI95.High, w.Unscored)
}

// counts renders a tally as "a 2, b 1" in name order, or "none".
func counts(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + " " + strconv.Itoa(m[k])
	}
	return strings.Join(parts, ", ")
}

// show prints a scope part as it is when it is plain printable text, quoted otherwise, so the
// view is readable (m|small, not m%7Csmall) and no part can smuggle escape codes to a terminal.
func show(s string) string {
	for _, r := range s {
		if r == ' ' || !strconv.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	if s == "" {
		return `""`
	}
	return s
}

// liveView redraws the view in place once a second on a terminal, through bubbletea's renderer.
// It takes no keyboard input, so Ctrl-C stays a signal and stops dev as it does without a terminal.
type liveView struct {
	v      *demoView
	text   string
	last   int64     // events sent at the previous tick
	lastAt time.Time // time of the previous tick
}

type liveTick time.Time

func (m *liveView) Init() tea.Cmd { return m.tick() }

func (m *liveView) tick() tea.Cmd {
	return tea.Tick(time.Second, func(t time.Time) tea.Msg { return liveTick(t) })
}

func (m *liveView) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	if t, ok := msg.(liveTick); ok {
		now := time.Time(t)
		sent := m.v.inputSoFar()
		period := now.Sub(m.lastAt)
		if m.lastAt.IsZero() || period <= 0 {
			period = time.Second
		}
		m.text = m.v.render(now, sent-m.last, period, 12) + "\n(Ctrl-C stops the demo)\n"
		m.last, m.lastAt = sent, now
		return m, m.tick()
	}
	return m, nil
}

func (m *liveView) View() string {
	if m.text == "" {
		return "waiting for the first events…\n"
	}
	return m.text
}

// live shows the view in place on out, a terminal, until ctx ends.
func (v *demoView) live(ctx context.Context, out io.Writer) error {
	p := tea.NewProgram(&liveView{v: v}, tea.WithContext(ctx), tea.WithInput(nil), tea.WithOutput(out),
		tea.WithoutSignalHandler())
	if _, err := p.Run(); err != nil && ctx.Err() == nil {
		return fmt.Errorf("live view: %w", err)
	}
	return nil
}

// eventsIn reads repeatrate_events_total, summed over types, from reg: every input event the
// processor decoded.
func eventsIn(reg prometheus.Gatherer) int64 {
	mfs, err := reg.Gather()
	if err != nil {
		return 0
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() == "repeatrate_events_total" {
			for _, m := range mf.GetMetric() {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return int64(n)
}

// observationOutcomes reads repeatrate_observations_total by outcome from reg.
func observationOutcomes(reg prometheus.Gatherer) map[string]int {
	out := map[string]int{}
	mfs, err := reg.Gather()
	if err != nil {
		return out
	}
	for _, mf := range mfs {
		if mf.GetName() != "repeatrate_observations_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" {
					out[l.GetValue()] = int(m.GetCounter().GetValue())
				}
			}
		}
	}
	return out
}

// ruleAlertText is a firing alert in one line: the rule, its subject's fields, and for a change
// rule the two windows' rates and the least increase the test vouches for.
func ruleAlertText(a *schemas.Alert) string {
	var parts []string
	for _, f := range []string{"workspace", "model", "suite", "version", "case_id", "correction_id", "source"} {
		if v, ok := a.Fields[f]; ok {
			parts = append(parts, show(v))
		}
	}
	text := a.Rule + " " + strings.Join(parts, " ")
	if ev := a.Evidence; ev.Test != nil && len(ev.Windows) == 2 && ev.Windows[0].Rate != nil && ev.Windows[1].Rate != nil {
		r, b := ev.Windows[0], ev.Windows[1]
		text += fmt.Sprintf(": %s %.1f%% of %d vs %.1f%% of %d before", r.Name, 100**r.Rate, r.Scored, 100**b.Rate, b.Scored)
		if d := ev.Test.Detector; d != nil {
			text += fmt.Sprintf(", detector e^%.1f ≥ e^%.1f", d.Statistic, d.Threshold)
		} else {
			text += fmt.Sprintf(", up ≥ %.1f pts", 100*ev.Test.LowerDifference)
		}
	}
	return text
}
