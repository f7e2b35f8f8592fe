package aggregator

import (
	"cmp"
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/repeatrate/repeatrate/schemas"
)

//go:embed apply.lua
var applyLua string

// applySource is the apply script as Redis runs it: the packed record store layout 11 keeps its
// records in, what converting an aggregate to layout 11 takes (a migration's calls mirror their
// writes), then apply.lua.
var applySource = packedRecordsSource + layout10to11Source + applyLua

var applyScript = redis.NewScript(applySource)

//go:embed store.lua
var storeLua string

// storeScript stores a call the processor computed (computed.go), or refuses it.
var storeScript = redis.NewScript(storeLua)

// MaxFutureSkew is the most an event's occurred_at may lie ahead of the observer's clock: the
// apply script keeps minute buckets for 70 minutes behind the newest event, the 1h window plus
// this much skew, so a larger skew would drop buckets the 1h window still covers.
const MaxFutureSkew = 10 * time.Minute

// Applied is the result of applying one batch: each observation's outcome, in input order, and the
// tally of every aggregate the batch touched, in order of first appearance.
type Applied struct {
	Outcomes []Outcome
	Keys     []Key
	Tallies  map[Key]Tally
}

// RedisConfig configures a Redis store.
type RedisConfig struct {
	// Prefix starts every key, so several deployments (or a rebuild) can share one Redis.
	Prefix string
	// Retention is how long an opportunity identity is kept behind its aggregate's newest event.
	Retention time.Duration
	// IdleTTL drops an aggregate's keys after this long without any event (wall clock); 0 keeps
	// them forever. It defaults to Retention.
	IdleTTL time.Duration
	// Epoch, when set, is checked with every batch: a Redis whose epoch marker is gone or
	// different has lost the state, and Apply fails with ErrStateLost.
	Epoch string
	// Group names the consumer group whose commits Verify records beside the state, so that a
	// later process can tell when the group committed work this Redis no longer holds
	// (CheckOffsets). Empty records nothing.
	Group string
	// Pending is the chain of pending tokens that every store writing a batch shares, so that Seal
	// can tell that all of the batch's writes survived (docs/semantics.md#delivery). The rates
	// store makes one of its own when it is nil; a suite store writes none then.
	Pending *Pending
	// WaitReplicas, when positive, makes Verify wait until that many replicas of every primary
	// the batches wrote acknowledged the writes (Redis WAIT), for at most WaitTimeout
	// (DefaultWaitTimeout when 0) per primary; fewer is ErrReplicasBehind and no commit.
	WaitReplicas int
	WaitTimeout  time.Duration

	// Fingerprint, when set, makes the store keep state layout 11 under its fingerprints: set it
	// (OpenFingerprint) exactly when the namespace is in layout 11 or migrating to it
	// (State.Layout). A call of one layout on an aggregate of the other is refused.
	Fingerprint *Fingerprinter

	// ComputeCalls makes the processor compute the commonest calls itself (new records,
	// duplicates and reassessments in place, computed.go; layout 11's too, computed11.go) and
	// store them through store.lua, which checks that nothing it read changed, instead of running
	// apply.lua on Redis's one thread. It costs a second round trip per batch that has such calls
	// (in layout 11 a third for calls whose store's shape the processor did not expect).
	ComputeCalls bool
	// BucketCacheBytes bounds what the processor holds of layout 11's buckets in place of reading
	// them again (bucketCache): DefaultBucketCacheBytes when 0. Past it the buckets of other
	// aggregates are forgotten whole, and a call on them reads them from Redis again.
	BucketCacheBytes int64
}

// applyMode is how a store encodes its calls, by the epoch marker it last found: layout 10's
// records (fp nil), layout 11's, or both while the namespace migrates (both).
type applyMode struct {
	epoch string
	fp    *Fingerprinter
	both  bool
}

// Validate checks the configuration and fills defaults.
func (c *RedisConfig) Validate() error {
	if c.Prefix == "" {
		c.Prefix = "rr"
	}
	if strings.ContainsAny(c.Prefix, "{}") {
		return fmt.Errorf("redis key prefix %q must not contain braces", c.Prefix)
	}
	if c.Retention <= 0 {
		return errors.New("retention must be positive")
	}
	if c.IdleTTL == 0 {
		c.IdleTTL = c.Retention
	}
	if c.WaitReplicas < 0 || c.WaitTimeout < 0 {
		return errors.New("redis wait_replicas and wait_timeout must not be negative")
	}
	if c.WaitTimeout == 0 {
		c.WaitTimeout = DefaultWaitTimeout
	}
	if c.BucketCacheBytes < 0 {
		return errors.New("redis bucket_cache_bytes must not be negative")
	}
	if c.BucketCacheBytes == 0 {
		c.BucketCacheBytes = DefaultBucketCacheBytes
	}
	return nil
}

// Redis is the durable store: the rules of Model applied by one Lua script per aggregate and batch.
// Every key of an aggregate (records, state, id index) shares the hash tag {<key>}, so
// the script runs on Redis Cluster.
type Redis struct {
	client redis.UniversalClient
	cfg    RedisConfig

	sealMu   sync.Mutex
	sealKey  string
	sealSeq  int64 // the last batch mark written
	verified int64 // the last batch mark Verify confirmed before a commit
	sealed   []sealedTokens

	// mode follows the namespace's migration from layout 10 to 11 (followEpoch).
	mode atomic.Pointer[applyMode]

	// computedStored and computedRefused count the calls the processor computed that the store
	// wrote, and those it refused (ComputedCalls).
	computedStored, computedRefused atomic.Int64
	// offPath and unread count the calls left to apply.lua with compute on: read or planned and
	// off the path, and in batches left unread (ComputedCallsLeft).
	offPath, unread atomic.Int64
	// skipReads is how many batches from now on are left to apply.lua unread: the last batch read
	// mostly records of calls the processor could not compute (readBatch). Guarded by sealMu.
	skipReads int
	// misses is how many batches read in a row computed fewer than half the records read
	// (readBatch). Guarded by sealMu.
	misses int
	// shapes is, per aggregate of layout 11, the packed store's shape as this processor expects
	// to find it in the head (computed11.go, shapeCache). Guarded by sealMu.
	shapes shapeCache
	// sums is, per aggregate, the minute its window sums are for as this processor's last stored
	// call on it left them (sumsMinutes). Guarded by sealMu.
	sums sumsMinutes
	// buckets holds, per aggregate of layout 11, buckets of its packed store as this processor's
	// stored calls read and left them (bucketCache). Guarded by sealMu.
	buckets bucketCache
	// tokens makes the tokens of layout 11's computed calls (bucketsToken): newToken unless a
	// test's.
	tokens func() string
	// bucketsRead and bucketsCached count the buckets layout-11 calls read from Redis for the
	// computation and those they took from the bucket cache in their place (BucketReads).
	bucketsRead, bucketsCached atomic.Int64
	// secondReads counts layout-11 calls whose buckets took a second round trip: no shape was
	// cached for the aggregate, the head said another, or the cached buckets' token and stamp
	// were not those Redis held.
	secondReads atomic.Int64
	// storeLoaded says that store.lua was loaded once: Redis loses it only with apply.lua.
	storeLoaded atomic.Bool
	// chunkCalls, when set, is the fewest calls a chunk holds in place of minChunkCalls: a test's.
	chunkCalls int
	// parallelFrom, when set, is the fewest records a chunk's calls hold to be computed side by
	// side, in place of minParallelRecords: a test's.
	parallelFrom int
	// afterRead, when set, runs between computeCalls's read of a chunk and its store: a test's
	// other writer.
	afterRead func()
}

