package schemas

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// AppendJSON renders exactly what encoding/json renders, for any snapshot: strings that need
// escaping, nil and extreme floats, times in other zones and outside the years JSON accepts.
func TestSnapshotAppendJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	alphabet := []string{"a", "Z", "0", "|", "%", "<", ">", "&", "'", " ", "\"", "\\", "\n", "\x00", "\x7f", "é", "\u2028", "\u2029", "\xff", "😀"}
	str := func() string {
		var b strings.Builder
		for range r.IntN(6) {
			b.WriteString(alphabet[r.IntN(len(alphabet))])
		}
		return b.String()
	}
	floats := []float64{0, math.Copysign(0, -1), 1, 0.5, 1.0 / 3, 100, 1e-6, 9.99e-7, 1e-7, 1e20, 1e21, 123456789012345678901234.0, -2.5e-10,
		math.MaxFloat64, math.SmallestNonzeroFloat64, math.NaN(), math.Inf(1), math.Inf(-1)}
	float := func() *float64 {
		if r.IntN(4) == 0 {
			return nil
		}
		var f float64
		if r.IntN(2) == 0 {
			f = floats[r.IntN(len(floats))]
		} else {
			f = math.Float64frombits(r.Uint64())
		}
		return &f
	}
	zones := []*time.Location{time.UTC, time.FixedZone("", 5*3600+1800), time.FixedZone("", -11*3600)}
	when := func() time.Time {
		switch r.IntN(8) {
		case 0:
			return time.Time{}
		case 1:
			return time.Date(10000+r.IntN(100), 1, 1, 0, 0, 0, 0, time.UTC)
		case 2:
			return time.Date(-1-r.IntN(100), 1, 1, 0, 0, 0, 0, time.UTC)
		}
		return time.Unix(r.Int64N(1<<34), r.Int64N(1e9)).In(zones[r.IntN(len(zones))])
	}
	window := func() Window {
		w := Window{ConfirmedRepeats: r.Int64() - r.Int64(), Passed: r.Int64N(1 << 40), Unscored: r.Int64N(9), Scored: r.Int64(),
			Rate: float(), Percentage: float(), Status: []string{StatusMeasured, StatusNotMeasured, str()}[r.IntN(3)]}
		if r.IntN(3) > 0 {
			lo, hi := float(), float()
			if lo != nil && hi != nil {
				w.CI95 = &Interval{*lo, *hi}
			}
		}
		return w
	}
	plain := 0
	for range 30000 {
		s := Snapshot{
			Aggregate:  Aggregate{Workspace: str(), Model: str(), Run: str(), Checkpoint: str(), Artifact: str(), CorrectionID: str(), Source: str()},
			Windows:    Windows{All: window(), Hour: window(), Day: window(), Week: window()},
			ObservedAt: when(), Version: r.Int64() - r.Int64(),
		}
		if r.IntN(2) == 0 {
			s.OpportunityWindow = &Span{First: when(), Last: when()}
		}
		want, werr := json.Marshal(&s)
		got, err := s.AppendJSON([]byte("prefix"))
		if (err == nil) != (werr == nil) || (err == nil && !bytes.Equal(got, append([]byte("prefix"), want...))) {
			t.Fatalf("snapshot %+v:\nAppendJSON %s (%v)\njson       %s (%v)", s, got, err, want, werr)
		}
		if s.plainJSON() {
			plain++
		}
	}
	if plain < 3000 {
		t.Fatalf("only %d snapshots were rendered without encoding/json: the test compares too little", plain)
	}
}

// go test -run '^$' -bench SnapshotJSON -benchmem ./schemas
func BenchmarkSnapshotJSON(b *testing.B) {
	rate, pct := 0.125, 12.5
	w := Window{ConfirmedRepeats: 12, Passed: 84, Unscored: 3, Scored: 96, Rate: &rate, Percentage: &pct, Status: StatusMeasured, CI95: &Interval{0.07, 0.21}}
	s := &Snapshot{Aggregate: Aggregate{Workspace: "acme", Model: "support-bot", Run: "2026-11", Checkpoint: "ckpt-42", Artifact: "prod", CorrectionID: "fix-17", Source: "live"},
		Windows: Windows{All: w, Hour: w, Day: w, Week: w}, OpportunityWindow: &Span{time.Now(), time.Now()}, ObservedAt: time.Now(), Version: 123456}
	b.Run("append", func(b *testing.B) {
		b.ReportAllocs()
		var buf []byte
		for b.Loop() {
			buf, _ = s.AppendJSON(buf[:0])
		}
	})
	b.Run("encoding_json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			json.Marshal(s)
		}
	})
}
