package aggregator

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// An online migration moves a namespace from state layout 10 to 11 while the processors keep
// running (docs/operations.md, "State layouts"):
//
//  0. Migrate checks that it can finish (migrationCanRun): SCAN on every primary, the conversion
//     script; otherwise it changes nothing.
//  1. Migrate moves the epoch marker from layout 10 to "10 → 11" (Layout10To11). A processor of
//     this build follows on its next batch (the per-batch epoch check, followEpoch): from then on
//     its calls carry every observation in both layouts, and the script applies the one its
//     aggregate's head says. A processor of an earlier build stops: the marker is not its own.
//  2. Migrate converts every aggregate whose head says 10 (convert.lua, layout10to11.lua), in
//     script calls of bounded work: it marks the aggregate as converting, copies its records a
//     chunk at a time into the packed store with the fingerprints it computes here (the secret
//     stays out of the scripts), and finishes in one call once the store holds every record.
//     Meanwhile batches keep applying layout 10 to it and mirror each record they write into the
//     store, and garbage collection waits, so no record is lost or counted twice.
//  3. Once a whole pass over the namespace found nothing left in layout 10, the marker says
//     layout 11, and passes go on until one finds nothing again (an aggregate a lagging
//     processor created in layout 10 meanwhile).
//
// Every step can be interrupted and run again: the marker only moves forward, and converting an
// aggregate in layout 11 is a no-op.

//go:embed convert.lua
var convertLua string

//go:embed layout10to11.lua
var layout10to11Source string

var convertScript = redis.NewScript(packedRecordsSource + layout10to11Source + convertLua)