// NewRedis returns a store on client.
func NewRedis(client redis.UniversalClient, cfg RedisConfig) (*Redis, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Pending == nil {
		cfg.Pending = NewPending()
	}
	r := &Redis{client: client, cfg: cfg, tokens: newToken}
	r.buckets.max = cfg.BucketCacheBytes
	l, _ := layoutOf(cfg.Epoch)
	r.mode.Store(&applyMode{epoch: cfg.Epoch, fp: cfg.Fingerprint, both: l == Layout10To11 && cfg.Fingerprint != nil})
	return r, nil
}

// keys returns the keys of aggregate k: layout 10's record hash, the state hash, layout 11's packed
// record store and the sorted set of the index groups that list ids (apply.lua's KEYS).
func (r *Redis) keys(k Key) []string {
	return aggregateKeys(r.cfg.Prefix + ":{" + k.String() + "}:")
}

// aggregateKeys returns the keys of the aggregate whose keys all start with base, in the order
// the apply script takes them.
func aggregateKeys(base string) []string {
	return []string{base + "o", base + "s", base + "e", base + "z"}
}

// Apply applies obs in order, one script call per aggregate, in pipelined round trips, and
// returns outcomes and tallies as observed at time at. A call that fails may have been applied in
// part or whole; calling it again with the same observations is always safe. It is Encode and
// ApplyEncoded in a row.
func (r *Redis) Apply(ctx context.Context, obs []Observation, at time.Time) (Applied, error) {
	return r.ApplyEncoded(ctx, r.Encode(obs), at)
}

// Encoded is a batch of observations grouped by aggregate and encoded as the apply script takes
// them, made by Encode without any I/O, so that the processor can do it while Redis applies the
// batch before (docs/semantics.md#delivery).
type Encoded struct {
	mode   *applyMode // the store's mode when it was encoded: another one encodes it again
	obs    []Observation
	groups map[Key][]int
	keys   []Key
	redis  map[Key][]string // each aggregate's Redis keys
	args   map[Key][]any    // each aggregate's script arguments; the first three are ApplyEncoded's
	err    error            // why obs cannot be applied, returned by ApplyEncoded
}

// headArgs is how many script arguments ApplyEncoded fills in: retention, observation time, TTL.
const headArgs = 3

// Encode groups obs by aggregate and encodes them for ApplyEncoded. An observation that cannot be
// stored makes ApplyEncoded fail, as Apply would.
func (r *Redis) Encode(obs []Observation) *Encoded {
	return r.encode(r.mode.Load(), obs)
}

func (r *Redis) encode(m *applyMode, obs []Observation) *Encoded {
	groups, keys := groupByKey(obs)
	e := &Encoded{mode: m, obs: obs, groups: groups, keys: keys}
	var fields, recs, fps, fprecs []string
	var err error
	if m.fp == nil || m.both {
		if fields, err = recordFields(obs); err == nil {
			recs = encodeRecords(obs)
		}
	}
	if err == nil && m.fp != nil {
		fps, fprecs, err = encodeFingerprinted(m.fp, obs)
	}
	if err != nil {
		e.err = err
		return e
	}
	if m.fp != nil && !m.both {
		fields, recs = fps, fprecs
	}
	e.redis, e.args = make(map[Key][]string, len(keys)), make(map[Key][]any, len(keys))
	for _, k := range keys {
		idx := groups[k]
		size := headArgs + 2*len(idx)
		if m.both {
			size = headArgs + 4*len(idx) + 1
		}
		args := make([]any, headArgs, size)
		for _, i := range idx {
			args = append(args, fields[i])
		}
		for _, i := range idx {
			args = append(args, recs[i])
		}
		if m.both {
			// A migration call (apply.lua): layout 11's half after layout 10's, then one more.
			for _, i := range idx {
				args = append(args, fps[i])
			}
			for _, i := range idx {
				args = append(args, fprecs[i])
			}
			args = append(args, "both")
		}
		e.redis[k], e.args[k] = r.keys(k), args
	}
	return e
}

// ApplyEncoded applies a batch Encode made, as Apply applies the observations it was made of.
func (r *Redis) ApplyEncoded(ctx context.Context, e *Encoded, at time.Time) (Applied, error) {
	return r.ApplyEncodedWith(ctx, e, at, nil)
}

// Companion is another store's part of a batch, written in the same pipeline as the batch's
// observations (the last, when the batch is stored in chunks) so that both reach Redis in one round
// trip instead of two (suite.Redis makes one for graded runs). The companion shares this store's
// client, namespace and epoch.
type Companion interface {
	// Queue adds the companion's commands to p, after the observations' scripts and before the
	// pending token, which then vouches for its writes too, and returns the keys they write.
	Queue(ctx context.Context, p redis.Pipeliner) (written []string)
	// Finish reads the replies of the commands Queue added, once the pipeline ran and the epoch
	// and the batch mark were found intact.
	Finish() error
	// Load loads the companion's scripts into a Redis that has none (after a restart).
	Load(ctx context.Context) error
}

// ApplyEncodedWith is ApplyEncoded with c's commands in the same pipeline (c may be nil). Either
// part failing fails the call; both are idempotent, so a retry applies both again.
func (r *Redis) ApplyEncodedWith(ctx context.Context, e *Encoded, at time.Time, c Companion) (Applied, error) {
	res, refused, err := r.applyEncoded(ctx, e, at, c, r.cfg.ComputeCalls)
	if err != nil || len(refused) == 0 {
		return res, err
	}
	// The calls not applied: store.lua refused them (another writer changed their aggregates
	// after they were read, or the TTL stamp fell due), or Redis had lost the script. Nothing of
	// them was written; apply.lua runs them on the state as it is now.
	var obs []Observation
	var from []int // each of obs's index in e.obs
	for _, k := range refused {
		for _, i := range e.groups[k] {
			obs, from = append(obs, e.obs[i]), append(from, i)
		}
	}
	again, _, err := r.applyEncoded(ctx, r.Encode(obs), at, nil, false)
	if err != nil {
		return Applied{}, err
	}
	for j, i := range from {
		res.Outcomes[i] = again.Outcomes[j]
	}
	for k, t := range again.Tallies {
		res.Tallies[k] = t
	}
	return res, nil
}

