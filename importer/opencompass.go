package importer

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/repeatrate/repeatrate/schemas"
)

// OpenCompass output layout (opencompass/tasks/openicl_infer.py and openicl_eval.py):
//
//	<work_dir>/<YYYYMMDD_HHMMSS>/predictions/<model_abbr>/<dataset_abbr>.json   (or _0.json, _1.json… shards)
//	<work_dir>/<YYYYMMDD_HHMMSS>/results/<model_abbr>/<dataset_abbr>.json
//
// A predictions file maps the sample index ("0", "1", …) to a record with "prediction". With a
// dataset run n times (its config's n), OpenCompass repeats the whole dataset n times
// (opencompass/datasets/base.py, concatenate_datasets([dataset] * n)), so index i is replica
// i / size of example i % size. The results file's "details" (written with dump_details) holds one
// entry per example (BaseEvaluator.evaluate groups the replicas: "example_abbr" is
// "<dataset_abbr>_<idx>", and each field, e.g. "correct", becomes the list of the n replicas'
// values); its "correct", "is_correct" or "cascade_correct" decides pass or fail.
var ocTimestamp = regexp.MustCompile(`^\d{8}_\d{6}$`)

// OpenCompass imports an OpenCompass output directory (a timestamped run, or the work directory
// holding several runs). Each example and replica is one run: case_id is the example's index,
// run_index the replica, runs = n; the result is pass or fail from the details' correct flags,
// error when the details say nothing of it; prediction from the predictions file. Times are the
// run directory's timestamp (UTC).
func OpenCompass(path string, opt Options) ([]Event, error) {
	runs, err := ocRunDirs(path)
	if err != nil {
		return nil, err
	}
	enc, err := newEncoder(orDefault(opt.Source, "repeatrate-import/opencompass"))
	if err != nil {
		return nil, err
	}
	// Every run's results files, listed first so that progress counts them all.
	type resultsFile struct {
		dir, path string
		at        time.Time
	}
	var files []resultsFile
	for _, dir := range runs {
		at, err := time.Parse("20060102_150405", filepath.Base(dir))
		if err != nil {
			return nil, fmt.Errorf("%s: not an OpenCompass run directory (YYYYMMDD_HHMMSS)", dir)
		}
		results, _ := filepath.Glob(filepath.Join(dir, "results", "*", "*.json"))
		sort.Strings(results)
		for _, rf := range results {
			files = append(files, resultsFile{dir: dir, path: rf, at: at})
		}
	}
	var out []Event
	models := map[string]bool{}
	for i, f := range files {
		opt.progress(len(out), i, len(files))
		model := filepath.Base(filepath.Dir(f.path))
		dataset := strings.TrimSuffix(filepath.Base(f.path), ".json")
		if err := oneModelUnder(opt, models, model); err != nil {
			return nil, err
		}
		evs, err := ocEvents(f.dir, model, dataset, f.at, opt, enc)
		switch {
		case err != nil && opt.Skipped != nil:
			opt.Skipped(f.path, err.Error()) // the other datasets of the run are imported
			continue
		case err != nil:
			return nil, fmt.Errorf("%s: %w", f.path, err)
		}
		out = append(out, evs...)
	}
	opt.progress(len(out), len(files), len(files))
	return out, nil
}

func ocRunDirs(path string) ([]string, error) {
	if ocTimestamp.MatchString(filepath.Base(filepath.Clean(path))) {
		return []string{path}, nil
	}
	ents, err := os.ReadDir(path)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() && ocTimestamp.MatchString(e.Name()) {
			out = append(out, filepath.Join(path, e.Name()))
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no OpenCompass run directory (YYYYMMDD_HHMMSS) in it", path)
	}
	return out, nil
}

// ocResults is what the importer reads of a results file: its details, and whether it reports
// AccEvaluator's accuracy, over how many runs of the dataset (BaseEvaluator.evaluate names the
// metric "accuracy (n runs average)" when the dataset ran n > 1 times).
type ocResults struct {
	Details  json.RawMessage
	Accuracy bool
	Runs     int
}

