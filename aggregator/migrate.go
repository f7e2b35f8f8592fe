package aggregator

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// An online migration moves a namespace from state layout 10 to 11 while the processors keep
// running (docs/operations.md, "State layouts"):
//
//  1. Migrate moves the epoch marker from layout 10 to "10 → 11" (Layout10To11). A processor of
//     this build follows on its next batch (the per-batch epoch check, followEpoch): from then on
//     its calls carry every observation in both layouts, and the script applies the one its
//     aggregate's head says. A processor of an earlier build stops: the marker is not its own.
//  2. Migrate converts every aggregate whose head says 10, each in one script call (convert.lua)
//     with the fingerprints of its records, which it computes here: the secret never reaches
//     Redis. Being one call, a conversion falls wholly before or after any batch's call on the
//     aggregate, so no record is lost or counted twice; records written between the read of
//     the fields and the call are named by the script, and fingerprinted in another try.
//  3. Once a whole pass over the namespace found nothing left in layout 10, the marker says
//     layout 11, and passes go on until one finds nothing again (an aggregate a lagging
//     processor created in layout 10 meanwhile).
//
// Every step can be interrupted and run again: the marker only moves forward, and converting an
// aggregate in layout 11 is a no-op.

//go:embed convert.lua
var convertLua string

var convertScript = redis.NewScript(packedRecordsSource + convertLua)

// compareAndSet sets KEYS[1] to ARGV[2] when it holds ARGV[1].
var compareAndSet = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('SET', KEYS[1], ARGV[2]) return 1 end
return 0`)

// convertTries bounds the calls that converting one aggregate takes while processors keep adding
// records to it between the read of its fields and the call.
const convertTries = 20

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
	ns, err := current(ctx, c, prefix)
	if err != nil {
		return MigrateProgress{}, err
	}
	p := MigrateProgress{Namespace: ns}
	epoch, err := c.Get(ctx, EpochKey(ns)).Result()
	if err != nil {
		return p, fmt.Errorf("read epoch of %s: %w", ns, err)
	}
	layout, ok := layoutOf(epoch)
	if !ok {
		return p, fmt.Errorf("%w: namespace %q has epoch marker %q, in no layout this build migrates", ErrStateLost, ns, epoch)
	}
	if layout == Layout10 {
		if epoch, err = moveEpoch(ctx, c, ns, epoch, Layout10To11); err != nil {
			return p, err
		}
		layout = Layout10To11
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
		return "", fmt.Errorf("%w: epoch marker of %s changed during the migration (want %q)", ErrStateLost, ns, epoch)
	}
	return next, nil
}

// migratePass visits every aggregate of namespace ns once, converting those in layout 10, and
// returns how many it converted.
func migratePass(ctx context.Context, c redis.UniversalClient, fp *Fingerprinter, ns string, p *MigrateProgress) (int, error) {
	converted := 0
	visit := func(ctx context.Context, node redis.UniversalClient) error {
		iter := node.Scan(ctx, 0, globEscape(ns)+":{*}:s", 200).Iterator()
		for iter.Next(ctx) {
			base, ok := aggregateBase(ns, iter.Val())
			if !ok {
				continue
			}
			p.Aggregates++
			n, done, err := convertAggregate(ctx, c, fp, []string{base + "o", base + "s", base + "e", base + "z"})
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
	}
	var err error
	if cc, ok := c.(*redis.ClusterClient); ok {
		// SCAN walks one node: walk every primary (their keys are disjoint). Passes run one node
		// at a time, so p needs no lock.
		var nodes []*redis.Client
		err = cc.ForEachMaster(ctx, func(_ context.Context, n *redis.Client) error {
			nodes = append(nodes, n)
			return nil
		})
		for _, n := range nodes {
			if err == nil {
				err = visit(ctx, n)
			}
		}
	} else {
		err = visit(ctx, c)
	}
	p.Passes++
	return converted, err
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
// groups) from layout 10 to 11, and returns the records it moved and whether it converted it
// (false: it was in layout 11 already, or is gone).
func convertAggregate(ctx context.Context, c redis.UniversalClient, fp *Fingerprinter, keys []string) (int, bool, error) {
	var fields []string
	fps := map[string]string{}
	add := func(f string) {
		if _, ok := fps[f]; !ok && len(f) > 3 {
			fps[f] = string(fp.Append(nil, f[3:])) // the id after its length in three hex digits
			fields = append(fields, f)
		}
	}
	for try := 0; try < convertTries; try++ {
		args := make([]any, 0, 2*len(fields))
		for _, f := range fields {
			args = append(args, f)
		}
		for _, f := range fields {
			args = append(args, fps[f])
		}
		res, err := convertScript.Run(ctx, c, keys, args...).StringSlice()
		if err != nil {
			return 0, false, fmt.Errorf("convert %s: %w", keys[1], err)
		}
		switch res[0] {
		case "converted":
			n := 0
			if len(res) > 1 {
				fmt.Sscan(res[1], &n)
			}
			return n, true, nil
		case "layout11", "absent":
			return 0, false, nil
		case "missing":
			if try == 0 {
				// The first call names at most a few thousand: read them all.
				iter := c.HScan(ctx, keys[0], 0, "", 1000).Iterator()
				for i := 0; iter.Next(ctx); i++ {
					if i%2 == 0 {
						add(iter.Val())
					}
				}
				if err := iter.Err(); err != nil {
					return 0, false, fmt.Errorf("read records of %s: %w", keys[0], err)
				}
			}
			for _, f := range res[1:] {
				add(f)
			}
		default:
			return 0, false, fmt.Errorf("convert %s: reply %q", keys[1], res[0])
		}
	}
	return 0, false, errors.New("convert " + keys[1] + ": its records kept changing")
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
