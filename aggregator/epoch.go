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
// a rebuild), the epoch marker written when that namespace was created, and the layout it is in.
type State struct {
	Namespace string
	Epoch     string
	Layout    Layout
}

// stateLayout names the layout of the keys a namespace holds; it ends every epoch marker, so a
// namespace written by a build with another layout is refused rather than misread. Version 2:
// records carry their occurred time, expiry by per-hour id lists. Version 3: records may carry a
// horizon, and a sorted set names the hours that have id lists. Version 4: one hash holds the id
// index in chunks per hour instead of a list per hour, and counts that fall to 0 are deleted.
// Version 5: record fields carry the id's length, the state hash packs the head and each hour
// (counts, bounds, open index chunk) into one field each, in hex. Version 6: a suite's runs are
// held per cell and block of 16 run indexes, one field each, instead of one field per run.
// Version 7: an hour keeps its bounds (as offsets from its start) only once it holds 32 winners,
// and its count of closed index chunks only when not 0. Version 8: the state hash's numbers (the
// head, each hour's counts and bounds, the minute buckets) are fixed-width little-endian binary,
// not hex. Version 9: the id index is kept per index group of G hours (an eighth of the retention,
// 1 to 255, in the head) in fields of its own, so that a batch over many hours reads and writes it
// once per group instead of once per hour; every hour that holds winners keeps bounds, exact or
// loose. Version 10: version 9 as it landed — the head also keeps the cut (the first retained
// hour, which never moves back); builds between (commits bcdf9ec and 18ba637) wrote heads and
// hours of other sizes under the name layout 9, so their state is refused, not misread. Version 11
// (Layout11): each opportunity kept by a fingerprint of its id in packed buckets, a day's hours in
// one field; its heads end with the store's write count and its packed stores keep a write stamp
// (field written); a head written before the count (24 numbers) is read as one without it and
// gains it on its next write (a build before the count refuses the longer head, so it never
// writes a bucket without raising it). A namespace is made in 10 or 11 (OpenStateIn) and keeps it.
const stateLayout = "/layout10"

// Layout is the state layout a namespace is kept in; its epoch marker ends with it, and it never
// changes while the namespace is in use.
type Layout int

const (
	// Layout10 keeps a record per opportunity id, about 138 bytes an opportunity in Redis.
	Layout10 Layout = 10
	// Layout11 keeps each opportunity by a keyed 128-bit fingerprint of its id in packed buckets
	// (docs/performance.md), about 47 bytes an opportunity, at about layout 10's Redis CPU per event
	// and up to 1.5 times its processor's in the pipeline (up to 2 times the time a batch in
	// aggregates that hold many records), with a higher latency at load (BENCHMARKS.md). A
	// namespace in it needs its fingerprint secret.
	Layout11 Layout = 11
	// Layout10To11 is a namespace that an online migration (Migrate) is moving from layout 10 to
	// 11: each aggregate is in one or the other, as its head says, and the processors' calls carry
	// both encodings. No namespace is created in it.
	Layout10To11 Layout = 1011
)

// Validate says whether a namespace can be made in layout l: 10 or 11.
func (l Layout) Validate() error {
	if l != Layout10 && l != Layout11 {
		return fmt.Errorf("state layout %d: want %d or %d", int(l), int(Layout10), int(Layout11))
	}
	return nil
}

// suffix is what ends the epoch marker of a namespace in layout l.
func (l Layout) suffix() string {
	if l == Layout10To11 {
		return "/layout10to11"
	}
	return fmt.Sprintf("/layout%d", int(l))
}

// layoutOf returns the layout an epoch marker names, or false for one no build reads.
func layoutOf(epoch string) (Layout, bool) {
	for _, l := range []Layout{Layout10, Layout11, Layout10To11} {
		if strings.HasSuffix(epoch, l.suffix()) {
			return l, true
		}
	}
	return 0, false
}

// EpochFollows says whether epoch marker got is want or a later step of the same namespace's
// migration from layout 10 to 11 (10, then 10 → 11, then 11): a store opened on want keeps
// working across the migration, which changes the marker's layout and nothing else.
func EpochFollows(want, got string) bool {
	if got == want {
		return true
	}
	wl, ok1 := layoutOf(want)
	gl, ok2 := layoutOf(got)
	if !ok1 || !ok2 || strings.TrimSuffix(want, wl.suffix()) != strings.TrimSuffix(got, gl.suffix()) {
		return false
	}
	return wl == Layout10 && gl != Layout10 || wl == Layout10To11 && gl == Layout11
}

