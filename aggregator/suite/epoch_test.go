package suite

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/internal/testenv"
)

// A rebuild that retires the namespace in use and cuts over stops a suite store still writing to
// the old namespace at its next batch, as it stops the rate store (aggregator's cut-over test).
func TestCutOverStopsSuiteStoreOnOldNamespace(t *testing.T) {
	client := testenv.Redis(t)
	ctx := context.Background()
	prefix := testenv.Name(t, "suitecutover")
	testenv.CleanPrefix(t, client, prefix)

	old, err := aggregator.OpenState(ctx, client, prefix, false)
	if err != nil {
		t.Fatal(err)
	}
	suites, err := NewRedis(client, aggregator.RedisConfig{Prefix: old.Namespace, Retention: time.Hour, Epoch: old.Epoch}, Config{})
	if err != nil {
		t.Fatal(err)
	}
	runs := []RunObservation{{Key: RunKey{Key: Key{Workspace: "w", Suite: "s"}, Version: "v1", Case: "c"},
		Record: RunRecord{Result: 'p', Runs: 1}}}
	if _, err := suites.Apply(ctx, runs, t0); err != nil {
		t.Fatal(err)
	}
	fresh, err := aggregator.NewNamespace(ctx, client, prefix)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := aggregator.Retire(ctx, client, prefix, fresh); err != nil {
		t.Fatal(err)
	}
	if _, err := suites.Apply(ctx, runs, t0); !errors.Is(err, aggregator.ErrStateLost) {
		t.Errorf("suite apply on a retired namespace: %v, want ErrStateLost", err)
	}
	if err := aggregator.CutOver(ctx, client, prefix, fresh); err != nil {
		t.Fatal(err)
	}
	if _, err := suites.Apply(ctx, runs, t0); !errors.Is(err, aggregator.ErrStateLost) {
		t.Errorf("suite apply on the old namespace after the cut-over: %v, want ErrStateLost", err)
	}
}
