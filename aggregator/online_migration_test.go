package aggregator

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/repeatrate/repeatrate/internal/testenv"
)

// TestOnlineMigrationMatchesModel: a namespace in layout 10 migrated to layout 11 (Migrate) while
// batches keep being applied by a store opened on layout 10 gives the model's tallies after every
// batch and the model's outcomes on every batch that was not applied again, ends with every
// aggregate in layout 11 (a valid packed store, no record hash) and the store following the
// namespace to layout 11, and a second Migrate finds nothing to do.
func TestOnlineMigrationMatchesModel(t *testing.T) {
	for _, tc := range []struct {
		name string
		mc   modelCase
		how  string // "between" batches, "beside" them (concurrently), or in "steps": an aggregate a batch
	}{
		{"days, between batches", modelCase{seed: 1, span: 10 * 24 * time.Hour, retention: 3 * 24 * time.Hour, events: 9000}, "between"},
		{"days, beside batches", modelCase{seed: 2, span: 10 * 24 * time.Hour, retention: 3 * 24 * time.Hour, events: 9000}, "beside"},
		{"days, an aggregate a batch", modelCase{seed: 3, span: 10 * 24 * time.Hour, retention: 3 * 24 * time.Hour, events: 9000}, "steps"},
		{"minutes, an aggregate a batch", modelCase{seed: 4, span: 3 * time.Hour, retention: 3 * 24 * time.Hour, events: 9000}, "steps"},
		{"a month, an aggregate a batch", modelCase{seed: 9, span: 9 * 24 * time.Hour, retention: 30 * 24 * time.Hour, events: 12000}, "steps"},
		{"leaps, an aggregate a batch", modelCase{seed: 6, span: 10 * 24 * time.Hour, retention: 3 * 24 * time.Hour, jumpEvery: 500, events: 9000}, "steps"},
		{"leaps, beside batches", modelCase{seed: 7, span: 10 * 24 * time.Hour, retention: 3 * 24 * time.Hour, jumpEvery: 500, events: 9000}, "beside"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			c := testenv.Redis(t)
			prefix := testenv.Name(t, "migrate")
			testenv.CleanPrefix(t, c, prefix)
			state, err := OpenStateIn(ctx, c, prefix, false, Layout10)
			if err != nil {
				t.Fatal(err)
			}
			store, err := NewRedis(c, RedisConfig{Prefix: state.Namespace, Retention: tc.mc.retention, Epoch: state.Epoch})
			if err != nil {
				t.Fatal(err)
			}
			r := rand.New(rand.NewPCG(tc.mc.seed, 11))
			stream := randomStreamOver(r, tc.mc.events, tc.mc.span, tc.mc.jumpEvery)
			model := NewModel(tc.mc.retention)
			var maxOcc int64
			var migrated MigrateProgress
			var migErr error
			var wg sync.WaitGroup
			start, third := len(stream)/3, 2*len(stream)/3
			again, both := 0, 0
			var fp *Fingerprinter
			var stepped []Key // aggregates converted one a batch
			for i := 0; i < len(stream); {
				if tc.how == "steps" && start < 0 && third >= 0 {
					for _, k := range model.Keys() {
						if n, _ := c.Exists(ctx, store.keys(k)[0]).Result(); n > 0 {
							if _, _, err := convertAggregate(ctx, c, fp, store.keys(k)); err != nil {
								t.Fatal(err)
							}
							stepped = append(stepped, k)
							break
						}
					}
				}
				if i >= start && start >= 0 {
					start = -1
					if tc.how == "steps" {
						if _, err := moveEpoch(ctx, c, state.Namespace, state.Epoch, Layout10To11); err != nil {
							t.Fatal(err)
						}
						if fp, err = OpenFingerprint(ctx, c, state.Namespace); err != nil {
							t.Fatal(err)
						}
					} else if tc.how == "beside" {
						wg.Add(1)
						go func() {
							defer wg.Done()
							migrated, migErr = Migrate(ctx, c, prefix, nil)
						}()
					} else {
						migrated, migErr = Migrate(ctx, c, prefix, nil)
					}
				}
				if i >= third && third >= 0 {
					third = -1
					wg.Wait() // the last third after the migration ended
					if tc.how == "steps" {
						migrated, migErr = Migrate(ctx, c, prefix, nil)
					}
					if migErr != nil {
						t.Fatal(migErr)
					}
					// An aggregate no batch touches again still expires whole.
					for _, k := range model.Keys() {
						keys := store.keys(k)
						if st, _ := c.PTTL(ctx, keys[1]).Result(); st > 0 {
							if e, _ := c.PTTL(ctx, keys[2]).Result(); e <= 0 {
								t.Fatalf("%s: its state expires in %v, its packed store in %v", k, st, e)
							}
						}
					}
				}
				batch := stream[i:min(i+1+r.IntN(300), len(stream))]
				i += len(batch)
				for _, o := range batch {
					maxOcc = max(maxOcc, o.Occurred)
				}
				at := time.UnixMicro(maxOcc + int64(r.IntN(120))*1e6)
				got, err := store.Apply(ctx, batch, at)
				retried := false
				for try := 0; err != nil && strings.Contains(err.Error(), "apply the batch again") && try < 5; try++ {
					retried = true
					got, err = store.Apply(ctx, batch, at)
				}
				if err != nil {
					t.Fatal(err)
				}
				if retried {
					again++
				}
				if store.mode.Load().both {
					both++
				}
				want, _ := model.Apply(ctx, batch, at)
				for j := range batch {
					if !retried && got.Outcomes[j] != want.Outcomes[j] {
						t.Fatalf("event %d (%+v): redis %v, model %v", i-len(batch)+j, batch[j], got.Outcomes[j], want.Outcomes[j])
					}
				}
				for _, k := range want.Keys {
					if got.Tallies[k] != want.Tallies[k] {
						t.Fatalf("after event %d, %s:\nredis %+v\nmodel %+v", i, k, got.Tallies[k], want.Tallies[k])
					}
				}
			}
			t.Logf("migration %+v; batches applied again: %d, in both layouts: %d; converted one a batch: %d", migrated, again, both, len(stepped))
			if tc.how == "steps" && (both == 0 || len(stepped) < 3) {
				t.Fatalf("%d batches in both layouts, %d aggregates converted between them: the steps test nothing", both, len(stepped))
			}
			if migrated.Converted+len(stepped) == 0 {
				t.Fatalf("the migration converted nothing (%+v): it tests nothing", migrated)
			}
			if m := store.mode.Load(); m.fp == nil || m.both || !strings.HasSuffix(m.epoch, "/layout11") {
				t.Fatalf("the store did not follow the namespace to layout 11: epoch %q, fingerprints %v, both %v", m.epoch, m.fp != nil, m.both)
			}
			if epoch, _ := c.Get(ctx, EpochKey(state.Namespace)).Result(); epoch != strings.TrimSuffix(state.Epoch, "/layout10")+"/layout11" {
				t.Fatalf("epoch %q after the migration of %q", epoch, state.Epoch)
			}
			for _, later := range []time.Duration{0, 90 * time.Minute, 50 * time.Hour} {
				at := time.UnixMicro(maxOcc).Add(later)
				for _, k := range model.Keys() {
					got, err := store.Tally(ctx, k, at)
					if err != nil {
						t.Fatal(err)
					}
					if want := model.Tally(k, at); got != want {
						t.Fatalf("%s, read %v after the newest event: redis %+v, model %+v", k, later, got, want)
					}
				}
			}
			for _, k := range model.Keys() {
				keys := store.keys(k)
				if n, _ := c.Exists(ctx, keys[0]).Result(); n != 0 {
					t.Errorf("%s keeps a record hash of layout 10 after the migration", k)
				}
				if head, _ := c.HGet(ctx, keys[1], "H").Result(); head != "" && head[0] != 11 {
					t.Errorf("%s has a head of layout %d after the migration", k, head[0])
				}
				fingerprintedRecords(t, c, store, k)
			}
			second, err := Migrate(ctx, c, prefix, nil)
			if err != nil || second.Converted != 0 {
				t.Fatalf("a second migration: %+v, %v", second, err)
			}
		})
	}
}

