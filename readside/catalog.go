package readside

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/repeatrate/repeatrate/aggregator/suite"
	"github.com/repeatrate/repeatrate/schemas"
)

// Read-side bookkeeping kept in Redis beside the state (docs/semantics.md#read-side): an index of
// the aggregates and suites of each workspace, a bounded history of each aggregate's snapshots,
// and a channel that carries the published snapshots (the latest of each subject per write of the
// Recorder) to the HTTP servers' live streams.
const (
	// HistoryPoints is how many history points an aggregate keeps: one per minute (the last
	// snapshot of that minute), so 24 hours of a busy aggregate.
	HistoryPoints = 1440
	// HourlyPoints is how many points an aggregate's hourly history keeps (the last snapshot of
	// each hour): the 7 days a page charts on request, which the minute history cannot reach.
	HourlyPoints = 168
	// HistoryTTL drops an aggregate's history this long after its last snapshot.
	HistoryTTL = 7 * 24 * time.Hour
	// recorderQueue bounds the batches waiting to be recorded; beyond it a batch is dropped (and
	// counted) rather than holding up the processor.
	recorderQueue = 256
)

// Publisher is the processor's output port (consumer.Publisher's method set).
type Publisher interface {
	Publish(ctx context.Context, snaps []schemas.Snapshot) error
	PublishSuites(ctx context.Context, o suite.Output, at time.Time) error
}

// Catalog reads and writes the read side's keys under prefix (the configured key prefix, which a
// rebuild does not change) + ":web".
type Catalog struct {
	client redis.UniversalClient
	prefix string
	idle   time.Duration
}

// NewCatalog returns a catalog on client; index entries not refreshed for idle are dropped.
func NewCatalog(client redis.UniversalClient, keyPrefix string, idle time.Duration) *Catalog {
	return &Catalog{client: client, prefix: keyPrefix + ":web", idle: idle}
}

func (c *Catalog) wsKey(ws, kind string) string {
	return c.prefix + ":{w|" + schemas.JoinEscaped(ws) + "}:" + kind
}
func (c *Catalog) histKey(aggID string) string { return c.prefix + ":{h|" + aggID + "}" }

// workspacesKey is the set of workspaces the read side recorded anything of, scored by when.
func (c *Catalog) workspacesKey() string { return c.prefix + ":workspaces" }

// Workspaces lists, in name order, up to limit of the workspaces recorded within the idle
// period, the most recently recorded first to be kept when there are more.
func (c *Catalog) Workspaces(ctx context.Context, limit int) ([]string, error) {
	ws, err := c.client.ZRevRange(ctx, c.workspacesKey(), 0, int64(limit-1)).Result()
	slices.Sort(ws)
	return ws, err
}

// hourKey is an aggregate's hourly history, in the slot of its minute history.
func (c *Catalog) hourKey(aggID string) string { return c.prefix + ":{h|" + aggID + "}:hour" }

// Channel is the Redis Pub/Sub channel that carries the recorded snapshots: one FeedEvent per
// subject per write, its latest snapshot.
func (c *Catalog) Channel() string { return c.prefix + ":feed" }

// trimScript drops index members (KEYS[1], lexical) whose last-seen time (KEYS[2]) is before
// ARGV[1], at most 200 per call, and refreshes both keys' lifetime (ARGV[2] ms). With KEYS[3], the
// workspace's retained counts (retainedScript), a dropped aggregate's count leaves the total too.
var trimScript = redis.NewScript(`
local old = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. ARGV[1], 'LIMIT', 0, 200)
for _, m in ipairs(old) do
  redis.call('ZREM', KEYS[1], m)
  redis.call('ZREM', KEYS[2], m)
  if KEYS[3] then
    local held = redis.call('HGET', KEYS[3], m)
    if held then
      redis.call('HDEL', KEYS[3], m)
      redis.call('HINCRBY', KEYS[3], '', -tonumber(string.match(held, ' (%-?%d+)$')))
    end
  end
end
for i = 1, #KEYS do
  redis.call('PEXPIRE', KEYS[i], ARGV[2])
end
return #old`)

