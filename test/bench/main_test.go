package main

import (
	"context"
	"io"
	"maps"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestQuarterRates checks the first- and last-quarter rates, and their ratio, from cumulative
// counter samples.
func TestQuarterRates(t *testing.T) {
	t0 := time.Unix(1000, 0)
	// at builds samples: counts at the given seconds after t0.
	at := func(pairs ...float64) []countSample {
		var s []countSample
		for i := 0; i < len(pairs); i += 2 {
			s = append(s, countSample{at: t0.Add(time.Duration(pairs[i] * float64(time.Second))), n: pairs[i+1]})
		}
		return s
	}
	for _, tc := range []struct {
		name        string
		s           []countSample
		first, last float64
	}{
		// A steady 100/s holds: ratio 1.
		{"steady", at(0, 100, 1, 200, 2, 300, 3, 400, 4, 500), 100, 100},
		// The first half runs at 100/s, the second at 50/s: the last quarter is half as fast.
		{"halving", at(0, 0, 1, 100, 2, 200, 4, 300, 6, 400), 100, 50},
		// Batches land unevenly but the quarters are each bracketed by samples: 100 per 1 s first,
		// 100 per 4 s last.
		{"slowing", at(0, 0, 1, 100, 2, 200, 3, 300, 7, 400), 100, 25},
		// Too few samples to tell.
		{"short", at(0, 0, 1, 100), math.NaN(), math.NaN()},
		// Nothing counted (a shape without eval results).
		{"flat", at(0, 5, 1, 5, 2, 5), math.NaN(), math.NaN()},
	} {
		first, last := quarterRates(tc.s)
		if !same(first, tc.first) || !same(last, tc.last) {
			t.Errorf("%s: quarterRates = %v, %v, want %v, %v", tc.name, first, last, tc.first, tc.last)
		}
		r := pipelineResult{suiteFirst: first, suiteLast: last}
		if want := tc.last / tc.first; !same(r.suiteScale(), want) {
			t.Errorf("%s: suiteScale = %v, want %v", tc.name, r.suiteScale(), want)
		}
	}
}

// TestWindowQuarterRates checks the suite_scale figure over the first runs of a longer run: the
// samples up to the one that reaches the window, and their quarters.
func TestWindowQuarterRates(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var s []countSample
	// 100 runs/s for 4 s, then 25/s: the window of the first 400 runs never sees the slowdown; the
	// whole run does.
	for i, n := 0, 0.0; i <= 12; i++ {
		s = append(s, countSample{at: t0.Add(time.Duration(i) * time.Second), n: n})
		if i < 4 {
			n += 100
		} else {
			n += 25
		}
	}
	w := upTo(s, 400)
	if len(w) != 5 || w[len(w)-1].n != 400 {
		t.Fatalf("upTo(400) = %v, want the 5 samples up to 400", w)
	}
	if first, last := quarterRates(w); !same(first, 100) || !same(last, 100) {
		t.Errorf("window: quarterRates = %v, %v, want 100, 100", first, last)
	}
	if first, last := quarterRates(s); !same(first, 100) || !same(last, 25) {
		t.Errorf("whole run: quarterRates = %v, %v, want 100, 25", first, last)
	}
	if w := upTo(s, 401); w == nil || w[len(w)-1].n != 425 {
		t.Errorf("upTo(401) ends at %v, want the sample of 425", w)
	}
	if w := upTo(s, 1e6); w != nil {
		t.Errorf("upTo beyond the run = %v, want nil", w)
	}
	r := pipelineResult{windowFirst: 100, windowLast: 50}
	if !same(r.windowScale(), 0.5) {
		t.Errorf("windowScale = %v, want 0.5", r.windowScale())
	}
}

// same reports whether two figures are equal, or both unmeasured.
func same(a, b float64) bool {
	return math.IsNaN(a) && math.IsNaN(b) || math.Abs(a-b) < 1e-9
}

// TestVersus checks the current ÷ baseline figures: only figures both runs have, unmeasured
// (nil) ones left out.
func TestVersus(t *testing.T) {
	cur := map[string]any{"pipeline_eps": num(30000, 0), "redis_cpu_us_per_event": num(5, 2), "kafka_cpu_us_per_event": num(math.NaN(), 2), "events": 10}
	base := map[string]any{"pipeline_eps": num(20000, 0), "redis_cpu_us_per_event": num(20, 2), "kafka_cpu_us_per_event": num(4, 2)}
	got := versus(cur, base)
	want := map[string]any{"pipeline_eps": 1.5, "redis_cpu_us_per_event": 0.25}
	if len(got) != len(want) {
		t.Fatalf("versus = %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("versus[%s] = %v, want %v", k, got[k], v)
		}
	}
}

func TestPollInterval(t *testing.T) {
	for _, tc := range []struct {
		waiting     bool
		done, total float64
		want        time.Duration
	}{
		{true, 0, 1000, 10 * time.Millisecond},     // the first batch is awaited
		{false, 1, 1000, 200 * time.Millisecond},   // under way
		{false, 949, 1000, 200 * time.Millisecond}, // not near the end yet
		{false, 950, 1000, 10 * time.Millisecond},  // the end is near
	} {
		if got := pollInterval(tc.waiting, tc.done, tc.total); got != tc.want {
			t.Errorf("pollInterval(%v, %v, %v) = %v, want %v", tc.waiting, tc.done, tc.total, got, tc.want)
		}
	}
}

// TestScrapeRefusedIsNoSample checks that a refused scrape is an error, not an empty sample whose
// counters read as zeros.
func TestScrapeRefusedIsNoSample(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/limited" {
			w.WriteHeader(http.StatusTooManyRequests)
			io.WriteString(w, `{"error":"rate limit exceeded"}`)
			return
		}
		io.WriteString(w, "# HELP x y\nrepeatrate_graded_runs_total 42\n")
	}))
	defer srv.Close()
	if m, err := scrape(srv.URL + "/limited"); err == nil {
		t.Fatalf("scrape of a 429 = %v, nil; want an error", m)
	}
	m, err := scrape(srv.URL + "/metrics")
	if err != nil || m["repeatrate_graded_runs_total"] != 42 {
		t.Fatalf("scrape = %v, %v; want the counter at 42", m, err)
	}
}

