package suite

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/schemas"
)

//go:embed suite.lua
var suiteSource string

var suiteScript = redis.NewScript(suiteSource)

// announceScript adds revived cases to a suite's announced set (KEYS[2]) and gives the set the
// remaining lifetime of the suite's run hash (KEYS[1]), so that neither outlives the other: a set
// that expired first would have every revived case announced again, one that outlived a dropped
// suite would silence the revivals of its next history.
var announceScript = redis.NewScript(`
for i = 1, #ARGV do redis.call('SADD', KEYS[2], ARGV[i]) end
local ttl = redis.call('PTTL', KEYS[1])
if ttl > 0 then
  redis.call('PEXPIRE', KEYS[2], ttl)
elseif ttl == -1 then
  redis.call('PERSIST', KEYS[2])
else
  redis.call('DEL', KEYS[2])
end
return ttl`)

// Applied is the result of applying runs: each run's outcome in input order, and for every
// touched suite all of its runs after the apply (ordered as SortRuns orders them) and the revived
// cases already announced.
type Applied struct {
	Outcomes  []aggregator.Outcome
	Suites    []Key
	Runs      map[Key][]RunEntry
	Announced map[Key]map[string]bool
}

// Redis stores graded runs, one hash per suite under the hash tag {s|<suite id>}, merged by
// one idempotent script call per suite and batch.
type Redis struct {
	client redis.UniversalClient
	cfg    aggregator.RedisConfig
}

// NewRedis returns a suite store on client; cfg.IdleTTL drops a suite (its runs and its
// announced revived cases, together) once it has seen no result for that long of wall-clock time.
// The in-memory Model, which replay uses, has no wall clock and keeps every suite.
func NewRedis(client redis.UniversalClient, cfg aggregator.RedisConfig) (*Redis, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Redis{client: client, cfg: cfg}, nil
}

func (r *Redis) keys(k Key) (runs, announced string) {
	base := r.cfg.Prefix + ":{s|" + k.ID() + "}:"
	return base + "r", base + "rv"
}

func runField(k RunKey) string {
	return schemas.JoinEscaped(k.Version, k.Case, strconv.FormatInt(k.RunIndex, 10))
}

func encodeRun(r *RunRecord) string {
	trigger := r.Trigger
	if trigger == "" {
		trigger = "-"
	}
	reply := 0
	if r.Reply {
		reply = 1
	}
	return fmt.Sprintf("%c %d %d %d %d %d %d %d %s %s", r.Result, r.Assessed, r.Seq, r.VersionSeq, r.Runs, r.Occurred,
		reply, r.Tokens, strconv.FormatFloat(r.GzipRatio, 'g', -1, 64), trigger)
}

func decodeRun(sk Key, field, value string) (RunEntry, error) {
	parts, err := schemas.SplitEscaped(field)
	if err != nil || len(parts) != 3 {
		return RunEntry{}, fmt.Errorf("run field %q", field)
	}
	idx, err := strconv.ParseInt(parts[2], 10, 64)
	if err != nil {
		return RunEntry{}, fmt.Errorf("run field %q: %w", field, err)
	}
	f := strings.Fields(value)
	if len(f) != 10 || len(f[0]) != 1 {
		return RunEntry{}, fmt.Errorf("run value %q", value)
	}
	e := RunEntry{Key: RunKey{Key: sk, Version: parts[0], Case: parts[1], RunIndex: idx}}
	r := &e.Record
	r.Result = f[0][0]
	var ints [7]int64
	for i := range ints {
		if ints[i], err = strconv.ParseInt(f[1+i], 10, 64); err != nil {
			return RunEntry{}, fmt.Errorf("run value %q: %w", value, err)
		}
	}
	r.Assessed, r.Seq, r.VersionSeq, r.Runs, r.Occurred, r.Reply, r.Tokens = ints[0], ints[1], ints[2], ints[3], ints[4], ints[5] == 1, int(ints[6])
	if r.GzipRatio, err = strconv.ParseFloat(f[8], 64); err != nil {
		return RunEntry{}, fmt.Errorf("run value %q: %w", value, err)
	}
	if f[9] != "-" {
		r.Trigger = f[9]
	}
	return e, nil
}

