package main

import (
	"context"
	"io"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/repeatrate/repeatrate/aggregator"
)

// migrateCommand moves the installation's namespace from state layout 10 to 11 while the
// processors keep running (aggregator.Migrate): every processor must be of a build that follows a
// migration; one of an earlier build stops at the marker's change.
func migrateCommand(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	return configured(ctx, "migrate", args, getenv, stderr, func(ctx context.Context, cfg Config, log *zap.Logger) error {
		redis.SetLogger(redisLog{log.Named("redis")})
		rdb, err := newRedisClient(cfg.Redis)
		if err != nil {
			return err
		}
		defer rdb.Close()
		log.Info("migrating to state layout 11", zap.String("prefix", cfg.Redis.KeyPrefix))
		var before aggregator.MigrateProgress
		done, err := aggregator.Migrate(ctx, rdb, cfg.Redis.KeyPrefix, func(p aggregator.MigrateProgress) {
			// What this pass did; the totals are in the last line.
			log.Info("migration pass", zap.String("namespace", p.Namespace), zap.String("epoch", p.Epoch),
				zap.Int("pass", p.Passes), zap.Int("aggregates_visited", p.Aggregates-before.Aggregates),
				zap.Int("converted", p.Converted-before.Converted), zap.Int("records", p.Records-before.Records))
			before = p
		})
		if err != nil {
			return err
		}
		log.Info("migrated to state layout 11", zap.String("namespace", done.Namespace), zap.String("epoch", done.Epoch),
			zap.Int("passes", done.Passes), zap.Int("converted", done.Converted), zap.Int("records", done.Records))
		return nil
	})
}
