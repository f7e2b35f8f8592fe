package synth

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// EvalConfig shapes an eval-heavy stream: one suite version that grows to Runs graded runs, with
// live attempts mixed in. Fractions are of all generated lines (LiveShare) or of eval results
// (Checks).
type EvalConfig struct {
	Seed        uint64
	Workspace   string  // scope workspace of every line (default "bench")
	Suite       string  // suite of every eval result (default "regressions")
	Version     string  // the one version label (default "v1", version_seq 1)
	Runs        int     // graded runs in the version: distinct (case, run_index) pairs
	RunsPerCase int     // runs planned per case (default 5); cases = ⌈Runs / RunsPerCase⌉
	LiveShare   float64 // share of lines that are live attempts, each a new opportunity
	Checks      float64 // share of cases whose results are also correction checks (of one correction each)
	Corrections int     // corrections the live attempts and correction checks spread over (default 10)
}

// EvalGenerator produces an eval-heavy stream line by line (see NewEval); it is not safe for
// concurrent use. Lines are generated on demand, so a stream of millions of runs needs no memory
// beyond one line.
type EvalGenerator struct {
	cfg  EvalConfig
	r    *rand.Rand
	run  int // graded runs emitted so far
	live int // live attempts emitted so far
}

// NewEval returns a generator of cfg's stream. Runs arrive case by case (the RunsPerCase runs of
// a case back to back, run indexes in order), so the version's stored runs grow steadily from
// empty to Runs. Results follow four case profiles by index, like Suite: always pass, always fail,
// random, and pass-then-fail by run index; 3 % of runs error. Each eval result carries a short
// prediction of 3 to 40 words, never abnormal.
func NewEval(cfg EvalConfig) *EvalGenerator {
	if cfg.Workspace == "" {
		cfg.Workspace = "bench"
	}
	if cfg.Suite == "" {
		cfg.Suite = "regressions"
	}
	if cfg.Version == "" {
		cfg.Version = "v1"
	}
	if cfg.RunsPerCase <= 0 {
		cfg.RunsPerCase = 5
	}
	if cfg.Corrections <= 0 {
		cfg.Corrections = 10
	}
	return &EvalGenerator{cfg: cfg, r: rand.New(rand.NewPCG(cfg.Seed, 0xe7a1))}
}

// Runs returns how many graded runs (eval results) have been generated so far.
func (g *EvalGenerator) Runs() int { return g.run }

// replyWords are the vocabulary of the short predictions.
var replyWords = strings.Fields("the refund window is thirty days and store credit applies after that " +
	"please keep your receipt orders ship within two business days from our warehouse")

// Next returns the next line, occurred shortly before now, and false once all Runs graded runs have
// been generated.
func (g *EvalGenerator) Next(now time.Time) ([]byte, bool) {
	if g.run >= g.cfg.Runs {
		return nil, false
	}
	occ := now.Add(-time.Duration(g.r.IntN(30_000)) * time.Millisecond)
	assessed := occ.Add(time.Duration(g.r.IntN(2000)) * time.Millisecond)
	corr := fmt.Sprintf("fix-%d", g.r.IntN(g.cfg.Corrections))
	scope := map[string]string{"workspace": g.cfg.Workspace, "model": "m", "run": "run-1", "checkpoint": "ckpt-7", "artifact": "prod"}
	if g.r.Float64() < g.cfg.LiveShare {
		g.live++
		data := map[string]any{
			"scope": scope, "correction_id": corr, "opportunity_id": fmt.Sprintf("live-%d", g.live),
			"occurred_at": occ.UTC().Format(time.RFC3339Nano), "assessed_at": assessed.UTC().Format(time.RFC3339Nano),
			"outcome": []string{"confirmed_repeat", "passed", "passed", "passed"}[g.r.IntN(4)],
		}
		return g.event(fmt.Sprintf("l-%d", g.live), "repeatrate.live.attempt.v1", assessed, data), true
	}
	c, run := g.run/g.cfg.RunsPerCase, g.run%g.cfg.RunsPerCase
	g.run++
	var result string
	switch c % 4 {
	case 0:
		result = "pass"
	case 1:
		result = "fail"
	case 2:
		result = []string{"pass", "fail"}[g.r.IntN(2)]
	default:
		result = map[bool]string{true: "pass", false: "fail"}[run < g.cfg.RunsPerCase/2+1]
	}
	if g.r.Float64() < 0.03 {
		result = "error"
	}
	words := make([]string, 3+g.r.IntN(38))
	for i := range words {
		words[i] = replyWords[g.r.IntN(len(replyWords))]
	}
	data := map[string]any{
		"scope": scope, "suite": g.cfg.Suite, "case_id": fmt.Sprintf("case-%06d", c),
		"version": g.cfg.Version, "version_seq": 1, "run_index": run, "runs": g.cfg.RunsPerCase,
		"result": result, "prediction": strings.Join(words, " "),
		"occurred_at": occ.UTC().Format(time.RFC3339Nano), "assessed_at": assessed.UTC().Format(time.RFC3339Nano),
	}
	// A case checks one correction, as a regression case written for a fix does: all its runs
	// are checks of it, or none is.
	if h := caseHash(g.cfg.Seed, c); float64(h>>11)/(1<<53) < g.cfg.Checks {
		data["correction_id"] = fmt.Sprintf("fix-%d", h%uint64(g.cfg.Corrections))
		data["opportunity_id"] = fmt.Sprintf("check-%d", g.run)
	}
	return g.event(fmt.Sprintf("e-%d", g.run), "repeatrate.eval.result.v1", assessed, data), true
}

func (g *EvalGenerator) event(id, typ string, at time.Time, data map[string]any) []byte {
	b, _ := json.Marshal(map[string]any{
		"specversion": "1.0", "id": id, "source": "synth/" + g.cfg.Workspace, "type": typ,
		"time": at.UTC().Format(time.RFC3339Nano), "datacontenttype": "application/json", "data": data,
	})
	return b
}

// caseHash mixes seed and case number c (splitmix64's finalizer): which cases are checks, and of
// which correction, without drawing from the line generator.
func caseHash(seed uint64, c int) uint64 {
	z := seed ^ uint64(c)*0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}
