package testenv

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"
)

// LiveAttempts builds CloudEvent lines of one correction's live attempts, in the scope
// Workspace/bot/r1/c1/prod (artifact prod), for tests that feed a processor.
type LiveAttempts struct {
	Workspace, Correction string
	buf                   bytes.Buffer
	seq                   int
}

// Add appends n attempts occurring evenly from from to to, the first repeats of them confirmed
// repeats, each assessed a second after it occurred.
func (l *LiveAttempts) Add(n, repeats int, from, to time.Time) {
	for i := range n {
		at := from.Add(time.Duration(i) * to.Sub(from) / time.Duration(n))
		outcome := "passed"
		if i < repeats {
			outcome = "confirmed_repeat"
		}
		l.seq++
		b, _ := json.Marshal(map[string]any{"specversion": "1.0", "id": fmt.Sprintf("%s-%d", l.Correction, l.seq), "source": "test",
			"type": "repeatrate.live.attempt.v1", "data": map[string]any{
				"scope":         map[string]string{"workspace": l.Workspace, "model": "bot", "run": "r1", "checkpoint": "c1", "artifact": "prod"},
				"correction_id": l.Correction, "opportunity_id": fmt.Sprintf("opp-%d", l.seq), "outcome": outcome,
				"occurred_at": at.UTC().Format(time.RFC3339Nano), "assessed_at": at.Add(time.Second).UTC().Format(time.RFC3339Nano)}})
		l.buf.Write(b)
		l.buf.WriteByte('\n')
	}
}

// Take returns the lines added since the last Take.
func (l *LiveAttempts) Take() []byte {
	b := bytes.Clone(l.buf.Bytes())
	l.buf.Reset()
	return b
}
