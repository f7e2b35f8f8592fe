package sink

import (
	"bytes"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/repeatrate/repeatrate/schemas"
)

// testSnapshot is a snapshot as the processor publishes it: every window measured.
func testSnapshot(r *rand.Rand) *schemas.Snapshot {
	rate := r.Float64()
	pct := rate * 100
	w := schemas.Window{ConfirmedRepeats: r.Int64N(1000), Passed: r.Int64N(1000), Unscored: r.Int64N(10), Rate: &rate, Percentage: &pct}
	w.Scored = w.ConfirmedRepeats + w.Passed
	return &schemas.Snapshot{
		Aggregate: schemas.Aggregate{Workspace: "acme", Model: "support-bot", Run: "2026-11", Checkpoint: "ckpt-42", Artifact: "prod",
			CorrectionID: "fix-17", Source: "live"},
		Windows:    schemas.Windows{All: w, Hour: w, Day: w, Week: w},
		ObservedAt: time.Date(2026, 11, 30, 10, 0, 0, r.IntN(1e9), time.UTC),
		Version:    r.Int64N(1 << 40),
	}
}

// The direct encoding gives the SDK's bytes, whatever the attributes: plain ones take the direct
// path, the rest (quotes, backslashes, controls, non-ASCII, spaces the SDK trims, an empty subject,
// a zero time) the SDK's, and both agree wherever either could be taken.
func TestEncodeAgreesWithSDK(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	alphabet := []string{"a", "Z", "0", "|", "%", "<", ">", "&", "'", "{", "}", "~", " ", "\"", "\\", "\n", "\t", "\x7f", "é", "\u2028", "\xff", "😀"}
	word := func() string {
		var b bytes.Buffer
		for range r.IntN(8) {
			b.WriteString(alphabet[r.IntN(len(alphabet))])
		}
		return b.String()
	}
	zones := []*time.Location{time.UTC, time.FixedZone("x", 2*3600+1800), time.FixedZone("y", -5*3600)}
	direct := 0
	for i := range 20000 {
		s := testSnapshot(r)
		o := SnapshotOut(s)
		switch i % 4 {
		case 1:
			o.Subject = schemas.JoinEscaped(word(), word(), word())
		case 2:
			o.Subject, o.Type = word(), word()
		case 3:
			o.Data = map[string]any{word(): word(), "n": r.Float64()}
		}
		switch r.IntN(10) {
		case 0:
			o.Time = time.Time{}
		case 1:
			o.Time = time.Date(1+r.IntN(9998), time.Month(1+r.IntN(12)), 1+r.IntN(28), r.IntN(24), r.IntN(60), r.IntN(60), r.IntN(1e9), zones[r.IntN(len(zones))])
		}
		got, err := Encode(&o)
		want, werr := encodeSDK(&o)
		if (err == nil) != (werr == nil) || !bytes.Equal(got, want) {
			t.Fatalf("out %+v:\nEncode    %s (%v)\nSDK       %s (%v)", o, got, err, want, werr)
		}
		if plainAttribute(o.Type) && plainAttribute(o.Subject) && !o.Time.IsZero() {
			direct++
		}
	}
	if direct < 8000 {
		t.Fatalf("only %d of 20000 outputs took the direct path: the test compares too little", direct)
	}
}

// go test -run '^$' -bench Encode -benchmem ./sink
func BenchmarkEncodeSnapshot(b *testing.B) {
	o := SnapshotOut(testSnapshot(rand.New(rand.NewPCG(1, 2))))
	for _, bc := range []struct {
		name string
		enc  func(*Out) ([]byte, error)
	}{{"direct", Encode}, {"sdk", encodeSDK}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := bc.enc(&o); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
