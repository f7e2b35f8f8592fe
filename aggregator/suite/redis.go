package suite

import (
	"cmp"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/schemas"
)

//go:embed suite.lua
var suiteSource string

var suiteScript = redis.NewScript(suiteSource)

// announceScript adds revived cases to a suite's announced set (KEYS[2]), takes them out of its
// set of revived cases still to announce (KEYS[3]), and gives the announced set the
// remaining lifetime of the suite's run hash (KEYS[1]), so that neither outlives the other: a set
// that expired first would have every revived case announced again, one that outlived a dropped
// suite would silence the revivals of its next history. Redis 7.0 reads its clock for each command
// even inside a script, so the set may outlive the runs by the millisecond between the PTTL and
// the PEXPIRE (7.2 freezes the clock for a script and makes them equal); PEXPIRETIME and PEXPIREAT
// would be exact but need two more commands in the documented ACL.
var announceScript = redis.NewScript(`
for i = 1, #ARGV do
  redis.call('SADD', KEYS[2], ARGV[i])
  redis.call('ZREM', KEYS[3], ARGV[i])
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl > 0 then
  redis.call('PEXPIRE', KEYS[2], ttl)
elseif ttl == -1 then
  redis.call('PERSIST', KEYS[2])
else
  redis.call('DEL', KEYS[2])
end
return ttl`)

// Redis stores graded runs and the sums each suite's snapshots are computed from, under the hash
// tag {s|<suite id>} (the keys are described in suite.lua), updated by one idempotent script call
// per suite and batch that costs what the batch changes, not what the suite holds.
type Redis struct {
	client   redis.UniversalClient
	cfg      aggregator.RedisConfig
	suite    Config
	versions versionIDs
}

// versionIDs remembers the greatest version id of each suite the script reported, so that a call
// declares the keys of every version without reading them first (suite.lua, Keys). A suite not
// remembered, or one that gained versions meanwhile, costs one more call: the script answers
// with the number it needs. Bounded: past maxRemembered suites, one is forgotten for each new one.
type versionIDs struct {
	mu    sync.Mutex
	n     map[Key]int
	limit int // maxRemembered when 0
}

const maxRemembered = 1 << 16

func (v *versionIDs) get(k Key) int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.n[k]
}

func (v *versionIDs) set(k Key, n int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.n == nil {
		v.n = make(map[Key]int)
	}
	if _, ok := v.n[k]; !ok && len(v.n) >= cmp.Or(v.limit, maxRemembered) {
		for old := range v.n { // any one: map order
			delete(v.n, old)
			break
		}
	}
	v.n[k] = n
}

// fixedKeys are the suffixes of a suite's keys after B..'r' and B..'rv', in suite.lua's order.
var fixedKeys = [...]string{"vo", "vi", "vx", "c", "m", "d", "rl", "pa"}

// scriptKeys returns the keys a call of suite.lua on suite k declares: the fixed ones, then those
// of version ids 1 to the greatest the store remembers plus one for each version label of args
// (which the call may create).
func (r *Redis) scriptKeys(k Key, args []any) []string {
	return r.scriptKeysOf(k, r.versions.get(k)+versionLabels(args))
}

// scriptKeysAtLeast is scriptKeys declaring at least the versions need says.
func (r *Redis) scriptKeysAtLeast(k Key, args []any, need int) []string {
	return r.scriptKeysOf(k, max(need, r.versions.get(k)+versionLabels(args)))
}

// scriptKeysOf returns the keys of suite k that suite.lua declares for version ids 1 to v.
func (r *Redis) scriptKeysOf(k Key, v int) []string {
	runsKey, annKey := r.keys(k)
	b := strings.TrimSuffix(runsKey, "r")
	keys := make([]string, 0, 2+len(fixedKeys)+3*v)
	keys = append(keys, runsKey, annKey)
	for _, f := range fixedKeys {
		keys = append(keys, b+f)
	}
	for id := 1; id <= v; id++ {
		n := strconv.Itoa(id)
		keys = append(keys, b+"h"+n, b+"i"+n, b+"x"+n)
	}
	return keys
}

