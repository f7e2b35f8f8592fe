package sink

import (
	"bytes"
	"testing"
	"time"

	"github.com/repeatrate/repeatrate/schemas"
)

// Encode gives the SDK's bytes for subjects and types with characters JSON or the SDK treat
// specially, times in other zones and at the edges, and data of every output kind, none included.
func TestEncodeAdversarialAgreesWithSDK(t *testing.T) {
	lmt, _ := time.LoadLocation("Europe/Amsterdam")
	subjects := []string{"a<b>&c", "a%7Cb|c{d}", "x\x7fy", "\u2028", "a b", " a", "a ", "\ta", "a\\b", `a"b`, "é", "\xff", "/", "~", "!#$'()*+,-./:;=?@[]^_`"}
	times := []time.Time{time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC), time.Date(1800, 1, 1, 0, 0, 0, 1, lmt),
		time.Date(2026, 3, 1, 12, 0, 0, 123000000, time.FixedZone("x", 3600+17)), time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC),
		time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC), time.Unix(0, 1)}
	rate := 0.25
	snap := &schemas.Snapshot{Aggregate: schemas.Aggregate{Workspace: "w<&>", Source: "live"}, Version: 7,
		Windows: schemas.Windows{All: schemas.Window{Rate: &rate, Percentage: &rate, CI95: &schemas.Interval{Low: 1e-7, High: 1e21}}}}
	datas := []any{snap, &schemas.CaseRevived{Workspace: "w", Suite: "s<>"}, map[string]any{"a": "<&>"}, nil, (*schemas.Snapshot)(nil)}
	for _, s := range subjects {
		for _, tm := range times {
			for _, d := range datas {
				if sp, ok := d.(*schemas.Snapshot); ok && sp != nil {
					sp.ObservedAt = tm
				}
				o := Out{Type: schemas.TypeSnapshot, Subject: s, Time: tm, IDSeed: "1", Data: d}
				got, gerr := Encode(&o)
				want, werr := encodeSDK(&o)
				if (gerr == nil) != (werr == nil) || !bytes.Equal(got, want) {
					t.Errorf("subject %q time %v data %T:\n got  %s %v\n want %s %v", s, tm, d, got, gerr, want, werr)
				}
			}
		}
	}
}