var ocRunsAverage = regexp.MustCompile(`^accuracy \((\d+) runs average\)$`)

func ocResultsOf(b []byte) (ocResults, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return ocResults{}, ocJSONError("the results file", err)
	}
	res := ocResults{Details: m["details"], Runs: 1}
	for k := range m {
		if k == "accuracy" {
			res.Accuracy = true
		} else if sm := ocRunsAverage.FindStringSubmatch(k); sm != nil {
			res.Accuracy = true
			if n, err := strconv.Atoi(sm[1]); err == nil && n > 1 {
				res.Runs = n
			}
		}
	}
	return res, nil
}

// ocDetail is one example's entry in details; the flags are a bool or a list of bools.
// Predictions and References are what format_details writes for an evaluator that gives no
// details of its own (their text, str() of each).
type ocDetail struct {
	ExampleAbbr    string          `json:"example_abbr"`
	Correct        json.RawMessage `json:"correct"`
	IsCorrect      json.RawMessage `json:"is_correct"`
	CascadeCorrect json.RawMessage `json:"cascade_correct"`
	Predictions    json.RawMessage `json:"predictions"`
	References     json.RawMessage `json:"references"`
}

// ocFlagsOf reads an entry's correct flags (one per replica); for an entry format_details wrote
// for an evaluator without details of its own (AccEvaluator: accuracy is reported), the entry is
// correct when its prediction is its reference, as AccEvaluator counts. nil: nothing says.
func ocFlagsOf(d ocDetail, accuracy bool) ([]bool, error) {
	for _, raw := range []json.RawMessage{d.Correct, d.IsCorrect, d.CascadeCorrect} {
		if len(raw) == 0 || string(raw) == "null" {
			continue
		}
		return ocFlags(raw)
	}
	if accuracy && len(d.Predictions) > 0 && len(d.References) > 0 {
		var pred, ref string
		if json.Unmarshal(d.Predictions, &pred) == nil && json.Unmarshal(d.References, &ref) == nil {
			return []bool{pred == ref}, nil
		}
	}
	return nil, nil
}

// ocJSONError says in a user's terms, without Go type names, why what (a part of a results
// file) could not be read.
func ocJSONError(what string, err error) error { return jsonError(what, "OpenCompass", err) }

// jsonError says in a user's terms, without Go type names, why what (a part of a file the tool
// wrote) could not be read.
func jsonError(what, tool string, err error) error {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te) && te.Field == "":
		return fmt.Errorf("%s is %s, not what %s writes there", what, article(te.Value), tool)
	case errors.As(err, &te):
		return fmt.Errorf("%s: its member %s is %s, not what %s writes there", what, te.Field, article(te.Value), tool)
	case errors.As(err, &se):
		return fmt.Errorf("%s is not JSON (at byte %d: %v)", what, se.Offset, se)
	}
	return fmt.Errorf("%s: %v", what, err)
}

// ocDetailsOf reads a results file's details: a list of entries (BaseEvaluator.evaluate), or an
// object of entries by index, which format_details (openicl_eval.py) writes with a "type" member
// (GEN or PPL) beside them.
func ocDetailsOf(raw json.RawMessage) (details []ocDetail, layout string, err error) {
	if len(raw) == 0 {
		return nil, "", nil
	}
	if raw[0] != '{' {
		if err := json.Unmarshal(raw, &details); err != nil {
			if raw[0] == '[' {
				return nil, "", ocJSONError("an entry of details", err)
			}
			return nil, "", ocJSONError("details", err)
		}
		return details, "", nil
	}
	m := map[string]json.RawMessage{}
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, "", err
	}
	if t, ok := m["type"]; ok {
		if err := json.Unmarshal(t, &layout); err != nil {
			return nil, "", fmt.Errorf("details type is not a text: %s", t)
		}
		delete(m, "type")
	}
	keys := make([]int, 0, len(m))
	for k := range m {
		i, err := strconv.Atoi(k)
		if err != nil {
			return nil, "", fmt.Errorf("details key %q is not an index", k)
		}
		keys = append(keys, i)
	}
	sort.Ints(keys)
	for _, k := range keys {
		var d ocDetail
		if err := json.Unmarshal(m[strconv.Itoa(k)], &d); err != nil {
			return nil, "", ocJSONError(fmt.Sprintf("details[%d]", k), err)
		}
		details = append(details, d)
	}
	return details, layout, nil
}

