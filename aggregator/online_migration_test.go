package aggregator

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/repeatrate/repeatrate/internal/testenv"
)

// TestOnlineMigrationMatchesModel: a namespace in layout 10 migrated to layout 11 (Migrate) while
// batches keep being applied by a store opened on layout 10 gives the model's tallies after every
// batch and the model's outcomes on every batch that was not applied again, ends with every
// aggregate in layout 11 (a valid packed store, no record hash) and the store following the
// namespace to layout 11, collects every record once the history has expired, and a second Migrate
// finds nothing to do.
func TestOnlineMigrationMatchesModel(t *testing.T) {
	for _, tc := range []struct {
		name string
		mc   modelCase
		how  string // "between" batches, "beside" them (concurrently), in "steps" (an aggregate a batch), or "interrupted" (see below)
	}{
		{"days, between batches", modelCase{seed: 1, span: 10 * 24 * time.Hour, retention: 3 * 24 * time.Hour, events: 9000}, "between"},
		{"days, beside batches", modelCase{seed: 2, span: 10 * 24 * time.Hour, retention: 3 * 24 * time.Hour, events: 9000}, "beside"},
		{"days, an aggregate a batch", modelCase{seed: 3, span: 10 * 24 * time.Hour, retention: 3 * 24 * time.Hour, events: 9000}, "steps"},
		{"minutes, an aggregate a batch", modelCase{seed: 4, span: 3 * time.Hour, retention: 3 * 24 * time.Hour, events: 9000}, "steps"},
		{"a month, an aggregate a batch", modelCase{seed: 9, span: 9 * 24 * time.Hour, retention: 30 * 24 * time.Hour, events: 12000}, "steps"},
		{"leaps, an aggregate a batch", modelCase{seed: 6, span: 10 * 24 * time.Hour, retention: 3 * 24 * time.Hour, jumpEvery: 500, events: 9000}, "steps"},
		{"days, interrupted between batches", modelCase{seed: 5, span: 10 * 24 * time.Hour, retention: 3 * 24 * time.Hour, events: 9000}, "interrupted"},
		{"a month, interrupted between batches", modelCase{seed: 10, span: 9 * 24 * time.Hour, retention: 30 * 24 * time.Hour, events: 12000}, "interrupted"},
		{"leaps, beside batches", modelCase{seed: 7, span: 10 * 24 * time.Hour, retention: 3 * 24 * time.Hour, jumpEvery: 500, events: 9000}, "beside"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			// Odd seeds compute calls in the processor (redis.compute_calls, on by default): in
			// layout 10 before, and in layout 11 after the marker flips.
			c, prefix, state, store := layout10Namespace(t, "migrate", RedisConfig{Retention: tc.mc.retention, ComputeCalls: tc.mc.seed%2 == 1})
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
			var stepped []Key // aggregates converted a step a batch
			var convs []*conversion
			steps := 0
			// "interrupted": a migration stopped at a moment that moves on with every batch (its
			// deadline doubles from 100 µs), run again until one finishes.
			budget, interrupts, finished, convertedBefore := 100*time.Microsecond, 0, false, 0
			for i := 0; i < len(stream); {
				if tc.how == "interrupted" && start < 0 && third >= 0 && !finished {
					mctx, cancel := context.WithTimeout(ctx, budget)
					migrated, migErr = Migrate(mctx, c, prefix, nil)
					cancel()
					convertedBefore += migrated.Converted
					if finished = migErr == nil; !finished {
						interrupts++
						budget *= 2
					}
				}
				if tc.how == "steps" && start < 0 && third >= 0 {
					// Every aggregate's conversion at once, one call of each between batches, of 20
					// records a copy: batches meet aggregates before, during and after conversion.
					if convs == nil {
						for _, k := range model.Keys() {
							if n, _ := c.Exists(ctx, store.keys(k)[0]).Result(); n > 0 {
								convs = append(convs, &conversion{c: c, fp: fp, keys: store.keys(k), chunk: 20})
							}
						}
					}
					for _, conv := range convs {
						if conv.done {
							continue
						}
						if err := conv.step(ctx); err != nil {
							t.Fatal(err)
						}
						steps++
						if conv.done {
							stepped = append(stepped, Key{})
						}
					}
				}
				if i >= start && start >= 0 {
					start = -1
					if tc.how == "steps" {
						if _, err := moveEpoch(ctx, c, state.Namespace, state.Epoch, Layout10To11); err != nil {
							t.Fatal(err)
						}
						var err error
						if fp, err = OpenFingerprint(ctx, c, state.Namespace); err != nil {
							t.Fatal(err)
						}
					} else if tc.how == "beside" {
						wg.Add(1)
						go func() {
							defer wg.Done()
							migrated, migErr = Migrate(ctx, c, prefix, nil)
						}()
					} else if tc.how == "between" {
						migrated, migErr = Migrate(ctx, c, prefix, nil)
					}
				}
				if i >= third && third >= 0 {
					third = -1
					wg.Wait() // the last third after the migration ended
					if tc.how == "steps" || tc.how == "interrupted" && !finished {
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
			stored, refused := store.ComputedCalls()
			t.Logf("migration %+v; batches applied again: %d, in both layouts: %d; converted a step a batch: %d in %d steps; calls computed %d, refused %d",
				migrated, again, both, len(stepped), steps, stored, refused)
			if tc.how == "interrupted" {
				t.Logf("interrupted %d times, then finished: %v", interrupts, finished)
				if interrupts < 3 {
					t.Fatalf("interrupted %d times: the test interrupts nothing", interrupts)
				}
			}
			if tc.how == "steps" && (both == 0 || len(stepped) == 0 || steps < 10) {
				t.Fatalf("%d batches in both layouts, %d aggregates converted in %d steps between them: the steps test nothing", both, len(stepped), steps)
			}
			if migrated.Converted+len(stepped)+convertedBefore == 0 {
				t.Fatalf("the migration converted nothing (%+v): it tests nothing", migrated)
			}
			if m := store.mode.Load(); m.fp == nil || m.both || !strings.HasSuffix(m.epoch, "/layout11") {
				t.Fatalf("the store did not follow the namespace to layout 11: epoch %q, fingerprints %v, both %v", m.epoch, m.fp != nil, m.both)
			}
			if epoch, _ := c.Get(ctx, EpochKey(state.Namespace)).Result(); epoch != strings.TrimSuffix(state.Epoch, "/layout10")+"/layout11" {
				t.Fatalf("epoch %q after the migration of %q", epoch, state.Epoch)
			}
			readsMatchModel(t, store, model, maxOcc)
			for _, k := range model.Keys() {
				keys := store.keys(k)
				if n, _ := c.Exists(ctx, keys[0]).Result(); n != 0 {
					t.Errorf("%s keeps a record hash of layout 10 after the migration", k)
				}
				if head, _ := c.HGet(ctx, keys[1], "H").Result(); head != "" && head[0] != 11 {
					t.Errorf("%s has a head of layout %d after the migration", k, head[0])
				}
				fingerprintedRecords(t, c, store, k)
				stateFieldsOfLayout11(t, c, keys[1])
			}
			// Every record converted, copied or mirrored is listed where garbage collection finds
			// it: once the whole history expires, the packed stores hold only what came since.
			later := maxOcc + int64(2*tc.mc.retention/time.Microsecond) + int64(time.Hour/time.Microsecond)
			for _, k := range model.Keys() {
				collectAll(t, store, c, model, k, later)
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
	// Each case is refused at the call that reads what it breaks, and that call writes nothing; the
	// calls before it (begin, copies) are steps of a conversion that the next one resumes.
	for _, tc := range []struct {
		name, key, field, value string
	}{
		{"a record of no class", keys[0], "003abc", "X1,2"},
		{"an hour of another size", keys[1], "h400000", "\x01abc"},
		{"an hour of no counts", keys[1], "h400001", "\x01" + strings.Repeat("\x00", 25)},
		{"an hour whose bounds cross", keys[1], "h400002", "\x01\x01" + strings.Repeat("\x00", 14) + "\x09\x00\x00\x00\x00\x01\x00\x00\x00\x00"},
		{"an index group beside layout 10's cut short", keys[1], "j5", "\x00\x01"},
		{"a packed store's shape that is none", keys[1], "M", "1,2"},
		{"a field layout 10 does not write", keys[1], "d400", "\x03\x07" + strings.Repeat("\x00", 10)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old, had := c.HGet(ctx, tc.key, tc.field).Result()
			if err := c.HSet(ctx, tc.key, tc.field, tc.value).Err(); err != nil {
				t.Fatal(err)
			}
			defer func() {
				if had == nil {
					c.HSet(ctx, tc.key, tc.field, old)
				} else {
					c.HDel(ctx, tc.key, tc.field)
				}
			}()
			a := &conversion{c: c, fp: fp, keys: keys, chunk: 1000}
			var before string
			var err error
			for !a.done && err == nil {
				before = dump()
				err = a.step(ctx)
			}
			if err == nil {
				t.Fatal("converted")
			}
			if after := dump(); after != before {
				t.Fatalf("a refused step wrote: %v", err)
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

// TestMigrationsRacingAndWithoutASecretAgree: two migrations of one namespace at once both succeed
// and leave it in layout 11, and a namespace made before fingerprint secrets existed (none) is
// given one before its marker moves, so that a processor following the marker can fingerprint.
func TestMigrationsRacingAndWithoutASecretAgree(t *testing.T) {
	ctx := context.Background()
	c, prefix, state, store := layout10Namespace(t, "migrace", RedisConfig{Retention: 3 * 24 * time.Hour})
	batch := randomStreamOver(rand.New(rand.NewPCG(5, 5)), 3000, 48*time.Hour, 0)
	at := time.UnixMicro(batch[len(batch)-1].Occurred)
	if _, err := store.Apply(ctx, batch, at); err != nil {
		t.Fatal(err)
	}
	again, err := store.Apply(ctx, batch, at) // what a redelivery finds in layout 10
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Del(ctx, FingerprintKey(state.Namespace)).Err(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var res [2]MigrateProgress
	var errs [2]error
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i], errs[i] = Migrate(ctx, c, prefix, nil)
		}()
	}
	wg.Wait()
	for i := range 2 {
		if errs[i] != nil || !strings.HasSuffix(res[i].Epoch, "/layout11") {
			t.Fatalf("migration %d of 2: %+v, %v", i, res[i], errs[i])
		}
	}
	if res[0].Converted+res[1].Converted == 0 {
		t.Fatal("neither migration converted anything")
	}
	if _, err := store.Apply(ctx, batch, at); err != nil && !strings.Contains(err.Error(), "apply the batch again") {
		t.Fatal(err)
	}
	got, err := store.Apply(ctx, batch, at)
	if err != nil {
		t.Fatalf("a store following the migration: %v", err)
	}
	for i, o := range got.Outcomes {
		if o != again.Outcomes[i] {
			t.Fatalf("event %d redelivered after the migration: %v, before it %v", i, o, again.Outcomes[i])
		}
	}
	for k, want := range again.Tallies {
		if got.Tallies[k] != want {
			t.Fatalf("%s after the migration: %+v, before it %+v", k, got.Tallies[k], want)
		}
	}
}

// TestConversionFinishesOnlyWithEveryRecordCopied: a record that reached layout 10's record hash
// without being copied (as no batch of this build writes it: those of an aggregate being converted
// mirror their writes) holds the conversion's finish back until it is copied too, and is found
// after the conversion.
func TestConversionFinishesOnlyWithEveryRecordCopied(t *testing.T) {
	ctx := context.Background()
	store, c := testStore(t, "convert-short", RedisConfig{Retention: 3 * 24 * time.Hour})
	fp := testFingerprinter(t)
	batch := randomStreamOver(rand.New(rand.NewPCG(8, 8)), 300, 24*time.Hour, 0)
	at := time.UnixMicro(batch[len(batch)-1].Occurred)
	if _, err := store.Apply(ctx, batch, at); err != nil {
		t.Fatal(err)
	}
	k := batch[0].Key
	keys := store.keys(k)
	a := copyEveryRecord(t, ctx, c, fp, keys)
	late := Observation{Key: k, OpportunityID: "late-record", Class: Confirmed, Occurred: batch[0].Occurred, Assessed: batch[0].Occurred}
	fields, err := recordFields([]Observation{late})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.HSet(ctx, keys[0], fields[0], encodeRecords([]Observation{late})[0]).Err(); err != nil {
		t.Fatal(err)
	}
	for !a.done {
		if err := a.step(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if a.copies != 1 || !a.converted {
		t.Fatalf("copied the record hash %d more times, converted %v: want one more copy", a.copies, a.converted)
	}
	if _, ok := fingerprintedRecords(t, c, store, k)[string(fp.Append(nil, late.OpportunityID))]; !ok {
		t.Fatal("the record written past the copy is not in the packed store")
	}
}

// stateFieldsOfLayout11 fails unless state hash key holds only fields layout 11 writes: the head,
// the version, the hash-table field, minutes, days, and index groups with their closed chunks (none
// past the count the group's header gives), every chunk at most CHUNKBYTES (480) bytes.
func stateFieldsOfLayout11(t *testing.T, c *redis.Client, key string) {
	t.Helper()
	fields, err := c.HGetAll(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	closed := map[string]int{}
	for f, v := range fields {
		switch {
		case f == "H" || f == "v" || f == "enc":
		case regexp.MustCompile(`^[md]-?\d+$`).MatchString(f):
		case regexp.MustCompile(`^i-?\d+$`).MatchString(f):
			if len(v) < 16 || v[0] != 0 || len(v)-16 > 480 {
				t.Fatalf("%s: index group %s of %d bytes", key, f, len(v))
			}
			closed[f] = int(binary.LittleEndian.Uint32([]byte(v[1:5])))
		case regexp.MustCompile(`^i-?\d+\.\d+$`).MatchString(f):
			if len(v) > 480 {
				t.Fatalf("%s: index chunk %s of %d bytes", key, f, len(v))
			}
		default:
			t.Fatalf("%s holds field %q, which layout 11 does not write", key, f)
		}
	}
	for f := range fields {
		if g, k, ok := strings.Cut(f, "."); ok && strings.HasPrefix(f, "i") {
			if n, _ := strconv.Atoi(k); n > closed[g] {
				t.Fatalf("%s: chunk %s past the %d its group's header counts", key, f, closed[g])
			}
		}
	}
}

// TestConversionKeepsItsPackedStoreWithItsRecords: a batch on an aggregate being converted keeps
// the packed store alive as long as the record hash even when it writes no record (duplicates),
// and a packed store lost anyway is copied again, not finished empty: every record is found after
// the conversion.
func TestConversionKeepsItsPackedStoreWithItsRecords(t *testing.T) {
	ctx := context.Background()
	c, _, state, store := layout10Namespace(t, "convert-ttl", RedisConfig{Retention: 3 * 24 * time.Hour, IdleTTL: 10 * time.Minute})
	batch := randomStreamOver(rand.New(rand.NewPCG(12, 12)), 300, 24*time.Hour, 0)
	at := time.UnixMicro(batch[len(batch)-1].Occurred)
	apply := func() Applied {
		t.Helper()
		got, err := store.Apply(ctx, batch, at)
		if err != nil && strings.Contains(err.Error(), "apply the batch again") {
			got, err = store.Apply(ctx, batch, at)
		}
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	apply()
	again := apply() // what a redelivery finds
	if _, err := moveEpoch(ctx, c, state.Namespace, state.Epoch, Layout10To11); err != nil {
		t.Fatal(err)
	}
	fp, err := OpenFingerprint(ctx, c, state.Namespace)
	if err != nil {
		t.Fatal(err)
	}
	k := batch[0].Key
	keys := store.keys(k)
	a := copyEveryRecord(t, ctx, c, fp, keys)
	// As if the aggregate had aged: a redelivery (it writes no record) refreshes every key.
	for _, key := range keys[:3] {
		c.PExpire(ctx, key, 2*time.Second)
	}
	apply()
	for _, key := range keys[:3] {
		if ttl := c.PTTL(ctx, key).Val(); ttl < time.Minute {
			t.Fatalf("%s expires in %v after a batch that wrote no record, want the idle TTL", key, ttl)
		}
	}
	// Lost anyway: the conversion copies again.
	c.Del(ctx, keys[2])
	apply()
	for !a.done {
		if err := a.step(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if !a.converted || a.copies != 1 {
		t.Fatalf("converted %v after %d more copies, want one more", a.converted, a.copies)
	}
	got := apply()
	for i := range batch {
		if got.Outcomes[i] != again.Outcomes[i] {
			t.Fatalf("event %d redelivered after the conversion: %v, before it %v", i, got.Outcomes[i], again.Outcomes[i])
		}
	}
	if got.Tallies[k] != again.Tallies[k] {
		t.Fatalf("%s after the conversion: %+v, before %+v", k, got.Tallies[k], again.Tallies[k])
	}
}

// TestMigrateRefusesANamespaceThatLostItsSecret: once aggregates may be keyed by the fingerprint
// secret (the marker moved), a namespace without it has lost its state: Migrate says so and makes
// no new secret, whose fingerprints would find none of the records and count them again.
func TestMigrateRefusesANamespaceThatLostItsSecret(t *testing.T) {
	ctx := context.Background()
	c, prefix, state, store := layout10Namespace(t, "migrate-secret", RedisConfig{Retention: 3 * 24 * time.Hour})
	batch := randomStreamOver(rand.New(rand.NewPCG(13, 13)), 200, 24*time.Hour, 0)
	if _, err := store.Apply(ctx, batch, time.UnixMicro(batch[len(batch)-1].Occurred)); err != nil {
		t.Fatal(err)
	}
	for _, stop := range []Layout{Layout10To11, Layout11} {
		if _, err := Migrate(ctx, c, prefix, nil); err != nil {
			t.Fatal(err)
		}
		epoch := c.Get(ctx, EpochKey(state.Namespace)).Val()
		if stop == Layout10To11 {
			base := strings.TrimSuffix(epoch, Layout11.suffix())
			c.Set(ctx, EpochKey(state.Namespace), base+Layout10To11.suffix(), 0)
		}
		c.Del(ctx, FingerprintKey(state.Namespace))
		if _, err := Migrate(ctx, c, prefix, nil); !errors.Is(err, ErrStateLost) {
			t.Fatalf("migrating again at layout %d without the secret: %v, want ErrStateLost", int(stop), err)
		}
		if n := c.Exists(ctx, FingerprintKey(state.Namespace)).Val(); n != 0 {
			t.Fatal("the migration made a new secret")
		}
		c.Set(ctx, FingerprintKey(state.Namespace), strings.Repeat("k", fingerprintSecretBytes), 0)
	}
}

// layout10Namespace makes a namespace in layout 10 on the test Redis and a store opened on it with
// cfg (its prefix and epoch set), as a processor of the installation to migrate would have.
func layout10Namespace(t *testing.T, what string, cfg RedisConfig) (*redis.Client, string, State, *Redis) {
	t.Helper()
	c := testenv.Redis(t)
	prefix := testenv.Name(t, what)
	testenv.CleanPrefix(t, c, prefix)
	state, err := OpenStateIn(context.Background(), c, prefix, false, Layout10)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Prefix, cfg.Epoch = state.Namespace, state.Epoch
	store, err := NewRedis(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c, prefix, state, store
}

// TestMigrateChangesNothingWhereItCannotRun: where a migration could not finish (a Redis user
// without SCAN, the embedded Redis of `repeatrate dev` without the scripts' struct library) or
// finds no state (a wrong prefix), Migrate says so and leaves every key as it was: no marker moved,
// no secret made.
func TestMigrateChangesNothingWhereItCannotRun(t *testing.T) {
	ctx := context.Background()
	fill := func(t *testing.T, c *redis.Client, prefix string) State {
		t.Helper()
		state, err := OpenStateIn(ctx, c, prefix, false, Layout10)
		if err != nil {
			t.Fatal(err)
		}
		store, err := NewRedis(c, RedisConfig{Prefix: prefix, Retention: 24 * time.Hour, Epoch: state.Epoch})
		if err != nil {
			t.Fatal(err)
		}
		batch := randomStreamOver(rand.New(rand.NewPCG(14, 14)), 100, time.Hour, 0)
		if _, err := store.Apply(ctx, batch, time.UnixMicro(batch[len(batch)-1].Occurred)); err != nil {
			t.Fatal(err)
		}
		return state
	}
	keysOf := func(c *redis.Client, prefix string) string {
		keys, _ := c.Keys(ctx, prefix+"*").Result()
		var b strings.Builder
		for _, k := range keys {
			v, _ := c.Dump(ctx, k).Result()
			fmt.Fprintf(&b, "%s=%d;", k, len(v))
		}
		return b.String()
	}
	t.Run("a user without SCAN", func(t *testing.T) {
		admin := testenv.Redis(t)
		prefix := testenv.Name(t, "noscan")
		testenv.CleanPrefix(t, admin, prefix)
		state := fill(t, admin, prefix)
		user := testenv.Name(t, "user")
		if err := admin.Do(ctx, "ACL", "SETUSER", user, "on", ">migrate-check-password", "~"+prefix+":*",
			"+@all", "-scan").Err(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { admin.Do(ctx, "ACL", "DELUSER", user) })
		c := redis.NewClient(&redis.Options{Addr: admin.Options().Addr, Username: user, Password: "migrate-check-password"})
		defer c.Close()
		before := keysOf(admin, prefix)
		if _, err := Migrate(ctx, c, prefix, nil); err == nil || !strings.Contains(err.Error(), "cannot run a migration") {
			t.Fatalf("migrating as a user without SCAN: %v", err)
		}
		if after := keysOf(admin, prefix); after != before || admin.Get(ctx, EpochKey(prefix)).Val() != state.Epoch {
			t.Fatalf("a migration that could not run changed keys:\n%s\n%s", before, after)
		}
	})
	t.Run("the embedded Redis", func(t *testing.T) {
		c := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
		defer c.Close()
		state := fill(t, c, "dev")
		before := keysOf(c, "dev")
		if _, err := Migrate(ctx, c, "dev", nil); err == nil || !strings.Contains(err.Error(), "cannot run a migration") {
			t.Fatalf("migrating the embedded Redis: %v", err)
		}
		if after := keysOf(c, "dev"); after != before || c.Get(ctx, EpochKey("dev")).Val() != state.Epoch {
			t.Fatalf("a migration that could not run changed keys:\n%s\n%s", before, after)
		}
	})
	t.Run("a prefix without state", func(t *testing.T) {
		c := testenv.Redis(t)
		prefix := testenv.Name(t, "nostate")
		testenv.CleanPrefix(t, c, prefix)
		if _, err := Migrate(ctx, c, prefix, nil); err == nil || !strings.Contains(err.Error(), "no state under key prefix") {
			t.Fatalf("migrating a prefix without state: %v", err)
		}
		if keys := keysOf(c, prefix); keys != "" {
			t.Fatalf("a migration of nothing made keys: %s", keys)
		}
		if _, err := Migrate(ctx, c, "a{b}", nil); err == nil {
			t.Fatal("a prefix with braces was taken")
		}
	})
}

// copyEveryRecord begins the conversion of the aggregate of keys and copies every record it holds
// into its packed store, stopping before the finish.
func copyEveryRecord(t *testing.T, ctx context.Context, c redis.UniversalClient, fp *Fingerprinter, keys []string) *conversion {
	t.Helper()
	a := &conversion{c: c, fp: fp, keys: keys, chunk: 1000}
	for !a.scanned {
		if err := a.step(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return a
}