func pointerKey(prefix string) string { return prefix + ":ns" }

// EpochKey is the key of namespace ns's epoch marker, which every apply pipeline (of any store
// under ns) reads to detect lost state.
func EpochKey(ns string) string { return ns + ":epoch" }

// OpenState is OpenStateIn for an installation whose new namespaces are made in layout 10.
func OpenState(ctx context.Context, c redis.UniversalClient, prefix string, hadProgress bool) (State, error) {
	return OpenStateIn(ctx, c, prefix, hadProgress, Layout10)
}

// OpenStateIn finds the current namespace under prefix, its epoch and its layout. A namespace
// without an epoch is new when nothing was ever consumed (hadProgress false): its epoch is created,
// in layout fresh. An existing namespace keeps the layout it was made in, whatever fresh says
// (Migrate or a rebuild moves one). When the consumer group
// already committed offsets, a missing epoch means the state was lost, and OpenStateIn returns
// ErrStateLost instead of starting over silently. So it does for a namespace that a rebuild
// retired (Retire), until that rebuild cuts over, and for a layout-11 namespace without its
// fingerprint secret, whose records no fingerprint could find again.
func OpenStateIn(ctx context.Context, c redis.UniversalClient, prefix string, hadProgress bool, fresh Layout) (State, error) {
	if err := fresh.Validate(); err != nil {
		return State{}, err
	}
	ns, err := c.Get(ctx, pointerKey(prefix)).Result()
	if errors.Is(err, redis.Nil) {
		ns = prefix
	} else if err != nil {
		return State{}, fmt.Errorf("read namespace pointer: %w", err)
	}
	epoch, err := c.Get(ctx, EpochKey(ns)).Result()
	switch {
	case err == nil && strings.HasPrefix(epoch, retiredMark):
		return State{}, fmt.Errorf("%w: namespace %q is retired (%s): a rebuild is running or was interrupted; "+
			"let it finish, or run `repeatrate rebuild` again", ErrStateLost, ns, epoch)
	case err == nil:
		layout, ok := layoutOf(epoch)
		if !ok {
			return State{}, fmt.Errorf("%w: namespace %q was written in an older state layout (epoch %q); "+
				"run `repeatrate rebuild` to recompute it in the current one", ErrStateLost, ns, epoch)
		}
		if layout != Layout10 {
			// Its records are found by their fingerprints: a new secret would find none of them.
			if _, err := OpenFingerprint(ctx, c, ns); err != nil {
				return State{}, err
			}
		} else if err := ensureFingerprintSecret(ctx, c, ns); err != nil {
			// Layout 10 does not read the secret: a namespace opened without one (made by an
			// earlier build) gets it now, for a migration to layout 11 to find in place.
			return State{}, err
		}
		return State{Namespace: ns, Epoch: epoch, Layout: layout}, nil
	case !errors.Is(err, redis.Nil):
		return State{}, fmt.Errorf("read epoch: %w", err)
	case hadProgress:
		return State{}, fmt.Errorf("%w: namespace %q has no epoch marker but the consumer group has committed offsets; "+
			"run `repeatrate rebuild` to recompute the state from the input topics", ErrStateLost, ns)
	}
	return createEpoch(ctx, c, ns, fresh)
}

func createEpoch(ctx context.Context, c redis.UniversalClient, ns string, layout Layout) (State, error) {
	b := make([]byte, 8)
	rand.Read(b)
	epoch := time.Now().UTC().Format("20060102T150405Z") + "-" + hex.EncodeToString(b) + layout.suffix()
	// The secret before the epoch: whoever finds the epoch finds the secret too.
	if err := ensureFingerprintSecret(ctx, c, ns); err != nil {
		return State{}, err
	}
	// NX: when several instances start at once, all adopt the first one's epoch.
	if err := c.SetNX(ctx, EpochKey(ns), epoch, 0).Err(); err != nil {
		return State{}, fmt.Errorf("create epoch: %w", err)
	}
	got, err := c.Get(ctx, EpochKey(ns)).Result()
	if err != nil {
		return State{}, fmt.Errorf("read epoch: %w", err)
	}
	// Another instance's epoch, when it was first: its layout is the namespace's.
	layout, ok := layoutOf(got)
	if !ok {
		return State{}, fmt.Errorf("%w: namespace %q was created in a state layout this build does not read (epoch %q)", ErrStateLost, ns, got)
	}
	return State{Namespace: ns, Epoch: got, Layout: layout}, nil
}

