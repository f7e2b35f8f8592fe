package importer

import (
	"archive/zip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/repeatrate/repeatrate/schemas"
)

// Inspect AI log structures: the fields the importer reads (inspect_ai/log/_log.py).
type inspectLog struct {
	Status  string          `json:"status"`
	Eval    inspectEval     `json:"eval"`
	Samples []inspectSample `json:"samples"`
	// Results names the scorers too: a version-1 log names its one scorer only there.
	Results struct {
		Scores []struct {
			Name string `json:"name"`
		} `json:"scores"`
	} `json:"results"`
}

type inspectEval struct {
	RunID   string `json:"run_id"`
	Created string `json:"created"`
	Task    string `json:"task"`
	Model   string `json:"model"`
	Config  struct {
		Epochs int64 `json:"epochs"`
	} `json:"config"`
	Scorers []struct {
		Name string `json:"name"`
	} `json:"scorers"`
}

type inspectSample struct {
	ID          json.RawMessage             `json:"id"`
	Epoch       int64                       `json:"epoch"`
	Output      struct{ Completion string } `json:"output"`
	Scores      map[string]inspectScore     `json:"scores"`
	Error       *struct{ Message string }   `json:"error"`
	StartedAt   string                      `json:"started_at"`
	CompletedAt string                      `json:"completed_at"`
	// Events are the sample's transcript; the importer reads its score events (a scorer's verdict,
	// again when the log was re-scored) and score edits (inspect_ai.log.edit_score), whose
	// timestamps say when the sample was last judged.
	Events []inspectEvent `json:"events"`
	// Score and Transcript are a version-1 log's: its one score, and its events under
	// "transcript" (inspect_ai reads them as scores[the log's scorer] and events).
	Score      *inspectScore `json:"score"`
	Transcript struct {
		Events []inspectEvent `json:"events"`
	} `json:"transcript"`
}

type inspectEvent struct {
	Event     string `json:"event"`
	Timestamp string `json:"timestamp"`
	Scorer    string `json:"scorer"`     // of a score event; absent before inspect-ai 0.3.2xx
	ScoreName string `json:"score_name"` // of a score_edit event
}

// upgradeV1 reads a version-1 log as Inspect does (EvalSample.migrate_deprecated,
// EvalLog.populate_scorer_name_for_samples): each sample's one score is the log's first scorer's,
// as results.scores names it, and its transcript's events are its events.
func (log *inspectLog) upgradeV1() {
	scorer := ""
	if len(log.Results.Scores) > 0 {
		scorer = log.Results.Scores[0].Name
	}
	if len(log.Eval.Scorers) == 0 && scorer != "" {
		log.Eval.Scorers = append(log.Eval.Scorers, struct {
			Name string `json:"name"`
		}{scorer})
	}
	for i := range log.Samples {
		s := &log.Samples[i]
		if s.Score != nil && len(s.Scores) == 0 && scorer != "" {
			s.Scores = map[string]inspectScore{scorer: *s.Score}
		}
		if len(s.Events) == 0 {
			s.Events = s.Transcript.Events
		}
	}
}

// judged says how often scorer's verdict of s was given or changed (its score events and score
// edits; events that name no scorer, as older inspect-ai wrote them, count for any) and the time
// of the last one that has a time ("" when none has).
func (s *inspectSample) judged(scorer string) (times int64, last string) {
	for _, e := range s.Events {
		if (e.Event == "score" && (e.Scorer == scorer || e.Scorer == "")) ||
			(e.Event == "score_edit" && (e.ScoreName == scorer || e.ScoreName == "")) {
			times++
			if e.Timestamp != "" {
				last = e.Timestamp
			}
		}
	}
	return times, last
}

type inspectScore struct {
	Value json.RawMessage `json:"value"`
}

