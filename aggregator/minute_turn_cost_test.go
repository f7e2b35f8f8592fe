package aggregator

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/repeatrate/repeatrate/internal/testenv"
)

// newEachAt returns a batch maker for keys: batchAt(at, per, spread) is per new opportunities of
// every key, occurred within spread before at (by whole seconds), assessed a second after, ids
// numbered on from the last batch's.
func newEachAt(keys []Key) func(at time.Time, per int, spread time.Duration) []Observation {
	id := 0
	return func(at time.Time, per int, spread time.Duration) []Observation {
		var obs []Observation
		for _, k := range keys {
			for range per {
				id++
				occ := Micros(at) - int64(id%int(spread/time.Second))*1e6
				obs = append(obs, Observation{Key: k, OpportunityID: fmt.Sprintf("o-%d", id), Class: Class(1 + id%3),
					Occurred: occ, Assessed: occ + 1e6})
			}
		}
		return obs
	}
}

// TestMinuteTurnCost measures what a script call costs when its observation time enters a new
// minute, against one in the same minute: the window sums are then moved on (or, before they
// were, recomputed from 60 minutes and 168 hours), and every aggregate of a batch does it at once,
// so that batch's cost is what delays the snapshots behind it. 200 aggregates hold a week of hours
// and an hour of minutes; batches of 10 events per aggregate alternate between the same minute
// and the next. REPEATRATE_APPLY_COST_PREV=<file.lua> runs that script beside the current one
// (results checked equal), so that a change is measured as a ratio in one run:
//
//	REPEATRATE_APPLY_COST_MINUTES=20 go test -count=1 -run TestMinuteTurnCost -v ./aggregator
func TestMinuteTurnCost(t *testing.T) {
	turns, _ := strconv.Atoi(os.Getenv("REPEATRATE_APPLY_COST_MINUTES"))
	if turns <= 0 {
		t.Skip("set REPEATRATE_APPLY_COST_MINUTES to the number of minute turns to measure")
	}
	ctx := context.Background()
	client := costRedis(t)
	names, scripts := []string{"current"}, []*redis.Script{applyScript}
	if prev := previousScript(t); prev != nil {
		names, scripts = append(names, "previous"), append(scripts, prev)
	}
	prefixes := make([]string, len(names))
	for i := range names {
		if err := scripts[i].Load(ctx, client).Err(); err != nil {
			t.Fatal(err)
		}
		prefixes[i] = testenv.Name(t, fmt.Sprint("minute", i))
		testenv.CleanPrefix(t, client, prefixes[i])
	}
	const aggregates, ret = 200, 30 * 24 * time.Hour
	keys := make([]Key, aggregates)
	for a := range keys {
		keys[a] = Key{CorrectionID: fmt.Sprintf("fix-%d", a), Source: Live}
		keys[a].Scope.Workspace, keys[a].Scope.Model, keys[a].Scope.Run = "acme", "support-bot", "2026-11"
		keys[a].Scope.Checkpoint, keys[a].Scope.Artifact = "ckpt-42", "prod"
	}
	batchAt := newEachAt(keys)
	// apply runs the batch through every script, in an order that rotates, and returns the server
	// µs each took; the tallies must agree.
	rot := 0
	apply := func(obs []Observation, at time.Time) []float64 {
		us := make([]float64, len(names))
		res := make([]map[Key][]any, len(names))
		rot++
		for j := range names {
			i := (rot + j) % len(names)
			before, err := readCost(ctx, client)
			if err != nil {
				t.Fatal(err)
			}
			if res[i], err = applyCurrentArgs(ctx, client, scripts[i], prefixes[i], ret, ret, obs, at); err != nil {
				t.Fatal(err)
			}
			after, _ := readCost(ctx, client)
			us[i] = float64(after.usec["evalsha"] - before.usec["evalsha"])
		}
		for k, v := range res[0] {
			want, _, err := parseReply(v)
			if err != nil {
				t.Fatal(err)
			}
			for i := 1; i < len(names); i++ {
				if got, _, _ := parseReply(res[i][k]); got != want {
					t.Fatalf("%s: current %+v, %s %+v", k, want, names[i], got)
				}
			}
		}
		return us
	}
	now := time.Now().Truncate(time.Minute).Add(10 * time.Second)
	created := apply(batchAt(now, 10, 7*24*time.Hour), now) // each aggregate's first call
	for i, name := range names {
		t.Logf("%-9s a new aggregate's first call %6.1f µs", name+":", created[i]/aggregates)
	}
	for range 20 {
		apply(batchAt(now, 100, 7*24*time.Hour), now)
		apply(batchAt(now, 50, time.Hour), now)
	}
	same, turn := make([]float64, len(names)), make([]float64, len(names))
	for range turns {
		for i, us := range apply(batchAt(now.Add(time.Second), 10, time.Minute), now.Add(time.Second)) {
			same[i] += us
		}
		now = now.Add(time.Minute)
		for i, us := range apply(batchAt(now, 10, time.Minute), now) {
			turn[i] += us
		}
	}
	// readEach reads every aggregate at at with each script (calls with no observations, as Tally
	// makes), checks the first aggregate's tally equal across scripts, and returns the server µs
	// each script took.
	readEach := func(at time.Time) []float64 {
		args := []any{strconv.FormatInt(int64(ret/time.Microsecond), 10), strconv.FormatInt(Micros(at), 10), "0"}
		us := make([]float64, len(names))
		var want Tally
		for i := range names {
			before, _ := readCost(ctx, client)
			var first []any
			for a, k := range keys {
				base := prefixes[i] + ":{" + k.String() + "}:"
				got, err := scripts[i].EvalSha(ctx, client, []string{base + "o", base + "s", base + "e", base + "z"}, args...).Slice()
				if err != nil {
					t.Fatal(err)
				}
				if a == 0 {
					first = got
				}
			}
			after, _ := readCost(ctx, client)
			us[i] = float64(after.usec["evalsha"] - before.usec["evalsha"])
			got, _, err := parseReply(first)
			if err != nil {
				t.Fatal(err)
			}
			if i == 0 {
				want = got
			} else if got != want {
				t.Fatalf("read %s at %v: current %+v, %s %+v", keys[0], at, want, names[i], got)
			}
		}
		return us
	}
	// Reads 1 to REPEATRATE_APPLY_COST_MINUTES minutes after the last batch.
	read := make([]float64, len(names))
	for r := range turns {
		for i, us := range readEach(now.Add(time.Duration(r+1) * time.Minute)) {
			read[i] += us
		}
	}
	// Reads of an aggregate idle for three days, then for eight: every window is read again, up
	// to its newest event.
	for _, gap := range []time.Duration{3 * 24 * time.Hour, 8 * 24 * time.Hour} {
		for i, us := range readEach(now.Add(gap)) {
			t.Logf("%-9s a read %v after the last batch %6.1f µs", names[i]+":", gap, us/aggregates)
		}
	}
	calls := float64(turns * aggregates)
	for i, name := range names {
		t.Logf("%-9s same minute %6.1f µs a call, a new minute %6.1f µs a call (×%.2f), a read a minute later %6.1f µs",
			name+":", same[i]/calls, turn[i]/calls, turn[i]/same[i], read[i]/calls)
	}
	if len(names) > 1 {
		t.Logf("current ÷ previous: same minute %.3f, a new minute %.3f, a read %.3f",
			same[0]/same[1], turn[0]/turn[1], read[0]/read[1])
	}
}