func ocEvents(dir, model, dataset string, at time.Time, opt Options, enc *encoder) ([]Event, error) {
	b, err := os.ReadFile(filepath.Join(dir, "results", model, dataset+".json"))
	if err != nil {
		return nil, err
	}
	res, err := ocResultsOf(b)
	if err != nil {
		return nil, err
	}
	details, layout, err := ocDetailsOf(res.Details)
	if err != nil {
		return nil, err
	}
	if len(details) == 0 {
		return nil, fmt.Errorf("no details: run OpenCompass with dump_details to import per-sample results")
	}
	preds, err := ocPredictions(filepath.Join(dir, "predictions", model), dataset)
	if err != nil {
		return nil, err
	}
	if len(preds) == 0 {
		// OpenCompass refuses to evaluate a run without its predictions; results without them
		// are not a run it made.
		return nil, fmt.Errorf("no predictions (%s): OpenCompass does not evaluate a run without them, so these results are not one it made",
			filepath.Join("predictions", model, dataset+".json"))
	}
	flags := make([][]bool, len(details))
	for i, d := range details {
		if flags[i], err = ocFlagsOf(d, res.Accuracy); err != nil {
			return nil, fmt.Errorf("details[%d]: %w", i, err)
		}
	}
	// format_details writes an entry per prediction, not per example: with a dataset run n times
	// (the predictions repeat the dataset n times) entry i is replica i / size of example i % size.
	if layout != "" && res.Runs > 1 {
		if len(details)%res.Runs != 0 {
			return nil, fmt.Errorf("details hold %d entries, not a whole number of the %d runs its accuracy averages", len(details), res.Runs)
		}
		size := len(details) / res.Runs
		grouped := make([][]bool, size)
		for i, f := range flags {
			if len(f) != 1 {
				return nil, fmt.Errorf("details[%d] gives %d verdicts where format_details writes one per prediction", i, len(f))
			}
			grouped[i%size] = append(grouped[i%size], f[0])
		}
		details, flags = details[:size], grouped
	}
	n := 1
	for _, f := range flags {
		n = max(n, len(f))
	}
	scope := opt.Scope
	scope.Model = orDefault(scope.Model, model)
	scope.Run = orDefault(scope.Run, filepath.Base(dir))
	seq := opt.VersionSeq
	if seq == 0 {
		seq = at.Unix()
	}
	// The models of one run share its directory's timestamp: each is a version of its own, or the
	// later model's runs would be dropped as the same runs of the same version.
	version := orDefault(opt.Version, scope.Model+"@"+scope.Run)
	size := len(details)
	var out []Event
	for i, d := range details {
		caseID := strconv.Itoa(i)
		if idx := strings.LastIndexByte(d.ExampleAbbr, '_'); idx >= 0 {
			caseID = d.ExampleAbbr[idx+1:]
		}
		for rep := range n {
			r := schemas.EvalResult{Scope: scope, Suite: orDefault(opt.Suite, dataset), CaseID: caseID,
				Version: version, VersionSeq: seq, RunIndex: int64(rep), Runs: int64(n),
				Result: schemas.ResultError, OccurredAt: at, AssessedAt: at}
			if rep < len(flags[i]) {
				r.Result = schemas.ResultFail
				if flags[i][rep] {
					r.Result = schemas.ResultPass
				}
			}
			if p, ok := preds[rep*size+i]; ok {
				text := clipPrediction(p.text)
				r.Prediction, r.ReplyTokens = &text, p.resLength
			}
			ev, err := enc.encode(r)
			if err != nil {
				return nil, err
			}
			out = append(out, ev)
		}
	}
	return out, nil
}

