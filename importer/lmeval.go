package importer

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

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

// lmResults is what the importer reads of a results file; each task's config is read on its own
// (lmTaskConfigOf), so that one the importer cannot read skips that task, not the run.
type lmResults struct {
	Configs   map[string]json.RawMessage `json:"configs"`
	ModelName string                     `json:"model_name"`
	Date      *float64                   `json:"date"`
	NSamples  map[string]struct {
		Effective int `json:"effective"`
	} `json:"n-samples"`
}

type lmTaskConfig struct {
	OutputType     string          `json:"output_type"`
	Repeats        int             `json:"repeats"`
	DocToChoice    json.RawMessage `json:"doc_to_choice"`
	ProcessResults json.RawMessage `json:"process_results"`
	FilterList     json.RawMessage `json:"filter_list"`
	MetricList     []lmMetric      `json:"metric_list"`
}

// lmMetric is a metric_list entry: exact_match's options are the ones it is scored with, read as
// Python reads them (any truthy value; a text of regexes is its characters, as a loop over it
// gives them).
type lmMetric struct {
	Metric            string
	IgnoreCase        bool
	IgnorePunctuation bool
	IgnoreNumbers     bool
	RegexesToIgnore   []string
	RegexesGiven      bool // regexes_to_ignore is set, even to an empty list
}

func (m *lmMetric) UnmarshalJSON(b []byte) error {
	var raw map[string]any
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	m.Metric, _ = raw["metric"].(string)
	m.IgnoreCase, m.IgnorePunctuation, m.IgnoreNumbers = truthy(raw["ignore_case"]), truthy(raw["ignore_punctuation"]), truthy(raw["ignore_numbers"])
	m.RegexesGiven = raw["regexes_to_ignore"] != nil
	switch r := raw["regexes_to_ignore"].(type) {
	case nil:
	case string:
		for _, c := range r {
			m.RegexesToIgnore = append(m.RegexesToIgnore, string(c))
		}
	case []any:
		for _, x := range r {
			s, ok := x.(string)
			if !ok {
				return fmt.Errorf("regexes_to_ignore holds %v, not a regular expression", x)
			}
			m.RegexesToIgnore = append(m.RegexesToIgnore, s)
		}
	default:
		return fmt.Errorf("regexes_to_ignore is %v, not a list of regular expressions", r)
	}
	return nil
}

// truthy is Python's bool() of a JSON value.
func truthy(v any) bool {
	switch v := v.(type) {
	case bool:
		return v
	case float64:
		return v != 0
	case string:
		return v != ""
	case []any:
		return len(v) > 0
	case map[string]any:
		return len(v) > 0
	}
	return false
}

func isNull(raw json.RawMessage) bool { return len(raw) == 0 || string(raw) == "null" }

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

// lmStamp is the date lm_eval names its output files with: <name>_<date>.json beside
// samples_<task>_<date>.jsonl (results_<date>.json under a model folder, or the file
// --output_path names, x.json giving x_<date>.json).
var lmStamp = regexp.MustCompile(`_(\d{4}-\d\d-\d\dT\d\d-\d\d-\d\d(?:\.\d+)?)\.json$`)

