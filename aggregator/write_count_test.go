package aggregator

import (
	"fmt"
	"testing"
	"time"

	"github.com/repeatrate/repeatrate/internal/testenv"
)

// TestHeadsWithoutAWriteCountKeepTheirBucketsChecked: a layout-11 head written before the store's
// write count (24 numbers, by the build before it) says nothing of the buckets, so a computed call
// that read one is stored only if its buckets too are as read. Here a writer of that build changes
// a record between the call's read and its store and leaves the head as it was: the store refuses
// the call, apply.lua applies it on the record as that writer left it, and the head it leaves
// carries a write count.
func TestHeadsWithoutAWriteCountKeepTheirBucketsChecked(t *testing.T) {
	c := testenv.Redis(t)
	prefix := testenv.Name(t, "oldhead")
	testenv.CleanPrefix(t, c, prefix)
	fp := testFingerprinter(t)
	open := func(compute bool) *Redis {
		s, err := NewRedis(c, RedisConfig{Prefix: prefix, Retention: 24 * time.Hour, ComputeCalls: compute, Fingerprint: fp})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	mine, older := open(true), open(false)
	k := Key{Scope: collisionScopes[0], CorrectionID: "oldhead", Source: Live}
	occ := Micros(t0) + 30*minuteUS
	at := time.UnixMicro(occ + 5e6)
	ctx := t.Context()
	// "first" occurred before "base", so that an older assessment of it can move its horizon and
	// no bound or watermark.
	first := Observation{Key: k, OpportunityID: "first", Class: Passed, Occurred: occ - 2e6, Assessed: occ}
	base := Observation{Key: k, OpportunityID: "base", Class: Passed, Occurred: occ, Assessed: occ}
	if _, err := older.Apply(ctx, []Observation{first, base}, at); err != nil {
		t.Fatal(err)
	}
	st := mine.keys(k)[1]
	// The head as the build before wrote it: its first 24 numbers.
	toOld := func() string {
		h := c.HGet(ctx, st, "H").Val()
		if len(h) != headBytesWC {
			t.Fatalf("head of %d bytes, want %d", len(h), headBytesWC)
		}
		c.HSet(ctx, st, "H", h[:headBytes11])
		return h[:headBytes11]
	}
	old := toOld()
	// The older build's write: an older assessment that occurred later moves first's horizon, a
	// change of its bucket alone; that build leaves the head as it was.
	moved := first
	moved.Occurred, moved.Assessed = occ-1e6, occ-5e5
	mine.afterRead = func() {
		if _, err := older.Apply(ctx, []Observation{moved}, at); err != nil {
			t.Fatal(err)
		}
		if toOld() != old {
			t.Fatal("the other writer changed the head's first 24 numbers: the bucket check is not what refuses")
		}
	}
	_, refusedBefore := mine.ComputedCalls()
	got, err := mine.Apply(ctx, []Observation{first, {Key: k, OpportunityID: "e", Class: Passed, Occurred: occ, Assessed: occ}}, at)
	if err != nil {
		t.Fatal(err)
	}
	mine.afterRead = nil
	if _, refused := mine.ComputedCalls(); refused != refusedBefore+1 {
		t.Fatalf("the store refused %d calls, want 1", refused-refusedBefore)
	}
	if fmt.Sprint(got.Outcomes) != fmt.Sprint([]Outcome{Duplicate, Counted}) {
		t.Fatalf("outcomes %v, want [duplicate counted]", got.Outcomes)
	}
	if h := c.HGet(ctx, st, "H").Val(); len(h) != headBytesWC || h[headBytes11:] == "\x00\x00\x00\x00\x00\x00\x00" {
		t.Fatalf("head after the call: %d bytes, write count %q; want %d bytes and a count", len(h), h[min(len(h), headBytes11):], headBytesWC)
	}
	// From a head with a write count, the next call is computed and stored.
	storedBefore, _ := mine.ComputedCalls()
	if _, err := mine.Apply(ctx, []Observation{{Key: k, OpportunityID: "f", Class: Passed, Occurred: occ, Assessed: occ}}, at); err != nil {
		t.Fatal(err)
	}
	if stored, _ := mine.ComputedCalls(); stored != storedBefore+1 {
		t.Fatalf("%d calls stored after the head gained its write count, want 1", stored-storedBefore)
	}
}
