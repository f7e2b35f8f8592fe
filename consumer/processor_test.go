package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/aggregator/suite"
	"github.com/repeatrate/repeatrate/schemas"
	"github.com/repeatrate/repeatrate/sink"
)

// flakyStore fails its first n applies, then applies to the pure model.
type flakyStore struct {
	sealErr error
	fails   int
	calls   int
	model   *aggregator.Model
	sealed  aggregator.Offsets // the offsets of the last Seal
}

func (s *flakyStore) Apply(ctx context.Context, obs []aggregator.Observation, at time.Time) (aggregator.Applied, error) {
	s.calls++
	if s.calls <= s.fails {
		return aggregator.Applied{}, errors.New("connection reset")
	}
	return s.model.Apply(ctx, obs, at)
}

func (s *flakyStore) Seal(ctx context.Context, offsets aggregator.Offsets) (int64, error) {
	s.sealed = offsets
	return 1, s.sealErr
}

func (s *flakyStore) Verify(ctx context.Context, upTo int64, commit aggregator.Offsets) error {
	return s.sealErr
}

func (s *flakyStore) CheckOffsets(ctx context.Context, committed aggregator.Offsets) error {
	return nil
}

type recordingPublisher struct {
	snaps  []schemas.Snapshot
	suites []suite.Output
}

func (p *recordingPublisher) Publish(_ context.Context, s []schemas.Snapshot) error {
	p.snaps = append(p.snaps, s...)
	return nil
}

func (p *recordingPublisher) PublishSuites(_ context.Context, o suite.Output, _ time.Time) error {
	p.suites = append(p.suites, o)
	return nil
}

// downPublisher publishes snapshots but never gets suite outputs acknowledged.
type downPublisher struct{ recordingPublisher }

func (p *downPublisher) PublishSuites(context.Context, suite.Output, time.Time) error {
	return errors.New("broker not available")
}

type recordingDLQ struct {
	sends int
	dls   []DeadLetter
}

func (d *recordingDLQ) Send(_ context.Context, dls []DeadLetter) error {
	d.sends++
	d.dls = append(d.dls, dls...)
	return nil
}

