package aggregator

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/repeatrate/repeatrate/internal/testenv"
)

// A WAIT that cannot end in time is no answer: a wait_timeout below Redis's 1 ms resolution (WAIT
// 0 blocks forever) or beyond the caller's deadline (the group gives Verify DrainTimeout) must
// still end, by the deadline, in ErrReplicasBehind — the commit waits — rather than in a read
// timeout or an ignored deadline, which the group takes for an unverified commit and rewinds.
func TestWaitEndsByTheDeadline(t *testing.T) {
	for _, tc := range []struct {
		name     string
		wait     time.Duration
		deadline time.Duration // of the caller's context; 0 for none
		within   time.Duration
	}{
		{"below one millisecond", 500 * time.Microsecond, 0, 5 * time.Second},
		{"beyond the caller's deadline", 20 * time.Second, 700 * time.Millisecond, 5 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			primary, replica := testenv.StartReplicated(t)
			// As cmd/repeatrate builds it: reads wait for WAIT's timeout and 2 s more.
			client := redis.NewClient(&redis.Options{Addr: primary.Addr, ReadTimeout: max(3*time.Second, tc.wait+2*time.Second)})
			t.Cleanup(func() { client.Close() })
			store, err := NewRedis(client, RedisConfig{Prefix: "rr", Retention: time.Hour, Group: "g", WaitReplicas: 1, WaitTimeout: tc.wait})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			now := time.Now()
			obs := []Observation{{Key: keyLive, OpportunityID: "o", Class: Passed, Occurred: Micros(now), Assessed: Micros(now)}}
			if _, err := store.Apply(ctx, obs, now); err != nil {
				t.Fatal(err)
			}
			mark, err := store.Seal(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := replica.Proc.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { replica.Proc.Signal(syscall.SIGCONT) })
			vctx := ctx
			if tc.deadline > 0 {
				var cancel context.CancelFunc
				vctx, cancel = context.WithTimeout(ctx, tc.deadline)
				defer cancel()
			}
			begin := time.Now()
			err = store.Verify(vctx, mark, Offsets{"in": {0: 1}})
			took := time.Since(begin)
			if !errors.Is(err, ErrReplicasBehind) {
				t.Errorf("Verify returned %v after %v, want ErrReplicasBehind (the commit waits, no rewind)", err, took)
			}
			if took > tc.within {
				t.Errorf("Verify took %v, want at most %v", took, tc.within)
			}
		})
	}
}

// miniCluster is a Redis Cluster of the test's own: two primaries, slots 0-8191 and 8192-16383,
// one replica each, in sync.
type miniCluster struct {
	primaries [2]*testenv.RedisServer
	ids       [2]string
	all       []*testenv.RedisServer // primaries and replicas
	client    *redis.ClusterClient
}

func startMiniCluster(t *testing.T) *miniCluster {
	t.Helper()
	ctx := context.Background()
	args := []string{"--cluster-enabled", "yes", "--cluster-node-timeout", "5000", "--repl-diskless-sync-delay", "0"}
	mc := &miniCluster{}
	var all []*testenv.RedisServer
	for i := range 2 {
		mc.primaries[i] = testenv.StartRedis(t, args...)
		all = append(all, mc.primaries[i])
		mc.ids[i] = mc.primaries[i].Client.Do(ctx, "CLUSTER", "MYID").Val().(string)
	}
	if err := mc.primaries[0].Client.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 0, 8191).Err(); err != nil {
		t.Fatal(err)
	}
	if err := mc.primaries[1].Client.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 8192, 16383).Err(); err != nil {
		t.Fatal(err)
	}
	var replicas []*testenv.RedisServer
	for range 2 {
		r := testenv.StartRedis(t, args...)
		replicas = append(replicas, r)
		all = append(all, r)
	}
	// Distinct config epochs before the nodes meet, as `redis-cli --cluster create` sets them.
	// Left to collision handling, two primaries can still share an epoch when a slot moves: the
	// importing node then claims it without a higher epoch, a stale replica's gossip hands it back
	// to the old owner, and no node claims the slot any more (each thinks the other holds it).
	for i, s := range all {
		if err := s.Client.Do(ctx, "CLUSTER", "SET-CONFIG-EPOCH", i+1).Err(); err != nil {
			t.Fatal(err)
		}
	}
	host, port, _ := net.SplitHostPort(mc.primaries[0].Addr)
	for _, s := range all[1:] {
		if err := s.Client.Do(ctx, "CLUSTER", "MEET", host, port).Err(); err != nil {
			t.Fatal(err)
		}
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); !ok(); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("mini cluster: %s not reached in 20 s", what)
			}
		}
	}
	waitFor("every node knows every other", func() bool {
		for _, s := range all {
			if n := strings.Count(s.Client.Do(ctx, "CLUSTER", "NODES").String(), "\n"); n < 4 {
				return false
			}
		}
		return true
	})
	for i, r := range replicas {
		waitFor("replica accepted", func() bool { return r.Client.Do(ctx, "CLUSTER", "REPLICATE", mc.ids[i]).Err() == nil })
	}
	waitFor("cluster ok and replicas in sync", func() bool {
		for _, s := range all {
			if !strings.Contains(s.Client.ClusterInfo(ctx).Val(), "cluster_state:ok") {
				return false
			}
		}
		for _, r := range replicas {
			if !strings.Contains(r.Client.Info(ctx, "replication").Val(), "master_link_status:up") {
				return false
			}
		}
		return true
	})
	for _, p := range mc.primaries {
		waitFor("a replica acknowledges", func() bool {
			// On one connection: WAIT counts acknowledgements up to its own connection's last write.
			var wait *redis.Cmd
			p.Client.Pipelined(ctx, func(pp redis.Pipeliner) error {
				pp.Set(ctx, "ready", 1, time.Minute)
				wait = pp.Do(ctx, "WAIT", 1, 200)
				return nil
			})
			n, _ := wait.Int64()
			return n == 1
		})
	}
	mc.all = all
	mc.client = redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{mc.primaries[0].Addr, mc.primaries[1].Addr}})
	t.Cleanup(func() { mc.client.Close() })
	return mc
}

