package aggregator

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestRefusedBatchWritesNothing: a batch refused at a state field it could not have written
// leaves the state as it was, also when it finds that field only late in the call (the window
// recompute reading a week of hours, after the batch's events moved the watermark on by hours,
// which prunes minute buckets, and listed a new index group), in both layouts and on both servers:
// Redis keeps what a failed script wrote, so the script writes nothing before its last read.
func TestRefusedBatchWritesNothing(t *testing.T) {
	ctx := context.Background()
	day := Micros(t0)/(24*hourUS) - 3
	h0 := day * 24
	retainedBackends(t, true, func(t *testing.T, c *redis.Client) {
		for _, layout := range []Layout{Layout10, Layout11} {
			t.Run(fmt.Sprint("layout ", int(layout)), func(t *testing.T) {
				cfg := RedisConfig{Retention: 30 * 24 * time.Hour}
				if layout == Layout11 {
					cfg.Fingerprint = testFingerprinter(t)
				}
				s, _ := storeOn(t, c, fmt.Sprint("refused", int(layout)), cfg)
				apply := func(id string, h int64, at time.Time) error {
					occ := (h0+h)*hourUS + 7e6
					_, err := s.Apply(ctx, []Observation{{Key: keyLive, OpportunityID: id, Class: Passed, Occurred: occ, Assessed: occ + 1}}, at)
					return err
				}
				// Hour 5 of the day, then hour 3 of the next: minute buckets of both, index groups.
				for _, e := range []struct {
					id string
					h  int64
				}{{"a", 5}, {"b", 27}} {
					if err := apply(e.id, e.h, time.UnixMicro((h0+e.h)*hourUS+8e6)); err != nil {
						t.Fatal(err)
					}
				}
				st := s.keys(keyLive)[1]
				field, bad, refusal := fmt.Sprint("h", h0+5), "\x01short", "is no hour of this layout"
				if layout == Layout11 {
					field, bad, refusal = fmt.Sprint("d", day), "\x05", "is no day of this layout"
				}
				if c.HGet(ctx, st, field).Val() == "" {
					t.Fatalf("no field %s to overwrite", field)
				}
				c.HSet(ctx, st, field, bad)
				before := codecDump(t, c, s.cfg.Prefix)
				// Three hours on, and one 105 hours before hour 5 (another index group): the call
				// prunes the minutes of hour 3 and lists the new group before its window recompute
				// reads hour 5's field.
				at := time.UnixMicro((h0+30)*hourUS + 8e6)
				_, err := s.Apply(ctx, []Observation{
					{Key: keyLive, OpportunityID: "c", Class: Passed, Occurred: (h0+30)*hourUS + 7e6, Assessed: (h0+30)*hourUS + 7e6 + 1},
					{Key: keyLive, OpportunityID: "d", Class: Passed, Occurred: (h0-100)*hourUS + 7e6, Assessed: (h0-100)*hourUS + 7e6 + 1},
				}, at)
				if err == nil || !strings.Contains(err.Error(), refusal) {
					t.Fatalf("field %s = %q: %v, want the script's layout error", field, bad, err)
				}
				if after := codecDump(t, c, s.cfg.Prefix); !reflect.DeepEqual(before, after) {
					t.Fatalf("a refused batch changed the state:\nbefore %v\nafter  %v", before, after)
				}
			})
		}
	})
}
