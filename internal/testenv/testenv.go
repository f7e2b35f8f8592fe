// Package testenv finds the real Redis and Kafka that integration tests run against. The README's
// test command starts both (deploy/local) and exports their addresses; a developer running `go test`
// without them gets skips, but under CI=true a missing service fails the test.
package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
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

// OwnRedis starts a Redis of the test's own (Debian's redis-server on a unix socket, no
// persistence) and returns a client on it; both stop when the test ends. Tests that read
// server-wide counters (INFO commandstats) use it: on the shared test Redis the packages that
// `go test ./...` runs in parallel add their commands to the counts.
func OwnRedis(t testing.TB) *redis.Client {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("redis-server is required under CI=true: %v", err)
		}
		t.Skipf("redis-server not installed (deploy/local/redis.sh installs it): %v", err)
	}
	// A short directory of its own: a unix socket's path is limited to about 100 bytes.
	dir, err := os.MkdirTemp("", "rr-redis")
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "redis.sock")
	cmd := exec.Command(bin, "--port", "0", "--unixsocket", sock, "--dir", dir, "--save", "", "--appendonly", "no")
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Network: "unix", Addr: sock})
	t.Cleanup(func() {
		c.Close()
		cmd.Process.Kill()
		cmd.Wait()
		os.RemoveAll(dir)
	})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		err := c.Ping(context.Background()).Err()
		if err == nil {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("own redis-server on %s did not answer in 10 s: %v", sock, err)
		}
	}
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
