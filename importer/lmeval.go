package importer

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/dlclark/regexp2"

	"github.com/repeatrate/repeatrate/schemas"
)

// lm-evaluation-harness output layout (lm_eval --output_path OUT --log_samples, 0.4.x;
// lm_eval/loggers/evaluation_tracker.py):
//
//	OUT/<model_name_sanitized>/results_<date>.json
//	OUT/<model_name_sanitized>/samples_<task>_<date>.jsonl
//
// The results file holds each task's config (output_type, repeats, metric_list) and the run's
// model and start (model_name, date). A samples file holds one line per doc and filter: doc_id,
// target, resps (the model's replies: for generate_until one list of `repeats` replies), the
// filter's filtered_resps, and the value of each of the task's metrics. lm_eval scores only the
// first reply of a doc (its "none" filter is take_first), so the importer scores every reply itself
// with the task's exact_match, and checks the first against lm_eval's own verdict.

// lmResults is what the importer reads of a results file.
type lmResults struct {
	Configs   map[string]lmTaskConfig `json:"configs"`
	ModelName string                  `json:"model_name"`
	Date      float64                 `json:"date"`
	NSamples  map[string]struct {
		Effective int `json:"effective"`
	} `json:"n-samples"`
}

type lmTaskConfig struct {
	OutputType  string          `json:"output_type"`
	Repeats     int             `json:"repeats"`
	DocToChoice json.RawMessage `json:"doc_to_choice"`
	MetricList  []lmMetric      `json:"metric_list"`
}

// lmMetric is a metric_list entry: exact_match's options are the ones it is scored with.
type lmMetric struct {
	Metric            string   `json:"metric"`
	IgnoreCase        bool     `json:"ignore_case"`
	IgnorePunctuation bool     `json:"ignore_punctuation"`
	IgnoreNumbers     bool     `json:"ignore_numbers"`
	RegexesToIgnore   []string `json:"regexes_to_ignore"`
}

// lmSample is one line of a samples file; Values holds the whole line, the metrics' values too.
type lmSample struct {
	DocID         *int64          `json:"doc_id"`
	Target        json.RawMessage `json:"target"`
	Resps         json.RawMessage `json:"resps"`
	FilteredResps json.RawMessage `json:"filtered_resps"`
	Filter        string          `json:"filter"`
	Metrics       []string        `json:"metrics"`
	Values        map[string]json.RawMessage
}

// LMEval imports what lm_eval wrote with --log_samples: an output directory (every results file
// under it, one or two levels down) or one results file. Each task's doc and repeat is one run:
// case_id is the doc_id, run_index the repeat, runs = repeats; suite the task; version
// <model>@<results date>. A generate_until task run with repeats is scored reply by reply with its
// exact_match (Options.Metric must be exact_match, the filter none); any other task takes lm_eval's
// own value of Options.Metric (default exact_match, else acc, else the first) and passes at or above
// Options.PassThreshold (default 1). Times are the run's start (the results file's date).
func LMEval(path string, opt Options) ([]Event, error) {
	files, err := lmResultsFiles(path)
	if err != nil {
		return nil, err
	}
	enc, err := newEncoder(orDefault(opt.Source, "repeatrate-import/lm-eval"))
	if err != nil {
		return nil, err
	}
	type task struct {
		results string
		res     *lmResults
		name    string
	}
	var tasks []task
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var res lmResults
		if err := json.Unmarshal(b, &res); err != nil || len(res.Configs) == 0 {
			why := "it holds no task configs"
			if err != nil {
				why = lmJSONError("it", err).Error()
			}
			if opt.Skipped == nil || len(files) == 1 {
				return nil, fmt.Errorf("%s is not an lm_eval results file: %s", f, why)
			}
			opt.Skipped(f, "not an lm_eval results file: "+why)
			continue
		}
		for _, name := range slices.Sorted(maps.Keys(res.Configs)) {
			tasks = append(tasks, task{results: f, res: &res, name: name})
		}
	}
	var out []Event
	models := map[string]bool{}
	for i, t := range tasks {
		opt.progress(len(out), i, len(tasks))
		if err := oneModelUnder(opt, models, t.res.ModelName); err != nil {
			return nil, err
		}
		stamp := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(t.results), "results_"), ".json")
		samples := filepath.Join(filepath.Dir(t.results), "samples_"+t.name+"_"+stamp+".jsonl")
		evs, err := lmTaskEvents(samples, t.name, stamp, t.res, opt, enc)
		switch {
		case err != nil && opt.Skipped != nil:
			opt.Skipped(samples, err.Error()) // the run's other tasks are imported
			continue
		case err != nil:
			return nil, fmt.Errorf("%s: %w", samples, err)
		}
		out = append(out, evs...)
	}
	opt.progress(len(out), len(tasks), len(tasks))
	return out, nil
}

