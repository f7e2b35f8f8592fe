package cluster

import (
	"context"
	"net"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// scenarioEvents is the input of each Redis fault scenario: enough batches that the processors
// are writing on every shard when the fault comes, small enough to stay under a minute.
const scenarioEvents = 18_000

// Three processors run on the Redis Cluster while the primary that holds the batch marks (and
// aggregates) is SIGKILLed; the cluster promotes its replica. The processors keep running and
// publishing, the input goes on arriving, the old primary comes back as a replica, and in the end
// the latest snapshot of every aggregate equals replay's and the dead letters are exactly the
// poison.
func TestProcessorsSurviveRedisPrimaryLossAndEqualReplay(t *testing.T) {
	ctx := context.Background()
	s := newScenario(t, 15, scenarioEvents, 3)
	c := clusterClient(t, s.redisAddrs)
	cleanPrefix(t, c, s.name)
	s.produce(0)
	s.start(3)
	s.await(100, 2*time.Minute)

	marks, err := c.MasterForKey(ctx, s.name+":{marks}:x")
	if err != nil {
		t.Fatal(err)
	}
	victim := marks.Options().Addr
	replica := replicaOf(t, s.redisAddrs, victim)
	_, port, _ := net.SplitHostPort(victim)
	back := false
	t.Cleanup(func() {
		if !back { // leave the cluster whole for the next test
			exec.Command(root+"/deploy/local/redis-cluster.sh", "start-node", port).Run()
		}
	})
	t.Logf("SIGKILL primary %s (batch marks) after %d snapshots; its replica %s", victim, s.seen.count(), replica)
	signal(t, redisPid(t, victim), syscall.SIGKILL)
	s.produce(1)
	awaitPrimary(t, replica, 30*time.Second)
	before := s.seen.count()
	s.await(before+100, 2*time.Minute) // publishing again on the promoted replica
	script(t, "redis-cluster.sh", "start-node", port)
	back = true
	s.produce(2)
	s.converge(3 * time.Minute)
}

// Three processors run while `redis-cli --cluster reshard` moves slots that hold live aggregates
// (at least movedLive of the slots the processors already wrote) from one primary to another: the
// processors meet ASK redirections, TRYAGAIN on scripts whose keys are half moved and finally
// MOVED, and must neither lose nor double a count. The latest snapshots equal replay's, the dead
// letters are exactly the poison.
func TestProcessorsEqualReplayWhileSlotsMigrate(t *testing.T) {
	ctx := context.Background()
	s := newScenario(t, 16, scenarioEvents, 3)
	c := clusterClient(t, s.redisAddrs)
	cleanPrefix(t, c, s.name)
	s.produce(0)
	s.start(3)
	s.await(100, 2*time.Minute)

	// The source: the primary of the first node address; the reshard takes its lowest slots, so
	// take enough of them to include movedLive slots that hold this test's keys.
	const movedLive = 20
	nc := redis.NewClient(&redis.Options{Addr: s.redisAddrs[0]})
	defer nc.Close()
	nodes, err := clusterNodes(ctx, nc)
	if err != nil {
		t.Fatal(err)
	}
	var primaries []node
	for _, n := range nodes {
		if n.primary {
			primaries = append(primaries, n)
		}
	}
	if len(primaries) != 3 {
		t.Fatalf("%d primaries, want 3: %+v", len(primaries), nodes)
	}
	from, to := primaries[0], primaries[1]
	owned := ownedSlots(t, nc, from.id)
	live := liveSlots(t, from.addr, s.name)
	if len(live) < movedLive {
		t.Fatalf("%d slots of %s hold this test's keys, want at least %d", len(live), from.addr, movedLive)
	}
	n := slices.Index(owned, live[movedLive-1]) + 1
	moving := live[:movedLive]

	s.produce(1) // processed while the slots move
	t.Logf("reshard %d slots (%d with live aggregates) from %s to %s after %d snapshots", n, movedLive, from.addr, to.addr, s.seen.count())
	start, during := time.Now(), s.seen.count()
	out, err := exec.Command("redis-cli", "--cluster", "reshard", s.redisAddrs[0], "--cluster-from", from.id, "--cluster-to", to.id,
		"--cluster-slots", strconv.Itoa(n), "--cluster-yes").CombinedOutput()
	if err != nil {
		t.Fatalf("reshard: %v\n%s", err, tail(string(out), 20))
	}
	t.Logf("reshard took %v; %d snapshots published meanwhile", time.Since(start).Round(time.Millisecond), s.seen.count()-during)
	s.alive()
	// The live slots are the destination's now, with this test's keys in them.
	tc := redis.NewClient(&redis.Options{Addr: to.addr})
	defer tc.Close()
	nowOwned := ownedSlots(t, tc, to.id)
	keys := 0
	for _, slot := range moving {
		if !slices.Contains(nowOwned, slot) {
			t.Fatalf("slot %d still not on %s after the reshard", slot, to.addr)
		}
		k, err := tc.ClusterCountKeysInSlot(ctx, int(slot)).Result()
		if err != nil {
			t.Fatal(err)
		}
		keys += int(k)
	}
	if keys == 0 {
		t.Fatalf("the moved slots hold no keys on %s", to.addr)
	}
	t.Logf("%d keys in the %d live slots moved", keys, movedLive)
	s.produce(2)
	s.converge(3 * time.Minute)
}

// ownedSlots returns the slots the node id serves, ascending, from CLUSTER SLOTS.
func ownedSlots(t *testing.T, c *redis.Client, id string) []int64 {
	t.Helper()
	ranges, err := c.ClusterSlots(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	var slots []int64
	for _, r := range ranges {
		if len(r.Nodes) > 0 && r.Nodes[0].ID == id {
			for s := r.Start; s <= r.End; s++ {
				slots = append(slots, int64(s))
			}
		}
	}
	slices.Sort(slots)
	return slots
}

// liveSlots returns the distinct slots, ascending, of the keys under prefix on the node at addr.
func liveSlots(t *testing.T, addr, prefix string) []int64 {
	t.Helper()
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	var keys []string
	iter := c.Scan(ctx, 0, prefix+":*", 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	pipe := c.Pipeline()
	cmds := make([]*redis.IntCmd, len(keys))
	for i, k := range keys {
		cmds[i] = pipe.ClusterKeySlot(ctx, k)
	}
	if _, err := pipe.Exec(ctx); err != nil && len(keys) > 0 {
		t.Fatal(err)
	}
	seen := map[int64]bool{}
	for _, cmd := range cmds {
		seen[cmd.Val()] = true
	}
	var slots []int64
	for s := range seen {
		slots = append(slots, s)
	}
	slices.Sort(slots)
	return slots
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
