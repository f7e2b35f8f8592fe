package suite

import (
	"context"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/repeatrate/repeatrate/internal/testenv"
)

// TestCasesMatchRuns: the per-case table the read side shows (classes, suggested tiers, which
// cases moved) equals a recomputation from the stored runs — each case's outcome per version
// (fail when a scored run failed, pass when all scored runs passed, none otherwise), its class
// over the judged versions and its revival — and its class counts equal the store's own
// discrimination summary.
func TestCasesMatchRuns(t *testing.T) {
	client := testenv.Redis(t)
	ctx := context.Background()
	for name, cfg := range map[string]Config{
		"judge all":    {MinHistory: 3, MissingAfter: 20 * time.Minute},
		"judge last 4": {MinHistory: 3, JudgeLastVersions: 4, MissingAfter: 20 * time.Minute},
	} {
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		t.Run(name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(7, 11))
			store := newTestRedis(t, client, "cases", cfg)
			model := NewModel()
			stream := randomRuns(r, 3000)
			at := t0
			for i := 0; i < len(stream); {
				batch := stream[i:min(i+1+r.IntN(300), len(stream))]
				i += len(batch)
				at = at.Add(time.Minute)
				if _, err := store.Apply(ctx, batch, at); err != nil {
					t.Fatal(err)
				}
				model.Apply(batch)
			}
			for _, k := range model.Suites() {
				got, err := store.Cases(ctx, k)
				if err != nil {
					t.Fatal(err)
				}
				want := casesFromRuns(model, k, cfg)
				if !reflect.DeepEqual(got.Versions, want.Versions) {
					t.Fatalf("%v: versions %v, want %v", k, got.Versions, want.Versions)
				}
				if len(got.Cases) != len(want.Cases) {
					t.Fatalf("%v: %d cases, want %d", k, len(got.Cases), len(want.Cases))
				}
				for i := range want.Cases {
					if !reflect.DeepEqual(got.Cases[i], want.Cases[i]) {
						t.Fatalf("%v: case %+v, want %+v", k, got.Cases[i], want.Cases[i])
					}
				}
				s, err := store.Read(ctx, k, at)
				if err != nil {
					t.Fatal(err)
				}
				n := map[string]int{}
				for _, c := range got.Cases {
					n[c.Class]++
				}
				d := s.Discrimination
				if n[ClassAlwaysPass] != d.AlwaysPass || n[ClassAlwaysFail] != d.AlwaysFail || n[ClassDiscriminating] != d.Discriminating || n[ClassTooNew] != d.TooNew {
					t.Fatalf("%v: classes %v, summary %+v", k, n, d)
				}
			}
		})
	}
}

// casesFromRuns recomputes a suite's case table from its runs, independently of the store.
func casesFromRuns(m *Model, k Key, cfg Config) *CaseTable {
	t := &CaseTable{Versions: m.Versions(k)}
	col := map[string]int{}
	for i, v := range t.Versions {
		col[v] = i
	}
	rows := map[string][]Outcome{}
	for _, e := range m.Runs(k) {
		row := rows[e.Key.Case]
		if row == nil {
			row = make([]Outcome, len(t.Versions))
			rows[e.Key.Case] = row
		}
		j := col[e.Key.Version]
		switch {
		case e.Record.Result == 'f':
			row[j] = OutcomeFail
		case e.Record.Result == 'p' && row[j] != OutcomeFail:
			row[j] = OutcomePass
		}
	}
	first := 0
	if cfg.JudgeLastVersions > 0 && len(t.Versions) > cfg.JudgeLastVersions {
		first = len(t.Versions) - cfg.JudgeLastVersions
	}
	for c, outs := range rows {
		if !slices.ContainsFunc(outs, func(o Outcome) bool { return o != OutcomeNone }) {
			continue // only errored runs: a cell the store may or may not hold; never judged
		}
		row := CaseRow{Case: c, Outcomes: outs, Class: ClassNone}
		var seq []int
		for i, o := range outs {
			if o != OutcomeNone {
				seq = append(seq, i)
			}
		}
		streak := 1
		for streak < len(seq) && outs[seq[streak]] == outs[seq[0]] {
			streak++
		}
		if streak >= cfg.MinHistory && streak < len(seq) {
			row.Revived, row.RevivedFrom = t.Versions[seq[streak]], outs[seq[0]]
		}
		pass, fail := 0, 0
		for _, i := range seq {
			if i >= first {
				if outs[i] == OutcomePass {
					pass++
				} else {
					fail++
				}
			}
		}
		switch {
		case pass+fail < cfg.MinHistory:
			row.Class = ClassTooNew
		case fail == 0:
			row.Class = ClassAlwaysPass
		case pass == 0:
			row.Class = ClassAlwaysFail
		default:
			row.Class = ClassDiscriminating
		}
		t.Cases = append(t.Cases, row)
	}
	slices.SortFunc(t.Cases, func(a, b CaseRow) int { return strings.Compare(a.Case, b.Case) })
	return t
}
