package aggregator

import (
	"context"
	_ "embed"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/repeatrate/repeatrate/internal/testenv"
)

// layout3Source is the apply script of state layout 3 (commit 48431103), the per-hour id lists,
// kept only to measure the current script against it.
//
//go:embed testdata/apply_layout3.lua
var layout3Source string

// costShape is a stream shape of the performance issue: how many aggregates share the events and
// how far back their occurred times spread.
type costShape struct {
	name       string
	aggregates int
	span       time.Duration
}

// costStream returns batches of 2 000 observations (the processor's batch size) of the shape:
// mostly new opportunities, 5 % byte-identical duplicates and 5 % re-assessments, over a clock
// that moves 80 ms per batch (25 000 events/s), with the observation time of each batch.
func costStream(shape costShape, events int) (batches [][]Observation, ats []time.Time) {
	r := rand.New(rand.NewPCG(10, uint64(shape.aggregates)))
	keys := make([]Key, shape.aggregates)
	for i := range keys {
		keys[i] = Key{CorrectionID: fmt.Sprintf("fix-%d", i), Source: Live}
		keys[i].Scope.Workspace, keys[i].Scope.Model, keys[i].Scope.Run = "acme", "support-bot", "2026-11"
		keys[i].Scope.Checkpoint, keys[i].Scope.Artifact = "ckpt-42", "prod"
	}
	base := Micros(time.Now().Truncate(time.Second))
	span := int64(shape.span / time.Microsecond)
	var all []Observation
	for b := 0; b*2000 < events; b++ {
		clock := base + int64(b)*80_000
		batch := make([]Observation, 0, 2000)
		for len(batch) < 2000 {
			switch p := r.IntN(100); {
			case p < 5 && len(all) > 0:
				batch = append(batch, all[r.IntN(len(all))])
			case p < 10 && len(all) > 0:
				o := all[r.IntN(len(all))]
				o.Class, o.Assessed = Class(1+r.IntN(3)), o.Assessed+int64(1+r.IntN(600))*1e6
				batch = append(batch, o)
			default:
				n := len(all)
				occ := clock - r.Int64N(span)
				batch = append(batch, Observation{Key: keys[r.IntN(len(keys))],
					OpportunityID: fmt.Sprintf("conv-%07d/turn-%d", n/3, n%3),
					Class:         Class(1 + r.IntN(3)), Occurred: occ, Assessed: occ + 1e6})
			}
			all = append(all, batch[len(batch)-1])
		}
		batches, ats = append(batches, batch), append(ats, time.UnixMicro(clock))
	}
	return batches, ats
}

