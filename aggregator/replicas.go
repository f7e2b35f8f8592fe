package aggregator

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrReplicasBehind means fewer replicas than RedisConfig.WaitReplicas acknowledged a batch's
// writes in time: its offsets are not committed yet (docs/semantics.md#delivery).
var ErrReplicasBehind = errors.New("redis replicas did not acknowledge the writes")

// DefaultWaitTimeout is how long Verify waits for the replicas of each primary by default.
const DefaultWaitTimeout = time.Second

// Redis's WAIT counts the replicas that acknowledged the replication stream up to the last write
// of the connection it runs on. The stream is one per primary and in order, so a write sent just
// before WAIT on the same connection stands for every write that primary executed before it, from
// any connection. waitPrimaries does that on every primary that serves a chain of pending tokens
// (every shard a batch wrote) but the one of the batch marks, in parallel; Verify does it on the
// marks' primary in the pipeline that checks the mark.

// waitKey names the key whose write precedes WAIT on the shard of hash tag tag.
func (t *Pending) waitKey(prefix, tag string) string {
	return prefix + ":{" + tag + "}:wait:" + t.id
}

// shardKeys returns a key of every chain's shard, the marks' first.
func (t *Pending) shardKeys(prefix string) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	keys := make([]string, len(t.tags))
	for i, tag := range t.tags {
		keys[i] = t.waitKey(prefix, tag)
	}
	return keys
}

