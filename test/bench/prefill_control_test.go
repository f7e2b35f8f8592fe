package main

import (
	"bytes"
	"encoding/json"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/repeatrate/repeatrate/internal/synth"
)

// liveAggregate names the aggregate a live attempt counts in: its source, scope and correction.
func liveAggregate(t *testing.T, line []byte) (string, bool) {
	t.Helper()
	var ev struct {
		Source string `json:"source"`
		Type   string `json:"type"`
		Data   struct {
			Scope      map[string]string `json:"scope"`
			Correction string            `json:"correction_id"`
		} `json:"data"`
	}
	if err := json.Unmarshal(line, &ev); err != nil {
		t.Fatalf("%v: %s", err, line)
	}
	if ev.Type != "repeatrate.live.attempt.v1" {
		return "", false
	}
	s := ev.Data.Scope
	return ev.Source + "|" + s["workspace"] + "|" + s["model"] + "|" + s["run"] + "|" + s["checkpoint"] + "|" +
		s["artifact"] + "|" + ev.Data.Correction, true
}

// TestPrefillControlHoldsTheTodayStreamsLiveAggregates: the control store (BENCH_PREFILL_CONTROL)
// is prefilled in exactly the aggregates the today stream's live attempts count in, so that the
// prefilled store differs from it only by the history the stream never touches.
func TestPrefillControlHoldsTheTodayStreamsLiveAggregates(t *testing.T) {
	stream := map[string]bool{}
	gen := synth.New(todayConfig(0.2, 1_000_000_000))
	now := time.Now()
	for range 50_000 {
		l, _ := gen.Line(now)
		if a, ok := liveAggregate(t, l); ok {
			stream[a] = true
		}
	}
	control := map[string]bool{}
	lines := prefillLines(1, inTodayStream, now) // the control's input, a line an aggregate
	for l, more := lines(); more; l, more = lines() {
		name, ok := liveAggregate(t, l)
		if !ok {
			t.Fatalf("a prefill line is not a live attempt: %s", l)
		}
		control[name] = true
	}
	if len(stream) != 200 {
		t.Fatalf("the today stream's live attempts count in %d aggregates, want 200", len(stream))
	}
	if !maps.Equal(stream, control) {
		var missing, extra []string
		for a := range stream {
			if !control[a] {
				missing = append(missing, a)
			}
		}
		for a := range control {
			if !stream[a] {
				extra = append(extra, a)
			}
		}
		slices.Sort(missing)
		slices.Sort(extra)
		t.Fatalf("the control store holds %d aggregates; of the stream's, %d missing (%v); %d not the stream's (%v)",
			len(control), len(missing), missing, len(extra), extra)
	}
}

// TestPrefillControlHoldsTheSameLinesAsThePrefill: the control store's input is the prefill's
// lines of the stream's aggregates, byte for byte, in the same order, so that its aggregates hold
// what the prefilled store's do.
func TestPrefillControlHoldsTheSameLinesAsThePrefill(t *testing.T) {
	const per = 3
	now := time.Now()
	all, control := prefillLines(per, func(int) bool { return true }, now), prefillLines(per, inTodayStream, now)
	var want [][]byte
	for a := 0; ; a++ {
		l, ok := all()
		if !ok {
			if a != per*prefillAggregates {
				t.Fatalf("the prefill has %d lines, want %d", a, per*prefillAggregates)
			}
			break
		}
		if inTodayStream(a / per) {
			want = append(want, l)
		}
	}
	var got [][]byte
	for {
		l, ok := control()
		if !ok {
			break
		}
		got = append(got, l)
	}
	if len(got) != len(want) || len(want) != 200*per {
		t.Fatalf("the control has %d lines, the prefill %d of the stream's aggregates, want %d", len(got), len(want), 200*per)
	}
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("line %d of the control differs from the prefill's:\n%s\n%s", i, got[i], want[i])
		}
	}
}