// retainedScript keeps a workspace's retained opportunities (KEYS[1], a hash): per aggregate ID
// "<version> <retained>" of the newest snapshot recorded, and under the field "" their sum. ARGV[1]
// is the hash's lifetime (ms), then triples of aggregate ID, snapshot version and retained count;
// a snapshot older than the one recorded changes nothing, so the sum follows the newest snapshot
// of each aggregate whatever order the recorders write in.
var retainedScript = redis.NewScript(`
local delta = 0
for i = 2, #ARGV, 3 do
  local held = redis.call('HGET', KEYS[1], ARGV[i])
  local v, n = 0, 0
  if held then
    local hv, hn = string.match(held, '^(%d+) (%-?%d+)$')
    v, n = tonumber(hv), tonumber(hn)
  end
  if not held or tonumber(ARGV[i + 1]) >= v then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1] .. ' ' .. ARGV[i + 2])
    delta = delta + tonumber(ARGV[i + 2]) - n
  end
end
if delta ~= 0 then
  redis.call('HINCRBY', KEYS[1], '', delta)
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return delta`)

// Point is one history point of an aggregate: its version, observation time and each window's
// confirmed, passed and unscored counts.
type Point struct {
	Version    int64     `json:"v"`
	ObservedAt time.Time `json:"t"`
	All        [3]int64  `json:"all"`
	Hour       [3]int64  `json:"1h"`
	Day        [3]int64  `json:"24h"`
	Week       [3]int64  `json:"7d"`
}

func counts(w schemas.Window) [3]int64 { return [3]int64{w.ConfirmedRepeats, w.Passed, w.Unscored} }

// FeedEvent is one message of the live channel: a snapshot of an aggregate (Kind "snapshot",
// Subject its aggregate ID), a suite's discrimination ("discrimination", Subject the suite) or one
// version's stability ("stability", Subject "suite" and Version set). ID is the SSE event id: the
// snapshot's version, or a suite snapshot's observation time in µs.
type FeedEvent struct {
	Kind      string          `json:"kind"`
	Workspace string          `json:"workspace"`
	Subject   string          `json:"subject"`
	Version   string          `json:"version,omitempty"`
	ID        int64           `json:"id"`
	Data      json.RawMessage `json:"data"`
}

// suiteFeedID is a suite snapshot's event id in the live feed: the greater of its snapshot version
// and its observation time in µs. A change observed by a clock behind the last one's still gets a
// greater id (its version), and the same runs observed later (missing runs matured further) too.
func suiteFeedID(version int64, at time.Time) int64 {
	return max(version, at.UnixMicro())
}

// feedHead is a FeedEvent without its data: marshalled on its own, the data's JSON (compact) is
// appended after it, so a snapshot is encoded once, straight into the message, and never
// compacted again as a json.RawMessage would be.
type feedHead struct {
	Kind      string `json:"kind"`
	Workspace string `json:"workspace"`
	Subject   string `json:"subject"`
	Version   string `json:"version,omitempty"`
	ID        int64  `json:"id"`
}

// feedOpen returns head's FeedEvent up to its "data" value, with room for size more bytes; the
// caller appends the data (compact JSON) and a closing '}'.
func feedOpen(head feedHead, size int) []byte {
	h, _ := json.Marshal(head) // strings and an integer: cannot fail
	msg := make([]byte, 0, len(h)+9+size)
	msg = append(msg, h[:len(h)-1]...)
	return append(msg, `,"data":`...)
}

// feedMessage returns the FeedEvent of head with data (compact JSON) as its "data".
func feedMessage(head feedHead, data []byte) []byte {
	return append(append(feedOpen(head, len(data)), data...), '}')
}

// snapshotMessage returns s's FeedEvent, or false for a snapshot encoding/json refuses (a NaN
// rate), which the feed cannot carry.
func snapshotMessage(s *schemas.Snapshot, id string) ([]byte, bool) {
	msg, err := s.AppendJSON(feedOpen(feedHead{Kind: "snapshot", Workspace: s.Aggregate.Workspace, Subject: id,
		ID: s.Version}, 1024))
	return append(msg, '}'), err == nil
}