func TestProcessorHandle(t *testing.T) {
	store := &flakyStore{fails: 2, model: aggregator.NewModel(30 * 24 * time.Hour)}
	pub, dlq := &recordingPublisher{}, &recordingDLQ{}
	metrics := NewMetrics(prometheus.NewRegistry())
	p, err := NewProcessor(ProcessorConfig{RetryMin: time.Millisecond}, newTestDecoder(t), store, suite.NewMemory(suite.Config{}), pub, dlq,
		func() time.Time { return now }, zap.NewNop(), metrics)
	if err != nil {
		t.Fatal(err)
	}
	evalCheck := strings.NewReplacer(`"id":"e1"`, `"id":"e-check"`, `"type":"repeatrate.live.attempt.v1"`, `"type":"repeatrate.eval.result.v1"`,
		`"outcome":"confirmed_repeat"`, `"suite":"s","case_id":"k","version":"v1","version_seq":1,"run_index":0,"runs":1,"result":"error"`).Replace(structured)
	evalOnly := strings.NewReplacer(`"id":"e-check"`, `"id":"e-only"`, `"opportunity_id":"o","correction_id":"fix",`, "").Replace(evalCheck)
	msgs := []kafka.Message{
		{Topic: "in", Partition: 0, Offset: 10, Value: []byte(structured)},
		{Topic: "in", Partition: 0, Offset: 11, Value: []byte("garbage"), Headers: hdr("trace", "abc")},
		{Topic: "in", Partition: 1, Offset: 5, Value: []byte(structured)}, // the same event again: a duplicate
		{Topic: "in", Partition: 1, Offset: 6, Value: []byte(evalCheck)},
		{Topic: "in", Partition: 1, Offset: 7, Value: []byte(evalOnly)},
	}
	if err := p.Handle(context.Background(), msgs); err != nil {
		t.Fatal(err)
	}
	if store.calls != 3 {
		t.Fatalf("store called %d times, want 2 failures and 1 success", store.calls)
	}
	// The seal records the next offset of every partition the batch read, dead letters included.
	if got := fmt.Sprint(store.sealed); got != "map[in:map[0:12 1:8]]" {
		t.Fatalf("sealed offsets %s, want in/0 12 and in/1 8", got)
	}
	if dlq.sends != 1 || len(dlq.dls) != 1 || dlq.dls[0].Reason != schemas.ReasonUndecodable {
		t.Fatalf("dead letters sent %d times: %+v", dlq.sends, dlq.dls)
	}
	rec := dlq.dls[0].Record()
	want := map[string]string{"trace": "abc", HeaderDLQReason: "undecodable", HeaderDLQTopic: "in", HeaderDLQPartition: "0", HeaderDLQOffset: "11"}
	for _, h := range rec.Headers {
		if v, ok := want[h.Key]; ok && v == string(h.Value) {
			delete(want, h.Key)
		}
	}
	if len(want) != 0 || string(rec.Value) != "garbage" {
		t.Fatalf("dead letter lacks %v or its original value: %+v", want, rec)
	}
	if len(pub.snaps) != 2 {
		t.Fatalf("published %d snapshots, want one per touched aggregate (live and evaluation)", len(pub.snaps))
	}
	for _, s := range pub.snaps {
		switch s.Aggregate.Source {
		case "live":
			if w := s.Windows.All; w.ConfirmedRepeats != 1 || w.Scored != 1 || s.Version != s.ObservedAt.UnixMicro() {
				t.Fatalf("live snapshot %+v", s)
			}
		case "evaluation":
			if w := s.Windows.All; w.Unscored != 1 || w.Status != schemas.StatusNotMeasured {
				t.Fatalf("evaluation snapshot: an error result must be unscored: %+v", w)
			}
		}
	}
	// The batch's own duplicate (the same event twice) is counted as reapplied: the apply
	// succeeded on its third attempt, and a duplicate found then may be an earlier attempt's work.
	for outcome, n := range map[string]float64{"counted": 2, "duplicate": 0, "reapplied": 1} {
		if got := testutil.ToFloat64(metrics.Outcomes.WithLabelValues(outcome)); got != n {
			t.Errorf("outcome %s = %v, want %v", outcome, got, n)
		}
	}
	if got := testutil.ToFloat64(metrics.Retries.WithLabelValues("apply")); got != 2 {
		t.Errorf("apply retries = %v, want 2", got)
	}
	// One observation per step and batch, its retries included: the step's time, not its attempts.
	for _, step := range []string{"apply", "suite_apply", "seal", "dead_letter", "publish", "suite_publish", "suite_announce"} {
		if got := stepCount(t, metrics, step); got != 1 {
			t.Errorf("step %s observed %d times, want 1", step, got)
		}
	}
	// Both eval results (the correction check and the plain one) are graded runs of suite s.
	if len(pub.suites) != 1 || len(pub.suites[0].Discrimination) != 1 || len(pub.suites[0].Stability) != 1 {
		t.Fatalf("suite outputs = %+v", pub.suites)
	}
	if got := testutil.ToFloat64(metrics.RunOutcomes.WithLabelValues("counted")); got != 1 {
		t.Errorf("graded runs counted = %v, want 1 (the second result is the same run, graded again)", got)
	}
	if got := testutil.ToFloat64(metrics.Transport); got != 1 {
		t.Errorf("transport duplicates = %v, want 1", got)
	}
}

func TestProcessorGivesUpWhenCancelled(t *testing.T) {
	store := &flakyStore{fails: 1 << 30, model: aggregator.NewModel(time.Hour)}
	p, err := NewProcessor(ProcessorConfig{RetryMin: time.Millisecond}, newTestDecoder(t), store, suite.NewMemory(suite.Config{}), &recordingPublisher{}, &recordingDLQ{},
		func() time.Time { return now }, zap.NewNop(), NewMetrics(nil))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := p.Handle(ctx, []kafka.Message{{Value: []byte(structured)}}); err == nil {
		t.Fatal("Handle returned nil although the store never succeeded: the batch would be committed")
	}
}

func TestProcessorRewindsWhenWritesWereLost(t *testing.T) {
	store := &flakyStore{model: aggregator.NewModel(time.Hour), sealErr: fmt.Errorf("seal: %w", aggregator.ErrWritesLost)}
	p, err := NewProcessor(ProcessorConfig{RetryMin: time.Millisecond}, newTestDecoder(t), store, suite.NewMemory(suite.Config{}), &recordingPublisher{}, &recordingDLQ{},
		func() time.Time { return now }, zap.NewNop(), NewMetrics(nil))
	if err != nil {
		t.Fatal(err)
	}
	// Not retried in place: the batch must be consumed again from the committed offsets.
	err = p.Handle(context.Background(), []kafka.Message{{Value: []byte(structured)}})
	if !errors.Is(err, ErrRewind) {
		t.Fatalf("err = %v, want ErrRewind", err)
	}
}