// applyLayout3 applies obs with the layout-3 script as that commit's Redis.Apply did (no batch
// mark or epoch check: they cost the same for both).
func applyLayout3(ctx context.Context, c *redis.Client, script *redis.Script, prefix string, ret, ttl time.Duration,
	obs []Observation, at time.Time) (map[Key][]any, error) {
	groups, keys := groupByKey(obs)
	head := []any{strconv.FormatInt(int64(ret/time.Microsecond), 10), strconv.FormatInt(Micros(at), 10),
		strconv.FormatInt(ttl.Milliseconds(), 10)}
	cmds := make([]*redis.Cmd, len(keys))
	_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for n, k := range keys {
			args := append([]any{}, head...)
			for _, i := range groups[k] {
				o := obs[i]
				rec := fmt.Sprintf("%c%x,%x", classCode(o.Class), o.Occurred, o.Assessed)
				if o.Seq != 0 {
					rec += fmt.Sprintf(",%x", o.Seq)
				}
				args = append(args, o.OpportunityID, strconv.FormatInt(o.Occurred, 10), rec)
			}
			base := prefix + ":{" + k.String() + "}:"
			cmds[n] = script.EvalSha(ctx, p, []string{base + "o", base + "s", base + "e", base + "z"}, args...)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	out := make(map[Key][]any, len(keys))
	for n, k := range keys {
		out[k], _ = cmds[n].Slice()
	}
	return out, nil
}

// redisCost is what Redis reports having spent: CPU seconds and, per command, calls.
type redisCost struct {
	cpu   float64
	sys   float64 // of cpu
	calls map[string]int64
	usec  map[string]int64
}

func readCost(ctx context.Context, c *redis.Client) (redisCost, error) {
	s, err := c.Info(ctx, "cpu", "commandstats").Result()
	if err != nil {
		return redisCost{}, err
	}
	out := redisCost{calls: map[string]int64{}, usec: map[string]int64{}}
	for _, line := range strings.Split(s, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_cpu_sys:"); ok {
			f, _ := strconv.ParseFloat(v, 64)
			out.cpu += f
			out.sys += f
		} else if v, ok := strings.CutPrefix(line, "used_cpu_user:"); ok {
			f, _ := strconv.ParseFloat(v, 64)
			out.cpu += f
		} else if rest, ok := strings.CutPrefix(line, "cmdstat_"); ok {
			name, stats, _ := strings.Cut(rest, ":calls=")
			n, _ := strconv.ParseInt(stats[:strings.IndexByte(stats, ',')], 10, 64)
			out.calls[name] = n
			if _, u, ok := strings.Cut(stats, ",usec="); ok {
				us, _ := strconv.ParseInt(u[:strings.IndexByte(u, ',')], 10, 64)
				out.usec[name] = us
			}
		}
	}
	return out, nil
}

func (a *redisCost) add(before, after redisCost) {
	a.cpu += after.cpu - before.cpu
	a.sys += after.sys - before.sys
	for k, v := range after.calls {
		if d := v - before.calls[k]; d > 0 && k != "info" {
			a.calls[k] += d
			a.usec[k] += after.usec[k] - before.usec[k]
		}
	}
}

func (a redisCost) commands() (inner int64) {
	for k, v := range a.calls {
		if k != "evalsha" && k != "eval" {
			inner += v
		}
	}
	return inner
}

func (a redisCost) top(events int) string {
	type kv struct {
		k string
		v int64
	}
	var l []kv
	for k, v := range a.calls {
		l = append(l, kv{k, v})
	}
	sort.Slice(l, func(i, j int) bool { return l[i].v > l[j].v })
	var b strings.Builder
	for i, e := range l {
		if i == 8 {
			break
		}
		fmt.Fprintf(&b, " %s=%.3f(%.2fµs)", e.k, float64(e.v)/float64(events), float64(a.usec[e.k])/float64(events))
	}
	return b.String()
}

// memoryOf sums MEMORY USAGE over every key under prefix.
func memoryOf(ctx context.Context, c *redis.Client, prefix string) int64 {
	var total int64
	iter := c.Scan(ctx, 0, prefix+":*", 1000).Iterator()
	for iter.Next(ctx) {
		n, _ := c.MemoryUsage(ctx, iter.Val(), 0).Result()
		total += n
	}
	return total
}