// ocPrediction is a prediction's text and, when the record has it, its res_length: the reply's
// length in tokens as the model counted it (a multi-round prediction's turns summed, as
// OpenCompass's repeat analysis sums them for the joined text).
type ocPrediction struct {
	text      string
	resLength *int64
}

// ocPredictions reads a dataset's predictions (one file, or shards _0, _1, … numbered on), by index.
func ocPredictions(dir, dataset string) (map[int]ocPrediction, error) {
	files := []string{filepath.Join(dir, dataset+".json")}
	if _, err := os.Stat(files[0]); err != nil {
		files = nil
		for k := 0; ; k++ {
			f := filepath.Join(dir, fmt.Sprintf("%s_%d.json", dataset, k))
			if _, err := os.Stat(f); err != nil {
				break
			}
			files = append(files, f)
		}
	}
	out := map[int]ocPrediction{}
	base := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var m map[string]struct {
			Prediction json.RawMessage `json:"prediction"`
			ResLength  json.RawMessage `json:"res_length"`
		}
		if err := json.Unmarshal(b, &m); err != nil {
			return nil, ocJSONError(filepath.Base(f)+" (predictions: an object of records by index)", err)
		}
		top := 0
		for k, v := range m {
			i, err := strconv.Atoi(k)
			if err != nil {
				return nil, fmt.Errorf("%s: key %q is not an index", f, k)
			}
			p := ocPrediction{text: predictionText(v.Prediction)} // a multi-round one's turns joined, as OpenCompass does
			if p.resLength, err = ocResLength(v.ResLength); err != nil {
				return nil, fmt.Errorf("%s: record %q: %w", filepath.Base(f), k, err)
			}
			out[base+i] = p
			top = max(top, i+1)
		}
		base += top
	}
	return out, nil
}

// ocFlags reads a detail's correct flag, or its list of flags (one per repeat): booleans, or
// numbers as OpenCompass's evaluators write them (1/0) and OpenCompass counts them, with int():
// a number whose integer part is not 0 is correct.
func ocFlags(raw json.RawMessage) ([]bool, error) {
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, fmt.Errorf("correct: %w", err)
	}
	one := func(x any) (bool, bool) {
		switch x := x.(type) {
		case bool:
			return x, true
		case float64:
			return math.Trunc(x) != 0, true
		}
		return false, false
	}
	if f, ok := one(v); ok {
		return []bool{f}, nil
	}
	list, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("correct is %s, not a bool, a number or a list of them", raw)
	}
	out := make([]bool, len(list))
	for i, x := range list {
		if out[i], ok = one(x); !ok {
			return nil, fmt.Errorf("correct[%d] is not a bool or a number", i)
		}
	}
	return out, nil
}

// ocResLength reads a prediction record's res_length as OpenCompass's analysis does: absent or
// null, a number, or a list of numbers that sum() adds up. The sum must be a whole, non-negative
// count of tokens that an eval result can carry; anything else skips the dataset, saying why.
func ocResLength(raw json.RawMessage) (*int64, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, fmt.Errorf("res_length: %v", err)
	}
	var sum float64
	switch v := v.(type) {
	case float64:
		sum = v
	case []any:
		for _, x := range v {
			n, ok := x.(float64)
			if !ok {
				return nil, fmt.Errorf("res_length %s holds %s, which OpenCompass cannot add up", raw, clipText(fmt.Sprint(x)))
			}
			sum += n
		}
	default:
		return nil, fmt.Errorf("res_length is %s, not a count of tokens or a list of them", raw)
	}
	if sum < 0 || sum != math.Trunc(sum) || sum > schemas.MaxReplyTokens {
		return nil, fmt.Errorf("res_length %s is not a whole number of tokens from 0 to %d, which an eval result's reply_tokens must be", raw, schemas.MaxReplyTokens)
	}
	total := int64(sum)
	return &total, nil
}
