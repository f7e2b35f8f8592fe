// Package replay computes offline, with the pure models, what the processor would publish for a
// file of CloudEvents (`repeatrate replay`): the reference the end-to-end tests compare with.
package replay

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
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

// Result is what a replay computed from its input.
type Result struct {
	Snapshots   []schemas.Snapshot // sorted by aggregate ID
	Suites      suite.Output
	Outs        []sink.Out // every output event in print order
	DeadLetters []DeadLetter
	Events      int // the events that decoded
}

// DeadLetter is one line that did not decode, and why.
type DeadLetter struct {
	Line        int    `json:"line"`
	Reason      string `json:"reason"`
	Detail      string `json:"detail"`
	Value       string `json:"value,omitempty"`
	ValueBase64 []byte `json:"value_base64,omitempty"`
}

// Run runs the aggregation offline with the pure models, one event at a time in file order.
// Snapshots are observed at asOf, or at the largest occurred_at when asOf is zero; received is
// the time future-dated events are judged against. Versions count the changes of each aggregate.
// Suite outputs are computed once, over the final runs: a discrimination snapshot per suite, a
// stability snapshot per version, a revived event per revived case, and an abnormal-sample event
// per abnormal reply of any result, as the processor raises them. Suites are never dropped for idleness, unlike in the processor's
// Redis store (see suite.Model).
func Run(ctx context.Context, r io.Reader, dec *cloudevent.Decoder, retention time.Duration, suiteCfg suite.Config, asOf, received time.Time) (Result, error) {
	var res Result
	model := aggregator.NewModel(retention)
	suites := suite.NewModel()
	var runs []suite.RunObservation
	var maxOcc time.Time
	lr := NewLineReader(r, dec.MaxMessageBytes())
	for n := 1; ; n++ {
		if n%4096 == 0 && ctx.Err() != nil {
			return res, ctx.Err()
		}
		line, tooLong, err := lr.Next()
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
			d := DeadLetter{Line: n, Reason: string(schemas.ReasonOf(err)), Detail: err.Error()}
			if utf8.Valid(line) {
				d.Value = string(line)
			} else {
				d.ValueBase64 = slices.Clone(line)
			}
			res.DeadLetters = append(res.DeadLetters, d)
			continue
		}
		res.Events++
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
		res.Snapshots = append(res.Snapshots, model.Tally(k, at).Snapshot(k, at))
		res.Outs = append(res.Outs, sink.SnapshotOut(&res.Snapshots[len(res.Snapshots)-1]))
	}
	applied := suite.Applied{Suites: suites.Suites(), Summaries: map[suite.Key]*suite.Summary{}}
	for _, k := range applied.Suites {
		s := suites.Summary(k, slices.Sorted(slices.Values(suites.Versions(k))), nil, suiteCfg, at)
		applied.Summaries[k] = &s
	}
	// Every result, as the processor's batches see them: each abnormal reply raises its alert
	// (docs/semantics.md#alerts), whichever assessment of its run won.
	res.Suites = suite.BuildOutput(applied, runs, suiteCfg, at)
	snaps, alerts := sink.SuiteOuts(res.Suites, at)
	res.Outs = append(res.Outs, snaps...)
	res.Outs = append(res.Outs, alerts...)
	return res, nil
}

// LineReader reads lines of at most max bytes; a longer line is reported once, truncated.
type LineReader struct {
	r   *bufio.Reader
	max int
	buf []byte
}

// NewLineReader reads r in lines of at most max bytes.
func NewLineReader(r io.Reader, max int) *LineReader {
	return &LineReader{r: bufio.NewReaderSize(r, 64<<10), max: max}
}

// Next returns the next line without its line ending; tooLong says it was cut at max bytes.
// It returns io.EOF after the last line.
func (l *LineReader) Next() (line []byte, tooLong bool, err error) {
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
