package consumer

import (
	"errors"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the consumer's Prometheus series. Label sets are bounded: reasons, outcomes and
// event types are fixed enumerations; partitions are those of the input topics.
type Metrics struct {
	Events       *prometheus.CounterVec   // decoded input events by type
	DeadLetters  *prometheus.CounterVec   // quarantined messages by reason
	Outcomes     *prometheus.CounterVec   // repeat-rate observations by apply outcome
	RunOutcomes  *prometheus.CounterVec   // graded runs by apply outcome
	Alerts       *prometheus.CounterVec   // alert events published by kind
	Transport    prometheus.Counter       // transport duplicates: a CloudEvent source+id seen again in one batch
	BatchSize    prometheus.Histogram     // messages per processed batch
	BatchSeconds prometheus.Histogram     // time from a batch's first fetch to the end of its publish
	StageSeconds *prometheus.HistogramVec // time a batch spends in each stage (prepare, apply, publish), and each commit (commit)
	StepSeconds  *prometheus.HistogramVec // time a batch spends in each step of a stage (apply, suite_apply, seal, publish, ...)
	InFlight     prometheus.Gauge         // batches between their first message and the end of their publish
	Retries      *prometheus.CounterVec   // retried batch stages by stage
	Commits      *prometheus.CounterVec   // offset commits by result
	Rewinds      *prometheus.CounterVec   // times the batches in flight were dropped to be consumed again, by reason
	// UnsettledHandovers counts generations that ended with output writes still running.
	UnsettledHandovers prometheus.Counter
	Lag                *prometheus.GaugeVec // messages behind the high-water mark by topic and partition
	LastEvent          *prometheus.GaugeVec // unix time of the newest message processed, by topic
}

// NewMetrics registers the consumer's series on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "repeatrate_events_total", Help: "Input events decoded, by CloudEvent type.",
		}, []string{"type"}),
		DeadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "repeatrate_dead_letters_total", Help: "Messages sent to the dead-letter topic, by reason.",
		}, []string{"reason"}),
		Outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "repeatrate_observations_total", Help: "Repeat-rate observations applied, by outcome.",
		}, []string{"outcome"}),
		RunOutcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "repeatrate_graded_runs_total", Help: "Graded eval runs applied to suite state, by outcome.",
		}, []string{"outcome"}),
		Alerts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "repeatrate_alerts_total", Help: "Alert events published, by kind.",
		}, []string{"kind"}),
		Transport: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "repeatrate_transport_duplicates_total", Help: "Events whose CloudEvent source and id repeat within a batch.",
		}),
		BatchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "repeatrate_batch_messages", Help: "Messages per processed batch.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 8),
		}),
		BatchSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "repeatrate_batch_seconds", Help: "Time to process and commit one batch.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 10),
		}),
		StageSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "repeatrate_batch_stage_seconds", Help: "Time a batch spends in each stage of the pipeline (collect, prepare, apply, publish), retries included, and waiting before the next (queued_collect: for a place in flight, queued_prepare, queued_apply, queued_publish); input: from its first message's Kafka timestamp until it was taken (producer batching, broker, fetch); commit: the check before each offset commit, which holds up the next apply; commit_kafka: the broker's answer to each commit, awaited on a goroutine of its own.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2.5, 12),
		}, []string{"stage"}),
		StepSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "repeatrate_batch_step_seconds", Help: "Time a batch spends in each step of the apply and publish stages (apply, suite_apply, seal, dead_letter, publish, suite_publish, suite_announce), retries included: which Redis or Kafka call holds a stage up.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2.5, 12),
		}, []string{"step"}),
		InFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "repeatrate_batches_in_flight", Help: "Batches between their first message and the end of their publish (a batch its linger closed: until the applying stage took it back).",
		}),
		Retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "repeatrate_batch_retries_total", Help: "Batch stages retried after an error, by stage.",
		}, []string{"stage"}),
		Commits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "repeatrate_offset_commits_total", Help: "Offset commits, by result.",
		}, []string{"result"}),
		Rewinds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "repeatrate_rewinds_total", Help: "Times the batches in flight and pending commit were dropped, to be consumed again from the committed offsets, by reason: writes_lost (Redis lost acknowledged writes), state_lost (it lost committed work: the processor stops), error (a stage failed).",
		}, []string{"reason"}),
		UnsettledHandovers: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "repeatrate_unsettled_handovers_total", Help: "Generations that ended, their partitions going to the next owner, while output writes whose publish timed out were still running (past half the rebalance timeout): a snapshot may have landed after the next owner's.",
		}),
		Lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "repeatrate_consumer_lag_messages", Help: "Messages behind the partition's high-water mark after the last batch.",
		}, []string{"topic", "partition"}),
		LastEvent: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "repeatrate_last_message_timestamp_seconds", Help: "Kafka timestamp of the newest processed message.",
		}, []string{"topic"}),
	}
	if reg != nil {
		reg.MustRegister(m.Events, m.DeadLetters, m.Outcomes, m.RunOutcomes, m.Alerts, m.Transport, m.BatchSize, m.BatchSeconds,
			m.StageSeconds, m.StepSeconds, m.InFlight, m.Retries, m.Commits, m.Rewinds, m.UnsettledHandovers, m.Lag, m.LastEvent)
	}
	return m
}

func partitionLabel(p int) string { return strconv.Itoa(p) }

// rewindReason is the Rewinds label of an error that drops the work in flight.
func rewindReason(err error) string {
	switch {
	case errors.Is(err, ErrFatal):
		return "state_lost"
	case errors.Is(err, ErrRewind):
		return "writes_lost"
	}
	return "error"
}
