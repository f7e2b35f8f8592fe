package schemas

import (
	"encoding/json"
	"math"
	"strconv"
	"time"
)

// AppendJSON appends s as encoding/json renders it, byte for byte, without reflection: the
// processor renders a snapshot for every aggregate a batch touches (TestSnapshotAppendJSON holds
// the two to the same bytes). A value encoding/json would refuse (a NaN rate, a year beyond 9999)
// is rendered by encoding/json, and its error returned.
func (s *Snapshot) AppendJSON(b []byte) ([]byte, error) {
	if !s.plainJSON() {
		out, err := json.Marshal(s)
		return append(b, out...), err
	}
	a := &s.Aggregate
	b = append(b, `{"aggregate":{"workspace":`...)
	b = appendString(b, a.Workspace)
	b = append(b, `,"model":`...)
	b = appendString(b, a.Model)
	b = append(b, `,"run":`...)
	b = appendString(b, a.Run)
	b = append(b, `,"checkpoint":`...)
	b = appendString(b, a.Checkpoint)
	b = append(b, `,"artifact":`...)
	b = appendString(b, a.Artifact)
	b = append(b, `,"correction_id":`...)
	b = appendString(b, a.CorrectionID)
	b = append(b, `,"source":`...)
	b = appendString(b, a.Source)
	b = append(b, `},"windows":{"all":`...)
	b = s.Windows.All.appendJSON(b)
	b = append(b, `,"1h":`...)
	b = s.Windows.Hour.appendJSON(b)
	b = append(b, `,"24h":`...)
	b = s.Windows.Day.appendJSON(b)
	b = append(b, `,"7d":`...)
	b = s.Windows.Week.appendJSON(b)
	b = append(b, `},"opportunity_window":`...)
	if w := s.OpportunityWindow; w == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, `{"first":`...)
		b = appendTime(b, w.First)
		b = append(b, `,"last":`...)
		b = appendTime(b, w.Last)
		b = append(b, '}')
	}
	b = append(b, `,"observed_at":`...)
	b = appendTime(b, s.ObservedAt)
	b = append(b, `,"version":`...)
	b = strconv.AppendInt(b, s.Version, 10)
	return append(b, '}'), nil
}

// plainJSON reports whether every float is finite and every time within the years and zone
// offsets encoding/json accepts, so that AppendJSON can render s itself.
func (s *Snapshot) plainJSON() bool {
	for _, w := range [...]*Window{&s.Windows.All, &s.Windows.Hour, &s.Windows.Day, &s.Windows.Week} {
		if !finite(w.Rate) || !finite(w.Percentage) || (w.CI95 != nil && (!finite(&w.CI95.Low) || !finite(&w.CI95.High))) {
			return false
		}
	}
	ok := plainTime(s.ObservedAt)
	if w := s.OpportunityWindow; w != nil {
		ok = ok && plainTime(w.First) && plainTime(w.Last)
	}
	return ok
}

func finite(f *float64) bool { return f == nil || !(math.IsNaN(*f) || math.IsInf(*f, 0)) }

// plainTime reports whether time.Time's MarshalJSON accepts t: a year of four digits and a zone
// offset under 24 hours (RFC 3339).
func plainTime(t time.Time) bool {
	y := t.Year()
	_, off := t.Zone()
	return y >= 0 && y <= 9999 && off > -24*3600 && off < 24*3600
}

func (w *Window) appendJSON(b []byte) []byte {
	b = append(b, `{"confirmed_repeats":`...)
	b = strconv.AppendInt(b, w.ConfirmedRepeats, 10)
	b = append(b, `,"passed":`...)
	b = strconv.AppendInt(b, w.Passed, 10)
	b = append(b, `,"unscored":`...)
	b = strconv.AppendInt(b, w.Unscored, 10)
	b = append(b, `,"scored":`...)
	b = strconv.AppendInt(b, w.Scored, 10)
	b = append(b, `,"rate":`...)
	b = appendFloatPtr(b, w.Rate)
	b = append(b, `,"percentage":`...)
	b = appendFloatPtr(b, w.Percentage)
	b = append(b, `,"status":`...)
	b = appendString(b, w.Status)
	b = append(b, `,"ci95":`...)
	if w.CI95 == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, `{"low":`...)
		b = appendFloat(b, w.CI95.Low)
		b = append(b, `,"high":`...)
		b = appendFloat(b, w.CI95.High)
		b = append(b, '}')
	}
	return append(b, '}')
}

func appendFloatPtr(b []byte, f *float64) []byte {
	if f == nil {
		return append(b, "null"...)
	}
	return appendFloat(b, *f)
}

// appendFloat renders a finite f as encoding/json does: the shortest decimal that reads back as
// f, in exponent form below 1e-6 and from 1e21, with a one-digit negative exponent unpadded.
func appendFloat(b []byte, f float64) []byte {
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b
}

// appendTime renders t as time.Time's MarshalJSON does (its own offset kept).
func appendTime(b []byte, t time.Time) []byte {
	b = append(b, '"')
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b, '"')
}

// appendString renders s as encoding/json does: printable ASCII without quotes, backslashes and
// the characters it escapes for HTML is written as it is, anything else by encoding/json.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < ' ' || c > '~' || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			out, _ := json.Marshal(s)
			return append(b, out...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