// LMEval imports what lm_eval wrote with --log_samples: an output directory (every results file
// under it) or one results file. Each task's doc and repeat is one run: case_id is the doc_id,
// run_index the repeat, runs = repeats; suite the task; version <model>@<results date>. A
// generate_until task run with repeats is scored reply by reply with its exact_match, when its
// scoring is one the importer reproduces exactly (see docs/feeding.md); any other task takes
// lm_eval's own value of Options.Metric (default exact_match, else acc) and passes at or above
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
		results, stamp string
		res            *lmResults
		name           string
	}
	var tasks []task
	runs := map[string]bool{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var res lmResults
		why := ""
		switch err := json.Unmarshal(b, &res); {
		case err != nil:
			why = lmJSONError("its JSON", err).Error()
		case len(res.Configs) == 0:
			why = "it holds no task configs"
		case res.Date == nil:
			why = "it has no date (the run's start)"
		}
		if why != "" {
			if opt.Skipped == nil || len(files) == 1 {
				return nil, fmt.Errorf("%s is not an lm_eval results file: %s", f, why)
			}
			opt.Skipped(f, "not an lm_eval results file: "+why)
			continue
		}
		stamp := lmStamp.FindStringSubmatch(filepath.Base(f))[1]
		if runs[f] = true; opt.Scope.Run != "" && len(runs) > 1 {
			return nil, fmt.Errorf("the folder holds %d lm_eval runs: --run %q would make their docs one run each, the later replacing the earlier; leave --run unset, or import each results file apart", len(runs), opt.Scope.Run)
		}
		for _, name := range slices.Sorted(maps.Keys(res.Configs)) {
			tasks = append(tasks, task{results: f, stamp: stamp, res: &res, name: name})
		}
	}
	var out []Event
	models := map[string]bool{}
	for i, t := range tasks {
		opt.progress(len(out), i, len(tasks))
		if err := oneModelUnder(opt, models, t.res.ModelName); err != nil {
			return nil, err
		}
		samples := filepath.Join(filepath.Dir(t.results), "samples_"+t.name+"_"+t.stamp+".jsonl")
		evs, err := lmTaskEvents(samples, t.name, t.stamp, t.res, opt, enc)
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

// lmResultsFiles lists the results files at path: the file itself, or every one under the
// directory, in name order.
func lmResultsFiles(path string) ([]string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !st.IsDir() {
		if !lmStamp.MatchString(filepath.Base(path)) {
			return nil, fmt.Errorf("%s is not an lm_eval results file: lm_eval names them <name>_<date>.json", path)
		}
		return []string{path}, nil
	}
	var files []string
	err = filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && lmStamp.MatchString(d.Name()) {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("%s: no lm_eval results file (results_<date>.json) in it or under it", path)
	}
	return files, nil
}

// lmReplyScoring says why a task's replies cannot be scored one by one exactly as lm_eval would
// score them, or "" when they can: its exact_match over the replies as they are.
func lmReplyScoring(cfg lmTaskConfig, metric, filter string, repeats int) string {
	switch {
	case metric != "exact_match":
		return fmt.Sprintf("lm_eval scores only the first of a doc's %d replies with %s; repeatrate scores every reply only with exact_match (--metric exact_match), or run the task with repeats: 1", repeats, metric)
	case !isNull(cfg.ProcessResults):
		return "the task scores with its own process_results, which repeatrate does not run; run it with repeats: 1 to import lm_eval's own verdicts"
	case !isNull(cfg.DocToChoice):
		return "exact_match against doc_to_choice targets is not reproduced; run the task with repeats: 1"
	}
	if !isNull(cfg.FilterList) {
		var filters []struct {
			Name   string `json:"name"`
			Filter []struct {
				Function string `json:"function"`
			} `json:"filter"`
		}
		if json.Unmarshal(cfg.FilterList, &filters) != nil {
			return "the task's filter_list is not one repeatrate reads"
		}
		i := slices.IndexFunc(filters, func(f struct {
			Name   string `json:"name"`
			Filter []struct {
				Function string `json:"function"`
			} `json:"filter"`
		}) bool {
			return f.Name == filter
		})
		if i >= 0 && (len(filters[i].Filter) != 1 || filters[i].Filter[0].Function != "take_first") {
			var names []string
			for _, f := range filters {
				if len(f.Filter) == 1 && f.Filter[0].Function == "take_first" {
					names = append(names, f.Name)
				}
			}
			why := fmt.Sprintf("lm_eval's filter %q changes the replies before scoring, which repeatrate does not reproduce", filter)
			if len(names) > 0 {
				return why + fmt.Sprintf("; import the filter that takes them as they are with --filter %s", names[0])
			}
			return why + "; run the task with repeats: 1 to import lm_eval's own verdicts"
		}
	}
	return ""
}

func lmTaskEvents(samples, name, stamp string, res *lmResults, opt Options, enc *encoder) ([]Event, error) {
	var cfg lmTaskConfig
	if err := json.Unmarshal(res.Configs[name], &cfg); err != nil {
		return nil, fmt.Errorf("its config in the results file: %v", err)
	}
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
		for _, m := range []string{"acc", "exact_match"} {
			if slices.Contains(lines[0].Metrics, m) {
				metric = m
			}
		}
		if metric == "" {
			return nil, fmt.Errorf("the task has neither exact_match nor acc; name the metric whose per-doc value decides pass or fail with --metric (it has %s)", strings.Join(lines[0].Metrics, ", "))
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
		if why := lmReplyScoring(cfg, metric, filter, repeats); why != "" {
			return nil, errors.New(why)
		}
		// lm_eval keeps the options of the last exact_match entry (a dict by metric name).
		last := -1
		for i, m := range cfg.MetricList {
			if m.Metric == "exact_match" {
				last = i
			}
		}
		m := lmMetric{Metric: "exact_match"} // no metric_list: lm_eval's default, exact_match without options
		switch {
		case last >= 0:
			m = cfg.MetricList[last]
		case len(cfg.MetricList) > 0:
			return nil, fmt.Errorf("the task's config lists no exact_match metric")
		}
		if em, err = newExactMatch(m); err != nil {
			return nil, err
		}
	}
	threshold := 1.0
	if opt.PassThreshold != nil {
		threshold = *opt.PassThreshold
	}

	at := time.Unix(0, int64(*res.Date*1e9)).UTC().Truncate(time.Microsecond)
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
		value, scored, err := lmValue(s.Values[metric])
		if err != nil {
			return nil, fmt.Errorf("doc %d: %s %v", doc, metric, err)
		}
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
				pass, err := em.match(reply, golds)
				if err != nil {
					return nil, fmt.Errorf("doc %d reply %d: %w", doc, r, err)
				}
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
// replies). Python's json writes a float that is not a number as NaN, Infinity or -Infinity,
// which JSON does not have: they are read as the texts "NaN", "Infinity" and "-Infinity".
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
		line := pyJSONConstants(bytes.TrimSpace(sc.Bytes()))
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

// pyJSONConstants quotes the NaN, Infinity and -Infinity that Python's json writes outside
// strings, so that the line is JSON.
func pyJSONConstants(b []byte) []byte {
	if !bytes.Contains(b, []byte("NaN")) && !bytes.Contains(b, []byte("Infinity")) {
		return b
	}
	var out []byte
	in := false
	for i := 0; i < len(b); i++ {
		c := b[i]
		switch {
		case in && c == '\\':
			out = append(out, c)
			if i+1 < len(b) {
				i++
				out = append(out, b[i])
			}
			continue
		case c == '"':
			in = !in
		case !in:
			for _, k := range []string{"-Infinity", "Infinity", "NaN"} {
				if bytes.HasPrefix(b[i:], []byte(k)) {
					out = append(append(append(out, '"'), k...), '"')
					i += len(k) - 1
					c = 0
					break
				}
			}
			if c == 0 {
				continue
			}
		}
		out = append(out, c)
	}
	return out
}

// lmValue reads a doc's value of a metric: a number, or a boolean as 1 or 0, is a score; a float
// that is not a number (NaN, ±Infinity) leaves the doc unscored; anything else (a pair, a text,
// null) is no per-doc score, an error.
func lmValue(raw json.RawMessage) (float64, bool, error) {
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return 0, false, fmt.Errorf("is missing")
	}
	switch v := v.(type) {
	case float64:
		return v, true, nil
	case bool:
		return btof(v), true, nil
	case string:
		if v == "NaN" || v == "Infinity" || v == "-Infinity" {
			return 0, false, nil
		}
	}
	return 0, false, fmt.Errorf("is %s, not a per-doc score: choose a metric lm_eval scores each doc with (--metric)", clipText(string(raw)))
}

func clipText(s string) string {
	if len(s) > 40 {
		return strings.ToValidUTF8(s[:40], "") + "…"
	}
	return s
}

func btof(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// lmTargets reads a doc's target as the texts exact_match compares with: a text; a number or a
// boolean as Python's str() writes it (lm_eval casts the target to the reply's type). lm_eval
// writes a list of targets (a multiple-target task) as its Python text ("['a', 'b']"), which
// cannot be told from a text target that looks so: such a target is refused.
func lmTargets(raw json.RawMessage) ([]string, error) {
	var text string
	if json.Unmarshal(raw, &text) == nil {
		if t := strings.TrimSpace(text); strings.HasPrefix(t, "[") && strings.HasSuffix(t, "]") {
			return nil, fmt.Errorf("target %s reads as a list of targets (lm_eval writes a multiple-target task's list as text), which repeatrate does not score; run the task with repeats: 1", clipText(string(raw)))
		}
		return []string{text}, nil
	}
	if len(raw) == 0 || raw[0] == '{' || raw[0] == '[' {
		return nil, fmt.Errorf("target is %s, not a text or a number", clipText(string(raw)))
	}
	return []string{predictionText(raw)}, nil
}

// exactMatch is lm_eval's exact_match (exact_match_hf_evaluate in lm_eval/api/metrics.py) on one
// reply and one target, as Python and numpy compute it: each regex removed from both texts (the
// first on the texts as they are, later ones on numpy's elements), then both lowered (numpy's
// char.lower: Python's str.lower cut to the array's width), then ASCII punctuation and then
// digits removed, as the options ask; then compared. A numpy array holds each text padded with
// NULs to its width, so trailing NULs are dropped once the texts are in one; with an empty list
// of regexes and no option they never are, and the texts compare as they are.
type exactMatch struct {
	regexes              []*regexp2.Regexp
	array                bool // the texts become numpy arrays (not with an empty regex list and no option)
	lower, punct, digits bool
}

// pyRegexUnlike finds what Python's re and the regexp2 engine read differently: word and space
// classes and boundaries (Unicode's and .NET's sets differ), \Z, {,n}, possessive quantifiers,
// named groups and back references, inline flags, escapes beyond the common ones, and .NET's
// class subtraction and POSIX classes.
var pyRegexUnlike = regexp.MustCompile(`\\[wWsSbBZAUNxuo0-9]|\{,|[*+?}][+]|\(\?[^:]|-\[|\[:`)

// pyRegexLazyOrAlternation finds a lazy quantifier or an alternation: with them a regex may
// prefer an empty match where a longer one starts, and Python's re.sub then tries the longer
// match at the same place where the regexp2 engine moves on a character.
var pyRegexLazyOrAlternation = regexp.MustCompile(`[*+?}]\?|\|`)

func newExactMatch(m lmMetric) (*exactMatch, error) {
	em := &exactMatch{lower: m.IgnoreCase, punct: m.IgnorePunctuation, digits: m.IgnoreNumbers}
	// regexes_to_ignore unset: np.asarray; a list of regexes: np.array of their results; an empty
	// list leaves Python lists, until an option makes them arrays.
	em.array = !m.RegexesGiven || len(m.RegexesToIgnore) > 0 || em.lower || em.punct || em.digits
	for _, s := range m.RegexesToIgnore {
		if bad := pyRegexUnlike.FindString(s); bad != "" {
			return nil, fmt.Errorf("exact_match regex %q uses %q, which repeatrate cannot apply exactly as Python's re does; run the task with repeats: 1", s, bad)
		}
		re, err := regexp2.Compile(s, regexp2.None)
		if err != nil {
			return nil, fmt.Errorf("exact_match regex %q: %v", s, err)
		}
		re.MatchTimeout = 10 * time.Second
		if empty, _ := re.MatchString(""); empty && pyRegexLazyOrAlternation.MatchString(s) {
			return nil, fmt.Errorf("exact_match regex %q can match nothing before a longer match, where Python's re.sub removes differently; run the task with repeats: 1", s)
		}
		em.regexes = append(em.regexes, re)
	}
	return em, nil
}

// norm returns s as exact_match compares it.
func (em *exactMatch) norm(s string) (string, error) {
	width := utf8.RuneCountInString(s) // the numpy array's, once s is in one
	for i, re := range em.regexes {
		if i > 0 {
			s = strings.TrimRight(s, "\x00") // an element of the array the previous regex made
		}
		r, err := re.Replace(s, "", -1, -1)
		if err != nil {
			return "", fmt.Errorf("exact_match regex %q: %v", re.String(), err)
		}
		s, width = r, utf8.RuneCountInString(r)
	}
	if !em.array {
		return s, nil
	}
	s = strings.TrimRight(s, "\x00")
	if em.lower {
		s = npLower(s, width)
	}
	if em.punct || em.digits {
		s = strings.TrimRight(strings.Map(func(r rune) rune {
			if em.punct && r < 0x80 && strings.ContainsRune("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", r) ||
				em.digits && '0' <= r && r <= '9' {
				return -1
			}
			return r
		}, s), "\x00")
	}
	return s, nil
}

// match reports whether reply matches any of golds.
func (em *exactMatch) match(reply string, golds []string) (bool, error) {
	p, err := em.norm(reply)
	if err != nil {
		return false, err
	}
	for _, g := range golds {
		n, err := em.norm(g)
		if err != nil {
			return false, err
		}
		if p == n {
			return true, nil
		}
	}
	return false, nil
}

// npLower is numpy's char.lower of an element s (its trailing NULs dropped) of an array of width
// code points: Python's str.lower, cut to the width, without trailing NULs.
func npLower(s string, width int) string {
	l := pyLower(s)
	if utf8.RuneCountInString(l) > width {
		l = string([]rune(l)[:width])
	}
	return strings.TrimRight(l, "\x00")
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
