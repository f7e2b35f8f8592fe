// Package synth generates synthetic repeatrate telemetry: structured CloudEvents of both input types
// with the faults real streams carry (transport duplicates, re-assessments, stale re-assessments,
// poison). The dev demo, the end-to-end tests and benchmarks feed on it; it is deterministic for a
// seed.
package synth

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"time"
)

// Config shapes the stream. Fractions are of all generated lines.
type Config struct {
	Seed         uint64
	Workspaces   int     // distinct workspaces (scopes differ by workspace and model)
	Corrections  int     // corrections per scope
	Duplicates   float64 // byte-identical re-sends and re-sends with a new CloudEvent id
	Reassessed   float64 // re-assessments of an earlier opportunity, newer or older
	Poison       float64 // lines that must be dead-lettered
	EvalShare    float64 // share of new opportunities that are eval correction checks
	RepeatChance float64 // chance a scored attempt is a confirmed repeat
	// Spread is how far before now a new opportunity may have occurred, uniformly; zero keeps
	// the original 30 s.
	Spread time.Duration
	// Skip is where the count that numbers ids starts: generators of one seed with counts that
	// never meet name different opportunities and events.
	Skip int
	// FirstWorkspace is the first workspace's number: the workspaces are ws-FirstWorkspace to
	// ws-(FirstWorkspace+Workspaces-1), drawn as from 0, so that generators apart in it alone
	// write the same stream to different aggregates.
	FirstWorkspace int
}

// Generator produces lines; it is not safe for concurrent use.
type Generator struct {
	cfg  Config
	r    *rand.Rand
	n    int
	past []attempt
}

type attempt struct {
	live                 bool
	ws, model, corr, opp string
	occurred, assessed   time.Time
	seq                  int
	class                int // 0 repeat, 1 passed, 2 unscored
	line                 []byte
}

// New returns a generator.
func New(cfg Config) *Generator {
	if cfg.Workspaces <= 0 {
		cfg.Workspaces = 3
	}
	if cfg.Corrections <= 0 {
		cfg.Corrections = 2
	}
	if cfg.RepeatChance == 0 {
		cfg.RepeatChance = 0.2
	}
	return &Generator{cfg: cfg, r: rand.New(rand.NewPCG(cfg.Seed, 0x5eed)), n: cfg.Skip}
}

// Line returns the next line, the time it says it occurred at, and whether it is poison.
func (g *Generator) Line(now time.Time) (line []byte, poison bool) {
	g.n++
	p := g.r.Float64()
	switch {
	case p < g.cfg.Poison:
		return g.poison(now), true
	case p < g.cfg.Poison+g.cfg.Duplicates && len(g.past) > 0:
		a := g.past[g.r.IntN(len(g.past))]
		if g.r.IntN(2) == 0 {
			return a.line, false
		}
		return g.render(&a, fmt.Sprintf("resend-%d", g.n)), false
	case p < g.cfg.Poison+g.cfg.Duplicates+g.cfg.Reassessed && len(g.past) > 0:
		a := g.past[g.r.IntN(len(g.past))]
		a.class = g.r.IntN(3)
		// Assessed no later than now: a grader cannot have judged in the future, and an
		// assessed_at beyond the allowed skew is poison.
		if t := a.assessed.Add(time.Duration(g.r.IntN(600)-200) * time.Second); t.Before(now) {
			a.assessed = t
		} else {
			a.assessed = now
		}
		a.seq = g.r.IntN(3)
		a.line = g.render(&a, fmt.Sprintf("re-%d", g.n))
		g.remember(a)
		return a.line, false
	}
	var occ time.Time
	if g.cfg.Spread > 0 {
		occ = now.Add(-time.Duration(g.r.Int64N(int64(g.cfg.Spread))))
	} else {
		occ = now.Add(-time.Duration(g.r.IntN(30_000)) * time.Millisecond)
	}
	a := attempt{
		live:     g.r.Float64() >= g.cfg.EvalShare,
		ws:       fmt.Sprintf("ws-%d", g.cfg.FirstWorkspace+g.r.IntN(g.cfg.Workspaces)),
		model:    []string{"m:large", "m|small"}[g.r.IntN(2)],
		corr:     fmt.Sprintf("fix-%d", g.r.IntN(g.cfg.Corrections)),
		opp:      fmt.Sprintf("opp-%d", g.n),
		occurred: occ, assessed: occ.Add(time.Duration(g.r.IntN(5000)) * time.Millisecond),
	}
	switch q := g.r.Float64(); {
	case q < 0.1:
		a.class = 2
	case q < 0.1+0.9*g.cfg.RepeatChance:
		a.class = 0
	default:
		a.class = 1
	}
	a.line = g.render(&a, fmt.Sprintf("ev-%d", g.n))
	g.remember(a)
	return a.line, false
}

