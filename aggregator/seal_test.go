package aggregator

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestSealAndVerifyDetectLostWrites(t *testing.T) {
	ctx := context.Background()
	seal := func(s *Redis) (int64, error) { return s.Seal(ctx, nil) }
	tests := []struct {
		name string
		// run seals and verifies as a consumer does, then loses writes by setting the mark back
		// to lostTo, and returns what the next check says.
		run  func(s *Redis) (lostTo int64, check func() error)
		want error
	}{
		// Lost, but nothing verified for a commit: consume again from the committed offsets.
		{"loss before any commit", func(s *Redis) (int64, func() error) {
			seal(s)
			seal(s)
			return 1, func() error { _, err := seal(s); return err }
		}, ErrWritesLost},
		// Verify finds the loss before the offsets of the lost batches are committed.
		{"loss found by verify", func(s *Redis) (int64, func() error) {
			m1, _ := seal(s)
			s.Verify(ctx, m1, nil)
			m2, _ := seal(s)
			return m1, func() error { return s.Verify(ctx, m2, nil) }
		}, ErrWritesLost},
		// The loss reaches a batch whose offsets may be committed: the state is lost.
		{"loss below a verified mark", func(s *Redis) (int64, func() error) {
			seal(s)
			m2, _ := seal(s)
			s.Verify(ctx, m2, nil)
			seal(s)
			return m2 - 1, func() error { _, err := seal(s); return err }
		}, ErrStateLost},
		// A Redis restarted empty (or from a snapshot older than this process) lost the mark.
		{"mark gone after a commit", func(s *Redis) (int64, func() error) {
			m1, _ := seal(s)
			s.Verify(ctx, m1, nil)
			return 0, func() error { return s.Verify(ctx, m1, nil) }
		}, ErrStateLost},
		// The next batch's apply finds the loss before its tallies can be published.
		{"loss found by the next apply", func(s *Redis) (int64, func() error) {
			m1, _ := seal(s)
			s.Verify(ctx, m1, nil)
			seal(s)
			return m1, func() error {
				got, err := s.Apply(ctx, []Observation{obs("x", Confirmed, 0, 0, 0)}, t0)
				if len(got.Keys) > 0 {
					t.Errorf("apply on lost writes returned tallies %+v", got.Tallies)
				}
				return err
			}
		}, ErrWritesLost},
		// A retried seal after a lost reply finds its own mark.
		{"retried seal", func(s *Redis) (int64, func() error) {
			seal(s)
			m2, _ := seal(s)
			s.sealSeq--
			return m2, func() error { _, err := seal(s); return err }
		}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			store, client := testStore(t, "seal", RedisConfig{Retention: time.Hour})
			lostTo, check := tc.run(store)
			if lostTo == 0 {
				client.Del(ctx, store.sealKey)
			} else {
				client.Set(ctx, store.sealKey, lostTo, 0)
			}
			if err := check(); !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Fatalf("check = %v, want %v", err, tc.want)
			}
			if tc.want == nil {
				return
			}
			// After the loss is reported, the batches consumed again are checked against a
			// mark that holds: no endless rewinds.
			m, err := seal(store)
			if err != nil {
				t.Fatalf("seal after the loss was reported: %v", err)
			}
			if err := store.Verify(ctx, m, nil); err != nil {
				t.Fatalf("verify after the loss was reported: %v", err)
			}
		})
	}
}

func TestCloseRemovesTheMark(t *testing.T) {
	ctx := context.Background()
	store, client := testStore(t, "sealclose", RedisConfig{Retention: time.Hour})
	store.Seal(ctx, nil)
	if n := client.Exists(ctx, store.sealKey).Val(); n != 1 {
		t.Fatalf("mark missing after seal")
	}
	if err := store.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if n := client.Exists(ctx, store.sealKey).Val(); n != 0 {
		t.Fatalf("mark left after close")
	}
}

func TestSeedVersionKeyExpiresWithTheAggregate(t *testing.T) {
	// A rebuild seeds every aggregate found on the snapshot topic; one that never sees another
	// event must still leave after the idle TTL, like every other key of an aggregate.
	ctx := context.Background()
	store, client := testStore(t, "seed", RedisConfig{Retention: time.Hour, IdleTTL: 10 * time.Hour})
	if err := store.SeedVersion(ctx, keyLive, 42); err != nil {
		t.Fatal(err)
	}
	st := store.keys(keyLive)[1]
	if ttl := client.PTTL(ctx, st).Val(); ttl <= 0 || ttl > 10*time.Hour {
		t.Fatalf("seeded state hash has TTL %v, want the idle TTL", ttl)
	}
	if v, _ := client.HGet(ctx, st, "v").Int64(); v != 42 {
		t.Fatalf("seeded version %d, want 42", v)
	}
}

