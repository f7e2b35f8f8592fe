package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/repeatrate/repeatrate/internal/synth"
	"github.com/repeatrate/repeatrate/internal/testenv"
	"github.com/repeatrate/repeatrate/replay"
	"github.com/repeatrate/repeatrate/schemas"
	"github.com/repeatrate/repeatrate/schemas/cloudevent"
	"github.com/repeatrate/repeatrate/sink"
)

// envelope is an output CloudEvent with its data left raw.
type envelope struct {
	ID      string          `json:"id"`
	Type    string          `json:"type"`
	Subject string          `json:"subject"`
	Data    json.RawMessage `json:"data"`
}

// withoutObservedAt drops observed_at and snapshot_version, the fields streaming and replay
// legitimately differ in (both follow the observation clock).
func withoutObservedAt(t *testing.T, data []byte) string {
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	delete(m, "observed_at")
	delete(m, "snapshot_version")
	b, _ := json.Marshal(m)
	return string(b)
}

func TestEndToEndSuitesMatchReplay(t *testing.T) {
	testenv.KafkaBrokers(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	lines := synth.Suite(synth.SuiteConfig{Seed: 9, Workspace: "acme", Suite: "qa|core", Cases: 40, Versions: 8, Runs: 3,
		Duplicates: 0.1, Regrades: 0.05, LoopShare: 0.05}, time.Now().Add(-10*time.Minute))
	input := bytes.Join(lines, []byte("\n"))

	dec, _ := cloudevent.NewDecoder(cloudevent.DefaultDecoderConfig)
	suiteCfg, _ := defaultConfig().Suite.aggregator()
	want, err := replay.Run(ctx, bytes.NewReader(input), dec, 30*24*time.Hour, suiteCfg, time.Time{}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	wantSnaps := map[string]string{}
	wantAlerts := map[string]bool{}
	wantAbnormalIDs := map[string]bool{}
	for _, o := range want.Outs {
		b, err := json.Marshal(o.Data)
		if err != nil {
			t.Fatal(err)
		}
		switch o.Type {
		case schemas.TypeSuiteDiscrimination, schemas.TypeSuiteStability:
			wantSnaps[o.Subject] = withoutObservedAt(t, b)
		case schemas.TypeCaseRevived, schemas.TypeSampleAbnormal:
			wantAlerts[o.Type+" "+o.Subject] = true
		}
		if o.Type == schemas.TypeSampleAbnormal {
			b, err := sink.Encode(&o)
			if err != nil {
				t.Fatal(err)
			}
			var e envelope
			if err := json.Unmarshal(b, &e); err != nil {
				t.Fatal(err)
			}
			wantAbnormalIDs[e.ID] = true
		}
	}
	if len(want.Suites.Revived) == 0 || len(want.Suites.Abnormal) == 0 || len(want.Suites.Stability) != 8 {
		t.Fatalf("the input does not exercise revived cases and abnormal samples: %d, %d, %d versions",
			len(want.Suites.Revived), len(want.Suites.Abnormal), len(want.Suites.Stability))
	}

	p := startPipeline(ctx, t, input, len(lines))
	var mu sync.Mutex
	latest := map[string]string{}
	tailCtx, stopTail := context.WithCancel(ctx)
	defer stopTail()
	tailDone := make(chan error, 1)
	go func() {
		tailDone <- tail(tailCtx, p.kc, p.cfg.Kafka.SuiteTopic, 3*time.Minute, func(m kafka.Message) error {
			var e envelope
			if err := json.Unmarshal(m.Value, &e); err != nil {
				return err
			}
			mu.Lock()
			latest[string(m.Key)] = withoutObservedAt(t, e.Data) // per key, partition order is publish order
			mu.Unlock()
			return nil
		})
	}()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		mu.Lock()
		diff := ""
		for k, w := range wantSnaps {
			if latest[k] != w {
				diff = fmt.Sprintf("%s:\n got %s\nwant %s", k, latest[k], w)
				break
			}
		}
		if diff == "" && len(latest) != len(wantSnaps) {
			diff = fmt.Sprintf("%d suite snapshot keys, want %d", len(latest), len(wantSnaps))
		}
		mu.Unlock()
		if diff == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("suite snapshots did not converge to replay's: %s", diff)
		}
		select {
		case err := <-p.done:
			t.Fatalf("processor stopped early: %v", err)
		case <-time.After(200 * time.Millisecond):
		}
	}
	stopTail()
	<-tailDone
	p.stop()
	if err := <-p.done; err != nil {
		t.Fatal(err)
	}

	// Alerts: every revived case once; every abnormal run that replay names (streaming may also
	// name a run whose reply was later re-graded, never fewer).
	// Copies of one alert (a duplicate result re-raises its run's abnormal sample) share an id,
	// and subscribers drop them by it: count distinct ids.
	gotAlerts := map[string]int{}
	ids := map[string]bool{}
	if err := tail(ctx, p.kc, p.cfg.Kafka.AlertsTopic, 3*time.Second, func(m kafka.Message) error {
		var e envelope
		if err := json.Unmarshal(m.Value, &e); err != nil {
			return err
		}
		if ids[e.ID] {
			return nil
		}
		ids[e.ID] = true
		if e.Type == schemas.TypeSampleAbnormal && !wantAbnormalIDs[e.ID] {
			t.Errorf("abnormal sample %s (%s) published, but replay raises no such alert", e.ID, e.Subject)
		}
		gotAlerts[e.Type+" "+e.Subject]++
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var missing []string
	for k := range wantAlerts {
		if gotAlerts[k] == 0 {
			missing = append(missing, k)
		}
	}
	slices.Sort(missing)
	if len(missing) > 0 {
		t.Fatalf("alerts missing from the stream: %v", missing)
	}
	for id := range wantAbnormalIDs {
		if !ids[id] {
			t.Errorf("replay raises abnormal sample %s, the stream never published it", id)
		}
	}
	for k, n := range gotAlerts {
		if n > 1 && !wantAlerts[k] {
			t.Errorf("alert %s published %d times", k, n)
		}
	}
	revived := 0
	for k, n := range gotAlerts {
		if len(k) > len(schemas.TypeCaseRevived) && k[:len(schemas.TypeCaseRevived)] == schemas.TypeCaseRevived {
			revived++
			if n != 1 {
				t.Errorf("%s announced %d times", k, n)
			}
		}
	}
	if revived != len(want.Suites.Revived) {
		t.Errorf("%d revived cases announced, replay has %d", revived, len(want.Suites.Revived))
	}
	t.Logf("%d results, %d suite snapshot keys, %d revived, %d abnormal samples", len(lines), len(wantSnaps), revived, len(want.Suites.Abnormal))
}
