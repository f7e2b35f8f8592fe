package sink

import (
	"context"
	"fmt"
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
}

// NewKafka returns a publisher on the three writers.
func NewKafka(snapshots, suites, alerts MessageWriter) *Kafka {
	return &Kafka{snapshots: snapshots, suites: suites, alerts: alerts}
}

func write(ctx context.Context, w MessageWriter, outs []Out) error {
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
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		return fmt.Errorf("publish %d %s events: %w", len(msgs), outs[0].Type, err)
	}
	return nil
}

// Publish writes repeat-rate snapshots and returns once all are acknowledged.
func (k *Kafka) Publish(ctx context.Context, snaps []schemas.Snapshot) error {
	outs := make([]Out, len(snaps))
	for i := range snaps {
		outs[i] = SnapshotOut(&snaps[i])
	}
	return write(ctx, k.snapshots, outs)
}

// PublishSuites writes suite snapshots to the suite topic and revived and abnormal events to the
// alerts topic, and returns once all are acknowledged.
func (k *Kafka) PublishSuites(ctx context.Context, o suite.Output, at time.Time) error {
	snaps, alerts := SuiteOuts(o, at)
	if err := write(ctx, k.suites, snaps); err != nil {
		return err
	}
	return write(ctx, k.alerts, alerts)
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
