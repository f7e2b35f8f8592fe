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
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
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

// OwnRedis starts a Redis of the test's own and returns a client on it (see StartRedis). Tests
// that read server-wide counters (INFO commandstats) use it: on the shared test Redis the packages
// that `go test ./...` runs in parallel add their commands to the counts.
func OwnRedis(t testing.TB) *redis.Client {
	t.Helper()
	return StartRedis(t).Client
}

// RedisServer is a redis-server process a test started.
type RedisServer struct {
	Addr   string
	Client *redis.Client
	Proc   *os.Process
}

// StartRedis starts Debian's redis-server on a free loopback port with no persistence and args
// added to its command line (say "--replicaof", "127.0.0.1", "<port>"); it stops when the test
// ends. Without the binary the test skips, or fails under CI=true.
func StartRedis(t testing.TB, args ...string) *RedisServer {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("redis-server is required under CI=true: %v", err)
		}
		t.Skipf("redis-server not installed (deploy/local/redis.sh installs it): %v", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	dir := t.TempDir()
	cmd := exec.Command(bin, append([]string{"--bind", "127.0.0.1", "--port", port, "--dir", dir, "--save", "", "--appendonly", "no"}, args...)...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &RedisServer{Addr: "127.0.0.1:" + port, Proc: cmd.Process}
	s.Client = redis.NewClient(&redis.Options{Addr: s.Addr})
	t.Cleanup(func() {
		s.Client.Close()
		cmd.Process.Signal(syscall.SIGCONT) // a test may have stopped it
		cmd.Process.Kill()
		cmd.Wait()
	})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		err := s.Client.Ping(context.Background()).Err()
		if err == nil {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("own redis-server on %s did not answer in 10 s: %v", s.Addr, err)
		}
	}
}

// StartReplicated starts a primary (StartRedis) and a replica of it, and returns once the
// primary counts the replica: a write and WAIT on one connection see it acknowledged (the primary
// counts a replica only after its first acknowledgement, up to a second after the link is up).
func StartReplicated(t testing.TB) (primary, replica *RedisServer) {
	t.Helper()
	primary = StartRedis(t, "--repl-diskless-sync-delay", "0")
	host, port, _ := net.SplitHostPort(primary.Addr)
	replica = StartRedis(t, "--replicaof", host, port)
	ctx := context.Background()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var wait *redis.Cmd
		primary.Client.Pipelined(ctx, func(p redis.Pipeliner) error {
			p.Set(ctx, "replicated", "1", 0)
			wait = p.Do(ctx, "WAIT", 1, 100)
			return nil
		})
		if n, _ := wait.Int64(); n == 1 {
			return primary, replica
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica of %s not in sync after 10 s:\n%s", primary.Addr, replica.Client.Info(ctx, "replication").Val())
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
