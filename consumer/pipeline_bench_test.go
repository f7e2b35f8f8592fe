package consumer

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/aggregator/suite"
	"github.com/repeatrate/repeatrate/internal/testenv"
	"github.com/repeatrate/repeatrate/schemas"
	"github.com/repeatrate/repeatrate/sink"
)

// ackDelayPublisher encodes snapshots as sink.Kafka does and waits ackDelay per call, as long as a
// broker's acknowledgement of a produce request with acks=all takes.
type ackDelayPublisher struct {
	ackDelay time.Duration
}

func (p *ackDelayPublisher) Publish(ctx context.Context, snaps []schemas.Snapshot) error {
	for i := range snaps {
		out := sink.SnapshotOut(&snaps[i])
		if _, err := sink.Record(&out, now); err != nil {
			return err
		}
	}
	select {
	case <-time.After(p.ackDelay):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (p *ackDelayPublisher) PublishSuites(context.Context, suite.Output, time.Time) error { return nil }

type nopDLQ struct{}

func (nopDLQ) Send(context.Context, []DeadLetter) error { return nil }

// countingHandler counts published messages and signals when a stream's last one was published.
type countingHandler struct {
	*Processor
	published atomic.Int64
	want      atomic.Int64
	done      chan struct{}
}

func (h *countingHandler) Publish(ctx context.Context, b *Batch) error {
	err := h.Processor.Publish(ctx, b)
	if err == nil && h.published.Add(int64(len(b.Messages()))) == h.want.Load() {
		h.done <- struct{}{}
	}
	return err
}

type nopCommitter struct{}

func (nopCommitter) CommitOffsets(map[string]map[int]int64) error { return nil }

// liveStream returns n live attempts over 400 aggregates, new opportunities each time it is called
// with a new round, one topic partition.
func liveStream(round, n int) []kafka.Message {
	msgs := make([]kafka.Message, n)
	for i := range msgs {
		outcome := "passed"
		if i%5 == 0 {
			outcome = "confirmed_repeat"
		}
		v := fmt.Sprintf(`{"specversion":"1.0","id":"e%d-%d","source":"bench","type":"repeatrate.live.attempt.v1","datacontenttype":"application/json",`+
			`"data":{"scope":{"workspace":"w%d","model":"m","run":"r","checkpoint":"c","artifact":"a"},"opportunity_id":"o%d-%d","correction_id":"fix",`+
			`"occurred_at":"2026-11-29T11:%02d:00Z","assessed_at":"2026-11-29T11:%02d:00Z","outcome":%q}}`, round, i, i%400, round, i, i%60, i%60, outcome)
		msgs[i] = kafka.Message{Topic: "in", Offset: int64(round*n + i), Value: []byte(v)}
	}
	return msgs
}

// pipelineUnderTest is one group's batch loop over an in-memory input, kept running across rounds.
type pipelineUnderTest struct {
	h     *countingHandler
	in    chan kafka.Message
	round int
	took  []time.Duration
}

func startPipeline(b *testing.B, client redis.UniversalClient, maxInFlight int, ackDelay time.Duration) *pipelineUnderTest {
	prefix := testenv.Name(b, "benchpipe")
	testenv.CleanPrefix(b, client.(*redis.Client), prefix)
	store, err := aggregator.NewRedis(client, aggregator.RedisConfig{Prefix: prefix, Retention: 30 * 24 * time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	p, err := NewProcessor(ProcessorConfig{}, newTestDecoder(b), store, suite.NewMemory(suite.Config{}), &ackDelayPublisher{ackDelay: ackDelay},
		nopDLQ{}, func() time.Time { return now }, zap.NewNop(), NewMetrics(nil))
	if err != nil {
		b.Fatal(err)
	}
	h := &countingHandler{Processor: p, done: make(chan struct{}, 1)}
	g, err := NewGroup(GroupConfig{Brokers: []string{"unused"}, GroupID: "g", Topics: []string{"in"}, MaxInFlight: maxInFlight}, h, zap.NewNop(), NewMetrics(nil))
	if err != nil {
		b.Fatal(err)
	}
	g.fatal = func(err error) { b.Error(err) }
	pt := &pipelineUnderTest{h: h, in: make(chan kafka.Message, g.cfg.MaxBatch)}
	ctx, cancel := context.WithCancel(b.Context())
	loop := make(chan struct{})
	go func() { defer close(loop); g.batches(ctx, ctx, 1, nopCommitter{}, pt.in) }()
	b.Cleanup(func() { cancel(); <-loop })
	return pt
}

// feed hands one round of n new events to the loop, as the fetchers do, and returns once the
// last one was published.
func (pt *pipelineUnderTest) feed(ctx context.Context, n int) {
	msgs := liveStream(pt.round, n)
	pt.round++
	pt.h.want.Add(int64(n))
	began := time.Now()
	go func() {
		for _, m := range msgs {
			select {
			case pt.in <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	select {
	case <-pt.h.done:
	case <-ctx.Done():
	}
	pt.took = append(pt.took, time.Since(began))
}

// BenchmarkPipeline measures the processor alone — decode, the Redis store on the test Redis,
// publishes that wait a broker's acknowledgement time — through the group's batch loop, with one
// batch in flight (the stages one after another, as before the pipeline) and with three. The two
// run alternately, a round of 20 000 live attempts (400 aggregates, batches of 2 000) each, so
// that both see the same load on a shared machine; each reports its events/s over all rounds.
//
//	REPEATRATE_TEST_REDIS=127.0.0.1:16379 go test -run '^$' -bench Pipeline -benchtime 10x ./consumer
func BenchmarkPipeline(b *testing.B) {
	client := testenv.Redis(b)
	const perRound = 20_000
	for _, ack := range []time.Duration{2 * time.Millisecond, 10 * time.Millisecond} {
		b.Run(fmt.Sprintf("ack=%s", ack), func(b *testing.B) {
			modes := []*pipelineUnderTest{startPipeline(b, client, 1, ack), startPipeline(b, client, 3, ack)}
			for b.Loop() {
				for _, pt := range modes {
					pt.feed(b.Context(), perRound)
				}
			}
			rate := func(pt *pipelineUnderTest) float64 {
				var sum time.Duration
				for _, d := range pt.took {
					sum += d
				}
				return float64(perRound*len(pt.took)) / sum.Seconds()
			}
			seq, over := rate(modes[0]), rate(modes[1])
			b.ReportMetric(seq, "sequential_events/s")
			b.ReportMetric(over, "in_flight3_events/s")
			b.ReportMetric(over/seq, "speedup")
		})
	}
}
