package main

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/repeatrate/repeatrate/internal/testenv"
)

// fakeRedis answers INFO with the given process_id, as a Redis in another PID namespace does (a
// container publishing its port on 127.0.0.1, an SSH or kubectl port-forward): its pid names no
// process of this machine, or an unrelated one.
func fakeRedis(t *testing.T, pid int) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					// One RESP array of bulk strings per command.
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					n, _ := strconv.Atoi(strings.TrimSpace(line[1:]))
					var args []string
					for range n {
						r.ReadString('\n') // $len
						a, _ := r.ReadString('\n')
						args = append(args, strings.ToLower(strings.TrimSpace(a)))
					}
					switch {
					case len(args) > 0 && args[0] == "hello":
						fmt.Fprint(c, "-ERR unknown command 'HELLO'\r\n")
					case len(args) > 0 && args[0] == "info":
						body := fmt.Sprintf("# Server\r\nprocess_id:%d\r\n", pid)
						fmt.Fprintf(c, "$%d\r\n%s\r\n", len(body), body)
					default:
						fmt.Fprint(c, "+OK\r\n")
					}
				}
			}()
		}
	}()
	return l.Addr().String()
}

// A Redis reached through a loopback port is not necessarily a process of this machine: a
// container's Redis reports its own namespace's pid (1, typically), and /proc/1/schedstat is
// then this machine's init. The harness must not report init's scheduler times as Redis's main
// thread; it should check that the pid is a redis-server (/proc/<pid>/comm) before reading it.
func TestRedisThreadOnlyReadsARedisServer(t *testing.T) {
	if _, err := os.Stat("/proc/1/schedstat"); err != nil {
		t.Skip("no /proc/1/schedstat")
	}
	addr := fakeRedis(t, 1)
	if got := redisThread(context.Background(), addr); !math.IsNaN(got.run) {
		comm, _ := os.ReadFile("/proc/1/comm")
		t.Errorf("a Redis whose pid is 1 in its own namespace read as %+v: the scheduler times of pid 1 here (%s)", got, strings.TrimSpace(string(comm)))
	}
}

// "localhost" is how many set REPEATRATE_TEST_REDIS; it is this machine as much as 127.0.0.1, yet
// net.ParseIP("localhost") is nil and the Redis-thread line silently disappears from the log.
// A unix socket path or a remote address stays unknown, without a panic.
func TestRedisThreadAddresses(t *testing.T) {
	addr := testenv.RedisAddr(t)
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	if got := redisThread(context.Background(), addr); math.IsNaN(got.run) {
		t.Skipf("the test Redis at %s is not a local process here", addr)
	}
	if got := redisThread(context.Background(), "localhost:"+port); math.IsNaN(got.run) {
		t.Errorf("localhost:%s: unknown, although it is the same local Redis as %s", port, addr)
	}
	for _, a := range []string{"/var/run/redis/redis.sock", "unix:///tmp/redis.sock", "192.0.2.1:6379", ""} {
		if got := redisThread(context.Background(), a); !math.IsNaN(got.run) {
			t.Errorf("%q: read as %+v, want unknown", a, got)
		}
	}
}
