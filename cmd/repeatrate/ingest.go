package main

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/repeatrate/repeatrate/ingest"
	"github.com/repeatrate/repeatrate/internal/auth"
	"github.com/repeatrate/repeatrate/schemas/cloudevent"
)

// newIngest builds the handler of POST /v1/events (README, Ingest over HTTP) on a writer of its
// own: fully acknowledged (RequireAll), each message naming its input topic, its record limit the
// one every writer of the process has; retained counts each workspace's retained opportunities for
// their quota. closeWriter waits a while for the writes in flight, then
// flushes and closes the writer.
func newIngest(cfg Config, kc *kafkaClients, tokens *auth.Store, dec *cloudevent.Decoder, retained ingest.RetainedCounter, receipt func() time.Time,
	reg prometheus.Registerer, log *zap.Logger) (h *ingest.Handler, closeWriter func() error, err error) {
	live, eval := cfg.ingestTopics()
	w := kc.writer(live)
	w.Topic = "" // each message names its topic
	w.BatchBytes = min(kc.batchBytes(live), kc.batchBytes(eval))
	// One attempt per write: a refusal then means not written, and the client retries (a writer
	// that retried inside the write could have appended on an attempt before the refused one).
	w.MaxAttempts = 1
	h, err = ingest.New(ingest.Config{LiveTopic: live, EvalTopic: eval, Tokens: tokens,
		MaxBodyBytes: int64(cfg.HTTP.IngestMaxBodyBytes), RecordLimit: w.BatchBytes, WriteTimeout: 10 * time.Second,
		MaxInFlightBytes: int64(cfg.HTTP.IngestMaxInFlightBytes), SingleAttempt: true, WorkspaceRate: float64(cfg.HTTP.IngestWorkspaceRate),
		MaxRetained: int64(cfg.HTTP.IngestWorkspaceRetained), Retained: retained, Registerer: reg}, dec, w, receipt, log)
	if err != nil {
		w.Close()
		return nil, nil, err
	}
	// On shutdown the writes in flight get a while to finish (each request already had its
	// answer); the writer's Close then flushes what kafka-go still holds.
	closeAll := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return errors.Join(h.Close(ctx), w.Close())
	}
	return h, closeAll, nil
}
