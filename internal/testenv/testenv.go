// Package testenv finds the real Redis and Kafka that integration tests run against. The README's
// test command starts both (deploy/local) and exports their addresses; a developer running `go test`
// without them gets skips, but under CI=true a missing service fails the test.
package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Default addresses of the services deploy/local starts.
const (
	DefaultRedis = "127.0.0.1:16379"
	DefaultKafka = "127.0.0.1:19092"
)

func addr(env, def string) string {
	if v := os.Getenv(env); v != "" {
		return v
	}
	return def
}

func need(t testing.TB, what, address string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", address, 2*time.Second)
	if err == nil {
		c.Close()
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s is required under CI=true but %s does not answer: %v", what, address, err)
	}
	t.Skipf("%s not reachable at %s (start it with deploy/local or `make test`): %v", what, address, err)
}

// RedisAddr returns the test Redis address, skipping (or failing under CI) when it is down.
func RedisAddr(t testing.TB) string {
	t.Helper()
	a := addr("REPEATRATE_TEST_REDIS", DefaultRedis)
	need(t, "Redis", a)
	return a
}

// Redis returns a client on the test Redis, closed when the test ends.
func Redis(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: RedisAddr(t)})
	t.Cleanup(func() { c.Close() })
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("ping redis: %v", err)
	}
	return c
}

// KafkaBrokers returns the test Kafka bootstrap addresses, skipping (or failing under CI) when the
// broker is down.
func KafkaBrokers(t testing.TB) []string {
	t.Helper()
	brokers := strings.Split(addr("REPEATRATE_TEST_KAFKA", DefaultKafka), ",")
	need(t, "Kafka", brokers[0])
	return brokers
}

var seq atomic.Int64

// Name returns a name unique to this test process, for topics, groups and key prefixes.
func Name(t testing.TB, what string) string {
	return fmt.Sprintf("test-%s-%d-%d-%d", what, os.Getpid(), time.Now().UnixNano()%1e9, seq.Add(1))
}

// CleanPrefix deletes every key under prefix when the test ends.
func CleanPrefix(t testing.TB, c *redis.Client, prefix string) {
	t.Cleanup(func() {
		ctx := context.Background()
		iter := c.Scan(ctx, 0, prefix+":*", 1000).Iterator()
		var batch []string
		for iter.Next(ctx) {
			batch = append(batch, iter.Val())
			if len(batch) == 1000 {
				c.Del(ctx, batch...)
				batch = batch[:0]
			}
		}
		if len(batch) > 0 {
			c.Del(ctx, batch...)
		}
	})
}
