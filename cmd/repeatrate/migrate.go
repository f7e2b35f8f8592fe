package main

import (
	"context"
	"io"

	"go.uber.org/zap"

	"github.com/repeatrate/repeatrate/aggregator"
)

// migrateCommand moves the installation's namespace from state layout 10 to 11 while the
// processors keep running (aggregator.Migrate): every processor must be of a build that follows a
// migration; one of an earlier build stops at the marker's change.
func migrateCommand(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	return configured(ctx, "migrate", args, getenv, stderr, func(ctx context.Context, cfg Config, log *zap.Logger) error {
		rdb, err := newRedisClient(cfg.Redis)
		if err != nil {
			return err
		}
		defer rdb.Close()
		log.Info("migrating to state layout 11", zap.String("prefix", cfg.Redis.KeyPrefix))
		done, err := aggregator.Migrate(ctx, rdb, cfg.Redis.KeyPrefix, func(p aggregator.MigrateProgress) {
			log.Info("migration pass", zap.String("namespace", p.Namespace), zap.String("epoch", p.Epoch),
				zap.Int("passes", p.Passes), zap.Int("aggregates_visited", p.Aggregates),
				zap.Int("converted", p.Converted), zap.Int("records", p.Records))
		})
		if err != nil {
			return err
		}
		log.Info("migrated to state layout 11", zap.String("namespace", done.Namespace), zap.String("epoch", done.Epoch),
			zap.Int("converted", done.Converted), zap.Int("records", done.Records))
		return nil
	})
}