// indexMembersPerCommand bounds the members of one ZADD, so that a large flush sends several
// moderate commands rather than one that holds Redis for long.
const indexMembersPerCommand = 512

// write records a coalesced set in one pipeline: each aggregate's and suite's index entries once
// (one ZADD per workspace and index), each pending history point, and one feed event per subject
// (its latest snapshot). trimmed maps an aggregate ID to the minute of the history point this
// recorder last wrote for it; a point of that same minute replaces a member instead of adding
// one, so the history cannot have grown past HistoryPoints and needs no trim. write updates
// trimmed only when the pipeline succeeded.
func (c *Catalog) write(ctx context.Context, p *pending, now time.Time, trimmed map[string]int64) error {
	ttl := c.idle.Milliseconds()
	seen := float64(now.UnixMilli())
	cutoff := strconv.FormatInt(now.Add(-c.idle).UnixMilli(), 10)
	index := map[string][]any{}    // workspace + "\x00" + kind -> members
	retained := map[string][]any{} // workspace -> id, version, retained, …
	member := func(ws, kind, m string) {
		k := ws + "\x00" + kind
		index[k] = append(index[k], m)
	}
	_, err := c.client.Pipelined(ctx, func(pl redis.Pipeliner) error {
		for i := range p.aggs {
			a := &p.aggs[i]
			s, id := &a.latest, a.id
			member(s.Aggregate.Workspace, "a", id)
			all := &s.Windows.All
			retained[s.Aggregate.Workspace] = append(retained[s.Aggregate.Workspace], id, s.Version, all.ConfirmedRepeats+all.Passed+all.Unscored)
			hk := c.histKey(id)
			grows := false
			for j := range a.earlier {
				grows = c.writePoint(ctx, pl, hk, &a.earlier[j], trimmed, id) || grows
			}
			grows = c.writePoint(ctx, pl, hk, s, trimmed, id) || grows
			hourly := c.hourKey(id)
			for j := range a.earlier {
				// Only the last of an hour's points stays: the later ones replace it.
				if hourOf(a.earlier[j].ObservedAt) != hourOf(nextAt(a, j)) {
					c.writeHourPoint(ctx, pl, hourly, &a.earlier[j])
				}
			}
			c.writeHourPoint(ctx, pl, hourly, s)
			if grows {
				pl.ZRemRangeByRank(ctx, hk, 0, -HistoryPoints-1)
				pl.ZRemRangeByRank(ctx, hourly, 0, -HourlyPoints-1)
			}
			pl.PExpire(ctx, hk, HistoryTTL) // always: the key may be new (lost in a failover, say)
			pl.PExpire(ctx, hourly, HistoryTTL)
			if msg, ok := snapshotMessage(s, id); ok {
				pl.Publish(ctx, c.Channel(), msg)
			}
		}
		for i := range p.disc {
			d := &p.disc[i]
			member(d.Workspace, "s", d.Suite)
			data, _ := json.Marshal(d)
			pl.Publish(ctx, c.Channel(), feedMessage(feedHead{Kind: "discrimination", Workspace: d.Workspace,
				Subject: d.Suite, ID: suiteFeedID(d.SnapshotVersion, d.ObservedAt)}, data))
		}
		for i := range p.stab {
			s := &p.stab[i]
			data, _ := json.Marshal(s)
			pl.Publish(ctx, c.Channel(), feedMessage(feedHead{Kind: "stability", Workspace: s.Workspace,
				Subject: s.Suite, Version: s.Version, ID: suiteFeedID(s.SnapshotVersion, s.ObservedAt)}, data))
		}
		for ws, triples := range retained {
			for len(triples) > 0 {
				n := min(len(triples), 3*indexMembersPerCommand)
				retainedScript.Eval(ctx, pl, []string{c.wsKey(ws, "r")}, append([]any{ttl}, triples[:n]...)...)
				triples = triples[n:]
			}
		}
		// The workspaces seen, for the index page of a token that reads every workspace.
		var wss []redis.Z
		for ws := range retained {
			wss = append(wss, redis.Z{Score: seen, Member: ws})
		}
		for i := range p.disc {
			wss = append(wss, redis.Z{Score: seen, Member: p.disc[i].Workspace})
		}
		if len(wss) > 0 {
			pl.ZAdd(ctx, c.workspacesKey(), wss...)
			pl.ZRemRangeByScore(ctx, c.workspacesKey(), "-inf", "("+cutoff)
			pl.PExpire(ctx, c.workspacesKey(), c.idle)
		}
		for k, members := range index {
			ws, kind, _ := strings.Cut(k, "\x00")
			key, seenKey := c.wsKey(ws, kind), c.wsKey(ws, kind+"t")
			for len(members) > 0 {
				n := min(len(members), indexMembersPerCommand)
				zs, ts := make([]redis.Z, n), make([]redis.Z, n)
				for i, m := range members[:n] {
					zs[i], ts[i] = redis.Z{Member: m}, redis.Z{Score: seen, Member: m}
				}
				pl.ZAdd(ctx, key, zs...)
				pl.ZAdd(ctx, seenKey, ts...)
				members = members[n:]
			}
			keys := []string{key, seenKey}
			if kind == "a" {
				keys = append(keys, c.wsKey(ws, "r"))
			}
			trimScript.Eval(ctx, pl, keys, cutoff, ttl)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for i := range p.aggs {
		trimmed[p.aggs[i].id] = minuteOf(p.aggs[i].latest.ObservedAt)
	}
	return nil
}

// writePoint replaces the history point of s's minute with s and reports whether the history may
// have grown by a member (a minute other than the one this recorder last wrote for id).
func (c *Catalog) writePoint(ctx context.Context, pl redis.Pipeliner, hk string, s *schemas.Snapshot, trimmed map[string]int64, id string) bool {
	pt := pointOf(s)
	m := minuteOf(s.ObservedAt)
	minute := strconv.FormatInt(m, 10)
	pl.ZRemRangeByScore(ctx, hk, minute, minute)
	pl.ZAdd(ctx, hk, redis.Z{Score: float64(m), Member: pt})
	last, ok := trimmed[id]
	return !ok || last != m
}

// writeHourPoint replaces the hourly history point of s's hour with s.
func (c *Catalog) writeHourPoint(ctx context.Context, pl redis.Pipeliner, key string, s *schemas.Snapshot) {
	h := hourOf(s.ObservedAt)
	hour := strconv.FormatInt(h, 10)
	pl.ZRemRangeByScore(ctx, key, hour, hour)
	pl.ZAdd(ctx, key, redis.Z{Score: float64(h), Member: pointOf(s)})
}

// nextAt is the observation time of the snapshot after a.earlier[j]: the next earlier one, or
// the latest.
func nextAt(a *pendingAggregate, j int) time.Time {
	if j+1 < len(a.earlier) {
		return a.earlier[j+1].ObservedAt
	}
	return a.latest.ObservedAt
}

// pointOf is the history point of s, as stored.
func pointOf(s *schemas.Snapshot) []byte {
	pt, _ := json.Marshal(Point{Version: s.Version, ObservedAt: s.ObservedAt, All: counts(s.Windows.All),
		Hour: counts(s.Windows.Hour), Day: counts(s.Windows.Day), Week: counts(s.Windows.Week)})
	return pt
}

// minuteOf is the history minute of an observation time: Unix seconds / 60.
func minuteOf(t time.Time) int64 { return t.Unix() / 60 }

// hourOf is the hourly history's hour of an observation time: Unix seconds / 3600.
func hourOf(t time.Time) int64 { return t.Unix() / 3600 }

// Page lists members of an index after a cursor: the members, and the cursor of the next page
// ("" on the last page).
type Page struct {
	Items []string
	Next  string
}

// list returns up to limit members of the lexical index key that start with prefix and sort after
// after.
func (c *Catalog) list(ctx context.Context, key, prefix, after string, limit int) (Page, error) {
	lo := "[" + prefix
	if after != "" && after >= prefix {
		lo = "(" + after
	}
	hi := "+"
	if prefix != "" {
		hi = "[" + prefix + "\xff"
	}
	items, err := c.client.ZRangeByLex(ctx, key, &redis.ZRangeBy{Min: lo, Max: hi, Count: int64(limit + 1)}).Result()
	if err != nil {
		return Page{}, err
	}
	pg := Page{Items: items}
	if len(items) > limit {
		pg.Items = items[:limit]
		pg.Next = items[limit-1]
	}
	return pg, nil
}

// Aggregates lists the aggregate IDs of workspace ws whose ID starts with prefix (an escaped
// scope prefix such as "ws|model|"), in ID order, after the cursor.
func (c *Catalog) Aggregates(ctx context.Context, ws, prefix, after string, limit int) (Page, error) {
	return c.list(ctx, c.wsKey(ws, "a"), prefix, after, limit)
}

// Retained is the number of opportunities the aggregates of workspace ws retain, as their newest
// recorded snapshots say (an aggregate counts until its index entry is dropped, idle for the
// retention): what the ingest's quota of retained opportunities holds a workspace to.
func (c *Catalog) Retained(ctx context.Context, ws string) (int64, error) {
	n, err := c.client.HGet(ctx, c.wsKey(ws, "r"), "").Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	return n, err
}

// Suites lists the suites of workspace ws in name order after the cursor.
func (c *Catalog) Suites(ctx context.Context, ws, after string, limit int) (Page, error) {
	return c.list(ctx, c.wsKey(ws, "s"), "", after, limit)
}

// History returns an aggregate's kept history points, oldest first: one a minute, or with hourly
// one an hour.
func (c *Catalog) History(ctx context.Context, aggID string, hourly bool) ([]Point, error) {
	key := c.histKey(aggID)
	if hourly {
		key = c.hourKey(aggID)
	}
	vals, err := c.client.ZRange(ctx, key, 0, -1).Result()
	if err != nil {
		return nil, err
	}
	out := make([]Point, 0, len(vals))
	for _, v := range vals {
		var p Point
		if json.Unmarshal([]byte(v), &p) == nil {
			out = append(out, p)
		}
	}
	return out, nil
}

// pending is what the recorder holds between two writes, coalesced: per aggregate its latest
// snapshot and, for each earlier minute it passed through, that minute's last snapshot (the
// history keeps one point per minute); per suite its latest discrimination, per suite version its
// latest stability. "Latest" is the last handed over (docs/semantics.md#read-side).
type pending struct {
	aggs    []pendingAggregate
	aggAt   map[string]int // aggregate ID -> index in aggs
	disc    []schemas.SuiteDiscrimination
	discAt  map[string]int // workspace \x00 suite
	stab    []schemas.SuiteStability
	stabAt  map[string]int // workspace \x00 suite \x00 version
	points  int            // history points held: len(aggs) + every earlier minute's
	batches int            // batches merged since the last write, counted as dropped if it fails
}

type pendingAggregate struct {
	id      string
	latest  schemas.Snapshot
	earlier []schemas.Snapshot // last snapshot of each other minute, not yet written
}

func newPending() *pending {
	return &pending{aggAt: map[string]int{}, discAt: map[string]int{}, stabAt: map[string]int{}}
}

// size is what the bound on the pending set counts: history points and suite snapshots.
func (p *pending) size() int { return p.points + len(p.disc) + len(p.stab) }

func (p *pending) empty() bool { return p.size() == 0 }

// reset empties p, keeping its memory for the next interval.
func (p *pending) reset() {
	clear(p.aggs) // drop references to the batches' snapshots
	p.aggs, p.disc, p.stab = p.aggs[:0], p.disc[:0], p.stab[:0]
	clear(p.aggAt)
	clear(p.discAt)
	clear(p.stabAt)
	p.points, p.batches = 0, 0
}

// add merges one handed-over batch into p.
func (p *pending) add(j recordJob) {
	p.batches++
	for i := range j.snaps {
		p.addSnapshot(&j.snaps[i])
	}
	for _, d := range j.suites.Discrimination {
		k := d.Workspace + "\x00" + d.Suite
		if i, ok := p.discAt[k]; ok {
			p.disc[i] = d
			continue
		}
		p.discAt[k] = len(p.disc)
		p.disc = append(p.disc, d)
	}
	for _, s := range j.suites.Stability {
		k := s.Workspace + "\x00" + s.Suite + "\x00" + s.Version
		if i, ok := p.stabAt[k]; ok {
			p.stab[i] = s
			continue
		}
		p.stabAt[k] = len(p.stab)
		p.stab = append(p.stab, s)
	}
}

func (p *pending) addSnapshot(s *schemas.Snapshot) {
	id := s.Aggregate.ID()
	i, ok := p.aggAt[id]
	if !ok {
		p.aggAt[id] = len(p.aggs)
		p.aggs = append(p.aggs, pendingAggregate{id: id, latest: *s})
		p.points++
		return
	}
	a := &p.aggs[i]
	m := minuteOf(s.ObservedAt)
	if minuteOf(a.latest.ObservedAt) != m {
		// The latest so far stays the last snapshot of its minute, for the history only; s
		// replaces an earlier point of its own minute (a clock that went back), if there is one.
		a.earlier = append(a.earlier, a.latest)
		p.points++
		for k := range a.earlier {
			if minuteOf(a.earlier[k].ObservedAt) == m {
				a.earlier = append(a.earlier[:k], a.earlier[k+1:]...)
				p.points--
				break
			}
		}
	}
	a.latest = *s
}

// Recorder is a Publisher that passes every batch to the next one and, once it is acknowledged,
// hands it to a background writer that records it in the catalog. The queue is bounded: when the
// writer falls behind, batches are dropped and counted, never waited for. The writer coalesces:
// it keeps the latest pending snapshot of each subject (and each earlier minute's last one for
// the history) and writes them in one pipeline every recordInterval, or sooner when
// recordMaxPending points are pending, so a busy aggregate costs Redis a few commands per
// interval instead of seven per batch.
type Recorder struct {
	next     Publisher
	catalog  *Catalog
	queue    chan recordJob
	dropped  prometheus.Counter
	failed   atomic.Int64
	log      *zap.Logger
	interval time.Duration
	bound    int

	mu      sync.Mutex // the writer's state below; held across a write, so writes never overlap
	pending *pending
	trimmed map[string]int64 // see Catalog.write
	pruned  int64            // the minute trimmed was last pruned at
}

type recordJob struct {
	snaps  []schemas.Snapshot
	suites suite.Output
}

// Recorder timing and bounds.
const (
	// recordInterval is the longest a handed-over snapshot waits before it is written. Half a
	// second is live for a person watching a page or a stream, far below the history's one point
	// per minute, and at the bench's rate (about a dozen batches a second) folds five or more
	// batches of a busy aggregate into one write.
	recordInterval = 500 * time.Millisecond
	// recordMaxPending writes sooner when this many history points and suite snapshots are
	// pending (many distinct aggregates), so one pipeline stays moderate (about 3 commands and
	// 1 KB per point) and the pending set's memory bounded.
	recordMaxPending = 4096
	// recordTimeout bounds one write.
	recordTimeout = 5 * time.Second
	// recordShutdownTimeout bounds the final write after Run's context ended.
	recordShutdownTimeout = 2 * time.Second
	// trimmedLimit bounds the aggregates Recorder.trimmed remembers; beyond it the map is
	// cleared, which costs one trim per aggregate, nothing more.
	trimmedLimit = 1 << 16
)

// NewRecorder returns a recorder in front of next; Run must run for anything to be recorded.
func NewRecorder(next Publisher, c *Catalog, reg prometheus.Registerer, log *zap.Logger) *Recorder {
	r := &Recorder{next: next, catalog: c, queue: make(chan recordJob, recorderQueue), log: log,
		interval: recordInterval, bound: recordMaxPending, pending: newPending(), trimmed: map[string]int64{},
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "repeatrate_readside_dropped_batches_total",
			Help: "Published batches the read side did not record (its queue was full or Redis failed)."})}
	if reg != nil {
		reg.MustRegister(r.dropped)
	}
	return r
}

func (r *Recorder) enqueue(j recordJob) {
	select {
	case r.queue <- j:
	default:
		r.dropped.Inc()
	}
}

// Settle waits for the next publisher's writes, when it has a Settle (Kafka.Settle).
func (r *Recorder) Settle(ctx context.Context) error {
	if s, ok := r.next.(interface{ Settle(context.Context) error }); ok {
		return s.Settle(ctx)
	}
	return nil
}

// Publish publishes through the next publisher, then queues the snapshots for recording.
func (r *Recorder) Publish(ctx context.Context, snaps []schemas.Snapshot) error {
	if err := r.next.Publish(ctx, snaps); err != nil {
		return err
	}
	if len(snaps) > 0 {
		r.enqueue(recordJob{snaps: snaps})
	}
	return nil
}

// PublishSuites publishes through the next publisher, then queues the suite snapshots.
func (r *Recorder) PublishSuites(ctx context.Context, o suite.Output, at time.Time) error {
	if err := r.next.PublishSuites(ctx, o, at); err != nil {
		return err
	}
	if len(o.Discrimination)+len(o.Stability) > 0 {
		r.enqueue(recordJob{suites: suite.Output{Discrimination: o.Discrimination, Stability: o.Stability}})
	}
	return nil
}

// Run merges queued batches into the pending set and writes it every recordInterval, or sooner
// when it reaches its bound, until ctx ends; then it writes what is queued and pending once more
// within recordShutdownTimeout, so a graceful stop leaves the latest snapshots recorded.
func (r *Recorder) Run(ctx context.Context) error {
	// A write is not cut short when ctx ends (it has its own timeout): what it holds would be
	// lost, and the final write follows it.
	wctx := context.WithoutCancel(ctx)
	tick := time.NewTicker(r.interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(wctx, recordShutdownTimeout)
			defer cancel()
			for r.flushOnce(fctx) {
			}
			return nil
		case j := <-r.queue:
			r.mu.Lock()
			r.pending.add(j)
			full := r.pending.size() >= r.bound
			r.mu.Unlock()
			if full {
				r.flushOnce(wctx)
			}
		case <-tick.C:
			r.flushOnce(wctx)
		}
	}
}

