package cluster

import (
	"context"
	"net"
	"testing"

	"github.com/redis/go-redis/v9"
)

// slotMove moves the slot of one key from its primary to another by hand, step by step, as
// `redis-cli --cluster reshard` does: the target importing, the source migrating, keys migrated,
// then the slot assigned. Whatever the test does, the slot ends stable on one node.
type slotMove struct {
	t         *testing.T
	slot      int64
	from, to  node
	primaries []node
	src       *redis.Client
	migrated  bool
}

// startSlotMove opens the move of key's slot from its primary to another primary.
func startSlotMove(t *testing.T, c *redis.ClusterClient, key string) *slotMove {
	t.Helper()
	ctx := context.Background()
	slot, err := c.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	src, err := c.MasterForKey(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := clusterNodes(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	m := &slotMove{t: t, slot: slot, src: src}
	for _, n := range nodes {
		if !n.primary {
			continue
		}
		m.primaries = append(m.primaries, n)
		if n.addr == src.Options().Addr {
			m.from = n
		} else if m.to.id == "" {
			m.to = n
		}
	}
	if m.from.id == "" || m.to.id == "" {
		t.Fatalf("no source and target among %+v", nodes)
	}
	t.Cleanup(func() {
		owner := m.from
		if m.migrated {
			owner = m.to
		}
		for _, n := range m.primaries {
			m.setSlot(n, "NODE", owner.id)
		}
	})
	if err := m.setSlot(m.to, "IMPORTING", m.from.id); err != nil {
		t.Fatal(err)
	}
	if err := m.setSlot(m.from, "MIGRATING", m.to.id); err != nil {
		t.Fatal(err)
	}
	return m
}

func (m *slotMove) setSlot(n node, args ...any) error {
	nc := redis.NewClient(&redis.Options{Addr: n.addr})
	defer nc.Close()
	return nc.Do(context.Background(), append([]any{"CLUSTER", "SETSLOT", m.slot}, args...)...).Err()
}

// migrate moves keys of the slot to the target.
func (m *slotMove) migrate(keys ...string) {
	m.t.Helper()
	host, port, _ := net.SplitHostPort(m.to.addr)
	args := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
	for _, k := range keys {
		args = append(args, k)
	}
	if err := m.src.Do(context.Background(), args...).Err(); err != nil {
		m.t.Fatalf("migrate %q: %v", keys, err)
	}
	m.migrated = true
}

// finish migrates what the source still holds of the slot and assigns the slot to the target on
// every primary.
func (m *slotMove) finish() {
	m.t.Helper()
	for {
		keys, err := m.src.ClusterGetKeysInSlot(context.Background(), int(m.slot), 1000).Result()
		if err != nil {
			m.t.Fatal(err)
		}
		if len(keys) == 0 {
			break
		}
		m.migrate(keys...)
	}
	for _, n := range m.primaries {
		if err := m.setSlot(n, "NODE", m.to.id); err != nil {
			m.t.Fatal(err)
		}
	}
}