// index returns which primary serves key.
func (mc *miniCluster) index(key string) int {
	slot := mc.primaries[0].Client.ClusterKeySlot(context.Background(), key).Val()
	if slot < 8192 {
		return 0
	}
	return 1
}

// migrate moves slot from primary `from` to the other one, keys included, as `redis-cli --cluster
// reshard` does, behind the back of mc.client (whose slot map is now stale).
func (mc *miniCluster) migrate(t *testing.T, slot int64, from int) {
	t.Helper()
	ctx := context.Background()
	src, dst := mc.primaries[from], mc.primaries[1-from]
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(dst.Client.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", mc.ids[from]).Err())
	must(src.Client.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", mc.ids[1-from]).Err())
	host, port, _ := net.SplitHostPort(dst.Addr)
	for {
		keys, err := src.Client.ClusterGetKeysInSlot(ctx, int(slot), 100).Result()
		must(err)
		if len(keys) == 0 {
			break
		}
		args := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
		for _, k := range keys {
			args = append(args, k)
		}
		must(src.Client.Do(ctx, args...).Err())
	}
	must(dst.Client.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", mc.ids[1-from]).Err())
	must(src.Client.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", mc.ids[1-from]).Err())
	// As `redis-cli --cluster` checks after a reshard: every node, replicas included, agrees on
	// the slot's new owner before anything relies on it (gossip takes a while on a loaded machine,
	// and a client that reads the slot map from a node not yet told is sent back and forth).
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		agreed := true
		for _, n := range mc.all {
			slots, err := n.Client.ClusterSlots(ctx).Result()
			owner := ""
			for _, r := range slots {
				if int64(r.Start) <= slot && slot <= int64(r.End) && len(r.Nodes) > 0 {
					owner = r.Nodes[0].ID
				}
			}
			agreed = agreed && err == nil && owner == mc.ids[1-from]
		}
		if agreed {
			return
		}
		if time.Now().After(deadline) {
			var views []string
			for _, n := range mc.all {
				views = append(views, n.Addr+":\n"+n.Client.ClusterNodes(ctx).Val())
			}
			t.Fatalf("the nodes did not agree on slot %d's new owner within 30 s; their views:\n%s", slot, strings.Join(views, "\n"))
		}
	}
}

// A slot moved by a reshard answers a write and WAIT sent to its old primary with MOVED. That is
// not a loss and not an unverified commit: nothing was lost (the keys moved with the slot), so the
// commit waits (ErrReplicasBehind) or passes, and it passes once the slot map was read again. An
// error of any other kind makes the group drop every pending batch and consume them again.
func TestWaitAcrossAMovedSlot(t *testing.T) {
	for _, which := range []string{"a shard's token", "the batch marks"} {
		t.Run(which, func(t *testing.T) {
			mc := startMiniCluster(t)
			ctx := context.Background()
			store, err := NewRedis(mc.client, RedisConfig{Prefix: "rr", Retention: time.Hour, Group: "g", WaitReplicas: 1, WaitTimeout: 500 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			now := time.Now()
			b := 0
			applySeal := func() int64 {
				t.Helper()
				var obs []Observation
				for i := range 40 {
					k := keyLive
					k.CorrectionID = fmt.Sprint("fix-", i)
					obs = append(obs, Observation{Key: k, OpportunityID: fmt.Sprint("o", b), Class: Passed, Occurred: Micros(now), Assessed: Micros(now)})
				}
				b++
				if _, err := store.Apply(ctx, obs, now); err != nil {
					t.Fatal(err)
				}
				mark, err := store.Seal(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				return mark
			}
			mark := applySeal()
			// A replica just started may take a moment to acknowledge (a loaded CI machine).
			for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
				err := store.Verify(ctx, mark, Offsets{"in": {0: 1}})
				if err == nil {
					break
				}
				if !errors.Is(err, ErrReplicasBehind) || time.Now().After(deadline) {
					t.Fatalf("before the reshard: %v", err)
				}
			}
			keys := store.cfg.Pending.shardKeys("rr")
			if len(keys) != 2 {
				t.Fatalf("want the marks' chain and one other, got %q", keys)
			}
			key := keys[1]
			if which == "the batch marks" {
				key = keys[0]
			}
			from := mc.index(key)
			if which != "the batch marks" && from == mc.index(keys[0]) {
				t.Fatalf("chains %q on one primary", keys)
			}
			mark = applySeal()
			mc.migrate(t, mc.primaries[0].Client.ClusterKeySlot(ctx, key).Val(), from)
			var errs []error
			for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
				err := store.Verify(ctx, mark, Offsets{"in": {0: 2}})
				if err == nil {
					break
				}
				errs = append(errs, err)
				if !errors.Is(err, ErrReplicasBehind) {
					t.Fatalf("Verify after the reshard: %v, want nil or ErrReplicasBehind (an unverified commit drops every pending batch)", err)
				}
				if time.Now().After(deadline) {
					t.Fatalf("Verify never passed in 20 s after the reshard: %d tries, the last %v", len(errs), errs[len(errs)-1])
				}
			}
		})
	}
}