// compareAndSet sets KEYS[1] to ARGV[2] when it holds ARGV[1].
var compareAndSet = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('SET', KEYS[1], ARGV[2]) return 1 end
return 0`)

// convertChunk is how many record fields one copy call of a conversion takes: about 10 to 20 ms of
// Redis at 10 to 15 µs a record, during which the aggregate's batches wait.
const convertChunk = 1000

// MigrateProgress is what a migration has done so far.
type MigrateProgress struct {
	Namespace  string
	Epoch      string // the marker as the migration left it
	Passes     int    // passes over the namespace's aggregates
	Aggregates int    // aggregates visited, over all passes
	Converted  int    // aggregates converted from layout 10 to 11
	Records    int    // records they held
}

// Migrate moves the namespace in use under prefix from layout 10 to 11 online (see above) and
// returns what it did; progress, if set, is told after each pass. A namespace already in layout
// 11 gets one more pass, which converts nothing unless an earlier migration stopped before its
// last pass.
func Migrate(ctx context.Context, c redis.UniversalClient, prefix string, progress func(MigrateProgress)) (MigrateProgress, error) {
	if prefix == "" || strings.ContainsAny(prefix, "{}") {
		return MigrateProgress{}, fmt.Errorf("redis key prefix %q: want the installation's, without braces", prefix)
	}
	ns, err := current(ctx, c, prefix)
	if err != nil {
		return MigrateProgress{}, err
	}
	p := MigrateProgress{Namespace: ns}
	epoch, err := c.Get(ctx, EpochKey(ns)).Result()
	if errors.Is(err, redis.Nil) {
		return p, fmt.Errorf("no state under key prefix %q: %s holds no epoch marker (check redis.key_prefix, redis.db and the address)",
			prefix, EpochKey(ns))
	}
	if err != nil {
		return p, fmt.Errorf("read epoch of %s: %w", ns, err)
	}
	layout, ok := layoutOf(epoch)
	if !ok {
		return p, fmt.Errorf("%w: namespace %q has epoch marker %q, in no layout this build migrates", ErrStateLost, ns, epoch)
	}
	// Nothing moves before the migration is known to be able to finish: a marker moved by a
	// migration that cannot run (a user without SCAN, a server without the scripts' library) would
	// leave every call carrying both layouts until one that can.
	if err := migrationCanRun(ctx, c, ns); err != nil {
		return p, err
	}
	if layout == Layout10 {
		// The secret before the marker moves: a namespace made by a build older than fingerprints
		// has none, and a processor following the marker needs it (layout 10 never reads it). Once
		// the marker has moved, aggregates may be keyed by the secret: one gone means the state is
		// lost (OpenFingerprint below), not a namespace to give a new one.
		if err := ensureFingerprintSecret(ctx, c, ns); err != nil {
			return p, err
		}
		if epoch, err = moveEpoch(ctx, c, ns, epoch, Layout10To11); err != nil {
			return p, err
		}
		layout, _ = layoutOf(epoch)
	}
	p.Epoch = epoch
	fp, err := OpenFingerprint(ctx, c, ns)
	if err != nil {
		return p, err
	}
	for {
		converted, err := migratePass(ctx, c, fp, ns, &p)
		if err != nil {
			return p, err
		}
		if progress != nil {
			progress(p)
		}
		if converted > 0 {
			continue
		}
		if layout == Layout11 {
			return p, nil
		}
		if epoch, err = moveEpoch(ctx, c, ns, epoch, Layout11); err != nil {
			return p, err
		}
		layout, p.Epoch = Layout11, epoch
	}
}

// migrationCanRun runs, on nothing, every command a migration of namespace ns runs: SCAN on every
// primary, HSCAN, and the conversion script (which needs Redis's struct library, which the embedded
// server of `repeatrate dev` lacks).
func migrationCanRun(ctx context.Context, c redis.UniversalClient, ns string) error {
	keys := aggregateKeys(ns + ":{migration check}:")
	err := forEachPrimary(ctx, c, func(node redis.UniversalClient) error {
		return node.Scan(ctx, 0, globEscape(ns)+":{*}:s", 1).Err()
	})
	if err == nil {
		err = c.HScan(ctx, keys[0], 0, "", 1).Err()
	}
	if err == nil {
		var res []string
		if res, err = convertScript.Run(ctx, c, keys, "begin").StringSlice(); err == nil && (len(res) == 0 || res[0] != "absent") {
			err = fmt.Errorf("the conversion script answered %q on no aggregate", res)
		}
	}
	if err != nil {
		return fmt.Errorf("this Redis or user cannot run a migration (nothing changed): %w", err)
	}
	return nil
}

// moveEpoch moves namespace ns's marker from epoch to the same one in layout to, and returns it.
// It fails if the marker changed meanwhile (a rebuild retired the namespace, or it was lost).
func moveEpoch(ctx context.Context, c redis.UniversalClient, ns, epoch string, to Layout) (string, error) {
	from, _ := layoutOf(epoch)
	next := strings.TrimSuffix(epoch, from.suffix()) + to.suffix()
	set, err := compareAndSet.Run(ctx, c, []string{EpochKey(ns)}, epoch, next).Int()
	if err != nil {
		return "", fmt.Errorf("move epoch of %s to layout %d: %w", ns, int(to), err)
	}
	if set != 1 {
		// Another migration of the same namespace may have moved it first: carry on from there.
		cur, err := c.Get(ctx, EpochKey(ns)).Result()
		if err == nil && EpochFollows(next, cur) {
			return cur, nil
		}
		return "", fmt.Errorf("%w: epoch marker of %s changed during the migration (want %q, found %q)", ErrStateLost, ns, epoch, cur)
	}
	return next, nil
}

// migratePass visits every aggregate of namespace ns once, converting those in layout 10, and
// returns how many it converted.
func migratePass(ctx context.Context, c redis.UniversalClient, fp *Fingerprinter, ns string, p *MigrateProgress) (int, error) {
	converted := 0
	err := forEachPrimary(ctx, c, func(node redis.UniversalClient) error {
		iter := node.Scan(ctx, 0, globEscape(ns)+":{*}:s", 200).Iterator()
		for iter.Next(ctx) {
			base, ok := aggregateBase(ns, iter.Val())
			if !ok {
				continue
			}
			p.Aggregates++
			n, done, err := convertAggregate(ctx, c, fp, aggregateKeys(base))
			if err != nil {
				return err
			}
			if done {
				converted++
				p.Converted++
				p.Records += n
			}
		}
		return iter.Err()
	})
	p.Passes++
	return converted, err
}

// forEachPrimary calls fn with every node whose keys a SCAN must walk: each primary of a Redis
// Cluster (their keys are disjoint), one at a time, or c itself.
func forEachPrimary(ctx context.Context, c redis.UniversalClient, fn func(node redis.UniversalClient) error) error {
	cc, ok := c.(*redis.ClusterClient)
	if !ok {
		return fn(c)
	}
	var nodes []*redis.Client
	if err := cc.ForEachMaster(ctx, func(_ context.Context, n *redis.Client) error {
		nodes = append(nodes, n)
		return nil
	}); err != nil {
		return err
	}
	for _, n := range nodes {
		if err := fn(n); err != nil {
			return err
		}
	}
	return nil
}

// aggregateBase returns the prefix of an aggregate's keys from the key of its state hash, or false
// for a key of namespace ns that is not one (a suite's, the batch marks).
func aggregateBase(ns, key string) (string, bool) {
	id, ok := strings.CutPrefix(key, ns+":{")
	if !ok {
		return "", false
	}
	id, ok = strings.CutSuffix(id, "}:s")
	if !ok || id == "marks" || strings.ContainsAny(id, "{}") {
		return "", false
	}
	return ns + ":{" + id + "}:", true
}

// globEscape escapes the characters SCAN's MATCH treats as a pattern.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// convertAggregate converts the aggregate with keys (record hash, state hash, packed store, index
// groups) from layout 10 to 11 in calls of bounded work, and returns the records it moved and
// whether it converted it (false: it was in layout 11 already, or is gone).
func convertAggregate(ctx context.Context, c redis.UniversalClient, fp *Fingerprinter, keys []string) (int, bool, error) {
	a := &conversion{c: c, fp: fp, keys: keys, chunk: convertChunk}
	for !a.done {
		if err := a.step(ctx); err != nil {
			return 0, false, err
		}
	}
	return a.records, a.converted, nil
}

// conversion is one aggregate's conversion, a step (one script call) at a time: begin, copy the
// record hash a chunk at a time (HSCAN: every field present for the whole scan is returned; one
// written meanwhile is copied by the batch that wrote it), finish.
type conversion struct {
	c     redis.UniversalClient
	fp    *Fingerprinter
	keys  []string
	chunk int

	begun, scanned bool
	cursor         uint64
	copies         int // full copies of the record hash so far
	done           bool
	converted      bool
	records        int
}

func (a *conversion) step(ctx context.Context) error {
	switch {
	case !a.begun:
		res, err := a.run(ctx, "begin")
		if err != nil {
			return err
		}
		a.begun = true
		if res[0] != "begun" {
			a.done = true // in layout 11 already, or gone
		}
		return nil
	case !a.scanned:
		kv, cursor, err := a.c.HScan(ctx, a.keys[0], a.cursor, "", int64(a.chunk)).Result()
		if err != nil {
			return fmt.Errorf("read records of %s: %w", a.keys[0], err)
		}
		fields := make([]string, 0, len(kv)/2)
		for i := 0; i < len(kv); i += 2 {
			fields = append(fields, kv[i])
		}
		args := make([]any, 0, 1+2*len(fields))
		args = append(args, "copy")
		for _, f := range fields {
			args = append(args, f)
		}
		for _, f := range fields {
			if len(f) < 3 {
				return fmt.Errorf("record field %q of %s is no field of layout 10", f, a.keys[0])
			}
			args = append(args, string(a.fp.Append(nil, f[3:]))) // the id after its length in three hex digits
		}
		if _, err := a.run(ctx, args...); err != nil {
			return err
		}
		a.cursor = cursor
		a.scanned = cursor == 0
		return nil
	default:
		res, err := a.run(ctx, "finish")
		if err != nil {
			return err
		}
		switch res[0] {
		case "converted":
			a.done, a.converted = true, true
			if len(res) > 1 {
				a.records, _ = strconv.Atoi(res[1])
			}
		case "layout11", "absent":
			a.done = true
		case "short":
			// Fewer records copied than held: none can be missing by the rules above, so copy the
			// whole hash again once before giving up.
			a.copies++
			if a.copies > 1 {
				return fmt.Errorf("convert %s: the record hash holds %s records, the packed store %s after copying it twice",
					a.keys[1], res[1], res[2])
			}
			a.scanned, a.cursor = false, 0
		default:
			return fmt.Errorf("convert %s: reply %q", a.keys[1], res[0])
		}
		return nil
	}
}

func (a *conversion) run(ctx context.Context, args ...any) ([]string, error) {
	res, err := convertScript.Run(ctx, a.c, a.keys, args...).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("convert %s: %w", a.keys[1], err)
	}
	if len(res) == 0 {
		return nil, fmt.Errorf("convert %s: empty reply", a.keys[1])
	}
	return res, nil
}

// followEpoch moves the store to the mode epoch marker got names, a later step of the migration
// of its namespace than m's (EpochFollows).
func (r *Redis) followEpoch(ctx context.Context, m *applyMode, got string) error {
	l, _ := layoutOf(got)
	next := &applyMode{epoch: got}
	if l != Layout10 {
		next.fp = m.fp
		if next.fp == nil {
			fp, err := OpenFingerprint(ctx, r.client, r.cfg.Prefix)
			if err != nil {
				return err
			}
			next.fp = fp
		}
		next.both = l == Layout10To11
	}
	r.mode.CompareAndSwap(m, next)
	return nil
}

// convertStragglers converts the aggregates whose calls of layout 11 failed on a head of layout 10:
// aggregates that a processor still on layout 10 created after the migration's last pass began.
// The batch is then applied again (it failed); a conversion that fails leaves the next try the same.
func (r *Redis) convertStragglers(ctx context.Context, fp *Fingerprinter, e *Encoded, cmds []redis.Cmder) {
	if m := r.mode.Load(); m.epoch != "" {
		cmds = cmds[1:] // the epoch marker
	}
	if r.sealSeq > 0 {
		cmds = cmds[1:] // the batch mark
	}
	for n, k := range e.keys {
		if n < len(cmds) && cmds[n].Err() != nil && strings.Contains(cmds[n].Err().Error(), "no head of this layout") {
			convertAggregate(ctx, r.client, fp, e.redis[k])
		}
	}
}
