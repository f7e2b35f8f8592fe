package alert

import (
	"math"
	"testing"
	"time"
)

// testDetectorParams are a 30-day, alpha 0.05 rule's parameters with a 24h recent window.
var testDetectorParams = detectorParams{h: detectorThreshold(0.05, DefaultHorizon), period: detectorPeriod(DefaultHorizon), quiet: 24 * time.Hour}

// The detector judges each snapshot's new outcomes once: a snapshot not newer than the one it
// consumed changes nothing, and the first one of a new hour (whose baseline window dropped an
// hour's bucket), of another source or baseline, or the very first, only becomes the reference
// for the next; so does one observed a recent window after the last, which starts it afresh.
func TestDetectorJudgesEachSnapshotsOutcomesOnce(t *testing.T) {
	in := func(source string, version int64, at time.Time, confirmed, scored int64) detectorInput {
		return detectorInput{source: source, version: version, observed: at, confirmed: confirmed, scored: scored, p0: 0.02, hasP0: true}
	}
	p := testDetectorParams
	var d Detector
	steps := []struct {
		in      detectorInput
		changed bool
		judged  int64
	}{
		{in("live/7d", 1, t0, 5, 100), true, 0},                                        // the first: a reference only
		{in("live/7d", 2, t0.Add(time.Minute), 8, 110), true, 10},                      // +10 scored, 3 repeats
		{in("live/7d", 2, t0.Add(time.Minute), 8, 110), false, 10},                     // the same snapshot again
		{in("live/7d", 1, t0, 5, 100), false, 10},                                      // an older one
		{in("live/7d", 3, t0.Add(59*time.Minute), 8, 112), true, 12},                   // +2 passes
		{in("live/7d", 4, t0.Add(61*time.Minute), 9, 90), true, 12},                    // a new hour: reference only
		{in("live/7d", 5, t0.Add(62*time.Minute), 9, 89), true, 12},                    // a fall (re-assessed to unscored)
		{in("live/24h", 6, t0.Add(62*time.Minute), 1, 10), true, 12},                   // another baseline: reference only
		{in("evaluation/24h", 1, t0.Add(63*time.Minute), 1, 10), true, 12},             // another source: reference only
		{in("evaluation/24h", 2, t0.Add(64*time.Minute), 1, 15), true, 17},             // +5 passes
		{in("evaluation/24h", 3, t0.Add(64*time.Minute), 9, 15), true, 17},             // re-assessed to repeats: no outcome
		{in("evaluation/24h", 4, t0.Add(64*time.Minute+time.Second), 9, 16), true, 18}, // one more pass
	}
	for i, s := range steps {
		before := d
		if got := d.step(s.in, p); got != s.changed {
			t.Fatalf("step %d: changed %v, want %v", i, got, s.changed)
		}
		if !s.changed && d != before {
			t.Fatalf("step %d: unchanged step moved the detector: %+v → %+v", i, before, d)
		}
		if d.Judged != s.judged {
			t.Fatalf("step %d: judged %d, want %d", i, d.Judged, s.judged)
		}
	}
	// 3 repeats in 10, then 2, 5 and 1 passes; the re-assessment's 8 repeats are no outcomes.
	var want Detector
	st, _ := newDetectorStep(0.02, 0)
	m := floorDiv(t0.Unix(), 60)
	want.advance(&st, 3, 10, m+1, p)
	want.advance(&st, 0, 2, m+59, p)
	want.advance(&st, 0, 5, m+64, p)
	want.advance(&st, 0, 1, m+64, p)
	if want.S != d.S {
		t.Fatalf("CUSUMs %v, want %v", d.S, want.S)
	}
	// A day later the window has left the last snapshot: the next one starts afresh.
	d.Alarm = true
	if !d.step(in("evaluation/24h", 5, t0.Add(26*time.Hour), 9, 20), p) || d.Alarm || d.Judged != 0 || d.S != ([2][detectorK]float64{}) {
		t.Fatalf("a snapshot a day after the last: %+v, want a fresh detector with it as the reference", d)
	}
}

// A new CUSUM run starts at most once a minute: within a minute a run of passes takes the
// statistic below zero, and only the next minute's first update lifts it back to zero.
func TestDetectorRestartsOncePerMinute(t *testing.T) {
	st, _ := newDetectorStep(0.05, 0)
	p := detectorParams{h: 100, period: 1 << 40}
	var d Detector
	d.advance(&st, 0, 10, 1, p)
	below := d.S[0]
	d.advance(&st, 0, 10, 1, p)
	for k := range d.S[0] {
		if !(d.S[0][k] < below[k] && below[k] < 0) {
			t.Fatalf("S[%d]: %v then %v within one minute, want falling below zero", k, below[k], d.S[0][k])
		}
	}
	d.advance(&st, 1, 1, 2, p)
	for k := range d.S[0] {
		if want := st.repeat[k]; math.Abs(d.S[0][k]-want) > 1e-12 {
			t.Fatalf("S[%d] = %v after a new minute's repeat, want the run restarted: %v", k, d.S[0][k], want)
		}
	}
}

