package sink

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/repeatrate/repeatrate/aggregator/suite"
	"github.com/repeatrate/repeatrate/schemas"
)

// MessageWriter writes messages and returns once they are acknowledged; *kafka.Writer with
// RequiredAcks: RequireAll is one.
type MessageWriter interface {
	WriteMessages(ctx context.Context, msgs ...kafka.Message) error
}

// Kafka publishes repeat-rate snapshots, suite snapshots and alerts, each to its own topic through
// its own writer. Snapshot topics are compacted and keyed by subject, so they keep the latest
// snapshot of everything.
type Kafka struct {
	snapshots, suites, alerts MessageWriter
	writes                    inflight
}

// NewKafka returns a publisher on the three writers.
func NewKafka(snapshots, suites, alerts MessageWriter) *Kafka {
	return &Kafka{snapshots: snapshots, suites: suites, alerts: alerts}
}

// write writes outs and returns once they are acknowledged or ctx ends. The write itself is not
// cancelled with ctx: kafka-go keeps a cancelled write queued and sends it later anyway, so it
// runs on until the writer ends it, and Settle waits for it.
func (k *Kafka) write(ctx context.Context, w MessageWriter, outs []Out) error {
	if len(outs) == 0 {
		return nil
	}
	msgs := make([]kafka.Message, len(outs))
	now := time.Now()
	for i := range outs {
		var err error
		if msgs[i], err = Record(&outs[i], now); err != nil {
			return err
		}
	}
	done := make(chan error, 1)
	k.writes.add()
	go func() {
		defer k.writes.done()
		done <- w.WriteMessages(context.WithoutCancel(ctx), msgs...)
	}()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("publish %d %s events: %w", len(msgs), outs[0].Type, err)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("publish %d %s events: stopped waiting (%w); the writer may still deliver them", len(msgs), outs[0].Type, ctx.Err())
	}
}

// Settle waits until every write this publisher started has ended, delivered or given up by its
// writer: the consumer group settles before it hands its partitions over, so that a snapshot it
// stopped waiting for cannot land on a compacted topic after the new owner's newer one (where
// compaction would then keep the older). It returns an error when ctx ends first.
func (k *Kafka) Settle(ctx context.Context) error { return k.writes.wait(ctx) }

// inflight counts running writes.
type inflight struct {
	mu   sync.Mutex
	n    int
	zero chan struct{} // closed when n drops to 0
}

func (f *inflight) add() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n == 0 {
		f.zero = make(chan struct{})
	}
	f.n++
}

func (f *inflight) done() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n--
	if f.n == 0 {
		close(f.zero)
	}
}

func (f *inflight) wait(ctx context.Context) error {
	f.mu.Lock()
	n, zero := f.n, f.zero
	f.mu.Unlock()
	if n == 0 {
		return nil
	}
	select {
	case <-zero:
		return nil
	default:
	}
	select {
	case <-zero:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%d kafka writes still running: %w", n, ctx.Err())
	}
}

// Publish writes repeat-rate snapshots and returns once all are acknowledged.
func (k *Kafka) Publish(ctx context.Context, snaps []schemas.Snapshot) error {
	outs := make([]Out, len(snaps))
	for i := range snaps {
		outs[i] = SnapshotOut(&snaps[i])
	}
	return k.write(ctx, k.snapshots, outs)
}

// PublishSuites writes suite snapshots to the suite topic and revived and abnormal events to the
// alerts topic, and returns once all are acknowledged.
func (k *Kafka) PublishSuites(ctx context.Context, o suite.Output, at time.Time) error {
	snaps, alerts := SuiteOuts(o, at)
	if err := k.write(ctx, k.suites, snaps); err != nil {
		return err
	}
	return k.write(ctx, k.alerts, alerts)
}

// SuiteOuts renders suite outputs as output events: snapshots, then alerts.
func SuiteOuts(o suite.Output, at time.Time) (snaps, alerts []Out) {
	for i := range o.Discrimination {
		snaps = append(snaps, DiscriminationOut(&o.Discrimination[i]))
	}
	for i := range o.Stability {
		snaps = append(snaps, StabilityOut(&o.Stability[i]))
	}
	for i := range o.Revived {
		alerts = append(alerts, RevivedOut(&o.Revived[i], at))
	}
	for i := range o.Abnormal {
		alerts = append(alerts, AbnormalOut(&o.Abnormal[i], at))
	}
	return snaps, alerts
}
