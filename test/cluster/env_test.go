package cluster

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// root is the repository, two levels above this package.
var root, _ = filepath.Abs("../..")

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func need(t testing.TB, what, addr string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err == nil {
		c.Close()
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s is required under CI=true but %s does not answer: %v", what, addr, err)
	}
	t.Skipf("%s not reachable at %s (deploy/local/%s start): %v", what, addr,
		map[string]string{"Redis Cluster": "redis-cluster.sh", "Kafka cluster": "kafka-cluster.sh"}[what], err)
}

// redisCluster returns the six node addresses of the test Redis Cluster.
func redisCluster(t testing.TB) []string {
	t.Helper()
	base, _ := strconv.Atoi(env("REDIS_CLUSTER_PORT", "17001"))
	var addrs []string
	for i := range 6 {
		addrs = append(addrs, "127.0.0.1:"+strconv.Itoa(base+i))
	}
	need(t, "Redis Cluster", addrs[0])
	return addrs
}

func clusterClient(t testing.TB, addrs []string) *redis.ClusterClient {
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, MaxRedirects: 8, ClusterStateReloadInterval: time.Second,
		DialTimeout: time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second})
	t.Cleanup(func() { c.Close() })
	return c
}

// cleanPrefix deletes every key under prefix on every primary when the test ends.
func cleanPrefix(t testing.TB, c *redis.ClusterClient, prefix string) {
	t.Cleanup(func() {
		ctx := context.Background()
		c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
			iter := n.Scan(ctx, 0, prefix+":*", 1000).Iterator()
			for iter.Next(ctx) {
				n.Del(ctx, iter.Val())
			}
			return nil
		})
	})
}

// node is one line of CLUSTER NODES.
type node struct {
	id, addr, master string // master: the primary's id, for a replica
	primary          bool
}

func clusterNodes(ctx context.Context, c *redis.Client) ([]node, error) {
	out, err := c.ClusterNodes(ctx).Result()
	if err != nil {
		return nil, err
	}
	var ns []node
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 || strings.Contains(f[2], "fail") {
			continue
		}
		ns = append(ns, node{id: f[0], addr: strings.Split(f[1], "@")[0], master: f[3], primary: strings.Contains(f[2], "master")})
	}
	return ns, nil
}

// replicaOf returns the address of the replica of the primary at addr.
func replicaOf(t *testing.T, addrs []string, addr string) string {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addrs[0]})
	defer c.Close()
	ns, err := clusterNodes(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	var id string
	for _, n := range ns {
		if n.addr == addr {
			id = n.id
		}
	}
	for _, n := range ns {
		if !n.primary && n.master == id {
			return n.addr
		}
	}
	t.Fatalf("no replica of %s in %+v", addr, ns)
	return ""
}

// redisPid returns the pid of the cluster node at addr, as the script recorded it.
func redisPid(t *testing.T, addr string) int {
	t.Helper()
	_, port, _ := net.SplitHostPort(addr)
	b, err := os.ReadFile(filepath.Join(root, ".cache/redis-cluster", port, "redis.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

func signal(t *testing.T, pid int, sig syscall.Signal) {
	t.Helper()
	if err := syscall.Kill(pid, sig); err != nil {
		t.Fatalf("signal %v to %d: %v", sig, pid, err)
	}
}

// script runs one of the deploy/local scripts.
func script(t *testing.T, name string, args ...string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(root, "deploy/local", name), args...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
}

// awaitPrimary waits until the node at addr is a primary.
func awaitPrimary(t *testing.T, addr string, within time.Duration) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if info, err := c.Info(context.Background(), "replication").Result(); err == nil && strings.Contains(info, "role:master") {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s was not promoted within %v", addr, within)
}
