package aggregator

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/repeatrate/repeatrate/internal/testenv"
)

// TestSparseAggregatesCostByMinute measures what a processor pays for aggregates that each see a
// call or so a minute, as a production stream spread over many aggregates does: every call is its
// aggregate's first of a new minute. Two computing stores apply the same batches, one minute
// apart, to 200 aggregates of 1 000 records each: one moves the window sums on itself
// (sumsMinutes), the other forgets the minute before every batch, as the processor did before it
// kept them, and leaves those calls to apply.lua (which in layout 11 also drops the bucket cache).
// Reported as Redis and processor CPU an event, each store's ÷ the other's, in one run:
//
//	REPEATRATE_SPARSE_COST_MINUTES=30 go test -count=1 -run TestSparseAggregatesCostByMinute -v ./aggregator
func TestSparseAggregatesCostByMinute(t *testing.T) {
	minutes, _ := strconv.Atoi(os.Getenv("REPEATRATE_SPARSE_COST_MINUTES"))
	if minutes <= 0 {
		t.Skip("set REPEATRATE_SPARSE_COST_MINUTES to the number of minutes to measure")
	}
	inBothLayouts(t, func(t *testing.T, fp *Fingerprinter) {
		ctx := context.Background()
		client := costRedis(t)
		const aggregates, per, ret = 200, 1000, 30 * 24 * time.Hour
		names := []string{"moved on", "left to apply.lua"}
		stores := make([]*Redis, len(names))
		for i := range stores {
			prefix := testenv.Name(t, fmt.Sprint("sparse", i))
			testenv.CleanPrefix(t, client, prefix)
			s, err := NewRedis(client, RedisConfig{Prefix: prefix, Retention: ret, ComputeCalls: true, Fingerprint: fp})
			if err != nil {
				t.Fatal(err)
			}
			stores[i] = s
		}
		keys := make([]Key, aggregates)
		for a := range keys {
			keys[a] = Key{Scope: collisionScopes[a%len(collisionScopes)], CorrectionID: fmt.Sprintf("fix-%d", a), Source: Live}
		}
		batchAt := newEachAt(keys)
		now := time.Now().Truncate(time.Hour).Add(-3 * time.Hour)
		for j := range per/100 + 1 { // each aggregate's records, over the day before, then a batch in now's hour
			b, at := batchAt(now, 100, 24*time.Hour), now
			if j == per/100 {
				at = now.Add(30 * time.Second)
				b = batchAt(at, 3, 30*time.Second)
			}
			for _, s := range stores {
				if _, err := s.Apply(ctx, b, at); err != nil {
					t.Fatal(err)
				}
			}
		}
		var redisUS, procUS [2]float64
		var computed [2]int64
		events := 0
		for m := range minutes {
			at := now.Add(time.Duration(m+1)*time.Minute + 10*time.Second)
			b := batchAt(at, 3, 30*time.Second)
			events += len(b)
			var tallies [2]map[Key]Tally
			for j := range stores {
				i := (m + j) % len(stores) // the order rotates
				if i == 1 {
					stores[i].sums = nil
				}
				was, _ := stores[i].ComputedCalls()
				before, err := readCost(ctx, client)
				if err != nil {
					t.Fatal(err)
				}
				cpu := processCPU()
				got, err := stores[i].Apply(ctx, b, at)
				if err != nil {
					t.Fatal(err)
				}
				procUS[i] += (processCPU() - cpu) * 1e6
				after, _ := readCost(ctx, client)
				redisUS[i] += (after.cpu - before.cpu) * 1e6
				now, _ := stores[i].ComputedCalls()
				computed[i] += now - was
				tallies[i] = got.Tallies
			}
			for _, k := range keys {
				if tallies[0][k] != tallies[1][k] {
					t.Fatalf("minute %d, %s: %s %+v, %s %+v", m, k, names[0], tallies[0][k], names[1], tallies[1][k])
				}
			}
		}
		for i, name := range names {
			t.Logf("%-18s Redis %5.2f µs an event, processor %5.2f; %d of %d calls computed", name+":",
				redisUS[i]/float64(events), procUS[i]/float64(events), computed[i], minutes*aggregates)
		}
		t.Logf("moved on ÷ left to apply.lua: Redis CPU an event %.3f, processor %.3f", redisUS[0]/redisUS[1], procUS[0]/procUS[1])
		// Every call is its aggregate's first of a minute: without the minutes kept, none is
		// computed; with them, all but a few off the path for other reasons, those of a new hour
		// included.
		calls := int64(minutes * aggregates)
		if computed[1] != 0 {
			t.Errorf("%s: %d calls computed, want none", names[1], computed[1])
		}
		if computed[0] < calls*9/10 {
			t.Errorf("%s: %d calls of %d computed", names[0], computed[0], calls)
		}
	})
}

// processCPU is this process's user and system CPU so far, in seconds.
func processCPU() float64 {
	var u syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &u)
	return float64(u.Utime.Nano()+u.Stime.Nano()) / 1e9
}
