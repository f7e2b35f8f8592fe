package aggregator

import (
	"math/rand/v2"
	"strconv"
	"testing"
)

// TestComputedPathReadsRecordsAsWritten: every record encodeRecords writes, with or without the
// horizon apply.lua appends, reads back as the numbers it holds, and any other shape is left to
// apply.lua (parseRecord10 reports false) rather than read as something else.
func TestComputedPathReadsRecordsAsWritten(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 8))
	classes := []Class{Confirmed, Passed, Unscored}
	for range 20000 {
		o := Observation{OpportunityID: "o", Class: classes[r.IntN(3)], Occurred: r.Int64N(recordMaxMicros - 1e12),
			Assessed: r.Int64N(recordMaxMicros)}
		if r.IntN(2) == 0 {
			o.Seq = r.Int64N(1 << 53)
		}
		rec := encodeRecords([]Observation{o})[0]
		horizon := o.Occurred
		if r.IntN(2) == 0 {
			horizon += 1 + r.Int64N(1e12)
			rec += ";" + strconv.FormatInt(horizon, 16)
		}
		got, ok := parseRecord10(rec)
		want := record10{class: classIndex(o.Class), occurred: o.Occurred, assessed: o.Assessed, seq: o.Seq, horizon: horizon}
		if !ok || got != want {
			t.Fatalf("%q read as %+v, %v; want %+v", rec, got, ok, want)
		}
	}
	for _, rec := range []string{"", "C", "C1", "C1,", "C,1", "X1,2", "c1,2", "C1,2,", "C1,2,3,4", "C1,2;", "C1,2;3;4",
		"C1,2,3;", "C1;2", "C1,2;3,4", "CA,2", "C1,2 ", "C-1,2", "C123456789abcdef,1", "P1,2,3;x",
		"C5,2;5", "C5,2;4", "C5,2,1;3", // a horizon not above the occurred time: apply.lua never writes one
		"C20000000000000,1", "C1,20000000000001", "C1,2,20000000000001", "C1,2;20000000000000"} { // past 2⁵³−1: Lua rounds

		if got, ok := parseRecord10(rec); ok {
			t.Errorf("%q read as %+v: want it left to apply.lua", rec, got)
		}
	}
}
