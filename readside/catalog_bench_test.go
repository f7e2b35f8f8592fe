package readside

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/repeatrate/repeatrate/aggregator/suite"
	"github.com/repeatrate/repeatrate/internal/testenv"
	"github.com/repeatrate/repeatrate/schemas"
)

// redisCounters returns the commands Redis ran (INFO commandstats, without the benchmark's own
// INFO) and its CPU seconds (user + sys).
func redisCounters(b *testing.B, c *redis.Client) (commands int64, cpu float64) {
	b.Helper()
	info, err := c.Info(context.Background(), "commandstats", "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, l := range strings.Split(info, "\r\n") {
		if name, rest, ok := strings.Cut(strings.TrimPrefix(l, "cmdstat_"), ":calls="); ok && name != "info" {
			n, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
			commands += n
		}
		for _, f := range []string{"used_cpu_sys:", "used_cpu_user:"} {
			if v, ok := strings.CutPrefix(l, f); ok {
				s, _ := strconv.ParseFloat(v, 64)
				cpu += s
			}
		}
	}
	return commands, cpu
}

// BenchmarkRecord puts batches of 400 snapshots (the bench's "today" shape: 400 aggregates,
// batches of 2000 events) through the read side's recorder on a Redis of its own, one batch per
// iteration, and reports per snapshot the wall time, this process's CPU time, and Redis's commands
// and CPU time. "each-batch" is the recorder before coalescing (recordEachBatch: one pipeline per
// batch, every snapshot written); "coalesced-6" writes every 6 batches, as Run's interval does at
// about 12 batches a second; "coalesced-1" writes after every batch (a quiet stream: nothing to
// fold, only the cheaper write). Observation times advance 80 ms per batch, so minutes change as
// in a run.
//
//	go test -run '^$' -bench BenchmarkRecord -benchtime 200x ./sink
func BenchmarkRecord(b *testing.B) {
	const aggregates = 400
	client := testenv.OwnRedis(b)
	for _, mode := range []struct {
		name            string
		batchesPerWrite int // 0: recordEachBatch
	}{{"each-batch", 0}, {"coalesced-1", 1}, {"coalesced-6", 6}} {
		b.Run(mode.name, func(b *testing.B) {
			ctx := context.Background()
			prefix := testenv.Name(b, "benchrecord")
			testenv.CleanPrefix(b, client, prefix)
			cat := NewCatalog(client, prefix, time.Hour)
			rec := NewRecorder(nopPublisher{}, cat, nil, zap.NewNop())
			batches := make([][]schemas.Snapshot, b.N)
			start := time.Now().Truncate(time.Minute)
			for n := range batches {
				batches[n] = make([]schemas.Snapshot, aggregates)
				for i := range batches[n] {
					batches[n][i] = recordSnapshot(fmt.Sprint("correction-", i), int64(n+1), start.Add(time.Duration(n)*80*time.Millisecond))
				}
			}
			cmd0, cpu0 := redisCounters(b, client)
			own0 := testenv.OwnCPU(b)
			b.ReportAllocs()
			b.ResetTimer()
			for n := range b.N {
				if mode.batchesPerWrite == 0 {
					if err := recordEachBatch(ctx, cat, batches[n], suite.Output{}, time.Now()); err != nil {
						b.Fatal(err)
					}
					continue
				}
				if err := rec.Publish(ctx, batches[n]); err != nil {
					b.Fatal(err)
				}
				if (n+1)%mode.batchesPerWrite == 0 || n == b.N-1 {
					if err := rec.Flush(ctx); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.StopTimer()
			own1 := testenv.OwnCPU(b)
			cmd1, cpu1 := redisCounters(b, client)
			snaps := float64(b.N * aggregates)
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/snaps, "ns/snapshot")
			b.ReportMetric(float64((own1-own0).Nanoseconds())/snaps, "cpu_ns/snapshot")
			b.ReportMetric(float64(cmd1-cmd0)/snaps, "redis_cmds/snapshot")
			b.ReportMetric((cpu1-cpu0)*1e6/snaps, "redis_cpu_us/snapshot")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// recordEachBatch is the recorder's write as it was before coalescing, kept for BenchmarkRecord's
// comparison only: every snapshot of every batch written to the index and history and published.
func recordEachBatch(ctx context.Context, c *Catalog, snaps []schemas.Snapshot, suites suite.Output, now time.Time) error {
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
