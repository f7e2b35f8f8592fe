package synth

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// SuiteConfig shapes a stream of eval results for one suite.
type SuiteConfig struct {
	Seed       uint64
	Workspace  string
	Suite      string
	Cases      int
	Versions   int
	Runs       int
	Duplicates float64 // re-sent results
	Regrades   float64 // later re-gradings of a run with another result
	LoopShare  float64 // replies that loop on one sentence
	// Scope is the results' scope (workspace is Workspace's); nil is model m, run r, checkpoint
	// c, artifact a.
	Scope map[string]string
}

// Suite returns the results of every (case, version, run), versions in order, runs shuffled within
// a version, with duplicates and re-gradings mixed in. Cases follow four profiles by index: always
// pass, always fail, random, and pass for five versions then fail (revived).
func Suite(cfg SuiteConfig, start time.Time) [][]byte {
	r := rand.New(rand.NewPCG(cfg.Seed, 0x5017e))
	var out [][]byte
	n := 0
	for v := 1; v <= cfg.Versions; v++ {
		var batch [][]byte
		for c := 0; c < cfg.Cases; c++ {
			for run := 0; run < cfg.Runs; run++ {
				var result string
				switch c % 4 {
				case 0:
					result = "pass"
				case 1:
					result = "fail"
				case 2:
					result = []string{"pass", "fail"}[r.IntN(2)]
				default:
					result = map[bool]string{true: "pass", false: "fail"}[v <= 5]
				}
				if r.Float64() < 0.03 {
					result = "error"
				}
				reply := "The refund window is thirty days and store credit applies after that."
				if r.Float64() < cfg.LoopShare {
					reply = strings.Repeat("Let me check that again. ", 40)
				}
				occ := start.Add(time.Duration(v)*time.Minute + time.Duration(r.IntN(1000))*time.Millisecond)
				n++
				line := suiteLine(cfg, fmt.Sprintf("case-%03d", c), v, run, result, reply, occ, occ.Add(time.Second), fmt.Sprintf("r-%d", n))
				batch = append(batch, line)
				if r.Float64() < cfg.Duplicates {
					batch = append(batch, line)
				}
				if r.Float64() < cfg.Regrades {
					re := map[string]string{"pass": "fail", "fail": "pass", "error": "pass"}[result]
					batch = append(batch, suiteLine(cfg, fmt.Sprintf("case-%03d", c), v, run, re, reply, occ, occ.Add(time.Minute), fmt.Sprintf("rg-%d", n)))
				}
			}
		}
		r.Shuffle(len(batch), func(i, j int) { batch[i], batch[j] = batch[j], batch[i] })
		out = append(out, batch...)
	}
	return out
}

func suiteLine(cfg SuiteConfig, c string, v, run int, result, reply string, occ, assessed time.Time, id string) []byte {
	b, _ := json.Marshal(map[string]any{
		"specversion": "1.0", "id": id, "source": "synth/suite", "type": "repeatrate.eval.result.v1",
		"data": map[string]any{
			"scope": scopeOf(cfg),
			"suite": cfg.Suite, "case_id": c, "version": fmt.Sprintf("v%02d", v), "version_seq": v,
			"run_index": run, "runs": cfg.Runs, "result": result, "prediction": reply,
			"occurred_at": occ.UTC().Format(time.RFC3339Nano), "assessed_at": assessed.UTC().Format(time.RFC3339Nano),
		},
	})
	return b
}

func scopeOf(cfg SuiteConfig) map[string]string {
	sc := map[string]string{"model": "m", "run": "r", "checkpoint": "c", "artifact": "a"}
	for k, v := range cfg.Scope {
		sc[k] = v
	}
	sc["workspace"] = cfg.Workspace
	return sc
}