// lmResultsFiles lists the results files at path: the file itself, or those in the directory and
// in its subdirectories (one per model), in name order.
func lmResultsFiles(path string) ([]string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !st.IsDir() {
		return []string{path}, nil
	}
	var files []string
	err = filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != path && strings.Count(strings.TrimPrefix(p, path), string(filepath.Separator)) > 2 {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasPrefix(d.Name(), "results_") && strings.HasSuffix(d.Name(), ".json") {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("%s: no lm_eval results file (results_<date>.json) in it or in its model folders", path)
	}
	return files, nil
}

func lmTaskEvents(samples, name, stamp string, res *lmResults, opt Options, enc *encoder) ([]Event, error) {
	cfg := res.Configs[name]
	lines, err := lmReadSamples(samples)
	if err != nil {
		return nil, err
	}
	if len(lines) == 0 {
		return nil, fmt.Errorf("no samples: run lm_eval with --log_samples to import per-doc results")
	}
	filter := opt.Filter
	if filter == "" {
		filter = lines[0].Filter
		if slices.ContainsFunc(lines, func(s lmSample) bool { return s.Filter == "none" }) {
			filter = "none"
		}
	}
	lines = slices.DeleteFunc(lines, func(s lmSample) bool { return s.Filter != filter })
	if len(lines) == 0 {
		return nil, fmt.Errorf("no sample has the filter %q", filter)
	}
	metric := opt.Metric
	if metric == "" {
		metric = lines[0].Metrics[0]
		for _, m := range []string{"acc", "exact_match"} {
			if slices.Contains(lines[0].Metrics, m) {
				metric = m
			}
		}
	} else if !slices.Contains(lines[0].Metrics, metric) {
		return nil, fmt.Errorf("the task has no metric %q (it has %s)", metric, strings.Join(lines[0].Metrics, ", "))
	}
	if n, ok := res.NSamples[name]; ok && n.Effective != len(lines) {
		return nil, fmt.Errorf("%d docs have samples with the filter %q, the results say %d were evaluated: the samples file is not the whole run", len(lines), filter, n.Effective)
	}
	repeats := max(cfg.Repeats, 1)
	perReply := cfg.OutputType == "generate_until" && repeats > 1
	var em *exactMatch
	if perReply {
		switch {
		case metric != "exact_match":
			return nil, fmt.Errorf("lm_eval scores only the first of a doc's %d replies with %s; repeatrate scores every reply only with exact_match (--metric exact_match), or run the task with repeats: 1", repeats, metric)
		case filter != "none":
			return nil, fmt.Errorf("the filter %q changes the replies in ways repeatrate does not reproduce; import its unfiltered replies with --filter none", filter)
		case len(cfg.DocToChoice) > 0 && string(cfg.DocToChoice) != "null":
			return nil, fmt.Errorf("exact_match against doc_to_choice targets is not reproduced; run the task with repeats: 1")
		}
		i := slices.IndexFunc(cfg.MetricList, func(m lmMetric) bool { return m.Metric == "exact_match" })
		if i < 0 {
			return nil, fmt.Errorf("the task's config lists no exact_match metric")
		}
		if em, err = newExactMatch(cfg.MetricList[i]); err != nil {
			return nil, err
		}
	}
	threshold := 1.0
	if opt.PassThreshold != nil {
		threshold = *opt.PassThreshold
	}

	at := time.Unix(0, int64(res.Date*1e9)).UTC().Truncate(time.Microsecond)
	scope := opt.Scope
	scope.Model = orDefault(scope.Model, res.ModelName)
	scope.Run = orDefault(scope.Run, stamp)
	seq := opt.VersionSeq
	if seq == 0 {
		seq = at.Unix()
	}
	version := orDefault(opt.Version, scope.Model+"@"+scope.Run)
	runs := 1
	if perReply {
		runs = repeats
	}
	seen := map[int64]bool{}
	var out []Event
	for _, s := range lines {
		if s.DocID == nil {
			return nil, fmt.Errorf("a sample has no doc_id")
		}
		doc := *s.DocID
		if seen[doc] {
			return nil, fmt.Errorf("doc %d has two samples with the filter %q", doc, filter)
		}
		seen[doc] = true
		value, scored := lmValue(s.Values[metric])
		verdicts := make([]*bool, runs)
		replies := make([]*string, runs)
		if perReply {
			var resps [][]string
			if err := json.Unmarshal(s.Resps, &resps); err != nil || len(resps) != 1 || len(resps[0]) != repeats {
				return nil, fmt.Errorf("doc %d: resps is not one list of its %d replies", doc, repeats)
			}
			golds, err := lmTargets(s.Target)
			if err != nil {
				return nil, fmt.Errorf("doc %d: %w", doc, err)
			}
			for r, reply := range resps[0] {
				pass := em.match(reply, golds)
				verdicts[r], replies[r] = &pass, &reply
			}
			if !scored || (value == 1) != *verdicts[0] {
				return nil, fmt.Errorf("doc %d: lm_eval's exact_match of its first reply is %s, repeatrate's is %v: the task's scoring is not one repeatrate reproduces",
					doc, s.Values[metric], btof(*verdicts[0]))
			}
		} else {
			if scored {
				pass := value >= threshold
				verdicts[0] = &pass
			}
			var filtered []json.RawMessage
			if cfg.OutputType == "generate_until" && json.Unmarshal(s.FilteredResps, &filtered) == nil && len(filtered) > 0 {
				var reply string
				if json.Unmarshal(filtered[0], &reply) == nil {
					replies[0] = &reply
				}
			}
		}
		for r := range runs {
			e := schemas.EvalResult{Scope: scope, Suite: orDefault(opt.Suite, name), CaseID: strconv.FormatInt(doc, 10),
				Version: version, VersionSeq: seq, RunIndex: int64(r), Runs: int64(runs),
				Result: schemas.ResultError, OccurredAt: at, AssessedAt: at}
			if verdicts[r] != nil {
				e.Result = schemas.ResultFail
				if *verdicts[r] {
					e.Result = schemas.ResultPass
				}
			}
			if replies[r] != nil {
				p := clipPrediction(*replies[r])
				e.Prediction = &p
			}
			ev, err := enc.encode(e)
			if err != nil {
				return nil, err
			}
			out = append(out, ev)
		}
	}
	return out, nil
}

// lmReadSamples reads a samples file's lines (JSON Lines; a line may be long: a doc and its
// replies).
func lmReadSamples(path string) ([]lmSample, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("no samples file: run lm_eval with --log_samples to import per-doc results")
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []lmSample
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<30)
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var s lmSample
		if err := json.Unmarshal(line, &s); err != nil {
			return nil, lmJSONError(fmt.Sprintf("line %d", n), err)
		}
		if err := json.Unmarshal(line, &s.Values); err != nil {
			return nil, lmJSONError(fmt.Sprintf("line %d", n), err)
		}
		if len(s.Metrics) == 0 {
			return nil, fmt.Errorf("line %d names no metrics", n)
		}
		out = append(out, s)
	}
	return out, sc.Err()
}

