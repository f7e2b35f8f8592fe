package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/repeatrate/repeatrate/internal/synth"
	"github.com/repeatrate/repeatrate/internal/testenv"
	"github.com/repeatrate/repeatrate/schemas/cloudevent"
)

func TestLoadgenPacer(t *testing.T) {
	const ms = time.Millisecond
	type step struct {
		at       time.Duration // since start
		limit    int
		take     int           // events handed out
		wait     time.Duration // then the wait until the next one; -1: not checked
		finished bool
	}
	for _, tc := range []struct {
		name     string
		rate     int
		duration time.Duration
		steps    []step
		skipped  int64
	}{
		// Nothing is due at the start; the first event after 1/rate.
		{"first event", 100, 0, []step{{0, 10, 0, 10 * ms, false}, {9 * ms, 10, 0, 1 * ms, false}, {10 * ms, 10, 1, 10 * ms, false}}, 0},
		// Late, irregular wake-ups never shift the schedule: the total is rate × elapsed.
		{"no drift", 100, 0, []step{{13 * ms, 100, 1, 7 * ms, false}, {333 * ms, 100, 32, 7 * ms, false},
			{999 * ms, 100, 66, 1 * ms, false}, {1000 * ms, 100, 1, 10 * ms, false}, {1905 * ms, 1000, 90, 5 * ms, false}}, 0},
		// A rate that does not divide a second: exactly 3 a second, the wait rounded up.
		{"rate 3", 3, 0, []step{{0, 10, 0, 333333334, false}, {333333334, 10, 1, 333333333, false}, {time.Second, 10, 2, 333333334, false},
			{10 * time.Second, 10, 3, -1, false}}, 24},
		// limit splits what is due over several takes.
		{"limit", 1000, 0, []step{{50 * ms, 20, 20, 0, false}, {50 * ms, 20, 20, 0, false}, {50 * ms, 20, 10, 1 * ms, false}}, 0},
		// After a stall, at most one second of events is caught up; the rest is skipped.
		{"bounded catch-up", 100, 0, []step{{10 * ms, 10, 1, -1, false}, {5010 * ms, 1000, 100, 10 * ms, false}}, 400},
		// A duration ends the schedule: nothing is due past it, and finished once all is out.
		{"end", 100, time.Second, []step{{900 * ms, 1000, 90, 10 * ms, false}, {1000 * ms, 1000, 10, -1, true},
			{5 * time.Second, 1000, 0, -1, true}}, 0},
		// Not finished before the end, nor with events of the schedule still due.
		{"end with due events", 100, time.Second, []step{{999 * ms, 1000, 99, -1, false}, {1500 * ms, 0, 0, -1, false},
			{1500 * ms, 1, 1, -1, true}}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
			p := newPacer(tc.rate, start, tc.duration)
			total := 0
			for i, s := range tc.steps {
				now := start.Add(s.at)
				if n := p.take(now, s.limit); n != s.take {
					t.Fatalf("step %d at %s: take = %d, want %d", i, s.at, n, s.take)
				}
				total += s.take
				if s.wait >= 0 {
					if w := p.wait(now); w != s.wait {
						t.Fatalf("step %d at %s: wait = %s, want %s", i, s.at, w, s.wait)
					}
				}
				if f := p.finished(now); f != s.finished {
					t.Fatalf("step %d at %s: finished = %v, want %v", i, s.at, f, s.finished)
				}
			}
			if p.skipped != tc.skipped {
				t.Fatalf("skipped = %d, want %d", p.skipped, tc.skipped)
			}
		})
	}
}