// waitPrimaries makes sure that every write so far on the primaries serving the chains of pending
// tokens, other than the primary of the batch marks, reached r.cfg.WaitReplicas replicas. On a
// single Redis there is nothing to do here: the marks' primary is the only one.
func (r *Redis) waitPrimaries(ctx context.Context) error {
	cc, ok := r.client.(*redis.ClusterClient)
	if !ok {
		return nil
	}
	keys := r.cfg.Pending.shardKeys(r.cfg.Prefix)
	marks, err := cc.MasterForKey(ctx, keys[0])
	if err != nil {
		return fmt.Errorf("find the primary of the batch marks: %w", err)
	}
	// Every primary is found before any WAIT starts, so a lookup error leaves nothing running.
	type target struct {
		node *redis.Client
		key  string
	}
	seen := map[string]bool{marks.Options().Addr: true}
	var targets []target
	for _, key := range keys[1:] {
		node, err := cc.MasterForKey(ctx, key)
		if err != nil {
			return fmt.Errorf("find the primary of %s: %w", key, err)
		}
		if addr := node.Options().Addr; !seen[addr] {
			seen[addr] = true
			targets = append(targets, target{node, key})
		}
	}
	errs := make([]error, len(targets))
	var wg sync.WaitGroup
	for i, t := range targets {
		wg.Go(func() {
			errs[i] = r.waitOn(ctx, t.node, func(p redis.Pipeliner) { p.Set(ctx, t.key, t.node.Options().Addr, time.Minute) })
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// waitOn runs write, which must write, then WAIT in one pipeline on node.
func (r *Redis) waitOn(ctx context.Context, node redis.Cmdable, write func(redis.Pipeliner)) error {
	var wait *redis.Cmd
	_, err := node.Pipelined(ctx, func(p redis.Pipeliner) error {
		write(p)
		wait = p.Do(ctx, "WAIT", r.cfg.WaitReplicas, r.waitMillis(ctx))
		return nil
	})
	if err := r.moved(ctx, node, err); err != nil {
		return err
	}
	if err != nil {
		return fmt.Errorf("wait for replicas: %w", err)
	}
	acked, _ := wait.Int64()
	return r.replicasAcked(node, acked, wait)
}

// waitMillis is WAIT's timeout in milliseconds: WaitTimeout, but no more than half the time left
// before ctx's deadline, so that the answer (and what Verify does after it) arrives in time — the
// client does not cut a blocked read short at the deadline, and an answer past it is an error,
// which the group takes for an unverified commit and consumes everything pending again — and at
// least 1 ms: WAIT 0 blocks until the replicas acknowledged, however long that takes.
func (r *Redis) waitMillis(ctx context.Context) int64 {
	d := r.cfg.WaitTimeout
	if deadline, ok := ctx.Deadline(); ok {
		d = min(d, time.Until(deadline)/2)
	}
	return max(1, d.Milliseconds())
}

// moved turns a pipeline error that says the slot is served elsewhere now (MOVED, ASK during a
// migration, TRYAGAIN) into ErrReplicasBehind after asking the cluster client to read the slot
// map again: the write and WAIT went to a node picked from a stale map, not through the cluster
// client, which would have followed the redirection. Nothing is lost (the keys moved with their
// slot, and the tokens, read through the cluster client, say so when not); the commit waits for
// the next try. Any other error, or none, is returned as nil.
func (r *Redis) moved(ctx context.Context, node redis.Cmdable, err error) error {
	if err == nil {
		return nil
	}
	_, isMoved := redis.IsMovedError(err)
	_, isAsk := redis.IsAskError(err)
	if !isMoved && !isAsk && !redis.IsTryAgainError(err) {
		return nil
	}
	if cc, ok := r.client.(*redis.ClusterClient); ok {
		cc.ReloadState(ctx)
	}
	addr := "redis"
	if c, ok := node.(*redis.Client); ok {
		addr = c.Options().Addr
	}
	return fmt.Errorf("%w: %s no longer serves the slot (%v); the slot map is read again", ErrReplicasBehind, addr, err)
}

func (r *Redis) replicasAcked(node redis.Cmdable, acked int64, wait *redis.Cmd) error {
	if acked >= int64(r.cfg.WaitReplicas) {
		return nil
	}
	addr := "redis"
	if c, ok := node.(*redis.Client); ok {
		addr = c.Options().Addr
	}
	timeout := r.cfg.WaitTimeout
	if args := wait.Args(); len(args) == 3 {
		ms, _ := args[2].(int64)
		timeout = time.Duration(ms) * time.Millisecond
	}
	return fmt.Errorf("%w: %s: %d of %d replicas within %v", ErrReplicasBehind, addr, acked, r.cfg.WaitReplicas, timeout)
}

// verifyAndWait runs the verify script and, when replicas are awaited, WAIT after it in the same
// pipeline on the marks' primary: the script records commits (a write), so the WAIT covers the
// record, the mark, and every write before them on that primary.
func (r *Redis) verifyAndWait(ctx context.Context, keys []string, args []any, wait bool) ([]any, error) {
	if !wait {
		return verifyScript.Run(ctx, r.client, keys, args...).Slice()
	}
	var node redis.Cmdable = r.client
	if cc, ok := r.client.(*redis.ClusterClient); ok {
		n, err := cc.MasterForKey(ctx, keys[0])
		if err != nil {
			return nil, fmt.Errorf("find the primary of the batch marks: %w", err)
		}
		node = n
	}
	// The script writes only when it records commits; a write of its own makes WAIT cover the
	// mark's primary either way.
	seq := strconv.FormatInt(r.sealSeq, 10)
	waitKey := r.cfg.Pending.waitKey(r.cfg.Prefix, marksTag)
	for attempt := 0; ; attempt++ {
		var res *redis.Cmd
		var wait *redis.Cmd
		_, err := node.Pipelined(ctx, func(p redis.Pipeliner) error {
			res = verifyScript.EvalSha(ctx, p, keys, args...)
			p.Set(ctx, waitKey, seq, time.Minute)
			wait = p.Do(ctx, "WAIT", r.cfg.WaitReplicas, r.waitMillis(ctx))
			return nil
		})
		if err := r.moved(ctx, node, err); err != nil {
			return nil, err
		}
		if err != nil && isNoScript(res.Err()) && attempt == 0 {
			if err := verifyScript.Load(ctx, node).Err(); err != nil {
				return nil, err
			}
			continue
		}
		if err != nil {
			return nil, err
		}
		vals, err := res.Slice()
		if err != nil {
			return nil, err
		}
		if ok, _ := vals[0].(int64); ok == 1 {
			acked, _ := wait.Int64()
			if err := r.replicasAcked(node, acked, wait); err != nil {
				return nil, err
			}
		}
		return vals, nil
	}
}