// evalMessage is an eval result of case k in suite s, run 0 of 1, as a structured CloudEvent.
func evalMessage(id, version string, seq int, result, prediction string) kafka.Message {
	data := fmt.Sprintf(`{"scope":{"workspace":"w","model":"m","run":"r","checkpoint":"c","artifact":"a"},"suite":"s","case_id":"k",`+
		`"version":%q,"version_seq":%d,"run_index":0,"runs":1,"result":%q,"prediction":%q,`+
		`"occurred_at":"2026-11-29T11:00:00Z","assessed_at":"2026-11-29T11:00:00Z"}`, version, seq, result, prediction)
	return kafka.Message{Topic: "in", Value: []byte(`{"specversion":"1.0","id":"` + id + `","source":"src",` +
		`"type":"repeatrate.eval.result.v1","datacontenttype":"application/json","data":` + data + `}`)}
}

// alertIDs returns the CloudEvent ids of a suite output's alerts, revived then abnormal.
func alertIDs(t *testing.T, o suite.Output) []string {
	t.Helper()
	_, alerts := sink.SuiteOuts(o, now)
	ids := make([]string, len(alerts))
	for i := range alerts {
		b, err := sink.Encode(&alerts[i])
		if err != nil {
			t.Fatal(err)
		}
		var e struct{ ID, Type string }
		if err := json.Unmarshal(b, &e); err != nil {
			t.Fatal(err)
		}
		ids[i] = e.Type + " " + e.ID
	}
	return ids
}

// A batch redelivered after a crash past the suite apply, and again after it was fully handled,
// publishes its abnormal sample (and its revived case, until announced) every time, with the same
// ids, although every run in it is then a duplicate.
func TestProcessorRepublishesAlertsOnRedelivery(t *testing.T) {
	cfg := ProcessorConfig{RetryMin: time.Millisecond, Suite: suite.Config{MinHistory: 1}}
	suites := suite.NewMemory(cfg.Suite)
	msgs := []kafka.Message{
		evalMessage("r1", "v1", 1, "pass", strings.Repeat("and then again ", 60)), // abnormal reply
		evalMessage("r2", "v2", 2, "fail", "no"),                                  // pass → fail: revived
	}
	handle := func(pub Publisher) error {
		p, err := NewProcessor(cfg, newTestDecoder(t), &flakyStore{model: aggregator.NewModel(time.Hour)}, suites, pub, &recordingDLQ{},
			func() time.Time { return now }, zap.NewNop(), NewMetrics(nil))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		return p.Handle(ctx, msgs)
	}
	// The suite apply succeeds, the suite publish never does: the batch is not committed.
	if err := handle(&downPublisher{}); err == nil {
		t.Fatal("Handle returned nil although suite outputs were never published")
	}
	want := []string{schemas.TypeCaseRevived, schemas.TypeSampleAbnormal}
	var first []string
	for n, announced := range []bool{false, true} {
		pub := &recordingPublisher{}
		if err := handle(pub); err != nil {
			t.Fatal(err)
		}
		if len(pub.suites) != 1 {
			t.Fatalf("redelivery %d: %d suite publishes", n+1, len(pub.suites))
		}
		got := alertIDs(t, pub.suites[0])
		if announced {
			// The first redelivery announced the revived case; it is not announced twice.
			want = want[1:]
			first = first[1:]
		}
		if len(got) != len(want) {
			t.Fatalf("redelivery %d: alerts %v, want one of each of %v", n+1, got, want)
		}
		for i, w := range want {
			if !strings.HasPrefix(got[i], w+" ") {
				t.Fatalf("redelivery %d: alerts %v, want one of each of %v", n+1, got, want)
			}
		}
		if first != nil && !slices.Equal(got, first) {
			t.Fatalf("redelivery %d: alert ids %v, first published as %v", n+1, got, first)
		}
		first = got
	}
}

// stepCount is how many times the step's duration was observed.
func stepCount(t *testing.T, m *Metrics, step string) uint64 {
	t.Helper()
	var d dto.Metric
	if err := m.StepSeconds.WithLabelValues(step).(prometheus.Histogram).Write(&d); err != nil {
		t.Fatal(err)
	}
	return d.GetHistogram().GetSampleCount()
}