// versionLabels counts the distinct version labels of a call's arguments (suite.lua, ARGV).
func versionLabels(args []any) int {
	if len(args) <= headArgs {
		return 0
	}
	t, _ := args[headArgs].(int)
	seen := map[string]bool{}
	for j := headArgs + 1; j < headArgs+1+3*t && j < len(args); j += 3 {
		seen[fmt.Sprint(args[j])] = true
	}
	for j := headArgs + 1 + 3*t; j < len(args); j += groupWidth {
		seen[fmt.Sprint(args[j])] = true
	}
	return len(seen)
}

// declaredTooFew reads a reply of suite.lua that declined the call, having written nothing,
// because it declared the keys of fewer versions than the suite has or the call may create:
// the number it needs.
func declaredTooFew(reply any) (int, bool) {
	top, ok := reply.([]any)
	if !ok || len(top) != 2 || top[0] != "v" {
		return 0, false
	}
	n, ok := top[1].(int64)
	return int(n), ok
}

// rememberVersions keeps the greatest version id a reply of suite.lua reports.
func (r *Redis) rememberVersions(k Key, reply any) {
	if top, ok := reply.([]any); ok && len(top) == 6 {
		if n, ok := top[5].(int64); ok {
			r.versions.set(k, int(n))
		}
	}
}

// NewRedis returns a suite store on client; cfg.IdleTTL drops a suite (its runs and its
// announced revived cases, together) once it has seen no result for that long of wall-clock time.
// The in-memory Model, which replay uses, has no wall clock and keeps every suite.
func NewRedis(client redis.UniversalClient, cfg aggregator.RedisConfig, sc Config) (*Redis, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := sc.Validate(); err != nil {
		return nil, err
	}
	return &Redis{client: client, cfg: cfg, suite: sc}, nil
}

func (r *Redis) keys(k Key) (runs, announced string) {
	base := r.cfg.Prefix + ":{s|" + k.ID() + "}:"
	return base + "r", base + "rv"
}

// appendEntry appends run r of index idx as the script stores it among its cell's runs:
// "<run_index> <assessed> <seq> <flags>;", flags as runFlags packs them. The rest of the record is
// summed into the suite's counts and not kept.
func appendEntry(buf []byte, idx int64, r *RunRecord) []byte {
	for _, n := range [...]int64{idx, r.Assessed, r.Seq} {
		buf = strconv.AppendInt(buf, n, 10)
		buf = append(buf, ' ')
	}
	buf = strconv.AppendInt(buf, runFlags(r), 10)
	return append(buf, ';')
}