// TestApplyCost feeds the same batches to the layout-3 script and to the current store, alternating
// batch by batch, and reports Redis CPU and commands per event of each (docs/semantics.md#delivery:
// one script call per aggregate and batch). Results must agree batch by batch. Run it with
//
//	REPEATRATE_APPLY_COST=240000 go test -count=1 -run TestApplyCost -v ./aggregator
//
// (REPEATRATE_APPLY_COST_REDIS names another Redis than the test one; its CPU is then the scripts'
// alone.)
func TestApplyCost(t *testing.T) {
	events, _ := strconv.Atoi(os.Getenv("REPEATRATE_APPLY_COST"))
	if events <= 0 {
		t.Skip("set REPEATRATE_APPLY_COST to the number of events per shape")
	}
	ctx := context.Background()
	client := testenv.Redis(t)
	if a := os.Getenv("REPEATRATE_APPLY_COST_REDIS"); a != "" {
		client = redis.NewClient(&redis.Options{Addr: a})
		defer client.Close()
	}
	old := redis.NewScript(layout3Source)
	if err := old.Load(ctx, client).Err(); err != nil {
		t.Fatal(err)
	}
	if err := applyScript.Load(ctx, client).Err(); err != nil {
		t.Fatal(err)
	}
	// INFO's own cost, taken off each measurement.
	var infoCPU float64
	for i := 0; i < 20; i++ {
		a, _ := readCost(ctx, client)
		b, _ := readCost(ctx, client)
		infoCPU += (b.cpu - a.cpu) / 20
	}
	const ret = 30 * 24 * time.Hour
	for _, shape := range []costShape{{"wide", 60, 30 * 24 * time.Hour}, {"today", 400, 24 * time.Hour}} {
		t.Run(shape.name, func(t *testing.T) {
			batches, ats := costStream(shape, events)
			oldPrefix, newPrefix := testenv.Name(t, "cost-old"), testenv.Name(t, "cost-new")
			testenv.CleanPrefix(t, client, oldPrefix)
			testenv.CleanPrefix(t, client, newPrefix)
			store, err := NewRedis(client, RedisConfig{Prefix: newPrefix, Retention: ret})
			if err != nil {
				t.Fatal(err)
			}
			costOld := redisCost{calls: map[string]int64{}, usec: map[string]int64{}}
			costNew := redisCost{calls: map[string]int64{}, usec: map[string]int64{}}
			// The first tenth creates the aggregates; measured are the batches after it.
			n, warmup := 0, len(batches)/10
			for b, batch := range batches {
				var oldRes map[Key][]any
				var newRes Applied
				measured := b >= warmup
				runOld := func() {
					before, _ := readCost(ctx, client)
					if oldRes, err = applyLayout3(ctx, client, old, oldPrefix, ret, ret, batch, ats[b]); err != nil {
						t.Fatal(err)
					}
					after, _ := readCost(ctx, client)
					if measured {
						costOld.add(before, after)
						costOld.cpu -= infoCPU
					}
				}
				runNew := func() {
					before, _ := readCost(ctx, client)
					if newRes, err = store.Apply(ctx, batch, ats[b]); err != nil {
						t.Fatal(err)
					}
					after, _ := readCost(ctx, client)
					if measured {
						costNew.add(before, after)
						costNew.cpu -= infoCPU
					}
				}
				if b%2 == 0 {
					runOld()
					runNew()
				} else {
					runNew()
					runOld()
				}
				if measured {
					n += len(batch)
				}
				for _, k := range newRes.Keys {
					want, _, err := parseReply(oldRes[k])
					if err != nil {
						t.Fatal(err)
					}
					if newRes.Tallies[k] != want {
						t.Fatalf("batch %d, %s: new %+v, layout 3 %+v", b, k, newRes.Tallies[k], want)
					}
				}
			}
			per := func(c redisCost) (float64, float64) {
				return c.cpu * 1e6 / float64(n), float64(c.commands()) / float64(n)
			}
			oc, ocmd := per(costOld)
			nc, ncmd := per(costNew)
			om, nm := memoryOf(ctx, client, oldPrefix), memoryOf(ctx, client, newPrefix)
			t.Logf("%s: %d events measured after %d, %d aggregates, occurred over %v, batches of 2000",
				shape.name, n, warmup*2000, shape.aggregates, shape.span)
			t.Logf("  layout 3: %.2f µs Redis CPU/event (%.2f sys), %.3f commands/event:%s", oc, costOld.sys*1e6/float64(n), ocmd, costOld.top(n))
			t.Logf("  current:  %.2f µs Redis CPU/event (%.2f sys), %.3f commands/event:%s", nc, costNew.sys*1e6/float64(n), ncmd, costNew.top(n))
			t.Logf("  current ÷ layout 3: CPU %.3f, commands %.3f; memory %.1f → %.1f bytes/event (%.3f)",
				nc/oc, ncmd/ocmd, float64(om)/float64(len(batches)*2000), float64(nm)/float64(len(batches)*2000), float64(nm)/float64(om))
		})
	}
}
