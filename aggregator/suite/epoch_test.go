package suite

import (
	"context"
	"errors"
	"strings"
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

// A migration of the namespace from state layout 10 to 11 changes its epoch marker's layout and
// nothing of the suites: a suite store opened before it keeps applying through both steps, and is
// still stopped when a rebuild retires the namespace afterwards.
func TestSuiteStoreFollowsTheMigrationToLayout11(t *testing.T) {
	client := testenv.Redis(t)
	ctx := context.Background()
	prefix := testenv.Name(t, "suitemigrate")
	testenv.CleanPrefix(t, client, prefix)
	state, err := aggregator.OpenState(ctx, client, prefix, false)
	if err != nil {
		t.Fatal(err)
	}
	suites, err := NewRedis(client, aggregator.RedisConfig{Prefix: state.Namespace, Retention: time.Hour, Epoch: state.Epoch}, Config{})
	if err != nil {
		t.Fatal(err)
	}
	runs := []RunObservation{{Key: RunKey{Key: Key{Workspace: "w", Suite: "s"}, Version: "v1", Case: "c"},
		Record: RunRecord{Result: 'p', Runs: 1}}}
	base := strings.TrimSuffix(state.Epoch, "/layout10")
	for _, epoch := range []string{base + "/layout10to11", base + "/layout11"} {
		if err := client.Set(ctx, aggregator.EpochKey(state.Namespace), epoch, 0).Err(); err != nil {
			t.Fatal(err)
		}
		if _, err := suites.Apply(ctx, runs, t0); err != nil {
			t.Errorf("suite apply with the epoch at %q: %v", epoch, err)
		}
	}
	for _, epoch := range []string{base + "x/layout11", base + "x/layout10to11"} {
		if err := client.Set(ctx, aggregator.EpochKey(state.Namespace), epoch, 0).Err(); err != nil {
			t.Fatal(err)
		}
		if _, err := suites.Apply(ctx, runs, t0); !errors.Is(err, aggregator.ErrStateLost) {
			t.Errorf("suite apply with the epoch at %q, another namespace's: %v, want ErrStateLost", epoch, err)
		}
	}
}