// TestConvertRefusesWhatLayout10CouldNotHaveWritten: an aggregate whose state no write of layout 10
// makes is refused, with nothing written, and one written since its fields were read is converted
// with them.
func TestConvertRefusesWhatLayout10CouldNotHaveWritten(t *testing.T) {
	ctx := context.Background()
	store, c := testStore(t, "convert", RedisConfig{Retention: 3 * 24 * time.Hour})
	fp := testFingerprinter(t)
	batch := randomStreamOver(rand.New(rand.NewPCG(3, 3)), 400, 48*time.Hour, 0)
	if _, err := store.Apply(ctx, batch, time.UnixMicro(batch[len(batch)-1].Occurred)); err != nil {
		t.Fatal(err)
	}
	k := batch[0].Key
	keys := store.keys(k)
	dump := func() string {
		var b strings.Builder
		for _, key := range keys {
			// Contents, not DUMP: a hash table's order moves with its incremental rehashing.
			h, _ := c.HGetAll(ctx, key).Result()
			z, _ := c.ZRangeWithScores(ctx, key, 0, -1).Result()
			fmt.Fprintf(&b, "%s=%v %v;", key, h, z)
		}
		return b.String()
	}
	for _, tc := range []struct {
		name, key, field, value string
	}{
		{"a record of no class", keys[0], "003abc", "X1,2"},
		{"an hour of another size", keys[1], "h400000", "\x01abc"},
		{"an hour of no counts", keys[1], "h400001", "\x01" + strings.Repeat("\x00", 25)},
		{"an index group cut short", keys[1], "i5", "\x00\x01"},
		{"a group naming a chunk it has not", keys[1], "i6", "\x00\x01\x00\x00\x00\x00" + strings.Repeat("\x00", 10)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := c.HSet(ctx, tc.key, tc.field, tc.value).Err(); err != nil {
				t.Fatal(err)
			}
			defer c.HDel(ctx, tc.key, tc.field)
			before := dump()
			_, _, err := convertAggregate(ctx, c, fp, keys)
			if err == nil {
				t.Fatal("converted")
			}
			if after := dump(); after != before {
				t.Fatalf("a refused conversion wrote: %v", err)
			}
		})
	}
	n, done, err := convertAggregate(ctx, c, fp, keys)
	if err != nil || !done || n == 0 {
		t.Fatalf("convert: %d records, %v, %v", n, done, err)
	}
	if _, done, err := convertAggregate(ctx, c, fp, keys); err != nil || done {
		t.Fatalf("converted twice: %v, %v", done, err)
	}
	if _, done, err := convertAggregate(ctx, c, fp, []string{"nothing:o", "nothing:s", "nothing:e", "nothing:z"}); err != nil || done {
		t.Fatalf("converted an absent aggregate: %v, %v", done, err)
	}
}
