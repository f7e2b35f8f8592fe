package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/aggregator/suite"
	"github.com/repeatrate/repeatrate/schemas"
	"github.com/repeatrate/repeatrate/schemas/cloudevent"
	"github.com/repeatrate/repeatrate/sink"
)

// replayDeadLetter is one line of replay's dead-letter output.
type replayDeadLetter struct {
	Line        int    `json:"line"`
	Reason      string `json:"reason"`
	Detail      string `json:"detail"`
	Value       string `json:"value,omitempty"`
	ValueBase64 []byte `json:"value_base64,omitempty"`
}

func replayCommand(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("replay", stderr)
	in := fs.String("in", "", "NDJSON file of structured CloudEvents (- for standard input)")
	asOf := fs.String("as-of", "", "observation time, RFC 3339 (default: the largest occurred_at seen)")
	out := fs.String("out", "", "write snapshots here instead of standard output")
	dlq := fs.String("dlq", "", "write dead letters here instead of standard error")
	retention := fs.String("retention", "30d", "opportunity identity retention, as for run")
	maxMsg := fs.Int("max-message-bytes", cloudevent.DefaultDecoderConfig.MaxMessageBytes, "largest accepted event")
	sc := defaultConfig().Suite
	fs.IntVar(&sc.MinHistory, "min-history", sc.MinHistory, "versions with an outcome before a case is judged")
	fs.IntVar(&sc.JudgeLastVersions, "judge-last-versions", 0, "judge cases over only the last R versions (0: all)")
	passAtK := fs.String("pass-at-k", strings.Join(sc.PassAtK, ","), "pass@k levels")
	fs.StringVar(&sc.ReplyMode, "reply-mode", sc.ReplyMode, "reply repetition rules: default or opencompass")
	fs.StringVar(&sc.Tokenizer, "tokenizer", sc.Tokenizer, "what reply analysis counts as a token: whitespace, o200k_base or cl100k_base")
	fs.DurationVar(&sc.MissingAfter, "missing-after", sc.MissingAfter, "planned runs count as missing this long after a case's first run")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *in == "" {
		return errors.New("replay: --in is required")
	}
	sc.PassAtK = strings.Split(*passAtK, ",")
	suiteCfg, err := sc.aggregator()
	if err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	ret, err := parseDuration(*retention)
	if err != nil || ret <= 0 {
		return fmt.Errorf("replay: --retention %q: must be a positive duration", *retention)
	}
	var at time.Time
	if *asOf != "" {
		if at, err = time.Parse(time.RFC3339Nano, *asOf); err != nil {
			return fmt.Errorf("replay: --as-of: %w", err)
		}
	}
	r := stdin
	if *in != "-" {
		f, err := os.Open(*in)
		if err != nil {
			return fmt.Errorf("replay: %w", err)
		}
		defer f.Close()
		r = f
	}
	snapOut, closeOut, err := createOr(*out, stdout)
	if err != nil {
		return err
	}
	defer closeOut()
	dlqOut, closeDLQ, err := createOr(*dlq, stderr)
	if err != nil {
		return err
	}
	defer closeDLQ()

	dcfg := cloudevent.DefaultDecoderConfig
	dcfg.MaxMessageBytes = *maxMsg
	dec, err := cloudevent.NewDecoder(dcfg)
	if err != nil {
		return err
	}
	// Progress on a terminal; done before anything else is written there.
	prog := newProgress(stderr, "replay", inputSize(r))
	res, err := replay(ctx, prog.reader(r), dec, ret, suiteCfg, at, time.Now())
	prog.finish()
	if err != nil {
		return err
	}
	bw := bufio.NewWriter(snapOut)
	for i := range res.outs {
		b, err := sink.Encode(&res.outs[i])
		if err != nil {
			return err
		}
		bw.Write(b)
		bw.WriteByte('\n')
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("replay: write snapshots: %w", err)
	}
	enc := json.NewEncoder(dlqOut)
	for _, d := range res.deadLetters {
		if err := enc.Encode(d); err != nil {
			return fmt.Errorf("replay: write dead letters: %w", err)
		}
	}
	return nil
}

func createOr(path string, def io.Writer) (io.Writer, func(), error) {
	if path == "" || path == "-" {
		return def, func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, nil, fmt.Errorf("replay: %w", err)
	}
	return f, func() { f.Close() }, nil
}

type replayResult struct {
	snapshots   []schemas.Snapshot // sorted by aggregate ID
	suites      suite.Output
	outs        []Out // every output event in print order
	deadLetters []replayDeadLetter
	events      int
}

// Out is an output event as replay prints it.
type Out = sink.Out