func runFlag(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// resultCode is a run's result as the script numbers it: 0 pass, 1 fail, 2 error.
func resultCode(r *RunRecord) int64 {
	switch r.Result {
	case 'p':
		return 0
	case 'f':
		return 1
	}
	return 2
}

// runFlags packs what the script adds of a new run, so that it need not parse the record:
// tokens*16 + result*4 + reply*2 + trigger (result as resultCode numbers it).
func runFlags(r *RunRecord) int64 {
	trig := int64(0)
	if r.Trigger != "" {
		trig = 1
	}
	return int64(r.Tokens)*16 + resultCode(r)*4 + runFlag(r.Reply)*2 + trig
}

// cellGroup is the runs of one batch in one (version, case) cell, with what the script takes of
// them as a whole: the greatest planned runs, the least occurred time, the greatest version_seq.
type cellGroup struct {
	version, kase      string
	runs, occurred, vs int64
	obs                []int
}

// scriptArgs returns the suite script's arguments for the observations idx of one suite, grouped
// by cell in order of first appearance (the order Redis returns their outcome codes in, given in
// order), after headArgs places for ApplyEncoded to fill: the version sums of every run as if new
// (totalArgs), then the groups (groupArgs).
func scriptArgs(obs []RunObservation, idx []int) (args []any, order []int) {
	cells := cellGroups(obs, idx)
	args = make([]any, headArgs, headArgs+1+groupWidth*len(cells))
	args = totalArgs(args, obs, idx)
	return groupArgs(args, obs, cells, len(idx))
}

// cellGroups groups the observations idx by (version, case) cell, in order of first appearance.
func cellGroups(obs []RunObservation, idx []int) []cellGroup {
	at := map[[2]string]int{}
	var cells []cellGroup
	for _, i := range idx {
		o := &obs[i]
		ck := [2]string{o.Key.Version, o.Key.Case}
		n, ok := at[ck]
		if !ok {
			n = len(cells)
			at[ck] = n
			cells = append(cells, cellGroup{version: o.Key.Version, kase: o.Key.Case, runs: o.Record.Runs,
				occurred: o.Record.Occurred, vs: o.Record.VersionSeq})
		}
		g := &cells[n]
		g.runs, g.occurred, g.vs = max(g.runs, o.Record.Runs), min(g.occurred, o.Record.Occurred), max(g.vs, o.Record.VersionSeq)
		g.obs = append(g.obs, i)
	}
	return cells
}

// versionSums are one version's sums by run index and reply length that a call's runs add:
// counts by index or length below denseSums in slices, the rare greater ones in a map.
type versionSums struct {
	version    string
	p, n, l, a []int64 // passed and scored runs by index; replies and abnormal replies by length
	sparse     map[sparseSum]int64
}

// sparseSum names one of a version's sums of index or length k (at least denseSums): kind is
// 'p', 'n', 'l' or 'a' as in suite.lua's field names.
type sparseSum struct {
	kind byte
	k    int64
}

// denseSums bounds the run indexes and reply lengths versionSums counts in slices.
const denseSums = 1 << 14

func (v *versionSums) add(kind byte, s *[]int64, k int64) {
	if k < 0 || k >= denseSums {
		if v.sparse == nil {
			v.sparse = map[sparseSum]int64{}
		}
		v.sparse[sparseSum{kind, k}]++
		return
	}
	for int64(len(*s)) <= k {
		*s = append(*s, 0)
	}
	(*s)[k]++
}

// totalArgs appends the count of sums and the sums, as (version, field, count) triples, that
// the observations idx add to their versions' hashes if every one is a new run (suite.lua takes
// back the share of a run it finds held): the per-run work is done here, once, not in Redis.
func totalArgs(args []any, obs []RunObservation, idx []int) []any {
	var vs []*versionSums
	var cur *versionSums
	for _, i := range idx {
		o := &obs[i]
		if cur == nil || cur.version != o.Key.Version {
			cur = nil
			for _, v := range vs {
				if v.version == o.Key.Version {
					cur = v
					break
				}
			}
			if cur == nil {
				cur = &versionSums{version: o.Key.Version}
				vs = append(vs, cur)
			}
		}
		r := &o.Record
		switch r.Result {
		case 'p':
			cur.add('p', &cur.p, o.Key.RunIndex)
			cur.add('n', &cur.n, o.Key.RunIndex)
		case 'f':
			cur.add('n', &cur.n, o.Key.RunIndex)
		}
		if r.Reply {
			cur.add('l', &cur.l, int64(r.Tokens))
			if r.Trigger != "" {
				cur.add('a', &cur.a, int64(r.Tokens))
			}
		}
	}
	at := len(args)
	args = append(args, 0)
	n := 0
	for _, v := range vs {
		for _, d := range [...]struct {
			kind byte
			s    []int64
		}{{'p', v.p}, {'n', v.n}, {'l', v.l}, {'a', v.a}} {
			for k, c := range d.s {
				if c != 0 {
					args = append(args, v.version, string(d.kind)+strconv.Itoa(k), c)
					n++
				}
			}
		}
		keys := make([]sparseSum, 0, len(v.sparse))
		for k := range v.sparse {
			keys = append(keys, k)
		}
		slices.SortFunc(keys, func(a, b sparseSum) int { return cmp.Or(cmp.Compare(a.kind, b.kind), cmp.Compare(a.k, b.k)) })
		for _, k := range keys {
			args = append(args, v.version, string(k.kind)+strconv.FormatInt(k.k, 10), v.sparse[k])
			n++
		}
	}
	args[at] = n
	return args
}

// groupArgs appends the script's groupWidth arguments of each cell group (n runs in all) and returns them
// with the runs in the order of their outcome codes.
func groupArgs(args []any, obs []RunObservation, cells []cellGroup, n int) ([]any, []int) {
	order := make([]int, 0, n)
	// Entries, counts, bitmaps and records are slices of one buffer: one allocation per suite, not
	// per run (about 48 bytes per run and per cell).
	buf := make([]byte, 0, 48*n+48*len(cells))
	for _, g := range cells {
		start := len(buf)
		fast := true
		var pfe [3]int64
		blk := obs[g.obs[0]].Key.RunIndex / runBlock
		for _, i := range g.obs {
			o := &obs[i]
			buf = appendEntry(buf, o.Key.RunIndex, &o.Record)
			pfe[resultCode(&o.Record)]++
			fast = fast && o.Key.RunIndex/runBlock == blk
			order = append(order, i)
		}
		entries := buf[start:len(buf):len(buf)]
		var counts, bitmap, record []byte
		if fast {
			// The bitmap of the indexes, as the script keeps it (bit i in byte i/8, low bit
			// first); a repeated index leaves the group to the script's run-by-run path.
			start = len(buf)
			for _, i := range g.obs {
				ri := obs[i].Key.RunIndex
				for int64(len(buf)-start) <= ri/8 {
					buf = append(buf, 0)
				}
				bit := byte(1) << (ri % 8)
				if buf[start+int(ri/8)]&bit != 0 {
					fast = false
					break
				}
				buf[start+int(ri/8)] |= bit
			}
			bitmap = buf[start:len(buf):len(buf)]
		}
		if fast {
			start = len(buf)
			for j, c := range [...]int64{pfe[0], pfe[1], pfe[2], blk} {
				if j > 0 {
					buf = append(buf, ' ')
				}
				buf = strconv.AppendInt(buf, c, 10)
			}
			counts = buf[start:len(buf):len(buf)]
			// The record of a cell holding just these runs, as suite.lua writes it.
			start = len(buf)
			for _, c := range [...]int64{pfe[0], pfe[1], pfe[2], g.runs, g.occurred} {
				buf = strconv.AppendInt(buf, c, 10)
				buf = append(buf, ' ')
			}
			buf[len(buf)-1] = '|'
			buf = append(buf, bitmap...)
			record = buf[start:len(buf):len(buf)]
		} else {
			bitmap = nil
		}
		args = append(args, g.version, g.kase, len(g.obs), g.runs, g.occurred, g.vs, entries, counts, bitmap, record)
	}
	return args, order
}

// groupWidth is how many script arguments each cell group takes (suite.lua's GROUP).
const groupWidth = 10

// runBlock is how many run indexes one stored field of runs holds (suite.lua's BLOCK).
const runBlock = 16

// Apply merges obs, updates the summaries of every touched suite and reads them back, as
// observed at time at (the deadline of missing runs is at minus Config.MissingAfter, and never
// moves back), in one pipelined round trip with one script call per suite. Calling it again with
// the same observations changes nothing. It is Encode and ApplyEncoded in a row.
func (r *Redis) Apply(ctx context.Context, obs []RunObservation, at time.Time) (Applied, error) {
	return r.ApplyEncoded(ctx, Encode(obs), at)
}

// Encoded is a batch of graded runs grouped by suite and cell and encoded as the suite script
// takes them, made by Encode without any I/O, so that the processor can do it while Redis applies
// the batch before.
type Encoded struct {
	n      int // runs
	suites []Key
	args   map[Key][]any // each suite's script arguments; the first headArgs are ApplyEncoded's
	orders map[Key][]int // each suite's runs (indexes into the batch) in the order of its outcome codes
}

// headArgs is how many script arguments ApplyEncoded fills in (suite.lua: ttl_ms to sample limit).
const headArgs = 7

// Encode groups obs by suite and cell and encodes them for ApplyEncoded.
func Encode(obs []RunObservation) *Encoded {
	groups := map[Key][]int{}
	e := &Encoded{n: len(obs)}
	for i := range obs {
		k := obs[i].Key.Key
		if _, ok := groups[k]; !ok {
			e.suites = append(e.suites, k)
		}
		groups[k] = append(groups[k], i)
	}
	e.args, e.orders = make(map[Key][]any, len(e.suites)), make(map[Key][]int, len(e.suites))
	for _, k := range e.suites {
		e.args[k], e.orders[k] = scriptArgs(obs, groups[k])
	}
	return e
}

// ApplyEncoded applies a batch Encode made, as Apply applies the runs it was made of.
func (r *Redis) ApplyEncoded(ctx context.Context, e *Encoded, at time.Time) (Applied, error) {
	r.fill(e, at)
	replies, err := r.call(ctx, e.suites, true, func(k Key) []any { return e.args[k] })
	if err != nil {
		return Applied{}, fmt.Errorf("apply runs: %w", err)
	}
	return e.applied(replies)
}

// fill sets the head arguments of e's script calls for observation time at.
func (r *Redis) fill(e *Encoded, at time.Time) {
	head := [headArgs]any{r.cfg.IdleTTL.Milliseconds(), r.suite.MinHistory, r.suite.JudgeLastVersions,
		aggregator.Micros(at) - r.suite.MissingAfter.Microseconds(), "a:" + strconv.FormatInt(aggregator.Micros(at), 10),
		schemas.MaxListedCases, schemas.MaxMissingRunIndexes}
	for _, k := range e.suites {
		copy(e.args[k], head[:])
	}
}

// applied reads the replies of e's script calls, one per suite in e.suites order.
func (e *Encoded) applied(replies []any) (Applied, error) {
	res := Applied{Outcomes: make([]aggregator.Outcome, e.n), Suites: e.suites, Summaries: map[Key]*Summary{}}
	for n, k := range e.suites {
		codes, sum, err := parseSummary(k, replies[n])
		if err != nil || len(codes) != len(e.orders[k]) {
			return Applied{}, fmt.Errorf("apply runs of %s: %q %v", k.ID(), codes, err)
		}
		for j, i := range e.orders[k] {
			res.Outcomes[i] = outcomeCodes[codes[j]]
		}
		res.Summaries[k] = sum
	}
	return res, nil
}

// Companion is a batch of graded runs (made by Encode) written in the pipeline of the batch's
// observations (aggregator.Redis.ApplyEncodedWith): one round trip for both. It relies on that
// store, which shares the client, namespace and epoch, for the epoch check and the pending token.
type Companion struct {
	r    *Redis
	e    *Encoded
	cmds []*redis.Cmd
	// Applied is what ApplyEncoded would have returned, once the pipeline ran and Finish succeeded.
	Applied Applied
}

var _ aggregator.Companion = (*Companion)(nil)

// Companion returns e, observed at time at, as work for the repeat-rate store's pipeline.
func (r *Redis) Companion(e *Encoded, at time.Time) *Companion {
	r.fill(e, at)
	return &Companion{r: r, e: e}
}

// Queue implements aggregator.Companion: one script call per suite.
func (c *Companion) Queue(ctx context.Context, p redis.Pipeliner) []string {
	c.cmds = make([]*redis.Cmd, len(c.e.suites))
	written := make([]string, len(c.e.suites))
	for n, k := range c.e.suites {
		keys := c.r.scriptKeys(k, c.e.args[k])
		c.cmds[n] = suiteScript.EvalSha(ctx, p, keys, c.e.args[k]...)
		written[n] = keys[0]
	}
	return written
}

// Finish implements aggregator.Companion.
func (c *Companion) Finish() error {
	replies := make([]any, len(c.cmds))
	var declined []string
	for n, cmd := range c.cmds {
		v, err := cmd.Result()
		if err != nil {
			return fmt.Errorf("apply runs of %s: %w", c.e.suites[n].ID(), err)
		}
		if need, ok := declaredTooFew(v); ok {
			c.r.versions.set(c.e.suites[n], need)
			declined = append(declined, c.e.suites[n].ID())
			continue
		}
		c.r.rememberVersions(c.e.suites[n], v)
		replies[n] = v
	}
	if len(declined) > 0 {
		// Nothing of theirs was written; the batch is applied again with their versions' keys.
		return fmt.Errorf("apply runs: suites %q have versions this store did not know of: apply the batch again", declined)
	}
	a, err := c.e.applied(replies)
	c.Applied = a
	return err
}

// Load implements aggregator.Companion.
func (c *Companion) Load(ctx context.Context) error {
	if err := suiteScript.Load(ctx, c.r.client).Err(); err != nil {
		return fmt.Errorf("load suite script: %w", err)
	}
	return nil
}

// call runs the suite script once per suite in one pipeline, after the namespace's epoch check,
// and returns each call's reply. A batch's call (token true) ends with the write of the next
// pending token, which the processor's Seal checks; a read leaves the chain alone (Read).
func (r *Redis) call(ctx context.Context, suites []Key, token bool, args func(Key) []any) ([]any, error) {
	out := make([]any, len(suites))
	todo := make([]Key, len(suites))
	copy(todo, suites)
	at := make([]int, len(suites)) // the index in suites of each of todo
	for i := range at {
		at[i] = i
	}
	// What the script asked for, for this call's next round: the store's memory of it may be
	// forgotten meanwhile (versionIDs is bounded).
	need := map[Key]int{}
	for try := 0; len(todo) > 0; try++ {
		if try == maxDeclined {
			return nil, fmt.Errorf("suites %v keep gaining versions faster than the store learns of them: try again", todo)
		}
		replies, err := r.callOnce(ctx, todo, token, args, need)
		if err != nil {
			return nil, err
		}
		var again []Key
		var againAt []int
		for n, k := range todo {
			if v, ok := declaredTooFew(replies[n]); ok {
				// Declined, nothing written: called again with every version's keys, and a few
				// more, for the versions other processors add meanwhile (a reader beside busy
				// batches would otherwise be declined round after round).
				r.versions.set(k, v)
				need[k] = v + max(4, v/4)
				again, againAt = append(again, k), append(againAt, at[n])
				continue
			}
			r.rememberVersions(k, replies[n])
			out[at[n]] = replies[n]
		}
		todo, at = again, againAt
	}
	return out, nil
}

// maxDeclined bounds the calls of one suite that the script declines for want of declared
// versions: the second has every version the first found.
const maxDeclined = 4

// callOnce is one round of call.
func (r *Redis) callOnce(ctx context.Context, suites []Key, token bool, args func(Key) []any, need map[Key]int) ([]any, error) {
	var epoch *redis.StringCmd
	run := func() (cmds []*redis.Cmd, err error) {
		cmds = make([]*redis.Cmd, len(suites))
		checkToken := func() error { return nil }
		defer func() {
			if terr := checkToken(); err == nil {
				err = terr
			}
		}()
		client := r.client
		if token && r.cfg.Pending != nil {
			client = r.cfg.Pending.Writer(client) // aggregator.Pending.Writer: no redirected write outside a token
		}
		_, err = client.Pipelined(ctx, func(p redis.Pipeliner) error {
			if r.cfg.Epoch != "" {
				epoch = p.Get(ctx, aggregator.EpochKey(r.cfg.Prefix))
			}
			for n, k := range suites {
				a := args(k)
				cmds[n] = suiteScript.EvalSha(ctx, p, r.scriptKeysAtLeast(k, a, need[k]), a...)
			}
			if token && r.cfg.Pending != nil {
				// After the writes: Seal checks it (aggregator.Pending).
				written := make([]string, len(suites))
				for n, k := range suites {
					written[n], _ = r.keys(k)
				}
				checkToken = r.cfg.Pending.Append(ctx, r.client, p, r.cfg.Prefix, written)
			}
			return nil
		})
		return cmds, err
	}
	cmds, err := run()
	if err != nil && isNoScript(err) {
		if lerr := suiteScript.Load(ctx, r.client).Err(); lerr != nil {
			return nil, fmt.Errorf("load suite script: %w", lerr)
		}
		cmds, err = run()
	}
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	// A namespace migrating from state layout 10 to 11 changes its marker's layout, not the suites.
	if epoch != nil && !aggregator.EpochFollows(r.cfg.Epoch, epoch.Val()) {
		return nil, fmt.Errorf("%w: epoch marker of namespace %q is %q, want %q; run `repeatrate rebuild`",
			aggregator.ErrStateLost, r.cfg.Prefix, epoch.Val(), r.cfg.Epoch)
	}
	out := make([]any, len(cmds))
	for n, c := range cmds {
		if out[n], err = c.Result(); err != nil {
			return nil, fmt.Errorf("suite %s: %w", suites[n].ID(), err)
		}
	}
	return out, nil
}

// MarkAnnounced records that the revived events of cases were published. The announced set then
// expires with the suite's runs (every Apply refreshes both).
func (r *Redis) MarkAnnounced(ctx context.Context, k Key, cases []string) error {
	if len(cases) == 0 {
		return nil
	}
	runsKey, annKey := r.keys(k)
	members := make([]any, len(cases))
	for i, c := range cases {
		members[i] = c
	}
	pending := strings.TrimSuffix(runsKey, "r") + "pa"
	if err := announceScript.Run(ctx, r.client, []string{runsKey, annKey, pending}, members...).Err(); err != nil {
		return fmt.Errorf("mark revived of %s: %w", k.ID(), err)
	}
	return nil
}

// Read returns the summary of suite k with every version, observed at time at, without applying
// any run: what a rebuild publishes once it has re-applied the input, and what the read side
// shows. It is not read-only: like a batch, it advances each version's missing-run deadline to
// at, which only moves forward and changes no count a later batch would not change the same way.
// It writes no pending token: readers run at any moment beside the processor's batches, whose
// token pipelines must not overlap (aggregator.Pending), and no offset commit rests on a read's
// write, whose loss a later batch or read repeats.
func (r *Redis) Read(ctx context.Context, k Key, at time.Time) (*Summary, error) {
	replies, err := r.call(ctx, []Key{k}, false, func(Key) []any {
		return []any{0, r.suite.MinHistory, r.suite.JudgeLastVersions,
			aggregator.Micros(at) - r.suite.MissingAfter.Microseconds(), "r", schemas.MaxListedCases,
			schemas.MaxMissingRunIndexes}
	})
	if err != nil {
		return nil, fmt.Errorf("read suite %s: %w", k.ID(), err)
	}
	_, sum, err := parseSummary(k, replies[0])
	return sum, err
}

// parseSummary reads one reply of suite.lua: the outcome codes and the suite's summary.
func parseSummary(k Key, reply any) (string, *Summary, error) {
	top, ok := reply.([]any)
	// Six parts; four or five from the older scripts the tests compare with.
	if !ok || len(top) < 4 || len(top) > 6 {
		return "", nil, fmt.Errorf("suite script of %s returned %T", k.ID(), reply)
	}
	codes, _ := top[0].(string)
	bad := func(what string, v any) error { return fmt.Errorf("suite %s: bad %s %v", k.ID(), what, v) }
	disc, ok := top[1].([]any)
	if !ok || len(disc) != 12 {
		return "", nil, bad("discrimination", top[1])
	}
	var n [11]int64
	for i := range n {
		v, err := replyInt(disc[i])
		if err != nil && i != 5 {
			return "", nil, bad("discrimination", disc)
		}
		n[i] = v
	}
	latest, _ := disc[5].(string)
	s := &Summary{Discrimination: DiscSummary{AlwaysPass: int(n[0]), AlwaysFail: int(n[1]), Discriminating: int(n[2]),
		TooNew: int(n[3]), VersionsSeen: int(n[4]), Latest: latest, LatestN: int(n[6]), LatestPass: int(n[7]),
		LatestDiscN: int(n[8]), LatestDiscPass: int(n[9]), RevivedTotal: int(n[10])}}
	listed, _ := disc[11].([]any)
	for _, c := range listed {
		cs, _ := c.(string)
		s.Discrimination.Revived = append(s.Discrimination.Revived, cs)
	}
	revived, _ := top[2].([]any)
	for _, e := range revived {
		f, ok := e.([]any)
		if !ok || len(f) != 5 {
			return "", nil, bad("revived case", e)
		}
		c, _ := f[0].(string)
		v, _ := f[1].(string)
		from, _ := f[2].(int64)
		to, _ := f[3].(int64)
		streak, _ := f[4].(int64)
		s.Revived = append(s.Revived, schemas.CaseRevived{Workspace: k.Workspace, Suite: k.Suite, CaseID: c, Version: v,
			From: passWord(from == 1), To: passWord(to == 1), Streak: int(streak), Regression: from == 1})
	}
	slices.SortFunc(s.Revived, func(a, b schemas.CaseRevived) int { return strings.Compare(a.CaseID, b.CaseID) })
	versions, _ := top[3].([]any)
	for _, e := range versions {
		f, ok := e.([]any)
		if !ok || len(f) != 3 {
			return "", nil, bad("version", e)
		}
		v, err := parseVersion(f)
		if err != nil {
			return "", nil, fmt.Errorf("suite %s: %w", k.ID(), err)
		}
		s.Versions = append(s.Versions, v)
	}
	slices.SortFunc(s.Versions, func(a, b VersionSummary) int { return strings.Compare(a.Version, b.Version) })
	if len(top) >= 5 {
		sv, err := replyInt(top[4])
		if err != nil {
			return "", nil, bad("snapshot version", top[4])
		}
		s.SnapshotVersion = sv
	}
	return codes, s, nil
}

// parseVersion reads a version's entry of suite.lua's reply: its label, its sums hash (field
// letter + number: see suite.lua) and its listed missing runs.
func parseVersion(f []any) (VersionSummary, error) {
	v := VersionSummary{}
	v.Version, _ = f[0].(string)
	flat, _ := f[1].([]any)
	scores := map[int64]*RunScore{}
	score := func(i int64) *RunScore {
		if scores[i] == nil {
			scores[i] = &RunScore{Index: i}
		}
		return scores[i]
	}
	for i := 0; i+1 < len(flat); i += 2 {
		field, _ := flat[i].(string)
		val, _ := flat[i+1].(string)
		if field == "" {
			return v, fmt.Errorf("version %q: empty field", v.Version)
		}
		n, err := strconv.ParseInt(val, 10, 64)
		if err != nil {
			return v, fmt.Errorf("version %q: field %q: %w", v.Version, field, err)
		}
		rest := field[1:]
		num := func() (int64, error) { return strconv.ParseInt(rest, 10, 64) }
		switch field[0] {
		case 'R':
			v.Runs = n
		case 'M':
			v.MissingTotal = n
		case 'D':
		case 'p', 'n', 'l', 'a':
			x, err := num()
			if err != nil {
				return v, fmt.Errorf("version %q: field %q: %w", v.Version, field, err)
			}
			switch field[0] {
			case 'p':
				score(x).Pass = n
			case 'n':
				score(x).N = n
			case 'l':
				v.Lengths = append(v.Lengths, LengthCount{x, n})
			case 'a':
				v.Abnormal = append(v.Abnormal, LengthCount{x, n})
			}
		case 'c', 't':
			a, b, ok := strings.Cut(rest, ",")
			nn, err1 := strconv.ParseInt(a, 10, 64)
			cc, err2 := strconv.ParseInt(b, 10, 64)
			if !ok || err1 != nil || err2 != nil {
				return v, fmt.Errorf("version %q: field %q", v.Version, field)
			}
			if field[0] == 'c' {
				v.Cases = append(v.Cases, CaseCount{N: nn, C: cc, Cases: n})
			} else {
				v.Attempts = append(v.Attempts, CaseCount{N: nn, C: cc, Cases: n})
			}
		default:
			return v, fmt.Errorf("version %q: unknown field %q", v.Version, field)
		}
	}
	for _, rs := range scores {
		if rs.N > 0 {
			v.RunScores = append(v.RunScores, *rs)
		}
	}
	list, _ := f[2].([]any)
	for _, e := range list {
		m, ok := e.([]any)
		if !ok || len(m) != 3 {
			return v, fmt.Errorf("version %q: bad missing entry %v", v.Version, e)
		}
		c, _ := m[0].(string)
		count, _ := m[1].(int64)
		mr := schemas.MissingRuns{CaseID: c, Count: count}
		idx, _ := m[2].([]any)
		for _, i := range idx {
			x, _ := i.(int64)
			mr.RunIndexes = append(mr.RunIndexes, x)
		}
		v.Missing = append(v.Missing, mr)
	}
	sortSummary(&v)
	return v, nil
}

// replyInt reads an integer a script returned as a number or as hash text.
func replyInt(v any) (int64, error) {
	switch x := v.(type) {
	case int64:
		return x, nil
	case string:
		return strconv.ParseInt(x, 10, 64)
	}
	return 0, fmt.Errorf("not an integer: %T", v)
}

// isNoScript reports a script cache miss (the server restarted or flushed its scripts).
func isNoScript(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
}

// outcomeCodes maps suite.lua's one-letter outcomes.
var outcomeCodes = map[byte]aggregator.Outcome{'N': aggregator.Counted, 'R': aggregator.Reassessed,
	'D': aggregator.Duplicate, 'S': aggregator.Stale}
