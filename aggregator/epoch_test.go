package aggregator

import (
	"context"
	"errors"
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
	client.Del(ctx, epochKey(prefix))
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
	client.Set(ctx, epochKey(fresh.Namespace), "20261129T230000Z-00ff00ff00ff00ff", 0)
	if _, err := OpenState(ctx, client, prefix, true); !errors.Is(err, ErrStateLost) {
		t.Fatalf("open of an old-layout namespace: %v, want ErrStateLost", err)
	}
}

func TestSealDetectsLostWrites(t *testing.T) {
	ctx := context.Background()
	store, client := testStore(t, "seal", RedisConfig{Retention: time.Hour})
	for i := 0; i < 3; i++ {
		if err := store.Seal(ctx); err != nil {
			t.Fatalf("seal %d: %v", i, err)
		}
	}
	// A retried seal after a lost reply finds its own mark: fine.
	store.sealSeq--
	if err := store.Seal(ctx); err != nil {
		t.Fatalf("retried seal: %v", err)
	}
	// Redis restarted and lost the last second: the mark went back.
	client.Set(ctx, store.sealKey, "1", 0)
	if err := store.Seal(ctx); !errors.Is(err, ErrWritesLost) {
		t.Fatalf("seal after lost writes: %v, want ErrWritesLost", err)
	}
}