func TestCheckEviction(t *testing.T) {
	ctx := context.Background()
	_, client := testStore(t, "evict", RedisConfig{Retention: time.Hour})
	old := client.ConfigGet(ctx, "maxmemory*").Val()
	t.Cleanup(func() {
		client.ConfigSet(ctx, "maxmemory", old["maxmemory"])
		client.ConfigSet(ctx, "maxmemory-policy", old["maxmemory-policy"])
	})
	for _, tc := range []struct {
		maxmemory, policy string
		evicting          bool
	}{
		{"0", "volatile-lru", false},  // no memory limit: nothing is ever evicted
		{"1gb", "noeviction", false},  // full means refused writes, not lost state
		{"1gb", "volatile-lru", true}, // would evict exactly the aggregates (they carry TTLs)
		{"1gb", "allkeys-lru", true},  // would evict anything, markers included
	} {
		client.ConfigSet(ctx, "maxmemory", tc.maxmemory)
		client.ConfigSet(ctx, "maxmemory-policy", tc.policy)
		told, err := CheckEviction(ctx, client)
		if !told || errors.Is(err, ErrEvicting) != tc.evicting {
			t.Errorf("maxmemory %s, %s: told %v, err %v; want evicting %v", tc.maxmemory, tc.policy, told, err, tc.evicting)
		}
	}
}

func TestCheckOffsetsFindsCommittedWorkLostAcrossProcesses(t *testing.T) {
	// Process a commits twice; Redis then comes back from a snapshot taken between the commits,
	// and a new process b (whose own marks prove nothing) takes over the partition.
	ctx := context.Background()
	a, client := testStore(t, "offsets", RedisConfig{Retention: time.Hour, Group: "g|1"})
	m1, _ := a.Seal(ctx, nil)
	if err := a.Verify(ctx, m1, Offsets{"in": {0: 10}}); err != nil {
		t.Fatal(err)
	}
	m2, _ := a.Seal(ctx, nil)
	if err := a.Verify(ctx, m2, Offsets{"in": {0: 20, 1: 7}}); err != nil {
		t.Fatal(err)
	}
	if err := a.CheckOffsets(ctx, Offsets{"in": {0: 20, 1: 7}}); err != nil {
		t.Fatalf("nothing lost: %v", err)
	}
	client.HSet(ctx, a.offsetsKey(), "in/0", 10) // the older snapshot
	b, err := NewRedis(client, a.cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		committed Offsets
		lost      bool
	}{
		{"committed past what redis holds", Offsets{"in": {0: 20}}, true},
		{"committed what redis holds", Offsets{"in": {0: 10, 1: 7}}, false},
		{"a zombie's rejected commit left redis ahead", Offsets{"in": {0: 5}}, false},
		{"a partition never recorded is recorded as it stands", Offsets{"in": {2: 99}}, false},
		{"and judged from then on", Offsets{"in": {2: 100}}, true},
		{"nothing committed (kafka-go FirstOffset)", Offsets{"in": {0: -2, 3: -2}}, false},
		{"recorded as nothing", Offsets{"in": {3: 1}}, true},
	} {
		if err := b.CheckOffsets(ctx, tc.committed); errors.Is(err, ErrStateLost) != tc.lost {
			t.Errorf("%s: %v, want lost %v", tc.name, err, tc.lost)
		}
	}
	// Another group's record is another hash: a different group is not judged by g|1's commits.
	other, _ := NewRedis(client, RedisConfig{Prefix: a.cfg.Prefix, Retention: time.Hour, Group: "g"})
	if err := other.CheckOffsets(ctx, Offsets{"in": {0: 20}}); err != nil {
		t.Fatalf("group g judged by g|1's record: %v", err)
	}
	// A Verify that finds the mark lost records nothing.
	client.Set(ctx, a.sealKey, m1, 0)
	if err := a.Verify(ctx, m2, Offsets{"in": {0: 30}}); err == nil {
		t.Fatal("verify on a lost mark succeeded")
	}
	if got := client.HGet(ctx, a.offsetsKey(), "in/0").Val(); got != "10" {
		t.Fatalf("a failed verify recorded offset %s", got)
	}
}
