package main

import (
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// quartersSamples builds samples of counts ns one second apart, with Redis seen rewriting its AOF
// at the given sample indexes.
func quartersSamples(ns []float64, rewriting ...int) []countSample {
	t0 := time.Unix(1000, 0)
	s := make([]countSample, len(ns))
	for i, n := range ns {
		s[i] = countSample{at: t0.Add(time.Duration(i) * time.Second), n: n}
	}
	for _, i := range rewriting {
		s[i].rewriting = true
	}
	return s
}

// The quarters' bracketing samples on random runs of kept samples (the counter grew at each,
// unevenly, sometimes by more than a quarter at once): the first quarter ends at the first sample
// a quarter past the start, the last starts at the last sample a quarter before the end, each
// rate is what was counted between its brackets over the time between them, and a rewrite flag
// (seen since the previous sample) counts exactly when the interval it closes lies in a quarter.
func TestQuarterBoundsRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for run := range 2000 {
		ns := []float64{float64(r.IntN(1000))}
		for range 2 + r.IntN(30) {
			step := float64(1 + r.IntN(100))
			if r.IntN(8) == 0 {
				step *= 50 // one batch of many graded runs
			}
			ns = append(ns, ns[len(ns)-1]+step)
		}
		s := quartersSamples(ns)
		ia, ib, ok := quarterBounds(s)
		if !ok {
			t.Fatalf("run %d: %v: no quarters from %d growing samples", run, ns, len(ns))
		}
		first, last := ns[0], ns[len(ns)-1]
		q := (last - first) / 4
		if ns[ia]-first < q || ns[ia-1]-first >= q {
			t.Fatalf("run %d: %v: first quarter ends at sample %d", run, ns, ia)
		}
		if last-ns[ib] < q || last-ns[ib+1] >= q {
			t.Fatalf("run %d: %v: last quarter starts at sample %d", run, ns, ib)
		}
		a, b := quarterRates(s)
		if wa, wb := (ns[ia]-first)/float64(ia), (last-ns[ib])/float64(len(ns)-1-ib); math.Abs(a-wa) > 1e-9 || math.Abs(b-wb) > 1e-9 {
			t.Fatalf("run %d: %v: rates %v, %v, want %v, %v", run, ns, a, b, wa, wb)
		}
		i := 1 + r.IntN(len(ns)-1)
		want := i <= ia || i > ib
		if got := rewriteInQuarters(quartersSamples(ns, i)); got != want {
			t.Fatalf("run %d: %v (quarters end at %d, start at %d): a rewrite seen at sample %d reported %v", run, ns, ia, ib, i, got)
		}
	}
}

// Edge cases: the fewest samples, a counter that did not grow, a quarter bracketed by the run's
// own ends, and the rewrite flag on each bracketing sample.
func TestQuarterEdges(t *testing.T) {
	for _, tc := range []struct {
		name        string
		ns          []float64
		rewriting   []int
		first, last float64 // NaN: unknown
		rewrite     bool
	}{
		{"two samples", []float64{0, 100}, nil, math.NaN(), math.NaN(), false},
		{"two samples, rewriting", []float64{0, 100}, []int{1}, math.NaN(), math.NaN(), false},
		{"flat", []float64{5, 5, 5, 5}, []int{2}, math.NaN(), math.NaN(), false},
		{"three samples", []float64{0, 100, 400}, nil, 100, 300, false},
		// One batch holds most of the run: the first quarter ends at the last sample, the last
		// starts at the first; a rewrite anywhere is in a quarter.
		{"one large batch", []float64{0, 10, 1000}, []int{1}, 500, 990, true},
		// Counts 0..800: the first quarter is samples 0-2, the last 6-8.
		{"flag on the first sample only", []float64{0, 100, 200, 300, 400, 500, 600, 700, 800}, []int{0}, 100, 100, false},
		{"flag closing the first quarter", []float64{0, 100, 200, 300, 400, 500, 600, 700, 800}, []int{2}, 100, 100, true},
		{"flag just after the first quarter", []float64{0, 100, 200, 300, 400, 500, 600, 700, 800}, []int{3}, 100, 100, false},
		{"flag on the sample opening the last quarter", []float64{0, 100, 200, 300, 400, 500, 600, 700, 800}, []int{6}, 100, 100, false},
		{"flag closing the first interval of the last quarter", []float64{0, 100, 200, 300, 400, 500, 600, 700, 800}, []int{7}, 100, 100, true},
		{"flag on the last sample", []float64{0, 100, 200, 300, 400, 500, 600, 700, 800}, []int{8}, 100, 100, true},
	} {
		s := quartersSamples(tc.ns, tc.rewriting...)
		a, b := quarterRates(s)
		if !same(a, tc.first) || !same(b, tc.last) {
			t.Errorf("%s: quarterRates = %v, %v, want %v, %v", tc.name, a, b, tc.first, tc.last)
		}
		if got := rewriteInQuarters(s); got != tc.rewrite {
			t.Errorf("%s: rewriteInQuarters = %v, want %v", tc.name, got, tc.rewrite)
		}
	}
}

// Every refused or failed answer of the processor's metrics endpoint is an error, never a sample
// of zeros: the statuses a rate limit, an overloaded or restarting processor, or a proxy answer.
func TestQuarterScrapeNon200(t *testing.T) {
	for _, code := range []int{http.StatusNoContent, http.StatusMovedPermanently, http.StatusNotFound, http.StatusTooManyRequests,
		http.StatusInternalServerError, http.StatusBadGateway, http.StatusServiceUnavailable} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if code == http.StatusMovedPermanently {
					// Redirected to an answer that is refused.
					if r.URL.Path == "/metrics" {
						http.Redirect(w, r, "/elsewhere", code)
						return
					}
					w.WriteHeader(http.StatusTooManyRequests)
				} else {
					w.WriteHeader(code)
				}
				fmt.Fprint(w, "repeatrate_graded_runs_total 0\n")
			}))
			defer srv.Close()
			if m, err := scrape(srv.URL + "/metrics"); err == nil {
				t.Fatalf("scrape of a %d answer = %v, nil; want an error", code, m)
			}
		})
	}
}
