package suite

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/internal/testenv"
)

// t0 is the tests' reference time.
var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// newTestRedis returns a suite store with cfg on client, under a fresh prefix made from t and
// name, with an hour's retention.
func newTestRedis(t testing.TB, client *redis.Client, name string, cfg Config) *Redis {
	t.Helper()
	prefix := testenv.Name(t, name)
	testenv.CleanPrefix(t, client, prefix)
	store, err := NewRedis(client, aggregator.RedisConfig{Prefix: prefix, Retention: time.Hour}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return store
}

// testVersions is how many versions' keys a test declares when it calls suite.lua itself: more
// than any test's suite has.
const testVersions = 64
