package consumer

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/aggregator/suite"
	"github.com/repeatrate/repeatrate/internal/synth"
	"github.com/repeatrate/repeatrate/internal/testenv"
)

// separateSuites is a suite.Redis the processor cannot join to the repeat-rate store's pipeline:
// its Companion is not the one suiteCompanion asks for, so graded runs take a step of their own.
type separateSuites struct{ *suite.Redis }

func (separateSuites) Companion() {}

// jointSide is a processor on Redis at addr under a prefix of its own, its repeat-rate and suite
// stores joined into one pipeline or not, with the calls computed in the processor or not.
type jointSide struct {
	client  *redis.Client
	hook    *scriptPipelines
	prefix  string
	pub     *recordingPublisher
	proc    *Processor
	metrics *Metrics
	rates   *aggregator.Redis
}

func newJointSide(t *testing.T, addr, name string, joined, compute bool) *jointSide {
	t.Helper()
	s := &jointSide{client: redis.NewClient(&redis.Options{Addr: addr}), hook: &scriptPipelines{}, pub: &recordingPublisher{}}
	t.Cleanup(func() { s.client.Close() })
	s.client.AddHook(s.hook)
	s.prefix = testenv.Name(t, name)
	testenv.CleanPrefix(t, s.client, s.prefix)
	cfg := aggregator.RedisConfig{Prefix: s.prefix, Retention: 30 * 24 * time.Hour, ComputeCalls: compute}
	var err error
	if s.rates, err = aggregator.NewRedis(s.client, cfg); err != nil {
		t.Fatal(err)
	}
	suites, err := suite.NewRedis(s.client, cfg, suite.Config{MinHistory: 1})
	if err != nil {
		t.Fatal(err)
	}
	var ss SuiteStore = suites
	if !joined {
		ss = separateSuites{suites}
	}
	s.metrics = NewMetrics(prometheus.NewRegistry())
	s.proc, err = NewProcessor(ProcessorConfig{RetryMin: time.Millisecond, Suite: suite.Config{MinHistory: 1}}, newTestDecoder(t), s.rates, ss,
		s.pub, &recordingDLQ{}, func() time.Time { return now }, zap.NewNop(), s.metrics)
	if err != nil {
		t.Fatal(err)
	}
	if (s.proc.joint != nil) != joined {
		t.Fatalf("%s: joined %v, want %v", name, s.proc.joint != nil, joined)
	}
	return s
}

// syntheticBatches returns n batches of size messages generated under cfg, then batch 3 again (a
// redelivery).
func syntheticBatches(cfg synth.Config, n, size int) [][]kafka.Message {
	gen := synth.New(cfg)
	var batches [][]kafka.Message
	for b, off := 0, int64(0); b < n; b++ {
		var msgs []kafka.Message
		for range size {
			line, _ := gen.Line(now)
			msgs = append(msgs, kafka.Message{Topic: "in", Offset: off, Value: line})
			off++
		}
		batches = append(batches, msgs)
	}
	return append(batches, batches[3])
}

// scriptPipelines records, per pipeline a client sends, how many script calls it holds. A
// pipeline refused for a script the server had not loaded yet (NOSCRIPT: a fresh server, or one
// whose script cache was flushed) is sent again with the scripts, and is not counted.
type scriptPipelines struct {
	mu     sync.Mutex
	counts []int
}

func (h *scriptPipelines) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *scriptPipelines) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *scriptPipelines) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		n := 0
		for _, c := range cmds {
			if c.Err() != nil && strings.HasPrefix(c.Err().Error(), "NOSCRIPT") {
				return err
			}
			if strings.HasPrefix(c.Name(), "eval") {
				n++
			}
		}
		if n > 0 {
			h.mu.Lock()
			h.counts = append(h.counts, n)
			h.mu.Unlock()
		}
		return err
	}
}

func (h *scriptPipelines) take() []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	c := h.counts
	h.counts = nil
	return c
}