// Apply merges obs and reads back every touched suite, in one pipelined round trip. Calling it again
// with the same observations changes nothing.
func (r *Redis) Apply(ctx context.Context, obs []RunObservation) (Applied, error) {
	groups := map[Key][]int{}
	var suites []Key
	for i := range obs {
		k := obs[i].Key.Key
		if _, ok := groups[k]; !ok {
			suites = append(suites, k)
		}
		groups[k] = append(groups[k], i)
	}
	ttl := strconv.FormatInt(r.cfg.IdleTTL.Milliseconds(), 10)
	type reads struct {
		apply *redis.Cmd
		runs  *redis.MapStringStringCmd
		ann   *redis.StringSliceCmd
	}
	var epoch *redis.StringCmd
	run := func() ([]reads, error) {
		rs := make([]reads, len(suites))
		_, err := r.client.Pipelined(ctx, func(p redis.Pipeliner) error {
			if r.cfg.Epoch != "" {
				epoch = p.Get(ctx, aggregator.EpochKey(r.cfg.Prefix))
			}
			for n, k := range suites {
				runsKey, annKey := r.keys(k)
				args := make([]any, 0, 1+4*len(groups[k]))
				args = append(args, ttl)
				for _, i := range groups[k] {
					o := &obs[i]
					args = append(args, runField(o.Key), strconv.FormatInt(o.Record.Assessed, 10),
						strconv.FormatInt(o.Record.Seq, 10), encodeRun(&o.Record))
				}
				rs[n].apply = suiteScript.EvalSha(ctx, p, []string{runsKey, annKey}, args...)
				rs[n].runs = p.HGetAll(ctx, runsKey)
				rs[n].ann = p.SMembers(ctx, annKey)
			}
			return nil
		})
		return rs, err
	}
	rs, err := run()
	if err != nil && isNoScript(err) {
		if lerr := suiteScript.Load(ctx, r.client).Err(); lerr != nil {
			return Applied{}, fmt.Errorf("load suite script: %w", lerr)
		}
		rs, err = run()
	}
	if err != nil && !errors.Is(err, redis.Nil) {
		return Applied{}, fmt.Errorf("apply runs: %w", err)
	}
	if epoch != nil && epoch.Val() != r.cfg.Epoch {
		return Applied{}, fmt.Errorf("%w: epoch marker of namespace %q is %q, want %q; run `repeatrate rebuild`",
			aggregator.ErrStateLost, r.cfg.Prefix, epoch.Val(), r.cfg.Epoch)
	}
	res := Applied{Outcomes: make([]aggregator.Outcome, len(obs)), Suites: suites,
		Runs: map[Key][]RunEntry{}, Announced: map[Key]map[string]bool{}}
	for n, k := range suites {
		codes, err := rs[n].apply.Text()
		if err != nil || len(codes) != len(groups[k]) {
			return Applied{}, fmt.Errorf("apply runs of %s: %q %v", k.ID(), codes, err)
		}
		for j, i := range groups[k] {
			res.Outcomes[i] = outcomeCodes[codes[j]]
		}
		fields, err := rs[n].runs.Result()
		if err != nil {
			return Applied{}, fmt.Errorf("read runs of %s: %w", k.ID(), err)
		}
		es, err := decodeRuns(k, fields)
		if err != nil {
			return Applied{}, err
		}
		res.Runs[k] = es
		ann := map[string]bool{}
		for _, c := range rs[n].ann.Val() {
			ann[c] = true
		}
		res.Announced[k] = ann
	}
	return res, nil
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
	if err := announceScript.Run(ctx, r.client, []string{runsKey, annKey}, members...).Err(); err != nil {
		return fmt.Errorf("mark revived of %s: %w", k.ID(), err)
	}
	return nil
}

// Read returns every run of suite k.
func (r *Redis) Read(ctx context.Context, k Key) ([]RunEntry, error) {
	runsKey, _ := r.keys(k)
	fields, err := r.client.HGetAll(ctx, runsKey).Result()
	if err != nil {
		return nil, fmt.Errorf("read runs of %s: %w", k.ID(), err)
	}
	return decodeRuns(k, fields)
}

func decodeRuns(k Key, fields map[string]string) ([]RunEntry, error) {
	es := make([]RunEntry, 0, len(fields))
	for f, v := range fields {
		e, err := decodeRun(k, f, v)
		if err != nil {
			return nil, fmt.Errorf("suite %s: %w", k.ID(), err)
		}
		es = append(es, e)
	}
	SortRuns(es)
	return es, nil
}

// isNoScript reports a script cache miss (the server restarted or flushed its scripts).
func isNoScript(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
}

// outcomeCodes maps suite.lua's one-letter outcomes.
var outcomeCodes = map[byte]aggregator.Outcome{'N': aggregator.Counted, 'R': aggregator.Reassessed,
	'D': aggregator.Duplicate, 'S': aggregator.Stale}