// applyEncoded applies e, each call by apply.lua or, with compute, by store.lua where the processor
// computed it (computeCalls): in one pipeline, or with the computation on in chunks of its
// aggregates (Encoded.chunks), one pipeline each, the processor computing each chunk while Redis
// stores the one before. It returns the aggregates whose computed calls the store refused, which
// it did not apply.
func (r *Redis) applyEncoded(ctx context.Context, e *Encoded, at time.Time, c Companion, compute bool) (Applied, []Key, error) {
	m := r.mode.Load()
	if e.mode != m {
		// The namespace moved on in its migration since e was encoded.
		e = r.encode(m, e.obs)
	}
	if e.err != nil {
		return Applied{}, nil, e.err
	}
	head := [headArgs]any{
		strconv.FormatInt(int64(r.cfg.Retention/time.Microsecond), 10),
		strconv.FormatInt(Micros(at), 10),
		strconv.FormatInt(r.cfg.IdleTTL.Milliseconds(), 10),
	}
	for _, k := range e.keys {
		copy(e.args[k], head[:])
	}
	r.sealMu.Lock()
	defer r.sealMu.Unlock()
	res := Applied{Outcomes: make([]Outcome, len(e.obs)), Keys: e.keys, Tallies: make(map[Key]Tally, len(e.keys))}
	read := compute && !m.both
	if read && !r.readNext() {
		read = false
		r.unread.Add(int64(len(e.keys)))
	}
	// The chunks are stored one after another, each in a pipeline of its own; while Redis runs
	// one, the processor reads and computes the next (aggregates of different chunks are
	// disjoint, so neither's reads see the other's writes).
	chunks := []*Encoded{e}
	if read {
		chunks = e.chunks(cmp.Or(r.chunkCalls, minChunkCalls))
	}
	readAll, hitAll, prepared := 0, 0, 0
	prepare := func(ch *Encoded) map[Key]*computedCall {
		if !read {
			return nil
		}
		cc, n, hit := r.computeCalls(ctx, ch, at, m.fp != nil)
		r.offPath.Add(int64(len(ch.keys) - len(cc)))
		if r.afterRead != nil {
			r.afterRead()
		}
		readAll, hitAll, prepared = readAll+n, hitAll+hit, prepared+1
		if prepared == len(chunks) {
			r.readBatch(readAll, hitAll)
		}
		return cc
	}
	computed := prepare(chunks[0])
	var refused []Key
	for i, ch := range chunks {
		cc := c
		if i < len(chunks)-1 {
			cc = nil // the companion's writes go with the last chunk
		}
		var s storeSent
		var next map[Key]*computedCall
		if i+1 < len(chunks) {
			sent := make(chan storeSent, 1)
			go func() { sent <- r.sendChunk(ctx, m, ch, computed, cc, c, compute) }()
			next = prepare(chunks[i+1])
			s = <-sent // the goroutine has ended
		} else {
			s = r.sendChunk(ctx, m, ch, computed, cc, c, compute)
		}
		ref, err := r.finishChunk(ctx, m, ch, computed, cc, s, &res, floorDiv(Micros(at), minuteUS))
		if err != nil {
			return Applied{}, nil, err
		}
		refused = append(refused, ref...)
		computed = next
	}
	if c != nil {
		if err := c.Finish(); err != nil {
			return Applied{}, nil, err
		}
	}
	return res, refused, nil
}

// minChunkCalls is the fewest calls a chunk of a batch holds (Encoded.chunks), and maxChunks the
// most chunks: each costs a round trip and the pipeline's own reads and token, and a chunk's
// computation overlaps only the store of the chunk before it.
const (
	minChunkCalls = 64
	maxChunks     = 4
)

// chunks splits e's calls into up to maxChunks batches of consecutive aggregates, each of at
// least minCalls calls, sharing e's observations.
func (e *Encoded) chunks(minCalls int) []*Encoded {
	n := min(maxChunks, max(1, len(e.keys)/minCalls))
	if n == 1 {
		return []*Encoded{e}
	}
	out := make([]*Encoded, n)
	for i := range out {
		ch := *e
		ch.keys = e.keys[i*len(e.keys)/n : (i+1)*len(e.keys)/n]
		out[i] = &ch
	}
	return out
}

// storeSent is what a chunk's store pipeline answered (sendChunk): the commands, the pipeline's
// error and the pending token's own, the calls Redis refused for a missing script (they wrote
// nothing), and an error that fails the batch before its answers are read.
type storeSent struct {
	cmds      []redis.Cmder
	err, terr error
	unrun     map[Key]bool
	fatal     error
	marked    bool // the pipeline read the batch mark
}

// sendChunk sends the pipeline that stores chunk e: each call by apply.lua or, where the
// processor computed it, by store.lua, then the companion's writes and the pending token. The
// batch mark is read ahead of the scripts in the same pipeline: a Redis that lost recent writes is
// found before any tally computed on the lost state is published. When Redis had lost the scripts
// it loads them again, the batch's companion's (batch) too, whichever chunk carries its writes. It
// touches no state of r that the next chunk's computation does. The caller holds sealMu.
func (r *Redis) sendChunk(ctx context.Context, m *applyMode, e *Encoded, computed map[Key]*computedCall, c, batch Companion, compute bool) storeSent {
	keys, markKey, mark := e.keys, r.sealKey, r.sealSeq
	// run sends the pipeline; terr is the pending token's own check (Pending.Append).
	run := func() (cmds []redis.Cmder, err, terr error) {
		token := func() error { return nil }
		defer func() { terr = token() }()
		cmds, err = r.cfg.Pending.Writer(r.client).Pipelined(ctx, func(p redis.Pipeliner) error {
			if m.epoch != "" {
				p.Get(ctx, EpochKey(r.cfg.Prefix))
			}
			if mark > 0 {
				p.Get(ctx, markKey)
			}
			for _, k := range keys {
				if cc := computed[k]; cc != nil {
					records := e.redis[k][0]
					if m.fp != nil {
						records = e.redis[k][2] // layout 11's packed store
					}
					storeScript.EvalSha(ctx, p, []string{e.redis[k][1], records}, cc.args...)
				} else {
					applyScript.EvalSha(ctx, p, e.redis[k], e.args[k]...)
				}
			}
			written := make([]string, len(keys))
			for i, k := range keys {
				written[i] = e.redis[k][0]
			}
			if c != nil {
				written = append(written, c.Queue(ctx, p)...)
			}
			// Last, after every write of the pipeline; its reply is not among cmds' first len(keys).
			token = r.cfg.Pending.Append(ctx, r.client, p, r.cfg.Prefix, written)
			return nil
		})
		return cmds, err, nil
	}
	s := storeSent{marked: mark > 0}
	s.cmds, s.err, s.terr = run()
	from := 0 // the first script call's index in cmds
	if m.epoch != "" {
		from++
	}
	if mark > 0 {
		from++
	}
	if s.err == nil || !isNoScript(s.err) {
		return s
	}
	// A restarted or new Redis has no scripts loaded: load them, and run the chunk again when none
	// of its calls ran.
	if lerr := applyScript.Load(ctx, r.client).Err(); lerr != nil {
		s.fatal = fmt.Errorf("load apply script: %w", lerr)
		return s
	}
	if compute {
		if lerr := storeScript.Load(ctx, r.client).Err(); lerr != nil {
			s.fatal = fmt.Errorf("load store script: %w", lerr)
			return s
		}
		r.storeLoaded.Store(true)
	}
	if batch != nil {
		if lerr := batch.Load(ctx); lerr != nil {
			s.fatal = lerr
			return s
		}
	}
	switch {
	case !ranAny(s.cmds, from, len(keys)):
		s.cmds, s.err, s.terr = run()
	case c == nil:
		// Only some scripts were missing (another process loaded apply.lua alone after a
		// restart): the calls that ran stand, and those Redis refused wrote nothing and run
		// again through apply.lua (ApplyEncodedWith), as a refused store does.
		s.unrun = make(map[Key]bool)
		for n, k := range keys {
			if isNoScript(s.cmds[from+n].Err()) {
				s.unrun[k] = true
			}
		}
		s.err = nil
		for i, cmd := range s.cmds {
			if cerr := cmd.Err(); cerr != nil && !errors.Is(cerr, redis.Nil) && !(i >= from && i < from+len(keys) && isNoScript(cerr)) {
				s.err = cerr
				break
			}
		}
	default:
		// A companion's commands cannot be told apart here: the batch fails as a call that
		// may be applied in part does, and its retry finds every script loaded.
		s.fatal = fmt.Errorf("apply batch: scripts were missing from Redis and are loaded now; apply the batch again: %w", s.err)
	}
	return s
}