// NewNamespace creates a fresh namespace under prefix for a rebuild, in layout 10, with its own
// epoch. Nothing reads it until CutOver.
func NewNamespace(ctx context.Context, c redis.UniversalClient, prefix string) (State, error) {
	return NewNamespaceIn(ctx, c, prefix, Layout10)
}

// NewNamespaceIn is NewNamespace in layout l: a rebuild is how an installation moves its state
// from one layout to another.
func NewNamespaceIn(ctx context.Context, c redis.UniversalClient, prefix string, l Layout) (State, error) {
	if err := l.Validate(); err != nil {
		return State{}, err
	}
	return createEpoch(ctx, c, fmt.Sprintf("%s:r%d", prefix, time.Now().UnixNano()), l)
}

// retiredMark starts the epoch marker of a namespace that a rebuild retired. The marker names the
// namespace the rebuild moves to and says what to do, because a running processor's error (the
// epoch check of every batch) quotes it.
const retiredMark = "retired: repeatrate rebuild moves to "

func retiredEpoch(next string) string {
	return retiredMark + next + "; restart the processor once the rebuild has finished"
}

// current returns the namespace the pointer under prefix names (prefix itself when unset).
func current(ctx context.Context, c redis.UniversalClient, prefix string) (string, error) {
	ns, err := c.Get(ctx, pointerKey(prefix)).Result()
	if errors.Is(err, redis.Nil) {
		return prefix, nil
	}
	if err != nil {
		return "", fmt.Errorf("read namespace pointer: %w", err)
	}
	return ns, nil
}

// Retire takes the namespace in use under prefix out of service in favour of next, a namespace
// from NewNamespace that a rebuild is about to fill: its epoch marker is replaced by one naming
// next. From then on every processor still running on it fails its next batch with ErrStateLost
// (the per-batch epoch check), and a processor that starts refuses (OpenState), until CutOver
// points the installation at next. Retiring again for another rebuild is allowed: the last one
// wins. It returns the retired namespace.
func Retire(ctx context.Context, c redis.UniversalClient, prefix string, next State) (string, error) {
	ns, err := current(ctx, c, prefix)
	if err != nil {
		return "", err
	}
	if ns == next.Namespace {
		return "", fmt.Errorf("retire %s: it is already the namespace in use", ns)
	}
	if err := c.Set(ctx, EpochKey(ns), retiredEpoch(next.Namespace), 0).Err(); err != nil {
		return "", fmt.Errorf("retire namespace %s: %w", ns, err)
	}
	return ns, nil
}

// CutOver makes next the namespace every processor under prefix uses from its next start. The
// namespace in use must have been retired in favour of next (Retire), and next must still hold
// its epoch; otherwise another rebuild took over meanwhile, or Redis lost next, and CutOver fails
// without moving anything. Cutting over to the namespace already in use is a no-op, so a rebuild
// may repeat it. The checks and the move are separate commands (the keys live in different Redis
// Cluster slots): two rebuilds racing to the last step are not fenced.
func CutOver(ctx context.Context, c redis.UniversalClient, prefix string, next State) error {
	ns, err := current(ctx, c, prefix)
	if err != nil {
		return err
	}
	if ns == next.Namespace {
		return nil
	}
	mark, err := c.Get(ctx, EpochKey(ns)).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("cut over to %s: read epoch of %s: %w", next.Namespace, ns, err)
	}
	if mark != retiredEpoch(next.Namespace) {
		return fmt.Errorf("cut over to %s: namespace %s in use is not retired in its favour (epoch %q): "+
			"another rebuild started meanwhile, or Redis lost the retirement", next.Namespace, ns, mark)
	}
	epoch, err := c.Get(ctx, EpochKey(next.Namespace)).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("cut over to %s: read its epoch: %w", next.Namespace, err)
	}
	if epoch != next.Epoch {
		return fmt.Errorf("%w: cut over to %s: its epoch marker is %q, want %q", ErrStateLost, next.Namespace, epoch, next.Epoch)
	}
	if err := c.Set(ctx, pointerKey(prefix), next.Namespace, 0).Err(); err != nil {
		return fmt.Errorf("cut over to %s: %w", next.Namespace, err)
	}
	return nil
}
