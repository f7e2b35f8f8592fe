package aggregator

import (
	"context"
	"fmt"
	"testing"
)

// TestHeadsWithoutAWriteCountKeepTheirBucketsChecked: a layout-11 head written before the store's
// write count (24 numbers, by the build before it) says nothing of the buckets, so a computed call
// that read one is stored only if its buckets too are as read. Here a writer of that build changes
// a record between the call's read and its store and leaves the head as it was: the store refuses
// the call, apply.lua applies it on the record as that writer left it, and the head it leaves
// carries a write count.
func TestHeadsWithoutAWriteCountKeepTheirBucketsChecked(t *testing.T) {
	x := newLostWritesRig(t, "oldhead", false) // other plays the build before
	// "first" occurred before "base", so that an older assessment of it can move its horizon and
	// no bound or watermark.
	first := x.ob("first", x.occ-2e6, x.occ)
	x.otherApplies(t, first, x.ob("base", x.occ, x.occ))
	old := x.asBuildBefore()
	// The older build's write: an older assessment that occurred later moves first's horizon, a
	// change of its bucket alone.
	moved := first
	moved.Occurred, moved.Assessed = x.occ-1e6, x.occ-5e5
	x.mine.afterRead = func() {
		x.otherApplies(t, moved)
		if x.asBuildBefore() != old {
			t.Fatal("the other writer changed the head's first 24 numbers: the bucket check is not what refuses")
		}
	}
	_, refusedBefore := x.mine.ComputedCalls()
	got, err := x.mine.Apply(context.Background(), []Observation{first, x.ob("e", x.occ, x.occ)}, x.at)
	if err != nil {
		t.Fatal(err)
	}
	x.mine.afterRead = nil
	if _, refused := x.mine.ComputedCalls(); refused != refusedBefore+1 {
		t.Fatalf("the store refused %d calls, want 1", refused-refusedBefore)
	}
	if fmt.Sprint(got.Outcomes) != fmt.Sprint([]Outcome{Duplicate, Counted}) {
		t.Fatalf("outcomes %v, want [duplicate counted]", got.Outcomes)
	}
	st := x.mine.keys(x.k)[1]
	if h := x.c.HGet(context.Background(), st, "H").Val(); len(h) != headBytesWC || h[headBytes11:] == "\x00\x00\x00\x00\x00\x00\x00" {
		t.Fatalf("head after the call: %d bytes, write count %q; want %d bytes and a count", len(h), h[min(len(h), headBytes11):], headBytesWC)
	}
	// From a head with a write count, the next call is computed and stored.
	if stored, _ := x.mineApplies(t, x.ob("f", x.occ, x.occ)); stored != 1 {
		t.Fatalf("%d calls stored after the head gained its write count, want 1", stored)
	}
}