// finishChunk reads what chunk e's store pipeline answered (sendChunk) into res: each call's
// outcomes and tally. It returns the aggregates whose computed calls were not stored (store.lua
// refused them, or Redis had lost the script), which wrote nothing. Every call stored leaves its
// aggregate's window sums for minute, the observation time's (sumsMinutes). The caller holds
// sealMu.
func (r *Redis) finishChunk(ctx context.Context, m *applyMode, e *Encoded, computed map[Key]*computedCall, c Companion, s storeSent, res *Applied, minute int64) ([]Key, error) {
	if s.fatal != nil {
		return nil, s.fatal
	}
	cmds, err, unrun := s.cmds, s.err, s.unrun
	if err == nil {
		err = s.terr
	}
	if m.epoch != "" && len(cmds) > 0 {
		// The marker first, even when a script failed: a namespace that is not this build's state
		// (lost, replaced, or written in another layout) explains a script's error on it, and
		// must stop the processor as lost state, not be retried. A namespace that moved on in its
		// migration to layout 11 is followed, and the batch applied again in the new mode.
		got, gerr := cmds[0].(*redis.StringCmd).Result()
		if (gerr == nil || errors.Is(gerr, redis.Nil)) && got != m.epoch {
			if !EpochFollows(m.epoch, got) {
				return nil, fmt.Errorf("%w: epoch marker of namespace %q is %q, want %q; run `repeatrate rebuild`",
					ErrStateLost, r.cfg.Prefix, got, m.epoch)
			}
			if ferr := r.followEpoch(ctx, m, got); ferr != nil {
				return nil, ferr
			}
			if err != nil {
				// A call of the old mode on an aggregate converted since, refused, so unwritten.
				return nil, fmt.Errorf("namespace %q moved on in its migration to layout 11 (epoch %q): apply the batch again: %w",
					r.cfg.Prefix, got, err)
			}
			// Every call was applied in the layout its aggregate's head says: the replies stand.
		}
	}
	if err != nil && !errors.Is(err, redis.Nil) {
		if m.fp != nil && !m.both {
			r.convertStragglers(ctx, m.fp, e, cmds)
		}
		return nil, fmt.Errorf("apply batch: %w", err)
	}
	if m.epoch != "" {
		cmds = cmds[1:]
	}
	if s.marked {
		got, _ := cmds[0].(*redis.StringCmd).Result()
		if err := r.checkMark(ctx, got); err != nil {
			return nil, err
		}
		cmds = cmds[1:]
	}
	var refused []Key
	for n, k := range e.keys {
		if unrun[k] {
			refused = append(refused, k)
			if computed[k] != nil {
				r.computedRefused.Add(1)
			}
			continue
		}
		if cc := computed[k]; cc != nil {
			stored, stamp, err := storeReply(cmds[n].(*redis.Cmd))
			if err != nil {
				return nil, fmt.Errorf("store %s: %w", k, err)
			}
			if !stored {
				refused = append(refused, k)
				r.computedRefused.Add(1)
				r.buckets.drop(k)
				continue
			}
			r.computedStored.Add(1)
			r.sums.put(k, minute)
			if cc.shape != nil {
				r.shapes.put(k, *cc.shape)
			}
			if cc.buckets != nil {
				r.buckets.keep(k, cc.readStamp, cc.readToken, cmp.Or(stamp, cc.readStamp), cc.token, cc.buckets.buckets)
			}
			for j, i := range e.groups[k] {
				res.Outcomes[i] = cc.outcomes[j]
			}
			res.Tallies[k] = cc.tally
			continue
		}
		vals, err := cmds[n].(*redis.Cmd).Slice()
		if err != nil {
			return nil, fmt.Errorf("apply %s: %w", k, err)
		}
		t, outs, err := parseReply(vals)
		if err != nil {
			return nil, fmt.Errorf("apply %s: %w", k, err)
		}
		idx := e.groups[k]
		if len(outs) != len(idx) {
			return nil, fmt.Errorf("apply %s: %d outcomes for %d observations", k, len(outs), len(idx))
		}
		counted := int64(0)
		for j, i := range idx {
			res.Outcomes[i] = outs[j]
			if outs[j] == Counted {
				counted++
			}
		}
		if m.fp != nil && !m.both {
			r.shapes.grow(k, counted)
		}
		r.buckets.drop(k) // apply.lua made a new stamp if it wrote a bucket
		if r.cfg.ComputeCalls {
			r.sums.put(k, minute) // for the computation only
		}
		res.Tallies[k] = t
	}
	return refused, nil
}

// storeReply reads store.lua's reply: whether it stored the call, and the buckets' new write stamp
// when it made one.
func storeReply(cmd *redis.Cmd) (stored bool, stamp string, err error) {
	v, err := cmd.Result()
	if err != nil {
		return false, "", err
	}
	switch v := v.(type) {
	case int64:
		if v == 0 || v == 1 {
			return v == 1, "", nil
		}
	case string:
		if v != "" {
			return true, v, nil
		}
	}
	return false, "", fmt.Errorf("store.lua replied %v", v)
}

// ranAny reports whether any of the n script calls from cmds[from] ran (was not refused as a script
// Redis did not hold).
func ranAny(cmds []redis.Cmder, from, n int) bool {
	if from < 0 || from+n > len(cmds) {
		return true // not the pipeline's shape: assume the worst
	}
	for _, c := range cmds[from : from+n] {
		if !isNoScript(c.Err()) {
			return true
		}
	}
	return false
}

// Tally reads the state of aggregate k as observed at time at, changing nothing.
func (r *Redis) Tally(ctx context.Context, k Key, at time.Time) (Tally, error) {
	args := []any{
		strconv.FormatInt(int64(r.cfg.Retention/time.Microsecond), 10),
		strconv.FormatInt(Micros(at), 10), "0",
	}
	vals, err := applyScript.Run(ctx, r.client, r.keys(k), args...).Slice()
	if err != nil {
		return Tally{}, fmt.Errorf("read %s: %w", k, err)
	}
	t, _, err := parseReply(vals)
	return t, err
}

// encodeRecords returns the script argument of each observation besides its id: its record as
// the script stores it, "<class><occurred hex>,<assessed hex>[,<seq hex>]", from which the script
// also reads the occurred time. All are slices of one string, one allocation per batch. Times are
// validated to 1970..2200, so every value is non-negative and exact in Lua's doubles.
func encodeRecords(obs []Observation) []string {
	buf := make([]byte, 0, len(obs)*32)
	ends := make([]int, 0, len(obs))
	for i := range obs {
		o := &obs[i]
		buf = append(buf, classCode(o.Class))
		buf = strconv.AppendInt(buf, o.Occurred, 16)
		buf = append(buf, ',')
		buf = strconv.AppendInt(buf, o.Assessed, 16)
		if o.Seq != 0 {
			buf = append(buf, ',')
			buf = strconv.AppendInt(buf, o.Seq, 16)
		}
		ends = append(ends, len(buf))
	}
	s := string(buf)
	recs := make([]string, len(obs))
	from := 0
	for i := range obs {
		recs[i] = s[from:ends[i]]
		from = ends[i]
	}
	return recs
}

// maxIDBytes is the longest opportunity id a record field can hold: its length is written in three
// hex digits. Identity fields are limited to 512 bytes (docs/semantics.md#limits).
const maxIDBytes = 0xfff