// lmValue reads a metric's value: a number, or a boolean as 1 or 0.
func lmValue(raw json.RawMessage) (float64, bool) {
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return 0, false
	}
	switch v := v.(type) {
	case float64:
		return v, !math.IsNaN(v)
	case bool:
		return btof(v), true
	}
	return 0, false
}

func btof(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// lmTargets reads a doc's target as the texts exact_match compares with: a text; a number or a
// boolean as Python's str() writes it (lm_eval casts the target to the reply's type); a list of
// them, any of which may match (a multiple-target task).
func lmTargets(raw json.RawMessage) ([]string, error) {
	var list []json.RawMessage
	if json.Unmarshal(raw, &list) == nil {
		out := make([]string, 0, len(list))
		for _, x := range list {
			out = append(out, predictionText(x))
		}
		return out, nil
	}
	if len(raw) == 0 || raw[0] == '{' {
		return nil, fmt.Errorf("target is %s, not a text, a number or a list of them", article(jsonKind(raw)))
	}
	return []string{predictionText(raw)}, nil
}

func jsonKind(raw json.RawMessage) string {
	if len(raw) > 0 && raw[0] == '{' {
		return "object"
	}
	return "nothing"
}

// exactMatch is lm_eval's exact_match (exact_match_hf_evaluate in lm_eval/api/metrics.py): the
// regexes removed from both texts, then both lowered (Python's str.lower), then ASCII punctuation
// and then digits removed, as the options ask; the texts then equal.
type exactMatch struct {
	regexes              []*regexp2.Regexp
	lower, punct, digits bool
}

func newExactMatch(m lmMetric) (*exactMatch, error) {
	em := &exactMatch{lower: m.IgnoreCase, punct: m.IgnorePunctuation, digits: m.IgnoreNumbers}
	for _, s := range m.RegexesToIgnore {
		re, err := regexp2.Compile(s, regexp2.Unicode)
		if err != nil {
			return nil, fmt.Errorf("exact_match regex %q: %v", s, err)
		}
		re.MatchTimeout = time.Second
		em.regexes = append(em.regexes, re)
	}
	return em, nil
}

func (em *exactMatch) norm(s string) string {
	for _, re := range em.regexes {
		if r, err := re.Replace(s, "", -1, -1); err == nil {
			s = r
		}
	}
	if em.lower {
		s = pyLower(s)
	}
	if em.punct || em.digits {
		s = strings.Map(func(r rune) rune {
			if em.punct && r < 0x80 && strings.ContainsRune("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", r) ||
				em.digits && '0' <= r && r <= '9' {
				return -1
			}
			return r
		}, s)
	}
	return s
}

// match reports whether reply matches any of golds.
func (em *exactMatch) match(reply string, golds []string) bool {
	p := em.norm(reply)
	for _, g := range golds {
		if p == em.norm(g) {
			return true
		}
	}
	return false
}

// lmJSONError says in a user's terms, without Go type names, why what could not be read.
func lmJSONError(what string, err error) error { return jsonError(what, "lm_eval", err) }

// pyLower is Python's str.lower: Unicode's full lowercase mapping (İ becomes i and a combining
// dot) and a capital sigma that ends a word as final sigma (ς).
func pyLower(s string) string {
	if !strings.ContainsFunc(s, func(r rune) bool { return r == 'İ' || r == 'Σ' }) {
		return strings.ToLower(s)
	}
	rs := []rune(s)
	var b strings.Builder
	for i, r := range rs {
		switch {
		case r == 'İ':
			b.WriteString("i\u0307")
		case r == 'Σ' && finalSigma(rs, i):
			b.WriteRune('ς')
		default:
			b.WriteRune(unicode.ToLower(r))
		}
	}
	return b.String()
}

// finalSigma is Unicode's Final_Sigma condition as Python tests it: a cased letter before the
// sigma and none after it, case-ignorable characters skipped on both sides.
func finalSigma(rs []rune, i int) bool {
	j := i - 1
	for j >= 0 && caseIgnorable(rs[j]) {
		j--
	}
	if j < 0 || !cased(rs[j]) {
		return false
	}
	j = i + 1
	for j < len(rs) && caseIgnorable(rs[j]) {
		j++
	}
	return j == len(rs) || !cased(rs[j])
}

func cased(r rune) bool {
	return unicode.In(r, unicode.Lu, unicode.Ll, unicode.Lt, unicode.Other_Lowercase, unicode.Other_Uppercase)
}

// caseIgnorable is Unicode's Case_Ignorable: marks, format characters, modifiers, and the
// word-internal punctuation (MidLetter, MidNumLet, Single_Quote) of Unicode's word breaking.
func caseIgnorable(r rune) bool {
	return unicode.In(r, unicode.Mn, unicode.Me, unicode.Cf, unicode.Lm, unicode.Sk) ||
		strings.ContainsRune("'.:^`\u00b7\u0387\u055f\u05f4\u2018\u2019\u2024\u2027\ufe13\ufe52\ufe55\uff07\uff0e\uff1a", r)
}
