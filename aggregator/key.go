package aggregator

import (
	"strings"

	"github.com/repeatrate/repeatrate/schemas"
)

// Source says where an observation came from. Sources are never pooled.
type Source uint8

// The two sources of SPEC §3.
const (
	Live Source = iota + 1
	Evaluation
)

func (s Source) String() string {
	switch s {
	case Live:
		return "live"
	case Evaluation:
		return "evaluation"
	}
	return "unknown"
}

// ParseSource is the inverse of Source.String.
func ParseSource(s string) (Source, bool) {
	switch s {
	case "live":
		return Live, true
	case "evaluation":
		return Evaluation, true
	}
	return 0, false
}

// Key is the identity of one aggregate: scope, correction and source.
type Key struct {
	Scope        schemas.Scope
	CorrectionID string
	Source       Source
}

// String is the aggregate's stable identity text, used as the Kafka message key and inside Redis
// key names. Every part is escaped, so two distinct keys never give the same string and no part can
// break out of a Redis hash tag: parts are joined by '|', and '%', '|', '{', '}', controls, spaces
// and non-ASCII bytes are percent-encoded.
func (k Key) String() string {
	var b strings.Builder
	b.Grow(len(k.Scope.Workspace) + len(k.Scope.Model) + len(k.Scope.Run) + len(k.Scope.Checkpoint) +
		len(k.Scope.Artifact) + len(k.CorrectionID) + 16)
	for i, p := range [...]string{k.Scope.Workspace, k.Scope.Model, k.Scope.Run, k.Scope.Checkpoint,
		k.Scope.Artifact, k.CorrectionID, k.Source.String()} {
		if i > 0 {
			b.WriteByte('|')
		}
		escapeTo(&b, p)
	}
	return b.String()
}

// Aggregate returns the key in its published form.
func (k Key) Aggregate() schemas.Aggregate {
	return schemas.Aggregate{
		Workspace: k.Scope.Workspace, Model: k.Scope.Model, Run: k.Scope.Run,
		Checkpoint: k.Scope.Checkpoint, Artifact: k.Scope.Artifact,
		CorrectionID: k.CorrectionID, Source: k.Source.String(),
	}
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
