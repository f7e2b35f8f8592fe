package main

import (
	"bytes"
	"encoding/json"
	"fmt"
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

// TestEachPrefillRoundMeetsLiveAggregatesOfItsOwn: each round's today stream counts its live
// attempts in 200 prefilled aggregates that no other round's stream writes, so that every round
// meets them as the prefill left them; and the control store (BENCH_PREFILL_CONTROL) is prefilled
// in exactly the rounds' streams' aggregates, so that the prefilled store differs from it only by
// the history the streams never touch.
func TestEachPrefillRoundMeetsLiveAggregatesOfItsOwn(t *testing.T) {
	t.Setenv("BENCH_PREFILL_ROUNDS", fmt.Sprint(maxPrefillRounds+1))
	if _, err := prefillRounds(); err == nil {
		t.Fatalf("%d rounds accepted, where %d meet aggregates of their own", maxPrefillRounds+1, maxPrefillRounds)
	}
	t.Setenv("BENCH_PREFILL_ROUNDS", fmt.Sprint(maxPrefillRounds))
	rounds, err := prefillRounds()
	if err != nil || rounds != 5 {
		t.Fatalf("BENCH_PREFILL_ROUNDS=%d: %d rounds, %v; want the prefill's 50 workspaces in 5", maxPrefillRounds, rounds, err)
	}
	now := time.Now()
	prefilled := map[string]bool{}
	lines := prefillLines(1, func(int) bool { return true }, now) // a line an aggregate
	for l, more := lines(); more; l, more = lines() {
		name, ok := liveAggregate(t, l)
		if !ok {
			t.Fatalf("a prefill line is not a live attempt: %s", l)
		}
		prefilled[name] = true
	}
	if len(prefilled) != prefillAggregates {
		t.Fatalf("the prefill writes %d aggregates, want %d", len(prefilled), prefillAggregates)
	}
	streams := map[string]int{} // aggregate → the round (from 1) whose stream counts in it
	for k := range rounds {
		gen := synth.New(roundConfig(k))
		own := 0
		for range 50_000 {
			l, _ := gen.Line(now)
			a, ok := liveAggregate(t, l)
			if !ok {
				continue
			}
			switch r := streams[a]; {
			case r == 0:
				streams[a] = k + 1
				own++
			case r != k+1:
				t.Fatalf("round %d's stream counts in %s, round %d's aggregate", k+1, a, r)
			}
			if !prefilled[a] {
				t.Fatalf("round %d's stream counts in %s, which the prefill never wrote", k+1, a)
			}
		}
		if own != 200 {
			t.Fatalf("round %d's stream counts its live attempts in %d aggregates, want 200", k+1, own)
		}
	}
	for n := 1; n <= rounds; n++ {
		control := map[string]bool{}
		lines := controlLines(1, n, now)
		for l, more := lines(); more; l, more = lines() {
			name, _ := liveAggregate(t, l)
			control[name] = true
		}
		var missing, extra []string
		for a, r := range streams {
			if r <= n && !control[a] {
				missing = append(missing, a)
			}
		}
		for a := range control {
			if r := streams[a]; r == 0 || r > n {
				extra = append(extra, a)
			}
		}
		if len(missing)+len(extra) > 0 || len(control) != 200*n {
			slices.Sort(missing)
			slices.Sort(extra)
			t.Fatalf("%d rounds: the control store holds %d aggregates; of the streams', %d missing (first %v); %d not theirs (first %v)",
				n, len(control), len(missing), missing[:min(3, len(missing))], len(extra), extra[:min(3, len(extra))])
		}
	}
}

// TestPrefillControlHoldsTheSameLinesAsThePrefill: the control store's input is the prefill's
// lines of the stream's aggregates, byte for byte, in the same order, so that its aggregates hold
// what the prefilled store's do.
func TestPrefillControlHoldsTheSameLinesAsThePrefill(t *testing.T) {
	const per = 3
	now := time.Now()
	all, control := prefillLines(per, func(int) bool { return true }, now), controlLines(per, 1, now)
	var want [][]byte
	for a := 0; ; a++ {
		l, ok := all()
		if !ok {
			if a != per*prefillAggregates {
				t.Fatalf("the prefill has %d lines, want %d", a, per*prefillAggregates)
			}
			break
		}
		if inRoundStreams(1)(a / per) {
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

// The bench's rounds run the inputs roundInputs makes: round k's own stream (roundConfig(k)),
// warm + n events of it, the first warm run before the measured interval begins.
func TestPrefillRoundsRunTheirOwnStreamsAfterTheirWarmUp(t *testing.T) {
	var cfgs []synth.Config
	ins, err := roundInputs(3, 300, 100, func(name string, cfg synth.Config, n int) (*input, error) {
		cfgs = append(cfgs, cfg)
		return &input{file: name, n: n}, nil
	})
	if err != nil || len(ins) != 3 {
		t.Fatalf("%d inputs, %v; want 3", len(ins), err)
	}
	for k, in := range ins {
		if cfgs[k] != roundConfig(k) || in.n != 400 || in.warm != 100 || in.file != fmt.Sprintf("dup20-%d", k+1) {
			t.Errorf("round %d: %+v of %+v; want dup20-%d, 400 events, 100 of them warm-up, of %+v", k, *in, cfgs[k], k+1, roundConfig(k))
		}
	}
}