// recordFields returns each observation's field in the record hash: the id after its length in
// three hex digits, so that the id index can list fields back to back and split them again whatever
// bytes they hold. All are slices of one string.
func recordFields(obs []Observation) ([]string, error) {
	size := 0
	for i := range obs {
		if n := len(obs[i].OpportunityID); n > maxIDBytes {
			return nil, fmt.Errorf("opportunity id of %d bytes: at most %d can be stored", n, maxIDBytes)
		}
		size += 3 + len(obs[i].OpportunityID)
	}
	buf := make([]byte, 0, size)
	for i := range obs {
		id := obs[i].OpportunityID
		buf = append(buf, hexDigits[len(id)>>8], hexDigits[len(id)>>4&0xf], hexDigits[len(id)&0xf])
		buf = append(buf, id...)
	}
	s := string(buf)
	out := make([]string, len(obs))
	from := 0
	for i := range obs {
		to := from + 3 + len(obs[i].OpportunityID)
		out[i] = s[from:to]
		from = to
	}
	return out, nil
}

const hexDigits = "0123456789abcdef"

func isNoScript(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
}

func groupByKey(obs []Observation) (map[Key][]int, []Key) {
	groups := make(map[Key][]int)
	var keys []Key
	for i := range obs {
		k := obs[i].Key
		if _, ok := groups[k]; !ok {
			keys = append(keys, k)
		}
		groups[k] = append(groups[k], i)
	}
	return groups, keys
}

func classCode(c Class) byte {
	switch c {
	case Confirmed:
		return 'C'
	case Passed:
		return 'P'
	}
	return 'U'
}

var outcomeCodes = map[byte]Outcome{'N': Counted, 'R': Reassessed, 'D': Duplicate, 'S': Stale, 'E': Expired}

func parseReply(vals []any) (Tally, []Outcome, error) {
	if len(vals) != 16 {
		return Tally{}, nil, fmt.Errorf("apply script returned %d values, want 16", len(vals))
	}
	codes, _ := vals[0].(string)
	outs := make([]Outcome, len(codes))
	for i := 0; i < len(codes); i++ {
		o, ok := outcomeCodes[codes[i]]
		if !ok {
			return Tally{}, nil, fmt.Errorf("apply script returned outcome %q", codes[i])
		}
		outs[i] = o
	}
	ints := make([]int64, 13)
	for i := range ints {
		n, ok := vals[1+i].(int64)
		if !ok {
			return Tally{}, nil, fmt.Errorf("apply script value %d is %T, want integer", 1+i, vals[1+i])
		}
		ints[i] = n
	}
	t := Tally{
		Version: ints[0],
		All:     Counts{ints[1], ints[2], ints[3]},
		Hour:    Counts{ints[4], ints[5], ints[6]},
		Day:     Counts{ints[7], ints[8], ints[9]},
		Week:    Counts{ints[10], ints[11], ints[12]},
	}
	var err error
	if t.First, err = parseScore(vals[14]); err != nil {
		return Tally{}, nil, err
	}
	if t.Last, err = parseScore(vals[15]); err != nil {
		return Tally{}, nil, err
	}
	return t, outs, nil
}

func parseScore(v any) (int64, error) {
	s, _ := v.(string)
	if s == "" {
		return 0, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("apply script returned score %q: %w", s, err)
	}
	return int64(f), nil
}

// SeedVersion raises aggregate k's version to at least v, so that versions keep growing across a
// rebuild into a fresh namespace: subscribers drop snapshots whose version they have passed.
func (r *Redis) SeedVersion(ctx context.Context, k Key, v int64) error {
	st := r.keys(k)[1]
	cur, err := r.client.HGet(ctx, st, "v").Int64()
	if err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("seed version of %s: %w", k, err)
	}
	if cur >= v {
		return nil
	}
	_, err = r.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, st, "v", v)
		if r.cfg.IdleTTL > 0 {
			// Like every key of an aggregate: an aggregate that never sees another event goes.
			p.PExpire(ctx, st, r.cfg.IdleTTL)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("seed version of %s: %w", k, err)
	}
	return nil
}

// ErrWritesLost means Redis no longer holds writes it acknowledged earlier in this process's life
// (it restarted and recovered less than everything, or failed over to a replica that lagged), but
// none that offsets were committed for: the batches since the last committed offsets must be
// consumed again, and are applied idempotently.
var ErrWritesLost = errors.New("redis lost acknowledged writes")

// Pending is a process's chains of pending tokens, the evidence that a batch's writes survived up
// to its seal. Every pipeline that writes a batch's state ends with SET <token key> <next token>
// GET, after its other writes; the token it replaces must be the one written last, and Seal and
// Verify check that the last one is still there. Redis executes one connection's commands in
// order and persists and replicates them in that order, so a surviving token means every write
// sent before it to the same server survived too, and a replaced token that is not the last one
// written means Redis lost writes in between (docs/semantics.md#delivery). On Redis Cluster the
// order holds per shard only, so each shard a pipeline writes gets a token of its own: a key whose
// hash slot that shard serves (the chain follows the slot through a failover). The pipelines that
// write tokens must not overlap; the processor runs them one after another in its Apply stage.
type Pending struct {
	mu      sync.Mutex
	id      string
	n       int64
	tags    []string          // hash tags of the token keys ever used, "marks" first
	chains  map[string]*chain // by hash tag
	writers map[redis.UniversalClient]redis.UniversalClient
}

// chain is the token state of one token key.
type chain struct {
	held     []string // the tokens Redis may hold: the last one written, and any whose reply was lost
	verified int64    // the token held when Verify last confirmed the chain before a commit
	broken   error    // a replaced token was not one of held: the writes since the last seal are suspect
}

const marksTag = "marks"

// NewPending returns an empty chain with a random id of its own.
func NewPending() *Pending {
	b := make([]byte, 8)
	rand.Read(b)
	return &Pending{id: hex.EncodeToString(b), tags: []string{marksTag}, chains: map[string]*chain{}}
}

// Writer returns the client the pipelines that write a batch and its tokens run on: c itself, or
// on Redis Cluster a client with c's options that follows no MOVED or ASK redirect. go-redis
// re-sends a redirected command after the rest of its pipeline, so a write moved by a reshard or
// a failover landed on its new shard after that pipeline's token writes — outside what any token
// vouches for, and a failover of that shard could lose it unseen. Refused instead, the pipeline
// fails and the batch is applied again, idempotently, against the new slot map (for a slot still
// migrating, once it has moved). The clients live as long as the process; CloseWriters ends them.
func (t *Pending) Writer(c redis.UniversalClient) redis.UniversalClient {
	cc, ok := c.(*redis.ClusterClient)
	if !ok {
		return c
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if w, ok := t.writers[c]; ok {
		return w
	}
	opt := *cc.Options()
	opt.MaxRedirects = -1
	w := redis.NewClusterClient(&opt)
	if t.writers == nil {
		t.writers = make(map[redis.UniversalClient]redis.UniversalClient)
	}
	t.writers[c] = w
	return w
}

// CloseWriters closes the clients Writer made.
func (t *Pending) CloseWriters() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	var errs []error
	for c, w := range t.writers {
		errs = append(errs, w.Close())
		delete(t.writers, c)
	}
	return errors.Join(errs...)
}

func (t *Pending) key(prefix, tag string) string { return prefix + ":{" + tag + "}:pending:" + t.id }

func (t *Pending) chain(tag string) *chain {
	c := t.chains[tag]
	if c == nil {
		c = &chain{held: []string{""}}
		t.chains[tag] = c
	}
	return c
}