// TestRewriteInQuarters checks that an AOF rewrite seen in the first or the last quarter of a
// run's graded runs is reported, and one seen only in between is not.
func TestRewriteInQuarters(t *testing.T) {
	t0 := time.Unix(1000, 0)
	// Counts 0, 100, …, 800 one second apart; rewriting at the given sample indexes.
	samples := func(rewriting ...int) []countSample {
		s := make([]countSample, 9)
		for i := range s {
			s[i] = countSample{at: t0.Add(time.Duration(i) * time.Second), n: float64(100 * i)}
		}
		for _, i := range rewriting {
			s[i].rewriting = true
		}
		return s
	}
	for _, tc := range []struct {
		name      string
		rewriting []int
		want      bool
	}{
		{"none", nil, false},
		{"first quarter", []int{1}, true},
		{"end of the first quarter", []int{2}, true},
		{"middle", []int{3, 4, 5, 6}, false},
		{"last quarter", []int{8}, true},
		{"start of the last quarter", []int{7}, true},
	} {
		if got := rewriteInQuarters(samples(tc.rewriting...)); got != tc.want {
			t.Errorf("%s: rewriteInQuarters = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestQuarterRatesOutsideRewrites checks the suite-scale figure that leaves out the intervals in
// which Redis rewrote its AOF: a rewrite that halves the rate of one interval of the last quarter
// lowers quarterRates' figure and leaves this one at the steady rate.
func TestQuarterRatesOutsideRewrites(t *testing.T) {
	t0 := time.Unix(1000, 0)
	// 100 runs a second for 8 seconds, but the seventh second (sample 7) makes 50.
	s := make([]countSample, 9)
	n := 0.0
	for i := range s {
		if i > 0 {
			n += 100
			if i == 7 {
				n -= 50
			}
		}
		s[i] = countSample{at: t0.Add(time.Duration(i) * time.Second), n: n}
	}
	first, last := quarterRates(s)
	if !(last < first) {
		t.Fatalf("quarterRates = %v, %v; the slow interval should lower the last quarter", first, last)
	}
	s[7].rewriting = true
	first, last = quarterRatesOutsideRewrites(s)
	if first != 100 || last != 100 {
		t.Fatalf("quarterRatesOutsideRewrites = %v, %v; want 100, 100", first, last)
	}
	for i := 5; i <= 8; i++ {
		s[i].rewriting = true
	}
	if _, last = quarterRatesOutsideRewrites(s); !math.IsNaN(last) {
		t.Fatalf("a last quarter rewriting throughout: %v, want NaN", last)
	}
}

func TestSchedstat(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	got := parseSchedstat(write("ok", "2500000000 500000000 1234\n"))
	if got.run != 2.5 || got.wait != 0.5 {
		t.Fatalf("parsed %+v, want run 2.5 s, wait 0.5 s", got)
	}
	for name, body := range map[string]string{"empty": "", "one": "12", "text": "a b c"} {
		if got := parseSchedstat(write(name, body)); !math.IsNaN(got.run) || !math.IsNaN(got.wait) {
			t.Errorf("%s: parsed %+v, want unknown", name, got)
		}
	}
	if got := parseSchedstat(filepath.Join(dir, "missing")); !math.IsNaN(got.run) {
		t.Errorf("missing file: parsed %+v, want unknown", got)
	}
	run, wait := threadTimes{run: 3, wait: 1}.sub(threadTimes{run: 1, wait: 0.5}, 4*time.Second)
	if run != 0.5 || wait != 0.125 {
		t.Errorf("shares %v %v, want 0.5 0.125", run, wait)
	}
	// A Redis on another host: a pid from its INFO would name an unrelated local process.
	if got := redisThread(context.Background(), "192.0.2.1:6379"); !math.IsNaN(got.run) {
		t.Errorf("remote Redis read as %+v, want unknown", got)
	}
}

// A warmed-up run's figures count from the scrape its measured interval began at: counters and
// summaries lose what that scrape held, gauges are read as they stand at the end, and a run
// without a warm-up keeps every figure whole.
func TestMeasuredPartCountsFromTheWarmUpsEnd(t *testing.T) {
	base := map[string]float64{
		"repeatrate_batch_messages_sum":                               300,
		"repeatrate_batch_messages_count":                             3,
		`repeatrate_computed_buckets_total{from="redis"}`:             40,
		`repeatrate_batch_stage_seconds_bucket{stage="apply",le="1"}`: 2,
		"repeatrate_bucket_cache_bytes":                               1 << 20,
	}
	end := map[string]float64{
		"repeatrate_batch_messages_sum":                               1000,
		"repeatrate_batch_messages_count":                             10,
		`repeatrate_computed_buckets_total{from="redis"}`:             45,
		`repeatrate_batch_stage_seconds_bucket{stage="apply",le="1"}`: 9,
		"repeatrate_bucket_cache_bytes":                               3 << 20,
		"repeatrate_redis_roundtrips_total":                           7, // absent from base: all of it is the interval's
	}
	got := measuredPart(end, base)
	want := map[string]float64{
		"repeatrate_batch_messages_sum":                               700,
		"repeatrate_batch_messages_count":                             7,
		`repeatrate_computed_buckets_total{from="redis"}`:             5,
		`repeatrate_batch_stage_seconds_bucket{stage="apply",le="1"}`: 7,
		"repeatrate_bucket_cache_bytes":                               3 << 20,
		"repeatrate_redis_roundtrips_total":                           7,
	}
	if !maps.Equal(got, want) {
		t.Errorf("measuredPart = %v, want %v", got, want)
	}
	if whole := measuredPart(end, map[string]float64{}); !maps.Equal(whole, end) {
		t.Errorf("without a warm-up measuredPart = %v, want the scrape whole %v", whole, end)
	}
}
