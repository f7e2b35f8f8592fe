package sink

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
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
// and a channel that carries every published snapshot to the HTTP servers' live streams.
const (
	// HistoryPoints is how many history points an aggregate keeps: one per minute (the last
	// snapshot of that minute), so 24 hours of a busy aggregate.
	HistoryPoints = 1440
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

// Channel is the Redis Pub/Sub channel that carries every recorded snapshot.
func (c *Catalog) Channel() string { return c.prefix + ":feed" }

// trimScript drops index members (KEYS[1], lexical) whose last-seen time (KEYS[2]) is before
// ARGV[1], at most 200 per call, and refreshes both keys' lifetime (ARGV[2] ms).
var trimScript = redis.NewScript(`
local old = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. ARGV[1], 'LIMIT', 0, 200)
for _, m in ipairs(old) do
  redis.call('ZREM', KEYS[1], m)
  redis.call('ZREM', KEYS[2], m)
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return #old`)

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

// record writes one batch's snapshots to the index and history and publishes them on the channel,
// in one pipeline.
func (c *Catalog) record(ctx context.Context, snaps []schemas.Snapshot, suites suite.Output, now time.Time) error {
	ttl := c.idle.Milliseconds()
	seen := float64(now.UnixMilli())
	cutoff := strconv.FormatInt(now.Add(-c.idle).UnixMilli(), 10)
	touched := map[string]bool{}
	_, err := c.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range snaps {
			s := &snaps[i]
			id := s.Aggregate.ID()
			ws := s.Aggregate.Workspace
			p.ZAdd(ctx, c.wsKey(ws, "a"), redis.Z{Member: id})
			p.ZAdd(ctx, c.wsKey(ws, "at"), redis.Z{Score: seen, Member: id})
			touched[ws+"\x00a"] = true
			pt, _ := json.Marshal(Point{Version: s.Version, ObservedAt: s.ObservedAt, All: counts(s.Windows.All),
				Hour: counts(s.Windows.Hour), Day: counts(s.Windows.Day), Week: counts(s.Windows.Week)})
			minute := strconv.FormatInt(s.ObservedAt.Unix()/60, 10)
			hk := c.histKey(id)
			p.ZRemRangeByScore(ctx, hk, minute, minute)
			p.ZAdd(ctx, hk, redis.Z{Score: float64(s.ObservedAt.Unix() / 60), Member: string(pt)})
			p.ZRemRangeByRank(ctx, hk, 0, -HistoryPoints-1)
			p.PExpire(ctx, hk, HistoryTTL)
			data, _ := json.Marshal(s)
			ev, _ := json.Marshal(FeedEvent{Kind: "snapshot", Workspace: ws, Subject: id, ID: s.Version, Data: data})
			p.Publish(ctx, c.Channel(), ev)
		}
		for i := range suites.Discrimination {
			d := &suites.Discrimination[i]
			p.ZAdd(ctx, c.wsKey(d.Workspace, "s"), redis.Z{Member: d.Suite})
			p.ZAdd(ctx, c.wsKey(d.Workspace, "st"), redis.Z{Score: seen, Member: d.Suite})
			touched[d.Workspace+"\x00s"] = true
			data, _ := json.Marshal(d)
			ev, _ := json.Marshal(FeedEvent{Kind: "discrimination", Workspace: d.Workspace, Subject: d.Suite,
				ID: d.ObservedAt.UnixMicro(), Data: data})
			p.Publish(ctx, c.Channel(), ev)
		}
		for i := range suites.Stability {
			s := &suites.Stability[i]
			data, _ := json.Marshal(s)
			ev, _ := json.Marshal(FeedEvent{Kind: "stability", Workspace: s.Workspace, Subject: s.Suite, Version: s.Version,
				ID: s.ObservedAt.UnixMicro(), Data: data})
			p.Publish(ctx, c.Channel(), ev)
		}
		for k := range touched {
			ws, kind, _ := strings.Cut(k, "\x00")
			trimScript.Eval(ctx, p, []string{c.wsKey(ws, kind), c.wsKey(ws, kind+"t")}, cutoff, ttl)
		}
		return nil
	})
	return err
}

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

// Suites lists the suites of workspace ws in name order after the cursor.
func (c *Catalog) Suites(ctx context.Context, ws, after string, limit int) (Page, error) {
	return c.list(ctx, c.wsKey(ws, "s"), "", after, limit)
}

// History returns an aggregate's kept history points, oldest first.
func (c *Catalog) History(ctx context.Context, aggID string) ([]Point, error) {
	vals, err := c.client.ZRange(ctx, c.histKey(aggID), 0, -1).Result()
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

// Recorder is a Publisher that passes every batch to the next one and, once it is acknowledged,
// hands it to a background writer that records it in the catalog. The queue is bounded: when the
// writer falls behind, batches are dropped and counted, never waited for.
type Recorder struct {
	next    Publisher
	catalog *Catalog
	queue   chan recordJob
	dropped prometheus.Counter
	failed  atomic.Int64
	log     *zap.Logger
}

type recordJob struct {
	snaps  []schemas.Snapshot
	suites suite.Output
}

// NewRecorder returns a recorder in front of next; Run must run for anything to be recorded.
func NewRecorder(next Publisher, c *Catalog, reg prometheus.Registerer, log *zap.Logger) *Recorder {
	r := &Recorder{next: next, catalog: c, queue: make(chan recordJob, recorderQueue), log: log,
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

// Run records queued batches until ctx ends.
func (r *Recorder) Run(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case j := <-r.queue:
			wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := r.catalog.record(wctx, j.snaps, j.suites, time.Now())
			cancel()
			if err != nil && ctx.Err() == nil {
				r.dropped.Inc()
				if r.failed.Add(1)%100 == 1 { // the backend's error, logged, at most every 100th
					r.log.Warn("record read-side history", zap.Error(err))
				}
			}
		}
	}
}

// Flush records every queued batch now (tests).
func (r *Recorder) Flush(ctx context.Context) error {
	for {
		select {
		case j := <-r.queue:
			if err := r.catalog.record(ctx, j.snaps, j.suites, time.Now()); err != nil {
				return fmt.Errorf("record: %w", err)
			}
		default:
			return nil
		}
	}
}