// replay runs the aggregation offline with the pure models, one event at a time in file order.
// Snapshots are observed at asOf, or at the largest occurred_at when asOf is zero; received is
// the time future-dated events are judged against. Versions count the changes of each aggregate.
// Suite outputs are computed once, over the final runs: a discrimination snapshot per suite, a
// stability snapshot per version, a revived event per revived case, and an abnormal-sample event
// per abnormal reply of any result, as the processor raises them. Suites are never dropped for idleness, unlike in the processor's
// Redis store (see suite.Model).
func replay(ctx context.Context, r io.Reader, dec *cloudevent.Decoder, retention time.Duration, suiteCfg suite.Config, asOf, received time.Time) (replayResult, error) {
	var res replayResult
	model := aggregator.NewModel(retention)
	suites := suite.NewModel()
	var runs []suite.RunObservation
	var maxOcc time.Time
	lr := newLineReader(r, dec.MaxMessageBytes())
	for n := 1; ; n++ {
		if n%4096 == 0 && ctx.Err() != nil {
			return res, ctx.Err()
		}
		line, tooLong, err := lr.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return res, fmt.Errorf("replay: read line %d: %w", n, err)
		}
		if len(bytes.TrimSpace(line)) == 0 && !tooLong {
			continue
		}
		var ev cloudevent.Event
		if tooLong {
			err = schemas.Invalid(schemas.ReasonTooLarge, "line is over %d bytes (value truncated)", dec.MaxMessageBytes())
		} else {
			ev, err = dec.DecodeStructured(line, received)
		}
		if err != nil {
			d := replayDeadLetter{Line: n, Reason: string(schemas.ReasonOf(err)), Detail: err.Error()}
			if utf8.Valid(line) {
				d.Value = string(line)
			} else {
				d.ValueBase64 = slices.Clone(line)
			}
			res.deadLetters = append(res.deadLetters, d)
			continue
		}
		res.events++
		o, ok := ev.Observation()
		if ev.Eval != nil {
			run := suite.FromEvalRun(ev.Eval, suiteCfg.ReplyMode)
			suites.Apply([]suite.RunObservation{run})
			runs = append(runs, run)
			if t := ev.Eval.OccurredAt; t.After(maxOcc) {
				maxOcc = t
			}
		}
		if !ok {
			continue
		}
		if t := time.UnixMicro(o.Occurred); t.After(maxOcc) {
			maxOcc = t
		}
		model.ApplyBatch([]aggregator.Observation{o})
	}
	at := asOf
	if at.IsZero() {
		at = maxOcc
	}
	keys := model.Keys()
	ids := make(map[aggregator.Key]string, len(keys))
	for _, k := range keys {
		ids[k] = k.String()
	}
	slices.SortFunc(keys, func(a, b aggregator.Key) int { return strings.Compare(ids[a], ids[b]) })
	for _, k := range keys {
		res.snapshots = append(res.snapshots, model.Tally(k, at).Snapshot(k, at))
		res.outs = append(res.outs, sink.SnapshotOut(&res.snapshots[len(res.snapshots)-1]))
	}
	applied := suite.Applied{Suites: suites.Suites(), Summaries: map[suite.Key]*suite.Summary{}}
	for _, k := range applied.Suites {
		s := suites.Summary(k, slices.Sorted(slices.Values(suites.Versions(k))), nil, suiteCfg, at)
		applied.Summaries[k] = &s
	}
	// Every result, as the processor's batches see them: each abnormal reply raises its alert
	// (docs/semantics.md#alerts), whichever assessment of its run won.
	res.suites = suite.BuildOutput(applied, runs, suiteCfg, at)
	snaps, alerts := sink.SuiteOuts(res.suites, at)
	res.outs = append(res.outs, snaps...)
	res.outs = append(res.outs, alerts...)
	return res, nil
}

// lineReader reads lines of at most max bytes; a longer line is reported once, truncated.
type lineReader struct {
	r   *bufio.Reader
	max int
	buf []byte
}

func newLineReader(r io.Reader, max int) *lineReader {
	return &lineReader{r: bufio.NewReaderSize(r, 64<<10), max: max}
}

func (l *lineReader) next() (line []byte, tooLong bool, err error) {
	l.buf = l.buf[:0]
	for {
		chunk, err := l.r.ReadSlice('\n')
		if len(l.buf)+len(chunk) > l.max+1 {
			tooLong = true
			if keep := l.max + 1 - len(l.buf); keep > 0 {
				l.buf = append(l.buf, chunk[:keep]...)
			}
		} else {
			l.buf = append(l.buf, chunk...)
		}
		switch {
		case err == bufio.ErrBufferFull:
			continue
		case err == io.EOF && (len(l.buf) > 0 || tooLong):
			return bytes.TrimRight(l.buf, "\r\n"), tooLong, nil
		case err != nil:
			return nil, false, err
		}
		return bytes.TrimRight(l.buf, "\r\n"), tooLong, nil
	}
}
