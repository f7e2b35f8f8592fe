package readside

import (
	"context"
	"testing"
	"time"

	"github.com/repeatrate/repeatrate/internal/testenv"
	"github.com/repeatrate/repeatrate/schemas"
)

func retainedSnapshot(ws, agg string, version, retained int64) schemas.Snapshot {
	s := recordSnapshot(agg, version, recordBase)
	s.Aggregate.Workspace = ws
	s.Windows.All = schemas.Window{ConfirmedRepeats: 1, Passed: retained - 2, Unscored: 1}
	return s
}

// A workspace's retained opportunities are the sum over its aggregates of their newest recorded
// snapshot's: a newer snapshot replaces its aggregate's count, an older one (a recorder that
// writes late) changes nothing, other workspaces are apart, and an aggregate dropped from the index
// as idle leaves the sum.
func TestRetainedFollowsEachAggregatesNewestSnapshot(t *testing.T) {
	client := testenv.Redis(t)
	prefix := testenv.Name(t, "retained")
	testenv.CleanPrefix(t, client, prefix)
	cat := NewCatalog(client, prefix, time.Hour)
	ctx := context.Background()
	write := func(at time.Time, snaps ...schemas.Snapshot) {
		t.Helper()
		p := newPending()
		for i := range snaps {
			p.addSnapshot(&snaps[i])
		}
		if err := cat.write(ctx, p, at, map[string]int64{}); err != nil {
			t.Fatal(err)
		}
	}
	want := func(ws string, n int64) {
		t.Helper()
		got, err := cat.Retained(ctx, ws)
		if err != nil || got != n {
			t.Fatalf("workspace %s retains %d (%v), want %d", ws, got, err, n)
		}
	}
	want("w", 0)
	write(recordBase, retainedSnapshot("w", "x", 10, 3), retainedSnapshot("w", "y", 10, 5), retainedSnapshot("v", "x", 10, 7))
	want("w", 8)
	want("v", 7)
	write(recordBase, retainedSnapshot("w", "x", 20, 4))
	want("w", 9)
	write(recordBase, retainedSnapshot("w", "y", 5, 100)) // older than the one recorded
	want("w", 9)
	// Two hours on, x and y were not seen for longer than the catalog's idle hour: dropped with
	// the next write to the workspace's index, and so is their count.
	write(recordBase.Add(2*time.Hour), retainedSnapshot("w", "z", 30, 2))
	want("w", 2)
	want("v", 7)
}
