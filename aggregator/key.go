package aggregator

import "github.com/repeatrate/repeatrate/schemas"

// Source says where an observation came from. Sources are never pooled.
type Source uint8

// The two sources, never pooled (docs/semantics.md#aggregates).
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

// String is the aggregate's stable identity text (see schemas.Aggregate.ID): the Kafka message
// key of its snapshots and the hash tag of its Redis keys.
func (k Key) String() string { return k.Aggregate().ID() }

// Aggregate returns the key in its published form.
func (k Key) Aggregate() schemas.Aggregate {
	return schemas.Aggregate{
		Workspace: k.Scope.Workspace, Model: k.Scope.Model, Run: k.Scope.Run,
		Checkpoint: k.Scope.Checkpoint, Artifact: k.Scope.Artifact,
		CorrectionID: k.CorrectionID, Source: k.Source.String(),
	}
}
