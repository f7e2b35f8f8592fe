package aggregator

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// scriptCalls returns how many times Redis ran each named command so far (scripts included).
func scriptCalls(t *testing.T, c *redis.Client, cmds ...string) map[string]int64 {
	t.Helper()
	info := c.Info(context.Background(), "commandstats").Val()
	out := map[string]int64{}
	for _, line := range strings.Split(info, "\n") {
		for _, cmd := range cmds {
			if rest, ok := strings.CutPrefix(line, "cmdstat_"+cmd+":calls="); ok {
				n, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
				out[cmd] = n
			}
		}
	}
	return out
}

func TestFarApartHoursCostWhatTheyHold(t *testing.T) {
	// An event dated 1970 and one dated today, in one aggregate: garbage collection and the id
	// lists' TTL refresh visit the two hours that have lists, not the half million between them.
	ctx := context.Background()
	store, client := ownStore(t, "farapart", RedisConfig{Retention: 7 * 24 * time.Hour, IdleTTL: time.Hour})
	model := NewModel(7 * 24 * time.Hour)
	now := time.Now()
	old := time.Date(1970, 1, 2, 0, 0, 0, 0, time.UTC)
	before := scriptCalls(t, client, "pexpire", "lpop", "exists")
	for _, batch := range [][]Observation{
		{{Key: keyLive, OpportunityID: "a", Class: Passed, Occurred: Micros(old), Assessed: Micros(old)}},
		{{Key: keyLive, OpportunityID: "b", Class: Confirmed, Occurred: Micros(now), Assessed: Micros(now)}},
		{{Key: keyLive, OpportunityID: "c", Class: Passed, Occurred: Micros(now), Assessed: Micros(now)}},
	} {
		got, err := store.Apply(ctx, batch, now)
		if err != nil {
			t.Fatal(err)
		}
		if want, _ := model.Apply(ctx, batch, now); got.Tallies[keyLive] != want.Tallies[keyLive] {
			t.Fatalf("redis %+v, model %+v", got.Tallies[keyLive], want.Tallies[keyLive])
		}
	}
	after := scriptCalls(t, client, "pexpire", "lpop", "exists")
	for cmd, limit := range map[string]int64{"pexpire": 40, "lpop": 10, "exists": 10} {
		if n := after[cmd] - before[cmd]; n > limit {
			t.Errorf("%d %s calls for three events, want at most %d: the script walks hours that hold nothing", n, cmd, limit)
		}
	}
	// The 1970 record was collected and its hour forgotten.
	if n := client.HLen(ctx, store.keys(keyLive)[0]).Val(); n != 2 {
		t.Errorf("record hash holds %d records, want the 2 retained", n)
	}
	if hours := client.ZRange(ctx, store.keys(keyLive)[3], 0, -1).Val(); len(hours) != 1 {
		t.Errorf("hours with id lists: %v, want only today's", hours)
	}
}

func TestOpportunityMovedBackAndForthKeepsItsListsSmall(t *testing.T) {
	// One opportunity re-assessed thousands of times between two hours: its hours' id lists must
	// stay proportional to what the hours hold, not to the number of re-assessments.
	ctx := context.Background()
	store, client := testStore(t, "flipflop", RedisConfig{Retention: 30 * 24 * time.Hour})
	model := NewModel(30 * 24 * time.Hour)
	id := strings.Repeat("o", 512)
	base := time.Now().Add(-3 * time.Hour).Truncate(time.Hour)
	asd := Micros(base)
	for b := 0; b < 60; b++ {
		batch := make([]Observation, 200)
		for i := range batch {
			asd++
			occ := base.Add(30 * time.Minute)
			if i%2 == 1 {
				occ = occ.Add(time.Hour)
			}
			batch[i] = Observation{Key: keyLive, OpportunityID: id, Class: Class(1 + i%3), Occurred: Micros(occ), Assessed: asd}
		}
		at := time.Now()
		got, err := store.Apply(ctx, batch, at)
		if err != nil {
			t.Fatal(err)
		}
		if want, _ := model.Apply(ctx, batch, at); got.Tallies[keyLive] != want.Tallies[keyLive] {
			t.Fatalf("batch %d: redis %+v, model %+v", b, got.Tallies[keyLive], want.Tallies[keyLive])
		}
	}
	for _, h := range []time.Time{base, base.Add(time.Hour)} {
		list := store.keys(keyLive)[2] + strconv.FormatInt(Micros(h)/hourUS, 10)
		if n := client.LLen(ctx, list).Val(); n > 2*1+64+2 {
			t.Errorf("after 12 000 re-assessments of one opportunity, the id list of %s holds %d entries", h.Format("15h"), n)
		}
	}
}