// Each copy starts afresh once per horizon, the second half a horizon after the first, so that
// the statistic in any horizon-long period rests on at most two horizons of starts; an alarm
// outlives either copy's fresh start as long as the other holds it.
func TestDetectorCopiesStartAfreshInTurn(t *testing.T) {
	st, _ := newDetectorStep(0.02, 0)
	p := detectorParams{h: detectorThreshold(0.05, 24*time.Hour), period: 24 * 60}
	var d Detector
	for m := int64(0); m < 100; m++ {
		d.advance(&st, 1, 1, m, p)
	}
	if !d.Alarm {
		t.Fatal("100 repeats in a row raised no alarm")
	}
	d.advance(&st, 1, 1, 12*60, p) // copy 1's period turns
	if d.S[1] != st.repeat || !d.Alarm {
		t.Fatalf("at copy 1's turn: S[1] %v, alarm %v; want it fresh (one repeat) and the alarm kept by copy 0", d.S[1], d.Alarm)
	}
	for m := int64(12*60 + 1); m < 24*60; m++ {
		d.advance(&st, 0, 1, m, p)
	}
	if d.Alarm {
		t.Fatal("a day of passes after the repeats left the alarm set")
	}
	d.advance(&st, 0, 1, 24*60, p) // copy 0's period turns
	if d.S[0] != st.pass {
		t.Fatalf("at copy 0's turn: S[0] %v, want it fresh (one pass)", d.S[0])
	}
}

// The alternatives are at least min_increase above the baseline bound, and none at or above 1.
func TestDetectorAlternatives(t *testing.T) {
	st, ok := newDetectorStep(0.02, 0.05)
	if !ok {
		t.Fatal("no alternatives at p0 2 %, min_increase 5 points")
	}
	for k := range detectorGrid {
		theta := 0.02 * math.Exp(st.repeat[k])
		if theta < 0.07-1e-12 {
			t.Errorf("alternative %d is %.4f, below p0 + min_increase", k, theta)
		}
		if pass := math.Log1p(-theta) - math.Log1p(-0.02); math.Abs(pass-st.pass[k]) > 1e-12 {
			t.Errorf("alternative %d: pass ratio %v, want %v", k, st.pass[k], pass)
		}
	}
	for _, p0 := range []float64{0, 1, math.NaN(), 0.99} {
		if _, ok := newDetectorStep(p0, 0.05); ok {
			t.Errorf("p0 %v gives alternatives", p0)
		}
	}
}

// The threshold spends alpha/2 on the CUSUMs over two copies of at most 2B starts each in any
// horizon-long period: h = log(8·43 200/α) for 30 days; the cap keeps a long episode from
// holding the alarm for days once it is over.
func TestDetectorThresholdAndCap(t *testing.T) {
	h := detectorThreshold(0.05, DefaultHorizon)
	if want := math.Log(8 * 43200 / 0.05); math.Abs(h-want) > 1e-12 {
		t.Fatalf("threshold %v, want %v", h, want)
	}
	st, _ := newDetectorStep(0.02, 0)
	p := testDetectorParams
	var d Detector
	for m := range int64(10_000) {
		d.advance(&st, 1, 1, m, p) // a repeat every minute for a week
	}
	if s := d.Statistic(); s < h || s > h+detectorHeadroom+1e-9 || !d.Alarm {
		t.Fatalf("statistic %v (alarm %v) after a long episode, want an alarm and between h %v and the cap %v", s, d.Alarm, h, h+detectorHeadroom)
	}
	n := 0
	for m := int64(10_000); d.Alarm; m++ {
		d.advance(&st, 0, 1, m, p) // passes, at a rate below p0
		n++
		if s := d.Statistic(); d.Alarm != (s >= h-detectorHysteresis) {
			t.Fatalf("alarm %v at statistic %v, threshold %v", d.Alarm, s, h)
		}
	}
	if n > 200 {
		t.Fatalf("%d passes before the alarm ended after the episode, want at most 200", n)
	}
}

func TestDetectorEncodingRoundTrip(t *testing.T) {
	d := Detector{Source: "live/7d", Version: 42, Observed: t0.Unix(), Confirmed: 7, Scored: 900, Minute: 123, Judged: 55, P0: 0.03123457, Alarm: true}
	for k := range detectorK {
		d.S[0][k] = float64(k)*1.25 - 3
		d.S[1][k] = -float64(k) * 0.5
	}
	got := decodeDetector(d.encode())
	if got != d {
		t.Fatalf("round trip: %+v, want %+v", got, d)
	}
	zeros := " 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0"
	for _, bad := range []string{"", "garbage", "1 live 1 2 3 4 5 6 0.1 0" + zeros, "2 live x 2 3 4 5 6 0.1 0" + zeros,
		"2 live 1 2 3 4 5 6 0.1 2" + zeros, "2 live 1 2 3 4 5 6 0.1 0 +Inf" + zeros[2:]} {
		if got := decodeDetector(bad); got != (Detector{}) {
			t.Errorf("decode %q = %+v, want a new detector", bad, got)
		}
	}
	if n := len(d.encode()); n > 300 {
		t.Errorf("an encoded detector takes %d bytes", n)
	}
}
