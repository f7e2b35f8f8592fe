package suite

import (
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/repeatrate/repeatrate/internal/testenv"
)

// TestOpenCompassPassKOracle holds the opencompass mode's pass@k, G-Pass@k and mG-Pass@k to
// OpenCompass 0.5.4's own functions (test/opencompass/passk.py; its real numpy and SciPy): per
// (n, c, k) on a grid with k above n (11 921 cases, thresholds with inexact products such as
// 10 × 0.7), and per version on 40 generated versions with errored runs that OpenCompass's
// BaseEvaluator.evaluate itself scores — every reported G-Pass@k and mG-Pass@k mean, and the mean
// of compute_pass_at_k, to within 1e-9.
func TestOpenCompassPassKOracle(t *testing.T) {
	py := testenv.PythonVenv(t)
	out := filepath.Join(t.TempDir(), "passk.json")
	if b, err := exec.Command(py, filepath.Join("..", "..", "test", "opencompass", "passk.py"), out).CombinedOutput(); err != nil {
		t.Fatalf("passk.py: %v\n%s", err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		OpenCompass string    `json:"opencompass"`
		Taus        []float64 `json:"taus"`
		Cases       []struct {
			N, C, K   int
			PassAtK   float64   `json:"pass_at_k"`
			GPassAtK  []float64 `json:"g_pass_at_k"`
			MGPassAtK float64   `json:"mg_pass_at_k"`
		} `json:"cases"`
		Versions []struct {
			N        int                `json:"n"`
			Ks       []int              `json:"ks"`
			Results  [][]string         `json:"results"`
			Reported map[string]float64 `json:"reported"`
			PassAtK  map[string]float64 `json:"pass_at_k"`
		} `json:"versions"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	const eps = 1e-9
	bad := 0
	check := func(what string, got, want float64) {
		if math.Abs(got-want) > eps || math.IsNaN(got) {
			if bad++; bad <= 20 {
				t.Errorf("%s: ours %.15g, OpenCompass %.15g", what, got, want)
			}
		}
	}
	for _, c := range doc.Cases {
		name := "n=" + strconv.Itoa(c.N) + " c=" + strconv.Itoa(c.C) + " k=" + strconv.Itoa(c.K)
		check(name+" pass@k", PassAtK(c.N, c.C, c.K), c.PassAtK)
		check(name+" mG-Pass@k", OCMGPassAtK(c.N, c.C, c.K), c.MGPassAtK)
		for i, tau := range doc.Taus {
			check(name+" G-Pass@k τ="+strconv.FormatFloat(tau, 'f', -1, 64), OCGPassAtK(c.N, c.C, c.K, tau), c.GPassAtK[i])
		}
	}
	at := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	for vi, v := range doc.Versions {
		vs := versionOf(v.Results)
		cfg := Config{Ks: v.Ks, ReplyMode: ReplyOpenCompass}
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		s := StabilityOf(Key{"w", "s"}, &vs, cfg, at)
		pct := func(p *float64) float64 {
			if p == nil {
				return math.NaN()
			}
			return 100 * *p
		}
		reported := func(metric string) float64 {
			x, ok := v.Reported[metric]
			if !ok {
				t.Fatalf("version %d: OpenCompass reported no %s (it reported %v)", vi, metric, v.Reported)
			}
			return x
		}
		for _, k := range v.Ks {
			key := strconv.Itoa(k)
			name := "version " + strconv.Itoa(vi) + " (n=" + strconv.Itoa(v.N) + ") k=" + key
			check(name+" pass@k", pct(s.PassAtK[key]), v.PassAtK[key])
			check(name+" mG-Pass@k", pct(s.MGPassAtK[key]), reported("mG-Pass@"+key))
			for _, tau := range cfg.Taus {
				tk := strconv.FormatFloat(tau, 'f', -1, 64)
				pyTau := tk // Python's str(float): 0.0, 0.25, 1.0
				if !strings.Contains(pyTau, ".") {
					pyTau += ".0"
				}
				check(name+" G-Pass@k τ="+tk, pct(s.GPassAtK[key][tk]), reported("G-Pass@"+key+"_"+pyTau))
			}
		}
	}
	t.Logf("OpenCompass %s: %d (n, c, k) cases × %d thresholds and %d versions compared, %d differ", doc.OpenCompass,
		len(doc.Cases), len(doc.Taus), len(doc.Versions), bad)
	if len(doc.Cases) < 10000 || len(doc.Versions) < 40 {
		t.Fatalf("%d cases and %d versions: the generator lost some", len(doc.Cases), len(doc.Versions))
	}
}

// versionOf builds the summary a store keeps of a version whose cases ran results[case][run]
// ("pass", "fail" or "error"): scored runs by index, the (n, c) histogram of scored runs, and the
// one counting every run.
func versionOf(results [][]string) VersionSummary {
	v := VersionSummary{Version: "v"}
	byRun := map[int]*RunScore{}
	cases, attempts := map[[2]int64]int64{}, map[[2]int64]int64{}
	for _, runs := range results {
		v.Runs = max(v.Runs, int64(len(runs)))
		var n, c int64
		for i, r := range runs {
			if r == "error" {
				continue
			}
			rs := byRun[i]
			if rs == nil {
				rs = &RunScore{Index: int64(i)}
				byRun[i] = rs
			}
			rs.N++
			n++
			if r == "pass" {
				rs.Pass++
				c++
			}
		}
		if n > 0 {
			cases[[2]int64{n, c}]++
		}
		attempts[[2]int64{int64(len(runs)), c}]++
	}
	for _, rs := range byRun {
		v.RunScores = append(v.RunScores, *rs)
	}
	for nc, k := range cases {
		v.Cases = append(v.Cases, CaseCount{N: nc[0], C: nc[1], Cases: k})
	}
	for nc, k := range attempts {
		v.Attempts = append(v.Attempts, CaseCount{N: nc[0], C: nc[1], Cases: k})
	}
	sortSummary(&v)
	return v
}