func TestLoadgenParseMix(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     string // formatMix of the result, or the error
	}{
		// No overrides: the demo's mix.
		{"default", "", "duplicates=0.1,reassessed=0.1,poison=0.02,eval=0.3,workspaces=2,corrections=2"},
		// Overrides replace their key only, spaces allowed.
		{"overrides", "poison=0.2, eval=1,workspaces=5", "duplicates=0.1,reassessed=0.1,poison=0.2,eval=1,workspaces=5,corrections=2"},
		// Mistakes say what was wrong.
		{"unknown key", "bogus=1", `unknown key "bogus"`},
		{"no value", "poison", `"poison": want key=value`},
		{"not a fraction", "poison=2", "poison=2: want a fraction between 0 and 1"},
		{"not a count", "workspaces=0", "workspaces=0: want a positive integer"},
		{"over 1", "duplicates=0.5,reassessed=0.5,poison=0.1", "add up to 1.1, over 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := parseMix(tc.in, demoMix)
			got := formatMix(c)
			if err != nil {
				got = err.Error()
			}
			if !strings.Contains(got, tc.want) {
				t.Fatalf("parseMix(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestLoadgenFlags(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		ok   bool
		says string
	}{
		// --help lists the flags and is no error.
		{"help", []string{"loadgen", "--help"}, true, "-rate"},
		// Bad values are refused before connecting.
		{"zero rate", []string{"loadgen", "--rate", "0"}, false, "--rate 0: must be positive"},
		{"negative duration", []string{"loadgen", "--duration", "-1s"}, false, "must not be negative"},
		{"bad mix", []string{"loadgen", "--mix", "poison=x"}, false, "--mix: poison=x"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			err := run(context.Background(), tc.args, func(string) string { return "" }, strings.NewReader(""), &out, &errOut)
			if (err == nil) != tc.ok {
				t.Fatalf("err = %v, want ok %v", err, tc.ok)
			}
			said := out.String() + errOut.String()
			if err != nil {
				said += err.Error()
			}
			if !strings.Contains(said, tc.says) {
				t.Fatalf("output and error do not mention %q:\n%s", tc.says, said)
			}
		})
	}
}

// TestLoadgenKafka runs loadgen against a real broker for 2 s at 500 events/s with a fifth of poison,
// then reads both topics back.
func TestLoadgenKafka(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	live, eval := testenv.Name(t, "loadgen-live"), testenv.Name(t, "loadgen-eval")
	const rate, duration, poisonShare = 500, 2 * time.Second, 0.2
	var stderr bytes.Buffer
	args := []string{"loadgen", "--brokers", strings.Join(brokers, ","), "--rate", fmt.Sprint(rate), "--duration", duration.String(),
		"--live-topic", live, "--eval-topic", eval, "--seed", "7", "--mix", fmt.Sprintf("poison=%g", poisonShare)}
	began := time.Now()
	if err := run(ctx, args, func(string) string { return "" }, strings.NewReader(""), &bytes.Buffer{}, &stderr); err != nil {
		t.Fatalf("loadgen: %v\n%s", err, stderr.String())
	}
	if took := time.Since(began); took < duration {
		t.Fatalf("loadgen returned after %s, before its duration", took)
	}
	var sent, poison, evals int
	var achieved float64
	if _, err := fmt.Sscanf(stderr.String(), "loadgen: sent %d events (%d poison, %d eval results) in", &sent, &poison, &evals); err != nil {
		t.Fatalf("summary line %q: %v", stderr.String(), err)
	}
	if i := strings.Index(stderr.String(), ": "); i < 0 {
		t.Fatalf("summary line %q", stderr.String())
	}
	if _, err := fmt.Sscanf(stderr.String()[strings.LastIndex(stderr.String(), "s: ")+3:], "%f events/s", &achieved); err != nil {
		t.Fatalf("summary line %q: achieved rate: %v", stderr.String(), err)
	}
	want := float64(rate) * duration.Seconds()
	if float64(sent) < 0.7*want || float64(sent) > 1.3*want {
		t.Fatalf("sent %d events, want %.0f ± 30%%: %s", sent, want, stderr.String())
	}
	if achieved < 0.7*rate || achieved > 1.3*rate {
		t.Fatalf("achieved %.1f events/s, want %d ± 30%%", achieved, rate)
	}

	// What the topics hold: every message sent, poison exactly where loadgen said, eval results
	// on the eval topic only.
	kc, err := newKafkaClients(KafkaConfig{Brokers: brokers})
	if err != nil {
		t.Fatal(err)
	}
	ends, err := kc.endOffsets(ctx, []string{live, eval})
	if err != nil {
		t.Fatal(err)
	}
	dec, _ := cloudevent.NewDecoder(cloudevent.DefaultDecoderConfig)
	got := map[string]int{}
	gotPoison, gotEval, misplaced := 0, 0, 0
	for topic, parts := range ends {
		for part, end := range parts {
			if _, err := kc.partitionReader().Read(ctx, topic, part, end, 1000, func(b []kafka.Message) error {
				for _, m := range b {
					got[topic]++
					ev, err := dec.DecodeStructured(m.Value, time.Now())
					switch {
					case err != nil:
						gotPoison++
						if topic != live {
							misplaced++
						}
					case ev.Eval != nil:
						gotEval++
						if topic != eval {
							misplaced++
						}
					case topic != live:
						misplaced++
					}
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n := got[live] + got[eval]; n != sent {
		t.Fatalf("topics hold %d messages (%v), loadgen said %d", n, got, sent)
	}
	if gotPoison != poison || gotEval != evals {
		t.Fatalf("topics hold %d poison and %d eval results, loadgen said %d and %d", gotPoison, gotEval, poison, evals)
	}
	if misplaced > 0 {
		t.Fatalf("%d messages on the wrong topic", misplaced)
	}
	if share := float64(gotPoison) / float64(sent); share < 0.7*poisonShare || share > 1.3*poisonShare {
		t.Fatalf("poison share %.3f, want %g ± 30%%", share, poisonShare)
	}
	if got[eval] == 0 || got[live] == 0 {
		t.Fatalf("a topic got nothing: %v", got)
	}
}

// TestLoadgenStopsOnCancel: without a duration loadgen sends until its context ends (Ctrl-C), and
// that is a success with a summary.
func TestLoadgenStopsOnCancel(t *testing.T) {
	var w countingWriter
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	var told int64
	st, err := generateLoad(ctx, trafficConfig{Rate: 1000, Mix: synth.Config{Seed: 1, Poison: 0.5}, LiveTopic: "l", EvalTopic: "e",
		OnSent: func(n int) { told += int64(n) }}, &w)
	if err != nil {
		t.Fatal(err)
	}
	if st.Sent == 0 || st.Sent != w.n || st.Sent != told || st.Finished {
		t.Fatalf("sent %d, writer got %d, OnSent told %d, finished %v", st.Sent, w.n, told, st.Finished)
	}
	if st.Sent > 1000 { // 0.3 s at 1000/s, with a second of catch-up at most
		t.Fatalf("sent %d events in 0.3 s at 1000/s", st.Sent)
	}
}

type countingWriter struct{ n int64 }

func (w *countingWriter) WriteMessages(_ context.Context, msgs ...kafka.Message) error {
	w.n += int64(len(msgs))
	return nil
}