// readInspect reads one Inspect AI log: a .eval archive (header.json and samples/*.json, stored,
// deflated or zstd-compressed, as Inspect writes them) or a .json log.
func readInspect(path string, maxMember int64) (inspectLog, error) {
	var log inspectLog
	if strings.HasSuffix(path, ".json") {
		b, err := os.ReadFile(path)
		if err != nil {
			return log, err
		}
		if err := json.Unmarshal(b, &log); err != nil {
			return log, notALog(path, err)
		}
		return log, nil
	}
	z, err := zip.OpenReader(path)
	if err != nil {
		return log, fmt.Errorf("%s: %w", path, err)
	}
	defer z.Close()
	// A frame may declare a window of up to 512 MB, allocated before the member cap applies: the
	// decoder refuses windows over 8 MB (Inspect's writer uses the default level's 8 MB at most)
	// and holds at most the member cap in memory.
	z.RegisterDecompressor(zstd.ZipMethodWinZip, zstd.ZipDecompressor(
		zstd.WithDecoderMaxWindow(8<<20), zstd.WithDecoderMaxMemory(uint64(maxMember))))
	read := func(f *zip.File, v any) error {
		if f.UncompressedSize64 > uint64(maxMember) {
			return fmt.Errorf("%s in %s: %d bytes decompressed, more than the limit of %d", f.Name, path, f.UncompressedSize64, maxMember)
		}
		r, err := f.Open()
		if err != nil {
			return err
		}
		defer r.Close()
		// archive/zip fails a member that decompresses past its declared size; the limit holds
		// whatever the declaration says.
		b, err := io.ReadAll(io.LimitReader(r, maxMember+1))
		if err != nil {
			return fmt.Errorf("%s in %s: %w", f.Name, path, err)
		}
		if int64(len(b)) > maxMember {
			return fmt.Errorf("%s in %s: more than the limit of %d bytes decompressed", f.Name, path, maxMember)
		}
		if err := json.Unmarshal(b, v); err != nil {
			return fmt.Errorf("%s in %s: %w", f.Name, path, err)
		}
		return nil
	}
	for _, f := range z.File {
		switch {
		case f.Name == "header.json":
			if err := read(f, &log); err != nil {
				return log, err
			}
		case strings.HasPrefix(f.Name, "samples/") && strings.HasSuffix(f.Name, ".json"):
			var s inspectSample
			if err := read(f, &s); err != nil {
				return log, err
			}
			log.Samples = append(log.Samples, s)
		}
	}
	return log, nil
}

// notALogError is a file whose JSON is not an Inspect AI log: why says what it holds instead, in
// the user's terms (no Go type names).
type notALogError struct{ path, why string }

func (e *notALogError) Error() string { return e.path + " is " + e.why }

// notALog words a JSON error of reading path as an Inspect log.
func notALog(path string, err error) error {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te) && te.Field == "":
		return &notALogError{path, fmt.Sprintf("not an Inspect AI log: its JSON is %s, not a log object", article(te.Value))}
	case errors.As(err, &te):
		return &notALogError{path, fmt.Sprintf("not an Inspect AI log: its member %s is %s", te.Field, article(te.Value))}
	case errors.As(err, &se):
		return &notALogError{path, fmt.Sprintf("not JSON (at byte %d: %v)", se.Offset, se)}
	}
	return &notALogError{path, "not an Inspect AI log: " + err.Error()}
}

// article puts "a" or "an" before a JSON kind ("array", "object", "string", "number", "bool").
func article(kind string) string {
	if strings.IndexByte("aeiou", kind[0]) >= 0 {
		return "an " + kind
	}
	return "a " + kind
}

// inspectFiles lists the logs at path: the file itself, or the .eval and .json files in a directory.
func inspectFiles(path string) ([]string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !st.IsDir() {
		return []string{path}, nil
	}
	var out []string
	err = filepath.WalkDir(path, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && (strings.HasSuffix(p, ".eval") || strings.HasSuffix(p, ".json")) {
			out = append(out, p)
		}
		return err
	})
	sort.Strings(out)
	return out, err
}

// Inspect imports the Inspect AI logs at path (a .eval or .json log, or a directory of them).
// Each sample and epoch is one run: case_id is the sample id, run_index = epoch − 1, runs = the
// log's epochs. result is error for a sample that errored or has no score from the scorer; else
// from the score's value: C → pass (score 1), P → score 0.5, I and N → fail (score 0); true/false →
// pass/fail; a number → pass when at least PassThreshold (the score is kept when within 0..1).
// prediction is the output's completion, cut to the prediction limit. occurred_at and assessed_at
// are the sample's start and completion (the log's creation when absent).
func Inspect(path string, opt Options) ([]Event, error) {
	files, err := inspectFiles(path)
	if err != nil {
		return nil, err
	}
	enc, err := newEncoder(orDefault(opt.Source, "repeatrate-import/inspect"))
	if err != nil {
		return nil, err
	}
	var out []Event
	models := map[string]bool{}
	for i, f := range files {
		opt.progress(len(out), i, len(files))
		maxMember := opt.MaxMemberBytes
		if maxMember <= 0 {
			maxMember = DefaultMaxMemberBytes
		}
		log, err := readInspect(f, maxMember)
		var nl *notALogError
		switch {
		case errors.As(err, &nl) && f != path && opt.Skipped != nil:
			opt.Skipped(f, nl.why) // a stray file beside the logs of a folder
			continue
		case err != nil:
			return nil, err
		case log.Eval.Task == "":
			if f == path {
				return nil, fmt.Errorf("%s is not an Inspect AI log: it names no task (eval.task)", f)
			}
			if opt.Skipped != nil {
				opt.Skipped(f, "not an Inspect AI log: it names no task (eval.task)")
			}
			continue
		}
		log.upgradeV1()
		if err := oneModelUnder(opt, models, log.Eval.Model); err != nil {
			return nil, err
		}
		evs, err := inspectEvents(log, opt, enc)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		out = append(out, evs...)
	}
	opt.progress(len(out), len(files), len(files))
	return out, nil
}