// flushOnce moves queued batches into the pending set until it is full or the queue empty,
// writes the set, and reports whether batches are still queued. A failed write's batches are
// counted as dropped and its error logged (at most every 100th).
func (r *Recorder) flushOnce(ctx context.Context) (more bool) {
	more, err := r.flush(ctx)
	if err != nil && r.failed.Add(1)%100 == 1 {
		r.log.Warn("record read-side history", zap.Error(err))
	}
	return more && ctx.Err() == nil
}

func (r *Recorder) flush(ctx context.Context) (more bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.pending
drain:
	for p.size() < r.bound {
		select {
		case j := <-r.queue:
			p.add(j)
		default:
			break drain
		}
	}
	more = len(r.queue) > 0
	if p.empty() {
		return more, nil
	}
	now := time.Now()
	if m := minuteOf(now); m != r.pruned || len(r.trimmed) > trimmedLimit {
		r.pruneTrimmed(m)
	}
	wctx, cancel := context.WithTimeout(ctx, recordTimeout)
	defer cancel()
	if err = r.catalog.write(wctx, p, now, r.trimmed); err != nil {
		r.dropped.Add(float64(p.batches))
	}
	p.reset()
	return more, err
}

// pruneTrimmed forgets aggregates whose last written minute is more than a minute before m (their
// next point is a new minute anyway), and everything when the map outgrew trimmedLimit.
func (r *Recorder) pruneTrimmed(m int64) {
	r.pruned = m
	if len(r.trimmed) > trimmedLimit {
		clear(r.trimmed)
		return
	}
	for id, last := range r.trimmed {
		if last < m-1 {
			delete(r.trimmed, id)
		}
	}
}

// Flush writes every queued and pending snapshot now (tests; Run writes on its own).
func (r *Recorder) Flush(ctx context.Context) error {
	for {
		more, err := r.flush(ctx)
		if err != nil {
			return fmt.Errorf("record: %w", err)
		}
		if !more {
			return nil
		}
	}
}
