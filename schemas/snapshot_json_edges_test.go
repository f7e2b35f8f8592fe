package schemas

import (
	"bytes"
	"encoding/json"
	"math"
	"testing"
	"time"
)

// AppendJSON gives encoding/json's bytes, or its error, on edge floats, times and strings.
func TestSnapshotAppendJSONEdges(t *testing.T) {
	lmt, err := time.LoadLocation("Europe/Amsterdam") // LMT +00:19:32 before 1835
	if err != nil {
		t.Skip(err)
	}
	floats := []float64{0, math.Copysign(0, -1), 1e21, 1e21 - 65536, 999999999999999900000, 1e-6, 1e-7, 9.999999e-7,
		5e-324, -5e-324, 2.2250738585072014e-308, math.MaxFloat64, -math.MaxFloat64, 1e-100, 123456789.123, 1e20, 0.1 + 0.2}
	times := []time.Time{
		{},
		time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC),
		time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(1800, 6, 1, 12, 0, 0, 1, lmt),
		time.Date(2026, 3, 1, 12, 0, 0, 0, time.FixedZone("", 5*3600+30*60+17)),
		time.Date(2026, 3, 1, 12, 0, 0, 0, time.FixedZone("", -(23*3600+59*60+59))),
		time.Date(2026, 3, 1, 12, 0, 0, 0, time.FixedZone("", 24*3600)),
		time.Date(2026, 3, 1, 12, 0, 0, 0, time.FixedZone("", -25*3600)),
		time.Date(2026, 3, 1, 12, 0, 0, 0, time.FixedZone("", 100*3600)),
		time.Date(0, 1, 1, 0, 0, 0, 0, time.FixedZone("", 3600)),
		time.Date(9999, 12, 31, 23, 0, 0, 0, time.FixedZone("", -3600)),
		time.Unix(1<<40, 0).UTC(),
	}
	strs := []string{"", "a\u2028b", "\x7f", "\xff\xfe", "<&>", "\"\\", "é", "\x00", "\ufeff"}
	check := func(s *Snapshot) {
		t.Helper()
		want, werr := json.Marshal(s)
		got, gerr := s.AppendJSON([]byte("prefix"))
		if (werr == nil) != (gerr == nil) {
			t.Errorf("encoding/json error %v, AppendJSON error %v, AppendJSON %s", werr, gerr, got)
			return
		}
		if werr == nil && !bytes.Equal(got, append([]byte("prefix"), want...)) {
			t.Errorf("AppendJSON\n %s\nencoding/json\n %s", got[len("prefix"):], want)
		}
	}
	for _, f := range floats {
		f := f
		s := Snapshot{Version: 1, ObservedAt: time.Unix(0, 0).UTC()}
		s.Windows.All = Window{Rate: &f, Percentage: &f, CI95: &Interval{Low: f, High: -f}, Status: StatusMeasured}
		check(&s)
	}
	for _, tm := range times {
		check(&Snapshot{ObservedAt: tm})
		check(&Snapshot{ObservedAt: time.Unix(0, 0).UTC(), OpportunityWindow: &Span{First: tm, Last: tm}})
	}
	for _, str := range strs {
		check(&Snapshot{ObservedAt: time.Unix(0, 0).UTC(), Aggregate: Aggregate{Workspace: str, Source: str}, Windows: Windows{Day: Window{Status: str}}})
	}
	check(&Snapshot{ObservedAt: time.Unix(0, 0).UTC(), Version: math.MinInt64})
}
