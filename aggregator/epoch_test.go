package aggregator

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/repeatrate/repeatrate/internal/testenv"
)

func TestStateLossIsDetected(t *testing.T) {
	client := testenv.Redis(t)
	ctx := context.Background()
	prefix := testenv.Name(t, "epoch")
	testenv.CleanPrefix(t, client, prefix)

	// A first start creates the epoch; a second start adopts it.
	s1, err := OpenState(ctx, client, prefix, false)
	if err != nil || s1.Namespace != prefix || s1.Epoch == "" {
		t.Fatalf("first open: %+v %v", s1, err)
	}
	if s2, err := OpenState(ctx, client, prefix, true); err != nil || s2 != s1 {
		t.Fatalf("second open: %+v %v", s2, err)
	}
	store, err := NewRedis(client, RedisConfig{Prefix: s1.Namespace, Retention: time.Hour, Epoch: s1.Epoch})
	if err != nil {
		t.Fatal(err)
	}
	batch := []Observation{obs("x", Confirmed, 0, 0, 0)}
	if _, err := store.Apply(ctx, batch, t0); err != nil {
		t.Fatal(err)
	}

	// The state goes (FLUSHALL would take the other tests' keys too; the epoch marker is enough).
	client.Del(ctx, EpochKey(prefix))
	if _, err := store.Apply(ctx, batch, t0); !errors.Is(err, ErrStateLost) {
		t.Fatalf("apply after state loss: %v, want ErrStateLost", err)
	}
	if _, err := OpenState(ctx, client, prefix, true); !errors.Is(err, ErrStateLost) {
		t.Fatalf("open after state loss with committed offsets: %v, want ErrStateLost", err)
	}

	// A rebuild's namespace becomes current after the cut-over.
	fresh, err := NewNamespace(ctx, client, prefix)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Retire(ctx, client, prefix, fresh); err != nil {
		t.Fatal(err)
	}
	if err := CutOver(ctx, client, prefix, fresh); err != nil {
		t.Fatal(err)
	}
	if s, err := OpenState(ctx, client, prefix, true); err != nil || s != fresh {
		t.Fatalf("open after cut-over: %+v %v, want %+v", s, err, fresh)
	}
	if err := store.SeedVersion(ctx, keyLive, 41); err != nil {
		t.Fatal(err)
	}

	// A namespace written in an older state layout is refused, never read in the new one.
	client.Set(ctx, EpochKey(fresh.Namespace), "20261129T230000Z-00ff00ff00ff00ff", 0)
	if _, err := OpenState(ctx, client, prefix, true); !errors.Is(err, ErrStateLost) {
		t.Fatalf("open of an old-layout namespace: %v, want ErrStateLost", err)
	}
}

// A rebuild retires the namespace in use before it commits and cuts over: from then on a
// processor still running on the old namespace fails its next batch with
// ErrStateLost, and a processor that starts refuses, until the cut-over; after it, starting
// finds the new namespace while the old stores keep failing.
func TestCutOverStopsProcessorsOnOldNamespace(t *testing.T) {
	client := testenv.Redis(t)
	ctx := context.Background()
	prefix := testenv.Name(t, "cutover")
	testenv.CleanPrefix(t, client, prefix)

	old, err := OpenState(ctx, client, prefix, false)
	if err != nil {
		t.Fatal(err)
	}
	cfg := RedisConfig{Prefix: old.Namespace, Retention: time.Hour, Epoch: old.Epoch}
	rates, err := NewRedis(client, cfg)
	if err != nil {
		t.Fatal(err)
	}
	batch := []Observation{obs("x", Confirmed, 0, 0, 0)}
	if _, err := rates.Apply(ctx, batch, t0); err != nil {
		t.Fatal(err)
	}
	stopped := func(when string) {
		t.Helper()
		if _, err := rates.Apply(ctx, batch, t0); !errors.Is(err, ErrStateLost) || !strings.Contains(err.Error(), "rebuild") {
			t.Errorf("%s: apply on the old namespace: %v, want ErrStateLost naming the rebuild", when, err)
		}
	}

	fresh, err := NewNamespace(ctx, client, prefix)
	if err != nil {
		t.Fatal(err)
	}
	// Not retired in its favour: the cut-over refuses and moves nothing.
	if err := CutOver(ctx, client, prefix, fresh); err == nil {
		t.Fatal("cut-over without retiring the namespace in use succeeded")
	}
	if s, err := OpenState(ctx, client, prefix, true); err != nil || s != old {
		t.Fatalf("open after a refused cut-over: %+v %v, want %+v", s, err, old)
	}

	retired, err := Retire(ctx, client, prefix, fresh)
	if err != nil || retired != old.Namespace {
		t.Fatalf("retire: %q %v, want %q", retired, err, old.Namespace)
	}
	stopped("after retire")
	if _, err := OpenState(ctx, client, prefix, true); !errors.Is(err, ErrStateLost) || !strings.Contains(err.Error(), "rebuild") {
		t.Fatalf("start during the rebuild: %v, want ErrStateLost naming the rebuild", err)
	}

	// A second rebuild retires it again in favour of its own namespace: the first one's cut-over
	// must then refuse.
	second, err := NewNamespace(ctx, client, prefix)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Retire(ctx, client, prefix, second); err != nil {
		t.Fatal(err)
	}
	if err := CutOver(ctx, client, prefix, fresh); err == nil {
		t.Fatal("a superseded rebuild cut over")
	}
	if err := CutOver(ctx, client, prefix, second); err != nil {
		t.Fatal(err)
	}
	if err := CutOver(ctx, client, prefix, second); err != nil {
		t.Fatalf("repeated cut-over: %v", err)
	}
	stopped("after cut-over")
	s, err := OpenState(ctx, client, prefix, true)
	if err != nil || s != second {
		t.Fatalf("open after cut-over: %+v %v, want %+v", s, err, second)
	}
	moved, err := NewRedis(client, RedisConfig{Prefix: s.Namespace, Retention: time.Hour, Epoch: s.Epoch})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := moved.Apply(ctx, batch, t0); err != nil {
		t.Fatalf("apply on the new namespace: %v", err)
	}

	// A namespace that lost its epoch while being rebuilt is never cut over to.
	third, err := NewNamespace(ctx, client, prefix)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Retire(ctx, client, prefix, third); err != nil {
		t.Fatal(err)
	}
	client.Del(ctx, EpochKey(third.Namespace))
	if err := CutOver(ctx, client, prefix, third); !errors.Is(err, ErrStateLost) {
		t.Fatalf("cut-over to a namespace that lost its epoch: %v, want ErrStateLost", err)
	}
}