// shardTags returns the hash tags of the token keys that cover keys: on Redis Cluster one per
// primary serving any of them, chosen among the tags used before where one still maps there;
// elsewhere the one of the batch marks. When the slot map cannot be read, every tag used so far.
// owners are the primaries, as the map says, of keys and then of the returned tags' token keys;
// nil off Redis Cluster or when the map cannot be read.
func (t *Pending) shardTags(ctx context.Context, c redis.UniversalClient, prefix string, keys []string) (tags, owners []string) {
	cc, ok := c.(*redis.ClusterClient)
	if !ok {
		return []string{marksTag}, nil
	}
	addr := func(key string) (string, error) {
		m, err := cc.MasterForKey(ctx, key)
		if err != nil {
			return "", err
		}
		return m.Options().Addr, nil
	}
	want := map[string]bool{}
	owners = make([]string, 0, len(keys)+len(t.tags))
	for _, k := range keys {
		a, err := addr(k)
		if err != nil {
			return slices.Clone(t.tags), nil
		}
		want[a] = true
		owners = append(owners, a)
	}
	for _, tag := range t.tags {
		a, err := addr(t.key(prefix, tag))
		if err != nil {
			return slices.Clone(t.tags), nil
		}
		if want[a] {
			tags, owners = append(tags, tag), append(owners, a)
			delete(want, a)
		}
	}
	for i := len(t.tags); len(want) > 0 && i < len(t.tags)+100000; i++ {
		tag := "p" + strconv.Itoa(i)
		if a, err := addr(t.key(prefix, tag)); err == nil && want[a] {
			t.tags = append(t.tags, tag)
			tags, owners = append(tags, tag), append(owners, a)
			delete(want, a)
		}
	}
	return tags, owners
}

// Append adds the write of the next token to pipeline p for every shard that keys (the keys the
// pipeline writes) live on; it must come after every other write of the pipeline, and p must be a
// pipeline of t.Writer(c). Once the
// pipeline has run, whatever its error, call the returned function: it checks the tokens the
// writes replaced.
func (t *Pending) Append(ctx context.Context, c redis.UniversalClient, p redis.Pipeliner, prefix string, keys []string) func() error {
	// The shards as the client that runs the pipeline maps them (Writer): its writes and tokens
	// then go to the same primaries.
	c = t.Writer(c)
	t.mu.Lock()
	t.n++
	next := strconv.FormatInt(t.n, 10)
	tags, owners := t.shardTags(ctx, c, prefix, keys)
	t.mu.Unlock()
	cmds := make([]*redis.StatusCmd, len(tags))
	tokenKeys := make([]string, len(tags))
	for i, tag := range tags {
		tokenKeys[i] = t.key(prefix, tag)
		cmds[i] = p.SetArgs(ctx, tokenKeys[i], next, redis.SetArgs{Get: true})
	}
	// The client reads its slot map again when it runs the pipeline, and may have reloaded it
	// since the token shards were picked: the owners are compared after it ran.
	mapped := slices.Concat(keys, tokenKeys)
	return func() error {
		defer t.checkReplaced(tags, cmds, next)
		if owners == nil {
			return nil
		}
		if now := primariesOf(ctx, c, mapped); !slices.Equal(now, owners) {
			return fmt.Errorf("%w: the slot map changed while the batch was written, so its writes may have gone where no token of its pipeline did; it is applied again",
				errMapMoved)
		}
		return nil
	}
}

// errMapMoved is the error of a batch pipeline whose writes and tokens may have followed different
// slot maps: the batch is applied again, which is safe.
var errMapMoved = errors.New("redis cluster slot map moved")

// primariesOf returns the address of the primary serving each key, as c's slot map says now; nil
// off Redis Cluster, or when the map cannot be read (then shardTags already covered every shard
// used so far).
func primariesOf(ctx context.Context, c redis.UniversalClient, keys []string) []string {
	cc, ok := c.(*redis.ClusterClient)
	if !ok {
		return nil
	}
	out := make([]string, len(keys))
	for i, k := range keys {
		m, err := cc.MasterForKey(ctx, k)
		if err != nil {
			return nil
		}
		out[i] = m.Options().Addr
	}
	return out
}

// checkReplaced checks the tokens the writes of a pipeline replaced (Append).
func (t *Pending) checkReplaced(tags []string, cmds []*redis.StatusCmd, next string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i, tag := range tags {
		ch := t.chain(tag)
		prev, err := cmds[i].Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			// No reply: the write may or may not have run.
			ch.held = append(ch.held, next)
			continue
		}
		// prev == next: this very write ran before, its reply lost and the pipeline sent
		// again by the client; the first run replaced a held token (or a loss since then
		// would have taken next with it), so the chain holds.
		if prev != next && !slices.Contains(ch.held, prev) {
			if n, _ := strconv.ParseInt(prev, 10, 64); n < ch.verified {
				// Committed work is gone, whatever else was found first.
				ch.broken = fmt.Errorf("%w: redis lost writes that consumer offsets were committed for (pending token of {%s} was %q, confirmed %d); "+
					"run `repeatrate rebuild`", ErrStateLost, tag, prev, ch.verified)
			} else if ch.broken == nil {
				ch.broken = fmt.Errorf("%w: pending token %s of {%s} replaced %q, want one of %q",
					ErrWritesLost, next, tag, prev, ch.held)
			}
		}
		ch.held = []string{next}
	}
}

// heldTokens returns the tokens Redis may hold for tag when the chain is intact, none when a
// pipeline found it broken.
func (t *Pending) heldTokens(tag string) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	ch := t.chain(tag)
	if ch.broken != nil {
		return nil
	}
	return slices.Clone(ch.held)
}

// check classifies the token found in Redis for tag and makes it the chain's new baseline, so
// that the batches consumed again after a reported loss are checked against a token that holds.
// A token older than the one last verified means committed work is gone: ErrStateLost.
func (t *Pending) check(tag, found string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	ch := t.chain(tag)
	err := ch.broken
	if !slices.Contains(ch.held, found) {
		if n, _ := strconv.ParseInt(found, 10, 64); n < ch.verified {
			err = fmt.Errorf("%w: redis lost writes that consumer offsets were committed for (pending token of {%s} is %q, confirmed %d); "+
				"run `repeatrate rebuild`", ErrStateLost, tag, found, ch.verified)
		} else if err == nil {
			err = fmt.Errorf("%w: pending token of {%s} is %q, want one of %q: writes made after the previous batch mark are gone",
				ErrWritesLost, tag, found, ch.held)
		}
	}
	ch.broken, ch.held = nil, []string{found}
	return err
}

