package aggregator

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A seal that finds its batch's writes lost records nothing of the batch, and a later loss of the
// batch applied again is still found. The seal records the batch's offsets beside its mark; it
// did so whenever the previous mark held — also when the batch's own writes (and their pending
// token) were gone, which the same Seal reports as ErrWritesLost. That record claimed work Redis
// did not hold and outlived the rewind: once the batch was applied again and committed, Redis
// going back to just after the false record left the record at the committed offset, and
// CheckOffsets no longer found the committed work lost.
func TestSealThatFindsItsBatchLostRecordsNothing(t *testing.T) {
	ctx := context.Background()
	a, client := testStore(t, "advsealrecord", RedisConfig{Retention: time.Hour, Group: "g"})
	if _, err := a.Apply(ctx, []Observation{obs("x", Confirmed, 0, 0, 0)}, t0); err != nil {
		t.Fatal(err)
	}
	m1, err := a.Seal(ctx, Offsets{"in": {0: 10}})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Verify(ctx, m1, Offsets{"in": {0: 10}}); err != nil {
		t.Fatal(err)
	}
	held := dumpPrefix(t, client, a.cfg.Prefix) // batch 1 applied, sealed, verified, committed (10)

	// Batch 2 is applied; Redis then loses its writes (a restart from an AOF one second behind):
	// the mark of batch 1 survives, batch 2's writes and pending token do not.
	if _, err := a.Apply(ctx, []Observation{obs("y", Confirmed, time.Minute, time.Minute, 0)}, t0); err != nil {
		t.Fatal(err)
	}
	restorePrefix(t, client, a.cfg.Prefix, held)
	if _, err := a.Seal(ctx, Offsets{"in": {0: 20}}); !errors.Is(err, ErrWritesLost) {
		t.Fatalf("seal of a batch whose writes are gone: %v, want ErrWritesLost", err)
	}
	recorded, _ := client.HGet(ctx, a.offsetsKey(), "in/0").Result()
	afterFalseSeal := dumpPrefix(t, client, a.cfg.Prefix)

	// The processor consumes again from 10, applies batch 2 again, seals, verifies, commits 20.
	if _, err := a.Apply(ctx, []Observation{obs("y", Confirmed, time.Minute, time.Minute, 0)}, t0); err != nil {
		t.Fatal(err)
	}
	m3, err := a.Seal(ctx, Offsets{"in": {0: 20}})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Verify(ctx, m3, Offsets{"in": {0: 20}}); err != nil {
		t.Fatal(err)
	}
	// Redis loses everything after the seal that found the loss: batch 2 is gone again, this time
	// with its offsets committed.
	restorePrefix(t, client, a.cfg.Prefix, afterFalseSeal)
	cfg := a.cfg
	cfg.Pending = nil
	b, err := NewRedis(client, cfg)
	if err != nil {
		t.Fatal(err)
	}
	tally, err := b.Tally(ctx, keyLive, t0)
	if err != nil {
		t.Fatal(err)
	}
	if tally.All.Confirmed != 1 {
		t.Fatalf("setup: redis holds %d confirmed, want only batch 1's", tally.All.Confirmed)
	}
	if err := b.CheckOffsets(ctx, Offsets{"in": {0: 20}}); !errors.Is(err, ErrStateLost) {
		t.Fatalf("group committed in/0 up to 20 but redis holds only batch 1 (up to 10): CheckOffsets = %v, want ErrStateLost; "+
			"the seal that found batch 2 lost had recorded in/0 = %s", err, recorded)
	}
}
