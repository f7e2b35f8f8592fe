package aggregator

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrStateLost means Redis no longer holds the state the processor built: flushed, or replaced by
// an empty server. Counting on would silently undercount; the state must be rebuilt from the input
// topics (repeatrate rebuild).
var ErrStateLost = errors.New("redis state lost")

// State names where an installation's state lives: its namespace (the key prefix in use, moved by
// a rebuild) and the epoch marker written when that namespace was created.
type State struct {
	Namespace string
	Epoch     string
}

// stateLayout names the layout of the keys a namespace holds; it ends every epoch marker, so a
// namespace written by a build with another layout is refused rather than misread. Version 2:
// records carry their occurred time, expiry by per-hour id lists.
const stateLayout = "/layout2"

func pointerKey(prefix string) string { return prefix + ":ns" }
func epochKey(ns string) string       { return ns + ":epoch" }

// OpenState finds the current namespace under prefix and its epoch. A namespace without an epoch
// is new when nothing was ever consumed (hadProgress false): its epoch is created. When the
// consumer group already committed offsets, a missing epoch means the state was lost, and
// OpenState returns ErrStateLost instead of starting over silently.
func OpenState(ctx context.Context, c redis.UniversalClient, prefix string, hadProgress bool) (State, error) {
	ns, err := c.Get(ctx, pointerKey(prefix)).Result()
	if errors.Is(err, redis.Nil) {
		ns = prefix
	} else if err != nil {
		return State{}, fmt.Errorf("read namespace pointer: %w", err)
	}
	epoch, err := c.Get(ctx, epochKey(ns)).Result()
	switch {
	case err == nil && !strings.HasSuffix(epoch, stateLayout):
		return State{}, fmt.Errorf("%w: namespace %q was written in an older state layout (epoch %q); "+
			"run `repeatrate rebuild` to recompute it in the current one", ErrStateLost, ns, epoch)
	case err == nil:
		return State{Namespace: ns, Epoch: epoch}, nil
	case !errors.Is(err, redis.Nil):
		return State{}, fmt.Errorf("read epoch: %w", err)
	case hadProgress:
		return State{}, fmt.Errorf("%w: namespace %q has no epoch marker but the consumer group has committed offsets; "+
			"run `repeatrate rebuild` to recompute the state from the input topics", ErrStateLost, ns)
	}
	return createEpoch(ctx, c, ns)
}

func createEpoch(ctx context.Context, c redis.UniversalClient, ns string) (State, error) {
	b := make([]byte, 8)
	rand.Read(b)
	epoch := time.Now().UTC().Format("20060102T150405Z") + "-" + hex.EncodeToString(b) + stateLayout
	// NX: when several instances start at once, all adopt the first one's epoch.
	if err := c.SetNX(ctx, epochKey(ns), epoch, 0).Err(); err != nil {
		return State{}, fmt.Errorf("create epoch: %w", err)
	}
	got, err := c.Get(ctx, epochKey(ns)).Result()
	if err != nil {
		return State{}, fmt.Errorf("read epoch: %w", err)
	}
	return State{Namespace: ns, Epoch: got}, nil
}

// NewNamespace creates a fresh namespace under prefix for a rebuild, with its own epoch. Nothing
// reads it until CutOver.
func NewNamespace(ctx context.Context, c redis.UniversalClient, prefix string) (State, error) {
	return createEpoch(ctx, c, fmt.Sprintf("%s:r%d", prefix, time.Now().UnixNano()))
}

// CutOver makes s the namespace every processor under prefix uses from its next start.
func CutOver(ctx context.Context, c redis.UniversalClient, prefix string, s State) error {
	if err := c.Set(ctx, pointerKey(prefix), s.Namespace, 0).Err(); err != nil {
		return fmt.Errorf("cut over to %s: %w", s.Namespace, err)
	}
	return nil
}