// checkShards reads the token of every chain but the marks' one (which the seal script reads, and
// the batch mark covers) and checks each. It returns a read failure unwrapped, a loss as
// ErrWritesLost or ErrStateLost.
func (t *Pending) checkShards(ctx context.Context, c redis.UniversalClient, prefix string) error {
	t.mu.Lock()
	tags := slices.Clone(t.tags[1:])
	t.mu.Unlock()
	if len(tags) == 0 {
		return nil
	}
	cmds := make([]*redis.StringCmd, len(tags))
	_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, tag := range tags {
			cmds[i] = p.Get(ctx, t.key(prefix, tag))
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("read pending tokens: %w", err)
	}
	var errs []error
	for i, tag := range tags {
		found, _ := cmds[i].Result()
		if err := t.check(tag, found); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// snapshot returns the token each chain holds, as of a seal.
func (t *Pending) snapshot() map[string]int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	snap := make(map[string]int64, len(t.chains))
	for tag, ch := range t.chains {
		if len(ch.held) == 1 {
			snap[tag], _ = strconv.ParseInt(ch.held[0], 10, 64)
		}
	}
	return snap
}

// confirm makes the tokens of a seal's snapshot the confirmed ones: offsets are about to be
// committed for the work they stand for.
func (t *Pending) confirm(snap map[string]int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for tag, n := range snap {
		ch := t.chain(tag)
		ch.verified = max(ch.verified, n)
	}
}

// sealScript writes the next batch mark and returns the one it replaced with the pending token it
// found, in one atomic step: a token checked and a mark written are the same moment in Redis's
// order. When the mark it replaced is the expected one (or there is none to expect) and the token
// is one the batch may have left, it also records the batch's offsets, raising each partition's
// and never lowering it. KEYS[1] batch mark, KEYS[2] pending token, KEYS[3] recorded commits;
// ARGV[1] the next mark, ARGV[2] the expected mark (empty on a process's first seal), ARGV[3] the
// number k of tokens the batch may have left, then those k tokens, then field, offset pairs.
var sealScript = redis.NewScript(`
local prev = redis.call('GET', KEYS[1]) or ''
redis.call('SET', KEYS[1], ARGV[1])
local token = redis.call('GET', KEYS[2]) or ''
local k = tonumber(ARGV[3])
local held = false
for i = 4, 3 + k do
  if ARGV[i] == token then held = true end
end
if held and (ARGV[2] == '' or prev == ARGV[2]) then
  for i = 4 + k, #ARGV, 2 do
    local cur = tonumber(redis.call('HGET', KEYS[3], ARGV[i]) or '-1')
    if tonumber(ARGV[i + 1]) > cur then redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1]) end
  end
end
return {prev, token}
`)

// Seal marks the end of a batch: it writes this process's next batch mark to Redis and checks
// that the previous mark is still there, and that the pending tokens of the batch's write
// pipelines are (Pending), the one beside the mark atomically with writing it. Redis persists
// writes in order, so a surviving previous mark means every write before it survived too, and a
// surviving token means every write of this batch to its shard did. A missing or older mark or
// token means recent writes were lost: Seal returns ErrWritesLost, or ErrStateLost when the loss
// reaches a mark or token that Verify had confirmed (offsets may have been committed for it). The
// first Seal of a process checks only the tokens. A Seal retried after a lost reply finds its own
// mark, which is fine.
//
// In the same atomic step Seal records the batch's offsets (when the store has a Group) as work
// Redis holds: the record is written with the batch, so the commit delay ages it with the batch's
// writes. Recorded only by Verify, right before the commit, it was the newest write, and losing
// that tail alone (AOF everysec, a failover to a slightly lagging replica) made CheckOffsets find
// the group committed past the record and stop with ErrStateLost although the work survived. A
// record the seal writes for a batch that then proves lost is harmless: offsets are committed
// only after Verify, so the batch is consumed again before any commit passes it.
func (r *Redis) Seal(ctx context.Context, sealed Offsets) (int64, error) {
	r.sealMu.Lock()
	defer r.sealMu.Unlock()
	if r.sealKey == "" {
		b := make([]byte, 8)
		rand.Read(b)
		r.sealKey = marksKey(r.cfg.Prefix, "seal:"+hex.EncodeToString(b))
	}
	shards := r.cfg.Pending.checkShards(ctx, r.client, r.cfg.Prefix)
	if shards != nil && !errors.Is(shards, ErrWritesLost) && !errors.Is(shards, ErrStateLost) {
		return 0, fmt.Errorf("seal batch: %w", shards)
	}
	next := r.sealSeq + 1
	// No expiry: a mark that vanished must mean a loss, however long the process was idle. Close
	// deletes it; a crashed process leaves one small key behind.
	expect := ""
	if r.sealSeq > 0 {
		expect = strconv.FormatInt(r.sealSeq, 10)
	}
	// The record only for a batch whose writes the tokens vouch for: every other shard's token
	// held (shards), and the marks shard's checked in the script. A seal that finds its batch's
	// writes lost records nothing: a record of work Redis does not hold would outlive the rewind
	// and hide a later loss of the batch applied again.
	held := r.cfg.Pending.heldTokens(marksTag)
	args := []any{next, expect, len(held)}
	for _, h := range held {
		args = append(args, h)
	}
	if r.cfg.Group != "" && shards == nil {
		args = appendOffsets(args, sealed)
	}
	res, err := sealScript.Run(ctx, r.client, []string{r.sealKey, r.cfg.Pending.key(r.cfg.Prefix, marksTag), r.offsetsKey()},
		args...).StringSlice()
	if err == nil && len(res) != 2 {
		err = fmt.Errorf("seal script returned %d values", len(res))
	}
	if err != nil {
		return 0, errors.Join(fmt.Errorf("seal batch: %w", err), shards)
	}
	prev, token := res[0], res[1]
	first := r.sealSeq == 0
	want := r.sealSeq
	r.sealSeq = next // the new baseline, whatever the check finds
	errs := []error{r.cfg.Pending.check(marksTag, token), shards}
	if !first {
		errs = append(errs, r.lost(prev, want, next))
	}
	if err := errors.Join(errs...); err != nil {
		return next, err
	}
	r.sealed = append(r.sealed, sealedTokens{next, r.cfg.Pending.snapshot()})
	if len(r.sealed) > maxSealedTokens {
		r.sealed = r.sealed[1:]
	}
	return next, nil
}

// sealedTokens are the pending tokens a batch mark vouches for.
type sealedTokens struct {
	mark   int64
	tokens map[string]int64
}

// maxSealedTokens bounds the seals kept for Verify to confirm: a consumer verifies far more often.
const maxSealedTokens = 1024

// Offsets are consumer offsets by topic and partition: the next offset to consume.
type Offsets map[string]map[int]int64

// marksKey names a key of the namespace's bookkeeping: batch marks and recorded commits share the
// hash tag {marks}, so one script can check the one and write the other on Redis Cluster.
func marksKey(ns, name string) string { return ns + ":{marks}:" + name }

func (r *Redis) offsetsKey() string {
	return marksKey(r.cfg.Prefix, "offsets:"+schemas.JoinEscaped(r.cfg.Group))
}

// appendOffsets appends field, offset pairs of the recorded-commits hash.
func appendOffsets(args []any, offsets Offsets) []any {
	for topic, parts := range offsets {
		for p, off := range parts {
			args = append(args, offsetField(topic, p), off)
		}
	}
	return args
}

func offsetField(topic string, partition int) string { return topic + "/" + strconv.Itoa(partition) }

// verifyScript checks the batch mark and, only when it holds, records the offsets about to be
// committed (raising each partition's, never lowering it): both in one atomic step, so a
// recorded commit always stands for work Redis held at that moment.
// KEYS[1] batch mark, KEYS[2] recorded commits; ARGV[1] the expected mark, then field, offset pairs.
var verifyScript = redis.NewScript(`
local m = redis.call('GET', KEYS[1])
if m ~= ARGV[1] then return {0, m or ''} end
for i = 2, #ARGV, 2 do
  local cur = tonumber(redis.call('HGET', KEYS[2], ARGV[i]) or '-1')
  if tonumber(ARGV[i + 1]) > cur then redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1]) end
end
return {1, m}
`)

// Verify confirms that the last batch mark is still in Redis, immediately before offsets are
// committed for the batches sealed up to mark upTo; from then on a loss of those writes is
// ErrStateLost. In the same atomic step it records commit (when the store has a Group), so that
// CheckOffsets can later tell a loss from any process. Verify(ctx, 0, nil) only checks. Redis keeps
// writes in order, so the last mark stands for every write before it. How durable the writes are
// on disk is the persistence setting's business: the commit delay covers AOF everysec. With
// WaitReplicas, Verify with upTo > 0 also waits until that many replicas of every primary written
// acknowledged the writes, or returns ErrReplicasBehind (replicas.go).
func (r *Redis) Verify(ctx context.Context, upTo int64, commit Offsets) error {
	r.sealMu.Lock()
	defer r.sealMu.Unlock()
	if r.sealSeq == 0 {
		return nil
	}
	wait := r.cfg.WaitReplicas > 0 && upTo > 0 // a check alone (upTo 0) commits nothing
	var behind error
	if wait {
		// Before the tokens are read: a token read after the replicas acknowledged it is one that
		// a failover from then on keeps, and one that a failover took first is found missing.
		behind = r.waitPrimaries(ctx)
	}
	if err := r.cfg.Pending.checkShards(ctx, r.client, r.cfg.Prefix); err != nil {
		// A loss comes first: the batches are applied again rather than waited for.
		return fmt.Errorf("verify pending tokens: %w", err)
	}
	if behind != nil {
		return behind
	}
	args := []any{strconv.FormatInt(r.sealSeq, 10)}
	if r.cfg.Group != "" {
		args = appendOffsets(args, commit)
	}
	res, err := r.verifyAndWait(ctx, []string{r.sealKey, r.offsetsKey()}, args, wait)
	if errors.Is(err, ErrReplicasBehind) {
		return err
	}
	if err != nil {
		return fmt.Errorf("verify batch mark: %w", err)
	}
	if ok, _ := res[0].(int64); ok != 1 {
		found, _ := res[1].(string)
		return r.checkMark(ctx, found)
	}
	r.verified = max(r.verified, min(upTo, r.sealSeq))
	for len(r.sealed) > 0 && r.sealed[0].mark <= r.verified {
		r.cfg.Pending.confirm(r.sealed[0].tokens)
		r.sealed = r.sealed[1:]
	}
	return nil
}

// CheckOffsets compares the offsets the group has committed with those Verify recorded beside the
// state: a partition committed past what this Redis recorded means Redis lost work whose offsets
// were committed, by this process or any earlier one (a restart from an older snapshot, a
// failover to a lagging replica), and CheckOffsets returns ErrStateLost. A partition with no
// record yet (a new group, or state written by an older build) is recorded as it stands, so a
// snapshot taken from now on carries it.
func (r *Redis) CheckOffsets(ctx context.Context, committed Offsets) error {
	if r.cfg.Group == "" {
		return nil
	}
	var fields []string
	var want []int64
	for topic, parts := range committed {
		for p, off := range parts {
			// kafka-go's FirstOffset and LastOffset (< 0) mean nothing was committed.
			fields, want = append(fields, offsetField(topic, p)), append(want, max(off, 0))
		}
	}
	if len(fields) == 0 {
		return nil
	}
	key := r.offsetsKey()
	got, err := r.client.HMGet(ctx, key, fields...).Result()
	if err != nil {
		return fmt.Errorf("read recorded commits: %w", err)
	}
	var missing []any
	for i, v := range got {
		s, ok := v.(string)
		if !ok {
			missing = append(missing, fields[i], want[i])
			continue
		}
		rec, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return fmt.Errorf("recorded commit of %s is %q", fields[i], s)
		}
		if want[i] > rec {
			return fmt.Errorf("%w: group %s committed %s up to offset %d, but redis holds work only up to %d "+
				"(it restarted from older data or failed over to a lagging replica); run `repeatrate rebuild`",
				ErrStateLost, r.cfg.Group, fields[i], want[i], rec)
		}
	}
	for i := 0; i < len(missing); i += 2 {
		if err := r.client.HSetNX(ctx, key, missing[i].(string), missing[i+1]).Err(); err != nil {
			return fmt.Errorf("record commits: %w", err)
		}
	}
	return nil
}

