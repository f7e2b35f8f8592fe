package aggregator

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/repeatrate/repeatrate/internal/testenv"
)

// TestReadAheadStoresWhatTheScriptStores applies computedStream's batches through apply.lua alone
// and through the computed path with each batch announced (Upcoming) one or two batches before its
// turn and applied at the time its first chunk was read ahead at, as the processor does: every
// reply is the model's and every key the same byte for byte after every batch, on Redis and on the
// embedded server. Most batches must be applied with what was read ahead of them, and no call
// refused: nothing but this store writes.
func TestReadAheadStoresWhatTheScriptStores(t *testing.T) {
	inBothLayouts(t, func(t *testing.T, fp *Fingerprinter) {
		const retention = 3 * 24 * time.Hour
		x := newComputedSidesIn(t, "readahead", retention, 0, fp)
		r := rand.New(rand.NewPCG(7, 13))
		batches := computedStream(r, 40, 160, 160, retention)
		clocks := make([]time.Time, len(batches))
		clock := t0
		for i, b := range batches {
			var top int64
			for _, o := range b {
				top = max(top, o.Occurred)
			}
			if at := time.UnixMicro(top + int64(r.IntN(30))*1e6); at.After(clock) {
				clock = at
			}
			clocks[i] = clock
		}
		for side := 1; side < len(x.stores); side++ {
			s := x.stores[side]
			enc := make([]*Encoded, len(batches))
			announce := func(i int) {
				if i < len(batches) && enc[i] == nil {
					enc[i] = s.Encode(batches[i])
					s.Upcoming(enc[i], func() time.Time { return clocks[i] })
				}
			}
			next := 0
			x.rigs[side].applyObs = func(ctx context.Context, obs []Observation, at time.Time) (Applied, error) {
				i := next
				next++
				if &obs[0] != &batches[i][0] || !at.Equal(clocks[i]) {
					t.Fatalf("batch %d is not the one announced", i)
				}
				// One or two batches ahead, as the processor decodes up to four ahead.
				announce(i)
				announce(i + 1)
				if i%3 == 0 {
					announce(i + 2)
				}
				if got, ok := s.ReadAt(enc[i]); ok && !got.Equal(at) {
					t.Fatalf("batch %d was read ahead at %v, not at %v, its clock", i, got, at)
				}
				return s.ApplyEncoded(ctx, enc[i], at)
			}
		}
		for i, b := range batches {
			x.apply(fmt.Sprint("batch ", i), b, clocks[i])
		}
		for i, s := range x.stores[1:] {
			used, unused := s.ReadsAhead()
			made := used + unused
			stored, refused := s.ComputedCalls()
			t.Logf("%s: %d batches read ahead, %d applied with it; %d calls computed, %d refused", x.names[i+1], made, used, stored, refused)
			if used < int64(len(batches))/3 || used > made {
				t.Errorf("%s: %d of %d batches were applied with what was read ahead (%d read ahead)", x.names[i+1], used, len(batches), made)
			}
			if refused != 0 {
				t.Errorf("%s: the store refused %d calls no other writer touched", x.names[i+1], refused)
			}
		}
	})
}

// readAheadRig is a computing store in chunks of 2 calls over 8 aggregates, beside the model: a
// batch of one new opportunity an aggregate is applied after a batch that created them, with the
// batch after it announced, so that its first chunk is read ahead while its last is stored.
type readAheadRig struct {
	t     *testing.T
	s     *Redis
	other *Redis // another writer on the same namespace, apply.lua alone
	m     *Model
	keys  []Key
	n     int
}