// oneModelUnder refuses a --model given over files of several models: their runs would become one
// model's, each case's runs of one replacing the other's (models holds those seen so far).
func oneModelUnder(opt Options, models map[string]bool, model string) error {
	if opt.Scope.Model == "" {
		return nil
	}
	models[model] = true
	if len(models) > 1 {
		names := slices.Sorted(maps.Keys(models))
		return fmt.Errorf("the files hold runs of %d models (%s): --model %q would merge them into one, each model's runs replacing the other's; leave --model unset, or import each model's files apart",
			len(names), strings.Join(names, ", "), opt.Scope.Model)
	}
	return nil
}

func inspectEvents(log inspectLog, opt Options, enc *encoder) ([]Event, error) {
	created, err := time.Parse(time.RFC3339Nano, log.Eval.Created)
	if err != nil {
		return nil, fmt.Errorf("eval.created: %w", err)
	}
	scope := opt.Scope
	scope.Model = orDefault(scope.Model, log.Eval.Model)
	scope.Run = orDefault(scope.Run, log.Eval.RunID)
	suite := orDefault(opt.Suite, log.Eval.Task)
	// One eval() of several models writes a log per model with the same run id: each model is a
	// version of its own, or the later log's runs would replace the other's.
	version := orDefault(opt.Version, scope.Model+"@"+scope.Run)
	seq := opt.VersionSeq
	if seq == 0 {
		seq = created.Unix()
	}
	runs := log.Eval.Config.Epochs
	for _, s := range log.Samples {
		runs = max(runs, s.Epoch)
	}
	scorer := opt.Scorer
	if scorer == "" && len(log.Eval.Scorers) > 0 {
		scorer = log.Eval.Scorers[0].Name
	}
	threshold := 1.0
	if opt.PassThreshold != nil {
		threshold = *opt.PassThreshold
	}
	var out []Event
	ran, scored := 0, 0 // samples without an error; those with a score from scorer
	for _, s := range log.Samples {
		caseID := string(s.ID)
		var str string
		if json.Unmarshal(s.ID, &str) == nil {
			caseID = str
		}
		// Assessed when the scorer last judged it, and as often as it was: a log scored again
		// (inspect score, action overwrite) or edited (edit_score) supersedes the earlier verdicts,
		// as a re-assessment does, also when the events carry no time or no scorer name.
		judged, at := s.judged(scorer)
		assessed := parseTimeOr(s.CompletedAt, created)
		if at != "" {
			assessed = parseTimeOr(at, assessed)
		}
		r := schemas.EvalResult{Scope: scope, Suite: suite, CaseID: caseID, Version: version, VersionSeq: seq,
			RunIndex: s.Epoch - 1, Runs: runs, Result: schemas.ResultError,
			OccurredAt: parseTimeOr(s.StartedAt, created), AssessedAt: assessed, AssessmentSeq: judged}
		if s.Error == nil {
			ran++
			pred := clipPrediction(s.Output.Completion)
			r.Prediction = &pred
			if sc, ok := s.Scores[scorer]; ok {
				scored++
				r.Result, r.Score = inspectResult(sc.Value, threshold)
			}
		}
		ev, err := enc.encode(r)
		if err != nil {
			return nil, err
		}
		out = append(out, ev)
	}
	// Samples ran and none has a score from the scorer: a wrong --scorer, or a log whose scores
	// this reader does not find. Every result would be an error: refuse, naming what is there.
	if ran > 0 && scored == 0 {
		var names []string
		for _, sc := range log.Eval.Scorers {
			names = append(names, sc.Name)
		}
		return nil, fmt.Errorf("no sample has a score from scorer %q (the log's scorers: %s); choose one with --scorer",
			scorer, strings.Join(names, ", "))
	}
	return out, nil
}

// inspectResult maps a score value to a result and an optional score (documented at Inspect).
func inspectResult(v json.RawMessage, threshold float64) (string, *float64) {
	var num float64
	var letter string
	var b bool
	switch {
	case json.Unmarshal(v, &letter) == nil:
		switch letter {
		case "C":
			num = 1
		case "P":
			num = 0.5
		case "I", "N":
			num = 0
		default:
			return schemas.ResultError, nil
		}
	case json.Unmarshal(v, &b) == nil:
		if b {
			num = 1
		}
	case json.Unmarshal(v, &num) == nil:
	default:
		return schemas.ResultError, nil // a dict or list of values: no single verdict
	}
	res := schemas.ResultFail
	if num >= threshold {
		res = schemas.ResultPass
	}
	if num >= 0 && num <= 1 {
		return res, &num
	}
	return res, nil
}

func parseTimeOr(s string, def time.Time) time.Time {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t
	}
	return def
}
