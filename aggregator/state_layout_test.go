package aggregator

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/repeatrate/repeatrate/internal/testenv"
)

// TestNamespaceKeepsTheLayoutItWasCreatedIn: a namespace is created in the layout asked for, and
// every later open, whatever layout it asks new namespaces to take, gets the namespace's own;
// instances that create one at once asking for different layouts all agree on the first one's; a
// rebuild's namespace takes the layout asked for; no layout but 10 and 11 is made.
func TestNamespaceKeepsTheLayoutItWasCreatedIn(t *testing.T) {
	client := testenv.Redis(t)
	ctx := context.Background()
	for _, first := range []Layout{Layout10, Layout11} {
		prefix := testenv.Name(t, fmt.Sprint("layout", int(first)))
		testenv.CleanPrefix(t, client, prefix)
		s, err := OpenStateIn(ctx, client, prefix, false, first)
		if err != nil || s.Layout != first || !strings.HasSuffix(s.Epoch, fmt.Sprintf("/layout%d", int(first))) {
			t.Fatalf("created in layout %d: %+v %v", int(first), s, err)
		}
		for _, later := range []Layout{Layout10, Layout11} {
			if again, err := OpenStateIn(ctx, client, prefix, true, later); err != nil || again != s {
				t.Fatalf("created in layout %d, opened asking for %d: %+v %v, want %+v", int(first), int(later), again, err, s)
			}
		}
		if again, err := OpenState(ctx, client, prefix, true); err != nil || again != s {
			t.Fatalf("created in layout %d, opened by OpenState: %+v %v, want %+v", int(first), again, err, s)
		}
	}

	prefix := testenv.Name(t, "layoutrace")
	testenv.CleanPrefix(t, client, prefix)
	const instances = 8
	got := make([]State, instances)
	errs := make([]error, instances)
	var wg sync.WaitGroup
	for i := 0; i < instances; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], errs[i] = OpenStateIn(ctx, client, prefix, false, []Layout{Layout10, Layout11}[i%2])
		}()
	}
	wg.Wait()
	for i := range got {
		if errs[i] != nil || got[i] != got[0] || got[i].Layout == 0 {
			t.Fatalf("instance %d: %+v %v; instance 0: %+v", i, got[i], errs[i], got[0])
		}
	}

	// The instance whose SET NX lost, asking for the other layout, takes the winner's.
	if lost, err := createEpoch(ctx, client, prefix, Layout10+Layout11-got[0].Layout); err != nil || lost != got[0] {
		t.Fatalf("an instance that lost the race asking for the other layout: %+v %v, want %+v", lost, err, got[0])
	}

	rebuilt, err := NewNamespaceIn(ctx, client, prefix, Layout11)
	if err != nil || rebuilt.Layout != Layout11 || !strings.HasSuffix(rebuilt.Epoch, "/layout11") {
		t.Fatalf("a rebuild's namespace in layout 11: %+v %v", rebuilt, err)
	}
	testenv.CleanPrefix(t, client, rebuilt.Namespace)
	if _, err := OpenFingerprint(ctx, client, rebuilt.Namespace); err != nil {
		t.Fatalf("a rebuild's namespace in layout 11 without its secret: %v", err)
	}
	for _, bad := range []Layout{0, 9, 12} {
		other := testenv.Name(t, fmt.Sprint("badlayout", int(bad)))
		testenv.CleanPrefix(t, client, other)
		if s, err := OpenStateIn(ctx, client, other, false, bad); err == nil {
			t.Errorf("a namespace created in layout %d: %+v", int(bad), s)
		}
		if s, err := NewNamespaceIn(ctx, client, other, bad); err == nil {
			t.Errorf("a rebuild's namespace created in layout %d: %+v", int(bad), s)
		}
		if n := client.Exists(ctx, EpochKey(other)).Val(); n != 0 {
			t.Errorf("refusing layout %d left an epoch", int(bad))
		}
	}
}

// TestLayout11NamespaceWithoutItsSecretIsLost: the records of a layout-11 namespace are found by
// fingerprints under its secret, so a namespace that lost the secret is refused as lost state and
// is not given a new one (whose fingerprints would find none of its records and count every
// opportunity again), while a layout-10 namespace, which does not read it, gets a new one.
func TestLayout11NamespaceWithoutItsSecretIsLost(t *testing.T) {
	client := testenv.Redis(t)
	ctx := context.Background()
	for _, layout := range []Layout{Layout10, Layout11} {
		prefix := testenv.Name(t, fmt.Sprint("secretlost", int(layout)))
		testenv.CleanPrefix(t, client, prefix)
		s, err := OpenStateIn(ctx, client, prefix, false, layout)
		if err != nil {
			t.Fatal(err)
		}
		cfg := RedisConfig{Prefix: s.Namespace, Retention: time.Hour, Epoch: s.Epoch}
		if layout == Layout11 {
			if cfg.Fingerprint, err = OpenFingerprint(ctx, client, s.Namespace); err != nil {
				t.Fatal(err)
			}
		}
		store, err := NewRedis(client, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := store.Apply(ctx, []Observation{obs("x", Confirmed, 0, 0, 0)}, t0); err != nil {
			t.Fatal(err)
		}
		client.Del(ctx, FingerprintKey(s.Namespace))
		again, err := OpenStateIn(ctx, client, prefix, true, layout)
		switch layout {
		case Layout11:
			if !errors.Is(err, ErrStateLost) {
				t.Fatalf("layout 11 without its secret: %+v %v, want ErrStateLost", again, err)
			}
			if n := client.Exists(ctx, FingerprintKey(s.Namespace)).Val(); n != 0 {
				t.Fatal("refusing a layout-11 namespace without its secret made it a new one")
			}
		default:
			if err != nil || again != s || client.Exists(ctx, FingerprintKey(s.Namespace)).Val() != 1 {
				t.Fatalf("layout 10 without its secret: %+v %v", again, err)
			}
		}
	}
}
