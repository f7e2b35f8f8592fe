package suite

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Outcome is a case's outcome in one version (docs/semantics.md, suite discrimination): pass when
// it has scored runs and all passed, fail when any scored run failed, none otherwise.
type Outcome int8

// Case outcomes; OutcomeNone also stands for a version the case has no runs in.
const (
	OutcomeNone Outcome = iota
	OutcomePass
	OutcomeFail
)

// String is the outcome's word: pass, fail or none.
func (o Outcome) String() string {
	switch o {
	case OutcomePass:
		return "pass"
	case OutcomeFail:
		return "fail"
	}
	return "none"
}

// Case classes as the discrimination snapshot counts them; ClassNone is a case with no scored
// outcome in any version.
const (
	ClassAlwaysPass     = "always_pass"
	ClassAlwaysFail     = "always_fail"
	ClassDiscriminating = "discriminating"
	ClassTooNew         = "too_new"
	ClassNone           = "none"
)

// CaseRow is one case of a suite: its outcome in each version (aligned with CaseTable.Versions),
// its class over the judged versions, and, when it revived, the version of the flip.
type CaseRow struct {
	Case     string
	Outcomes []Outcome
	Class    string
	// Revived is the version in which a case whose first MinHistory or more outcomes were
	// identical flipped; "" otherwise. RevivedFrom is the outcome before the flip.
	Revived     string
	RevivedFrom Outcome
}

// CaseTable is every case of a suite with its per-version outcomes, versions in suite order.
type CaseTable struct {
	Versions []string
	Cases    []CaseRow // in case order
}

// Config returns the suite settings the store judges with.
func (r *Redis) Config() Config { return r.suite }

// Cases reads every case of suite k with its outcome in every version, and classifies each as the
// store does (min_history, judge_last_versions). It reads, never writes: the version order and
// each case's per-version counts, scanning the counts hash in pages, so Redis is not held for a
// large suite. Its cost grows with cases × versions: callers should cache it.
func (r *Redis) Cases(ctx context.Context, k Key) (*CaseTable, error) {
	runsKey, _ := r.keys(k)
	b := strings.TrimSuffix(runsKey, "r")
	vo, err := r.client.ZRangeWithScores(ctx, b+"vo", 0, -1).Result()
	if err != nil {
		return nil, fmt.Errorf("read suite %s versions: %w", k.ID(), err)
	}
	// The script orders versions by version_seq, ties by label: a sorted set's own order.
	t := &CaseTable{}
	for _, z := range vo {
		t.Versions = append(t.Versions, z.Member.(string))
	}
	ids, err := r.client.HGetAll(ctx, b+"vi").Result()
	if err != nil {
		return nil, fmt.Errorf("read suite %s version ids: %w", k.ID(), err)
	}
	col := map[string]int{} // version id -> column
	for i, v := range t.Versions {
		if id, ok := ids[v]; ok {
			col[id] = i
		}
	}
	rows := map[string][]Outcome{}
	var cursor uint64
	for {
		var kv []string
		kv, cursor, err = r.client.HScan(ctx, b+"m", cursor, "", 1000).Result()
		if err != nil && err != redis.Nil {
			return nil, fmt.Errorf("read suite %s cases: %w", k.ID(), err)
		}
		for i := 0; i+1 < len(kv); i += 2 {
			id, c, ok := strings.Cut(kv[i], "|")
			j, known := col[id]
			if !ok || !known {
				continue
			}
			head, _, _ := strings.Cut(kv[i+1], "|")
			f := strings.Fields(head)
			if len(f) < 2 {
				continue
			}
			p, err1 := strconv.ParseInt(f[0], 10, 64)
			fl, err2 := strconv.ParseInt(f[1], 10, 64)
			if err1 != nil || err2 != nil {
				continue
			}
			row := rows[c]
			if row == nil {
				row = make([]Outcome, len(t.Versions))
				rows[c] = row
			}
			switch {
			case fl > 0:
				row[j] = OutcomeFail
			case p > 0:
				row[j] = OutcomePass
			}
		}
		if cursor == 0 {
			break
		}
	}
	for c, outs := range rows {
		row := classify(c, outs, r.suite)
		if row.Revived != "" {
			i, _ := strconv.Atoi(row.Revived)
			row.Revived = t.Versions[i]
		}
		t.Cases = append(t.Cases, row)
	}
	slices.SortFunc(t.Cases, func(a, b CaseRow) int { return cmp.Compare(a.Case, b.Case) })
	return t, nil
}

// classify judges one case from its outcomes in version order, as suite.lua's judge does.
func classify(c string, outs []Outcome, cfg Config) CaseRow {
	row := CaseRow{Case: c, Outcomes: outs, Class: ClassNone}
	first := 0
	if cfg.JudgeLastVersions > 0 && len(outs) > cfg.JudgeLastVersions {
		first = len(outs) - cfg.JudgeLastVersions
	}
	var seq []int // columns with an outcome
	for i, o := range outs {
		if o != OutcomeNone {
			seq = append(seq, i)
		}
	}
	if len(seq) == 0 {
		return row
	}
	streak := 1
	for streak < len(seq) && outs[seq[streak]] == outs[seq[0]] {
		streak++
	}
	if streak >= cfg.MinHistory && streak < len(seq) {
		// The column of the flip; Cases replaces it by the version's label.
		row.RevivedFrom = outs[seq[0]]
		row.Revived = strconv.Itoa(seq[streak])
	}
	pass, fail := 0, 0
	for _, i := range seq {
		if i < first {
			continue
		}
		if outs[i] == OutcomePass {
			pass++
		} else {
			fail++
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
	return row
}