func newReadAheadRig(t *testing.T, fp *Fingerprinter) *readAheadRig {
	c := testenv.Redis(t)
	prefix := testenv.Name(t, "readahead")
	testenv.CleanPrefix(t, c, prefix)
	open := func(compute bool) *Redis {
		s, err := NewRedis(c, RedisConfig{Prefix: prefix, Retention: 24 * time.Hour, ComputeCalls: compute, Fingerprint: fp})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	x := &readAheadRig{t: t, s: open(true), other: open(false), m: NewModel(24 * time.Hour)}
	x.s.chunkCalls = 2
	for i := range 8 {
		x.keys = append(x.keys, Key{Scope: collisionScopes[i%len(collisionScopes)], CorrectionID: fmt.Sprint("ahead-", i), Source: Live})
	}
	return x
}

// batch returns one new opportunity for each of keys.
func (x *readAheadRig) batch(at time.Time, keys []Key) []Observation {
	var b []Observation
	for _, k := range keys {
		x.n++
		occ := Micros(at) - 5e6
		b = append(b, Observation{Key: k, OpportunityID: fmt.Sprint("op-", x.n), Class: Passed, Occurred: occ, Assessed: occ + 1e6})
	}
	return b
}

// check requires got to be what the model replies to obs at at.
func (x *readAheadRig) check(what string, store *Redis, e *Encoded, obs []Observation, at time.Time) {
	x.t.Helper()
	got, err := store.ApplyEncoded(context.Background(), e, at)
	if err != nil {
		x.t.Fatalf("%s: %v", what, err)
	}
	want, _ := x.m.Apply(context.Background(), obs, at)
	if fmt.Sprint(got.Outcomes) != fmt.Sprint(want.Outcomes) || fmt.Sprint(got.Keys) != fmt.Sprint(want.Keys) {
		x.t.Fatalf("%s: outcomes %v of %v, want %v of %v", what, got.Outcomes, got.Keys, want.Outcomes, want.Keys)
	}
	for _, k := range want.Keys {
		if got.Tallies[k] != want.Tallies[k] {
			x.t.Fatalf("%s, %s: %+v, want %+v", what, k, got.Tallies[k], want.Tallies[k])
		}
	}
}

// TestReadAheadOvertakenIsRefused: another writer that writes an aggregate after the store read it
// ahead, or a batch applied at another time than it was read ahead at, leaves the counts exact:
// the overtaken call is refused and run again by apply.lua, the batch at another time read again.
// The batch's snapshots keep its order of first appearance, though its first chunk was not its
// first aggregates.
func TestReadAheadOvertakenIsRefused(t *testing.T) {
	inBothLayouts(t, func(t *testing.T, fp *Fingerprinter) {
		x := newReadAheadRig(t, fp)
		at := t0.Add(30 * time.Minute)
		first := x.batch(at, x.keys)
		x.check("the batch that creates the aggregates", x.s, x.s.Encode(first), first, at)
		for round, tc := range []struct {
			name    string
			other   bool          // another writer writes the next batch's first chunk
			shifted time.Duration // the next batch is applied this much after it was read ahead
		}{
			{"as read", false, 0},
			{"another writer between", true, 0},
			{"applied later", false, time.Second},
		} {
			at = at.Add(time.Minute)
			b := x.batch(at, x.keys)
			// The next batch names the aggregates in another order, so that its first chunk is
			// not the batch before's.
			nextKeys := append(append([]Key{}, x.keys[6:]...), x.keys[:6]...)
			nextAt := at.Add(2 * time.Second)
			nb := x.batch(nextAt, nextKeys)
			e, ne := x.s.Encode(b), x.s.Encode(nb)
			x.s.Upcoming(e, func() time.Time { return at })
			x.s.Upcoming(ne, func() time.Time { return nextAt })
			usedBefore, unusedBefore := x.s.ReadsAhead()
			_, refusedBefore := x.s.ComputedCalls()
			x.check(tc.name+": the batch before", x.s, e, b, at)
			readAt, ok := x.s.ReadAt(ne)
			if used, unused := x.s.ReadsAhead(); !ok || used+unused != usedBefore+unusedBefore+1 || !readAt.Equal(nextAt) {
				t.Fatalf("%s: the next batch was not read ahead (%v at %v; %d read ahead)", tc.name, ok, readAt, used+unused-usedBefore-unusedBefore)
			}
			if tc.other {
				// The last chunk stored was x.keys[6:]; the next batch's first chunk is two of
				// the others, the first in its order: x.keys[0] and x.keys[1].
				ob := x.batch(nextAt.Add(-time.Second), x.keys[:1])
				x.check(tc.name+": the other writer", x.other, x.other.Encode(ob), ob, nextAt.Add(-time.Second))
			}
			x.check(tc.name+": the next batch", x.s, ne, nb, nextAt.Add(tc.shifted))
			used, _ := x.s.ReadsAhead()
			_, refused := x.s.ComputedCalls()
			wantUsed, wantRefused := usedBefore+1, refusedBefore
			if tc.shifted != 0 {
				wantUsed = usedBefore
			}
			if tc.other {
				wantRefused++
			}
			if used != wantUsed || refused != wantRefused {
				t.Fatalf("round %d, %s: %d applied with what was read ahead, %d refused; want %d, %d",
					round, tc.name, used-usedBefore, refused-refusedBefore, wantUsed-usedBefore, wantRefused-refusedBefore)
			}
			at = nextAt.Add(tc.shifted)
		}
	})
}
