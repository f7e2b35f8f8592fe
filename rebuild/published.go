package rebuild

import (
	"context"
	"encoding/json"
	"errors"
	"strings"

	"github.com/segmentio/kafka-go"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/schemas"
)

// PublishedVersions returns the greatest version the snapshot topic holds for every aggregate: each
// partition is read from its start up to its high-water mark as noted on entry, however long that
// takes (a stalled fetch delays the rebuild; it never ends the reading early). A missing topic has
// published nothing. Messages that are not snapshots are skipped.
func PublishedVersions(ctx context.Context, k Kafka, topic string) (map[aggregator.Key]int64, error) {
	published := map[aggregator.Key]int64{}
	ends, err := k.EndOffsets(ctx, []string{topic})
	if errors.Is(err, kafka.UnknownTopicOrPartition) || err != nil && strings.Contains(err.Error(), "not found") {
		return published, nil
	}
	if err != nil {
		return nil, err
	}
	for part, end := range ends[topic] {
		if _, err := k.Read(ctx, topic, part, end, batchSize, func(batch []kafka.Message) error {
			for i := range batch {
				var ev struct {
					Data schemas.Snapshot `json:"data"`
				}
				if json.Unmarshal(batch[i].Value, &ev) != nil {
					continue
				}
				a := ev.Data.Aggregate
				src, ok := aggregator.ParseSource(a.Source)
				if !ok {
					continue
				}
				k := aggregator.Key{Scope: schemas.Scope{Workspace: a.Workspace, Model: a.Model, Run: a.Run,
					Checkpoint: a.Checkpoint, Artifact: a.Artifact}, CorrectionID: a.CorrectionID, Source: src}
				published[k] = max(published[k], ev.Data.Version)
			}
			return nil
		}); err != nil {
			return nil, err
		}
	}
	return published, nil
}