func (g *Generator) remember(a attempt) {
	const keep = 5000
	if len(g.past) < keep {
		g.past = append(g.past, a)
		return
	}
	g.past[g.r.IntN(keep)] = a
}

func (g *Generator) render(a *attempt, id string) []byte {
	scope := map[string]string{"workspace": a.ws, "model": a.model, "run": "run-1", "checkpoint": "ckpt-7", "artifact": "prod"}
	var typ string
	data := map[string]any{
		"scope": scope, "correction_id": a.corr, "opportunity_id": a.opp,
		"occurred_at": a.occurred.UTC().Format(time.RFC3339Nano), "assessed_at": a.assessed.UTC().Format(time.RFC3339Nano),
	}
	if a.seq > 0 {
		data["assessment_seq"] = a.seq
	}
	if a.live {
		typ = "repeatrate.live.attempt.v1"
		data["outcome"] = []string{"confirmed_repeat", "passed", "unscored"}[a.class]
		if a.class == 2 {
			data["unscored_reason"] = "grader_error"
		}
	} else {
		typ = "repeatrate.eval.result.v1"
		data["suite"] = "regressions"
		data["case_id"] = "case-" + a.corr
		data["version"] = "v1"
		data["version_seq"] = 1
		data["run_index"] = 0
		data["runs"] = 1
		data["result"] = []string{"fail", "pass", "error"}[a.class]
	}
	b, _ := json.Marshal(map[string]any{
		"specversion": "1.0", "id": id, "source": "synth/" + a.ws, "type": typ,
		"time": a.assessed.UTC().Format(time.RFC3339Nano), "datacontenttype": "application/json", "data": data,
	})
	return b
}

// poisonKinds covers every class of bad input (docs/semantics.md#validation).
var poisonKinds = []func(now time.Time) string{
	func(time.Time) string { return "not json at all" },
	func(time.Time) string {
		return `{"specversion":"1.0","id":"x","source":"s","type":"unknown.type","data":{}}`
	},
	func(time.Time) string {
		return `{"specversion":"1.0","source":"s","type":"repeatrate.live.attempt.v1","data":{}}`
	},
	func(now time.Time) string {
		return fmt.Sprintf(`{"specversion":"1.0","id":"p","source":"s","type":"repeatrate.live.attempt.v1","data":{"scope":{"workspace":"","model":"m","run":"r","checkpoint":"c","artifact":"a"},"opportunity_id":"o","correction_id":"c","occurred_at":%q,"assessed_at":%q,"outcome":"passed"}}`,
			now.Format(time.RFC3339), now.Format(time.RFC3339))
	},
	func(now time.Time) string {
		return fmt.Sprintf(`{"specversion":"1.0","id":"p","source":"s","type":"repeatrate.live.attempt.v1","data":{"scope":{"workspace":"w","model":"m","run":"r","checkpoint":"c","artifact":"a"},"opportunity_id":"o","correction_id":"c","occurred_at":%q,"assessed_at":%q,"outcome":"maybe"}}`,
			now.Format(time.RFC3339), now.Format(time.RFC3339))
	},
	func(now time.Time) string {
		return fmt.Sprintf(`{"specversion":"1.0","id":"p","source":"s","type":"repeatrate.live.attempt.v1","data":{"scope":{"workspace":"w","model":"m","run":"r","checkpoint":"c","artifact":"a"},"opportunity_id":"o","correction_id":"c","occurred_at":"yesterday","assessed_at":%q,"outcome":"passed"}}`,
			now.Format(time.RFC3339))
	},
	func(now time.Time) string {
		f := now.Add(time.Hour).Format(time.RFC3339)
		return fmt.Sprintf(`{"specversion":"1.0","id":"p","source":"s","type":"repeatrate.live.attempt.v1","data":{"scope":{"workspace":"w","model":"m","run":"r","checkpoint":"c","artifact":"a"},"opportunity_id":"o","correction_id":"c","occurred_at":%q,"assessed_at":%q,"outcome":"passed"}}`, f, f)
	},
}

func (g *Generator) poison(now time.Time) []byte {
	return []byte(poisonKinds[g.r.IntN(len(poisonKinds))](now))
}
