package aggregator

import (
	"context"
	_ "embed"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
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

// layout4Source is the apply script of state layout 4 (commit be0c2b3), the id index in chunks
// per hour and the state hash read through a cache, kept only to measure the current script
// against it. Its arguments are those of encodeRecords at that commit: id and record per
// observation.
//
//go:embed testdata/apply_layout4.lua
var layout4Source string

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
// costBatch is the batch size of the cost streams: REPEATRATE_APPLY_COST_BATCH, 2000 by default
// (the processor's batches under load are larger, up to 16 000).
func costBatch() int { return positiveEnv("REPEATRATE_APPLY_COST_BATCH", 2000) }

// costKey is the i-th aggregate of the cost measurements: correction fix-i of one live scope.
func costKey(i int) Key {
	k := Key{CorrectionID: fmt.Sprintf("fix-%d", i), Source: Live}
	k.Scope.Workspace, k.Scope.Model, k.Scope.Run = "acme", "support-bot", "2026-11"
	k.Scope.Checkpoint, k.Scope.Artifact = "ckpt-42", "prod"
	return k
}

func costStream(shape costShape, events int) (batches [][]Observation, ats []time.Time) {
	r := rand.New(rand.NewPCG(10, uint64(shape.aggregates)))
	keys := make([]Key, shape.aggregates)
	for i := range keys {
		keys[i] = costKey(i)
	}
	base := Micros(time.Now().Truncate(time.Second))
	span := int64(shape.span / time.Microsecond)
	var all []Observation
	size := costBatch()
	for b := 0; b*size < events; b++ {
		clock := base + int64(b)*int64(size)*40
		batch := make([]Observation, 0, size)
		for len(batch) < size {
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

// applyLayout4 applies obs with the layout-4 script as that commit's Redis.Apply did.
func applyLayout4(ctx context.Context, c *redis.Client, script *redis.Script, prefix string, ret, ttl time.Duration,
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
				args = append(args, o.OpportunityID, rec)
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

// costRedis is the Redis the cost measurements run on: REPEATRATE_APPLY_COST_REDIS when set (its
// CPU is then the scripts' alone), the test Redis otherwise.
func costRedis(t *testing.T) *redis.Client {
	a := os.Getenv("REPEATRATE_APPLY_COST_REDIS")
	if a == "" {
		return testenv.Redis(t)
	}
	c := redis.NewClient(&redis.Options{Addr: a})
	t.Cleanup(func() { c.Close() })
	return c
}

// previousScript is the script REPEATRATE_APPLY_COST_PREV names (git show <commit>:aggregator/apply.lua),
// taking the current arguments, measured beside the current one as "previous"; nil when unset.
func previousScript(t *testing.T) *redis.Script {
	f := os.Getenv("REPEATRATE_APPLY_COST_PREV")
	if f == "" {
		return nil
	}
	src, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	return redis.NewScript(string(src))
}

// redisCost is what Redis reports having spent: CPU seconds, the bytes it read from clients and
// wrote to them, and, per command, calls.
type redisCost struct {
	cpu     float64
	sys     float64 // of cpu
	in, out float64
	calls   map[string]int64
	usec    map[string]int64
}

func readCost(ctx context.Context, c *redis.Client) (redisCost, error) {
	s, err := c.Info(ctx, "cpu", "commandstats", "stats").Result()
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
		} else if v, ok := strings.CutPrefix(line, "total_net_input_bytes:"); ok {
			out.in, _ = strconv.ParseFloat(v, 64)
		} else if v, ok := strings.CutPrefix(line, "total_net_output_bytes:"); ok {
			out.out, _ = strconv.ParseFloat(v, 64)
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

// floorSource is the reference of the performance issue, "a plain dedupe-and-count script": per
// aggregate and batch one call that looks the ids up, stores the new ones, counts them and refreshes
// two TTLs (its record hash made a hash table, as the apply script's). It keeps no windows, bounds,
// retention or index; it is measured beside the others as the floor one call per aggregate costs,
// not checked.
const floorSource = `
local n = (#ARGV - 3) / 2
local got = redis.call('HMGET', KEYS[1], unpack(ARGV, 4, 3 + n))
local sets, c = {}, 0
for i = 1, n do
  if not got[i] then sets[#sets + 1] = ARGV[3 + i]; sets[#sets + 1] = ARGV[3 + n + i]; c = c + 1 end
end
if #sets > 0 then redis.call('HSET', KEYS[1], unpack(sets)) end
local total = redis.call('HINCRBY', KEYS[2], 'n', c)
if total == c and c > 0 then -- a new aggregate: its record hash a hash table, as the apply script makes it
  local long = string.rep('x', 100)
  redis.call('HSET', KEYS[1], long, ''); redis.call('HDEL', KEYS[1], long)
end
redis.call('PEXPIRE', KEYS[1], ARGV[3]); redis.call('PEXPIRE', KEYS[2], ARGV[3])
return total
`

// applyCurrentArgs applies obs with script (one taking the current store's arguments: record fields,
// then records) as Redis.Apply does.
func applyCurrentArgs(ctx context.Context, c *redis.Client, script *redis.Script, prefix string, ret, ttl time.Duration,
	obs []Observation, at time.Time) (map[Key][]any, error) {
	groups, keys := groupByKey(obs)
	head := []any{strconv.FormatInt(int64(ret/time.Microsecond), 10), strconv.FormatInt(Micros(at), 10),
		strconv.FormatInt(ttl.Milliseconds(), 10)}
	recs := encodeRecords(obs)
	fields, err := recordFields(obs)
	if err != nil {
		return nil, err
	}
	cmds := make([]*redis.Cmd, len(keys))
	_, err = c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for n, k := range keys {
			args := append([]any{}, head...)
			for _, i := range groups[k] {
				args = append(args, fields[i])
			}
			for _, i := range groups[k] {
				args = append(args, recs[i])
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

// TestApplyCost feeds the same batches to the layout-3 script, the layout-4 script and the
// current store (and a previous version of the current script when one is named), rotating their
// order batch by batch, and reports Redis CPU and commands per event of each
// (docs/semantics.md#delivery: one script call per aggregate and batch), beside the floor of a plain
// dedupe-and-count script. Results (but the floor's) must agree batch by batch. Run it with
//
//	REPEATRATE_APPLY_COST=240000 go test -count=1 -run TestApplyCost -v ./aggregator
//
// (REPEATRATE_APPLY_COST_REDIS names another Redis than the test one; its CPU is then the scripts'
// alone. REPEATRATE_APPLY_COST_PREV=<file.lua> adds that script, taking the current arguments, as
// "previous", to measure a step of the current layout: git show <commit>:aggregator/apply.lua.
// REPEATRATE_APPLY_COST_ONLY=current runs the current store alone, to profile it;
// REPEATRATE_APPLY_COST_ONLY=current,previous those two, alternating, checked against each other.
// REPEATRATE_APPLY_COST_BATCH sets the batch size, 2000 by default: the processor's batches under
// load hold up to 16 000 events, over which a call's fixed cost spreads further.)
func TestApplyCost(t *testing.T) {
	selected := func(only, name string) bool {
		return only == "" || slices.Contains(strings.Split(only, ","), name)
	}
	events, _ := strconv.Atoi(os.Getenv("REPEATRATE_APPLY_COST"))
	if events <= 0 {
		t.Skip("set REPEATRATE_APPLY_COST to the number of events per shape")
	}
	ctx := context.Background()
	client := costRedis(t)
	only := os.Getenv("REPEATRATE_APPLY_COST_ONLY")
	names := []string{"layout 3", "layout 4", "current", "floor"}
	scripts := []*redis.Script{redis.NewScript(layout3Source), redis.NewScript(layout4Source), applyScript, redis.NewScript(floorSource)}
	if prev := previousScript(t); prev != nil {
		names, scripts = append(names, "previous"), append(scripts, prev)
	}
	for _, s := range scripts {
		if err := s.Load(ctx, client).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// INFO's own cost, taken off each measurement.
	var infoCPU float64
	for i := 0; i < 20; i++ {
		a, _ := readCost(ctx, client)
		b, _ := readCost(ctx, client)
		infoCPU += (b.cpu - a.cpu) / 20
	}
	const ret = 30 * 24 * time.Hour
	const cur, floor = 2, 3 // names[cur] is the current store, names[floor] the unchecked reference
	// wide and today spread occurred times over many hours; recent is the harness's today shape
	// (occurred within 30 s, so an aggregate's winners crowd one or two hours of 32 and more).
	shapes := []costShape{{"wide", 60, 30 * 24 * time.Hour}, {"today", 400, 24 * time.Hour}, {"recent", 400, 30 * time.Second}}
	for _, shape := range shapes {
		t.Run(shape.name, func(t *testing.T) {
			batches, ats := costStream(shape, events)
			nc := len(names)
			prefixes := make([]string, nc)
			for i := range prefixes {
				prefixes[i] = testenv.Name(t, fmt.Sprint("cost", i))
				testenv.CleanPrefix(t, client, prefixes[i])
			}
			store, err := NewRedis(client, RedisConfig{Prefix: prefixes[cur], Retention: ret})
			if err != nil {
				t.Fatal(err)
			}
			costs := make([]redisCost, nc)
			for i := range costs {
				costs[i] = redisCost{calls: map[string]int64{}, usec: map[string]int64{}}
			}
			// The first tenth creates the aggregates; measured are the batches after it.
			n, warmup := 0, len(batches)/10
			for b, batch := range batches {
				measured := b >= warmup
				res := make([]map[Key]Tally, nc)
				run := func(which int) {
					before, _ := readCost(ctx, client)
					var raw map[Key][]any
					switch which {
					case 0:
						raw, err = applyLayout3(ctx, client, scripts[0], prefixes[0], ret, ret, batch, ats[b])
					case 1:
						raw, err = applyLayout4(ctx, client, scripts[1], prefixes[1], ret, ret, batch, ats[b])
					case cur:
						var got Applied
						got, err = store.Apply(ctx, batch, ats[b])
						res[cur] = got.Tallies
					default:
						raw, err = applyCurrentArgs(ctx, client, scripts[which], prefixes[which], ret, ret, batch, ats[b])
					}
					if err != nil {
						t.Fatal(err)
					}
					after, _ := readCost(ctx, client)
					if measured {
						costs[which].add(before, after)
						costs[which].cpu -= infoCPU
					}
					if raw != nil && which != floor {
						res[which] = map[Key]Tally{}
						for k, v := range raw {
							if res[which][k], _, err = parseReply(v); err != nil {
								t.Fatal(err)
							}
						}
					}
				}
				for j := 0; j < nc; j++ {
					if which := (b + j) % nc; selected(only, names[which]) {
						run(which)
					}
				}
				if measured {
					n += len(batch)
				}
				if only == "current" {
					continue
				}
				for k, got := range res[cur] {
					for which := range nc {
						if want := res[which][k]; which != cur && which != floor && selected(only, names[which]) && got != want {
							t.Fatalf("batch %d, %s: current %+v, %s %+v", b, k, got, names[which], want)
						}
					}
				}
			}
			per := func(c redisCost) (float64, float64) {
				return c.cpu * 1e6 / float64(n), float64(c.commands()) / float64(n)
			}
			t.Logf("%s: %d events measured after %d, %d aggregates, occurred over %v, batches of %d",
				shape.name, n, warmup*costBatch(), shape.aggregates, shape.span, costBatch())
			cpu, cmds, mem := make([]float64, nc), make([]float64, nc), make([]float64, nc)
			for i := range costs {
				if !selected(only, names[i]) {
					continue
				}
				cpu[i], cmds[i] = per(costs[i])
				mem[i] = float64(memoryOf(ctx, client, prefixes[i])) / float64(len(batches)*costBatch())
				t.Logf("  %-9s %.2f µs Redis CPU/event (%.2f sys), %.3f commands/event, %.1f bytes/event:%s",
					names[i]+":", cpu[i], costs[i].sys*1e6/float64(n), cmds[i], mem[i], costs[i].top(n))
			}
			if only == "current" {
				return
			}
			for i := range nc {
				if i != cur && selected(only, names[i]) {
					t.Logf("  current ÷ %s: CPU %.3f, commands %.3f, memory %.3f", names[i], cpu[cur]/cpu[i], cmds[cur]/cmds[i], mem[cur]/mem[i])
				}
			}
		})
	}
}