// A batch's observations and graded runs reach Redis in one pipeline when both stores are the
// Redis ones, and that changes nothing: the same batches (live attempts, correction checks, plain
// eval results, duplicates, re-assessments, poison) applied through the joined pipeline and
// through separate steps leave the same keys and fields in Redis and publish the same snapshots
// and suite outputs, batch by batch; and each batch with both kinds costs one pipeline of scripts
// joined, two separate. A redelivered batch changes nothing either way.
func TestJointApplyIsTheSeparateApplyInOneRoundTrip(t *testing.T) {
	ctx := context.Background()
	addr := testenv.RedisAddr(t)
	joint, separate := newJointSide(t, addr, "joint", true, false), newJointSide(t, addr, "separate", false, false)
	batches := syntheticBatches(synth.Config{Seed: 5, Workspaces: 2, Corrections: 3, Duplicates: 0.2, Reassessed: 0.1, Poison: 0.02, EvalShare: 0.4}, 12, 150)

	ignore := func(name string) bool { return strings.Contains(name, ":pending:") || strings.Contains(name, "seal:") }
	// The two sides write a moment apart: the head's server-clock stamp may differ by a second.
	same := testenv.NormStateHead
	var both int
	for i, msgs := range batches {
		for _, s := range []*jointSide{joint, separate} {
			if err := s.proc.Handle(ctx, msgs); err != nil {
				t.Fatalf("batch %d: %v", i, err)
			}
		}
		b, err := joint.proc.Prepare(msgs)
		if err != nil {
			t.Fatal(err)
		}
		jp, sp := joint.hook.take(), separate.hook.take()
		if len(b.obs) > 0 && len(b.runs) > 0 {
			both++
			// The seal is a lone script call, not a pipeline: what is left is the apply.
			if len(jp) != 1 || len(sp) != 2 {
				t.Fatalf("batch %d: pipelines of scripts joined %v, separate %v; want one joined, two separate", i, jp, sp)
			}
		}
		testenv.SameDumps(t, fmt.Sprint("batch ", i), testenv.DumpKeys(t, joint.client, joint.prefix, ignore, same),
			testenv.DumpKeys(t, separate.client, separate.prefix, ignore, same))
		if !reflect.DeepEqual(joint.pub, separate.pub) {
			t.Fatalf("batch %d: published\njoined:   %+v\nseparate: %+v", i, joint.pub, separate.pub)
		}
	}
	if both < 10 || len(joint.pub.suites) == 0 || len(joint.pub.snaps) == 0 {
		t.Fatalf("%d batches with observations and runs, %d suite outputs, %d snapshots: the stream does not test the join",
			both, len(joint.pub.suites), len(joint.pub.snaps))
	}
}

// TestJointChunkedBatchesAnswerAsSeparateStepsAfterScriptsAreLost: with the computation on, a
// batch of hundreds of aggregates is stored in chunks, the suite's writes with the last; joined
// or in separate steps, batches leave the same keys, publish the same and count the same outcomes,
// also after Redis lost its scripts (SCRIPT FLUSH), which takes no retry of the batch either way.
func TestJointChunkedBatchesAnswerAsSeparateStepsAfterScriptsAreLost(t *testing.T) {
	ctx := context.Background()
	addr := testenv.StartRedis(t).Addr // a server of its own: the test flushes its scripts
	joint, separate := newJointSide(t, addr, "joint", true, true), newJointSide(t, addr, "separate", false, true)
	batches := syntheticBatches(synth.Config{Seed: 9, Workspaces: 40, Corrections: 12, Duplicates: 0.2, Reassessed: 0.1, Poison: 0.01, EvalShare: 0.4}, 8, 1500)
	ignore := func(name string) bool { return strings.Contains(name, ":pending:") || strings.Contains(name, "seal:") }
	same := testenv.NormStateHead
	for i, msgs := range batches {
		if i == 0 || i == 5 {
			if err := joint.client.ScriptFlush(ctx).Err(); err != nil { // server-wide: both sides
				t.Fatal(err)
			}
		}
		b, err := joint.proc.Prepare(msgs)
		if err != nil {
			t.Fatal(err)
		}
		aggs := map[aggregator.Key]bool{}
		for _, o := range b.obs {
			aggs[o.Key] = true
		}
		if len(aggs) < 256 {
			t.Fatalf("batch %d: %d aggregates, too few to be stored in chunks", i, len(aggs))
		}
		for _, s := range []*jointSide{joint, separate} {
			if err := s.proc.Handle(ctx, msgs); err != nil {
				t.Fatalf("batch %d: %v", i, err)
			}
		}
		testenv.SameDumps(t, fmt.Sprint("batch ", i), testenv.DumpKeys(t, joint.client, joint.prefix, ignore, same),
			testenv.DumpKeys(t, separate.client, separate.prefix, ignore, same))
		if !reflect.DeepEqual(joint.pub, separate.pub) {
			t.Fatalf("batch %d: published differently", i)
		}
	}
	for name, s := range map[string]*jointSide{"joined": joint, "separate": separate} {
		if n := testutil.ToFloat64(s.metrics.Retries.WithLabelValues("apply")); n != 0 {
			t.Errorf("%s: apply retried %v times", name, n)
		}
	}
	if stored, _ := joint.rates.ComputedCalls(); stored == 0 {
		t.Error("joined: no call computed")
	}
	for _, o := range []string{"counted", "duplicate", "reassessed", "stale", "reapplied"} {
		j, s := testutil.ToFloat64(joint.metrics.Outcomes.WithLabelValues(o)), testutil.ToFloat64(separate.metrics.Outcomes.WithLabelValues(o))
		if j != s {
			t.Errorf("outcome %s: joined %v, separate %v", o, j, s)
		}
	}
}
