package schemas

import (
	"fmt"
	"strings"
	"time"
)

// Aggregate is the identity of one correction repeat rate (docs/semantics.md#aggregates): a scope, a correction and a
// source. Live and evaluation results are never pooled.
type Aggregate struct {
	Workspace    string `json:"workspace"`
	Model        string `json:"model"`
	Run          string `json:"run"`
	Checkpoint   string `json:"checkpoint"`
	Artifact     string `json:"artifact"`
	CorrectionID string `json:"correction_id"`
	Source       string `json:"source"`
}

// ID is the aggregate's stable identity text: the Kafka message key of its snapshots and the hash
// tag of its Redis keys. Every part is escaped, so two distinct aggregates never share an ID and no
// part can break out of a Redis hash tag: parts are joined by '|', and '%', '|', '{', '}',
// controls, spaces and non-ASCII bytes are percent-encoded.
func (a Aggregate) ID() string {
	return JoinEscaped(a.Workspace, a.Model, a.Run, a.Checkpoint, a.Artifact, a.CorrectionID, a.Source)
}

// JoinEscaped joins parts with '|' after percent-encoding '%', '|', '{', '}', controls, spaces and
// non-ASCII bytes in each: distinct part lists never give the same text.
func JoinEscaped(parts ...string) string {
	n := len(parts)
	for _, p := range parts {
		n += len(p)
	}
	var b strings.Builder
	b.Grow(n + 8)
	for i, p := range parts {
		if i > 0 {
			b.WriteByte('|')
		}
		escapeTo(&b, p)
	}
	return b.String()
}

const hexDigits = "0123456789ABCDEF"

func escapeTo(b *strings.Builder, s string) {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || c == '%' || c == '|' || c == '{' || c == '}' {
			b.WriteByte('%')
			b.WriteByte(hexDigits[c>>4])
			b.WriteByte(hexDigits[c&15])
			continue
		}
		b.WriteByte(c)
	}
}

// Snapshot is the data of a repeatrate.snapshot.v1 event: the current repeat rate of one aggregate
// in every window. Version grows strictly with every change of the aggregate's state, so a
// subscriber keeps the snapshot with the greatest version it has seen.
type Snapshot struct {
	Aggregate         Aggregate `json:"aggregate"`
	Windows           Windows   `json:"windows"`
	OpportunityWindow *Span     `json:"opportunity_window"`
	ObservedAt        time.Time `json:"observed_at"`
	Version           int64     `json:"version"`
}

// Windows holds the four rolling windows (docs/semantics.md#windows).
type Windows struct {
	All  Window `json:"all"`
	Hour Window `json:"1h"`
	Day  Window `json:"24h"`
	Week Window `json:"7d"`
}

// Status values of a window.
const (
	StatusMeasured    = "measured"
	StatusNotMeasured = "not_measured"
)

// Window is the repeat rate over one window. Rate, Percentage and CI95 are null when nothing was
// scored; Unscored is always reported.
type Window struct {
	ConfirmedRepeats int64     `json:"confirmed_repeats"`
	Passed           int64     `json:"passed"`
	Unscored         int64     `json:"unscored"`
	Scored           int64     `json:"scored"`
	Rate             *float64  `json:"rate"`
	Percentage       *float64  `json:"percentage"`
	Status           string    `json:"status"`
	CI95             *Interval `json:"ci95"`
}

// Interval is a closed confidence interval for a rate.
type Interval struct {
	Low  float64 `json:"low"`
	High float64 `json:"high"`
}

// Span is the first and last occurred_at over an aggregate's retained opportunities.
type Span struct {
	First time.Time `json:"first"`
	Last  time.Time `json:"last"`
}

// SplitEscaped is the inverse of JoinEscaped.
func SplitEscaped(s string) ([]string, error) {
	parts := strings.Split(s, "|")
	for i, p := range parts {
		if !strings.Contains(p, "%") {
			continue
		}
		var b strings.Builder
		for j := 0; j < len(p); j++ {
			if p[j] != '%' {
				b.WriteByte(p[j])
				continue
			}
			if j+2 >= len(p) || unhex(p[j+1]) < 0 || unhex(p[j+2]) < 0 {
				return nil, fmt.Errorf("bad escape in %q", s)
			}
			b.WriteByte(byte(unhex(p[j+1])<<4 | unhex(p[j+2])))
			j += 2
		}
		parts[i] = b.String()
	}
	return parts, nil
}

func unhex(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}