// checkMark compares the mark found in Redis with the last one written. On a loss it puts the
// mark back, so that the batches consumed again are checked against a mark that holds. The
// caller holds sealMu.
func (r *Redis) checkMark(ctx context.Context, found string) error {
	err := r.lost(found, r.sealSeq, r.sealSeq)
	if err == nil {
		return nil
	}
	if serr := r.client.Set(ctx, r.sealKey, r.sealSeq, 0).Err(); serr != nil {
		return errors.Join(err, fmt.Errorf("reset batch mark: %w", serr))
	}
	return err
}

// lost classifies the mark found in Redis against the one expected (or own, when a retried write
// finds itself).
func (r *Redis) lost(found string, want, own int64) error {
	n, _ := strconv.ParseInt(found, 10, 64) // a missing mark reads as 0
	switch {
	case n == want || n == own:
		return nil
	case n < r.verified:
		return fmt.Errorf("%w: redis lost writes that consumer offsets were committed for (batch mark %d, confirmed %d); "+
			"run `repeatrate rebuild`", ErrStateLost, n, r.verified)
	}
	return fmt.Errorf("%w: batch mark is %d, want %d", ErrWritesLost, n, want)
}

// Close removes this process's batch mark and pending tokens and closes the write clients of its
// Pending (Pending.Writer), which the suite store shares: call it once both stores are done. It
// does not close the client.
func (r *Redis) Close(ctx context.Context) error {
	r.sealMu.Lock()
	defer r.sealMu.Unlock()
	t := r.cfg.Pending
	t.mu.Lock()
	keys := make([]string, 0, len(t.tags)+1)
	for _, tag := range t.tags {
		keys = append(keys, t.key(r.cfg.Prefix, tag))
	}
	t.mu.Unlock()
	if r.sealKey != "" {
		keys = append(keys, r.sealKey)
	}
	// One DEL per key: on Redis Cluster they live in different slots.
	_, err := r.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, k := range keys {
			p.Del(ctx, k)
		}
		return nil
	})
	return errors.Join(err, t.CloseWriters())
}

// ErrEvicting means Redis may evict keys when it runs out of memory. Every key of an aggregate
// carries the idle TTL, so a volatile-* policy would drop exactly the state, silently, while the
// epoch marker and batch marks (no TTL) survive to vouch for it; allkeys-* could drop those too.
var ErrEvicting = errors.New("redis may evict state")

// CheckEviction fails with ErrEvicting when Redis has a memory limit and an eviction policy other
// than noeviction. With noeviction a full Redis refuses writes, which the processor retries and
// reports, and loses nothing. ok is false when Redis does not tell (CONFIG disabled, as on some
// managed services): then the operator must make sure of it.
func CheckEviction(ctx context.Context, c redis.UniversalClient) (ok bool, err error) {
	cfg, err := c.ConfigGet(ctx, "maxmemory*").Result()
	if err != nil || cfg["maxmemory-policy"] == "" {
		return false, nil
	}
	if cfg["maxmemory"] != "0" && cfg["maxmemory-policy"] != "noeviction" {
		return true, fmt.Errorf("%w: maxmemory is %s bytes with maxmemory-policy %s; set maxmemory-policy noeviction",
			ErrEvicting, cfg["maxmemory"], cfg["maxmemory-policy"])
	}
	return true, nil
}
