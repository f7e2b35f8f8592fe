package aggregator

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestApplyCommandsDoNotGrowWithHoursTouched(t *testing.T) {
	// 2 000 new opportunities in 20 aggregates, dated over 30 days: nearly every event is in an
	// hour of its own. The script's writes per aggregate and batch must be a fixed handful, not a
	// HINCRBY, an RPUSH and a PEXPIRE per hour (layout 3: about 3 per event).
	ctx := context.Background()
	store, client := ownStore(t, "hours", RedisConfig{Retention: 30 * 24 * time.Hour})
	r := rand.New(rand.NewPCG(3, 4))
	now := time.Now()
	batch := func(from int) []Observation {
		obs := make([]Observation, 2000)
		for i := range obs {
			k := keyLive
			k.CorrectionID = fmt.Sprint("fix-", i%20)
			occ := Micros(now) - r.Int64N(int64(30*24*time.Hour/time.Microsecond))
			obs[i] = Observation{Key: k, OpportunityID: fmt.Sprint("o", from+i), Class: Class(1 + r.IntN(3)), Occurred: occ, Assessed: occ}
		}
		return obs
	}
	if _, err := store.Apply(ctx, batch(0), now); err != nil { // creates the aggregates
		t.Fatal(err)
	}
	cmds := []string{"hincrby", "rpush", "pexpire", "hset", "hmget", "zadd"}
	before := scriptCalls(t, client, cmds...)
	if _, err := store.Apply(ctx, batch(2000), now); err != nil {
		t.Fatal(err)
	}
	after := scriptCalls(t, client, cmds...)
	var total int64
	for _, c := range cmds {
		total += after[c] - before[c]
	}
	t.Logf("%d commands for 2000 events in 20 aggregates", total)
	if total > 300 {
		t.Fatalf("%d commands for 2000 events in 20 aggregates (%v → %v), want a fixed handful per aggregate", total, before, after)
	}
}

// indexEntries returns, per chunk of aggregate k's id index (the state hash's field i<group> holds
// an index group's open chunk after its numbers, i<group>.<k> its closed ones), keyed by the field
// name without its "i", the number of ids it lists.
// Every id listed must be a record field: its length in three hex digits, then the id.
func indexEntries(t *testing.T, s *Redis, k Key) map[string]int {
	t.Helper()
	kv, err := s.client.HGetAll(context.Background(), s.keys(k)[1]).Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for f, v := range kv {
		if !strings.HasPrefix(f, "i") {
			continue
		}
		if !strings.Contains(f, ".") {
			g, err := retainedParseGroup(v)
			if err != nil {
				t.Fatalf("index group field %s: %v", f, err)
			}
			v = g.open
		}
		ids := 0
		for len(v) > 0 {
			n, err := strconv.ParseInt(v[:3], 16, 64)
			if err != nil || int(n)+3 > len(v) {
				t.Fatalf("index chunk %s: bad entry at %q", f, v)
			}
			ids, v = ids+1, v[3+n:]
		}
		out[strings.TrimPrefix(f, "i")] = ids
	}
	return out
}

func TestIndexStaysProportionalToWhatHoursHold(t *testing.T) {
	// One opportunity re-assessed thousands of times between two hours: the index of its hours
	// must stay proportional to what the hours hold, not to the number of re-assessments; and ids
	// of any bytes (the entry separator, the chunk header's) are listed and found again.
	ctx := context.Background()
	store, _ := testStore(t, "flipindex", RedisConfig{Retention: 30 * 24 * time.Hour})
	model := NewModel(30 * 24 * time.Hour)
	ids := []string{strings.Repeat("o", 512), "a:b|c", "1:x", "\x00\n|:", "0|"}
	base := time.Now().Add(-3 * time.Hour).Truncate(time.Hour)
	asd := Micros(base)
	for b := 0; b < 40; b++ {
		batch := make([]Observation, 200)
		for i := range batch {
			asd++
			occ := base.Add(30 * time.Minute)
			if (i/len(ids))%2 == 1 {
				occ = occ.Add(time.Hour)
			}
			batch[i] = Observation{Key: keyLive, OpportunityID: ids[i%len(ids)], Class: Class(1 + i%3), Occurred: Micros(occ) + int64(i), Assessed: asd}
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
	total := 0
	for _, n := range indexEntries(t, store, keyLive) {
		total += n
	}
	if total > 2*(2*len(ids)+64) {
		t.Errorf("after 8 000 re-assessments of %d opportunities in two hours, the index lists %d ids", len(ids), total)
	}
}

func TestBoundedHourIndexStaysProportional(t *testing.T) {
	// Two hours of 40 winners each (so both keep their bounds, held at the hours' first and last
	// microsecond) and one opportunity moved between their middles 2 000 times, a batch each: no
	// move leaves at a bound, yet every move in leaves an entry behind when the hours' index groups
	// differ. The index must stay proportional to what the hours hold (it grew by one entry per
	// move before layout 7). Both cases: the hours in one group of 24 (30 days' retention), and in
	// groups of their own (8 hours' retention: groups of one hour).
	for _, ret := range []time.Duration{30 * 24 * time.Hour, 8 * time.Hour} {
		t.Run(ret.String(), func(t *testing.T) { boundedHourIndex(t, ret) })
	}
}

func boundedHourIndex(t *testing.T, ret time.Duration) {
	ctx := context.Background()
	store, _ := testStore(t, "boundedflip", RedisConfig{Retention: ret})
	model := NewModel(ret)
	a := time.Now().Add(-5 * time.Hour).Truncate(time.Hour)
	hours := []time.Time{a, a.Add(time.Hour)}
	var fixed []Observation
	for hi, h := range hours {
		for i := 0; i < 40; i++ {
			occ := Micros(h) + int64(i)*int64(time.Minute/time.Microsecond)
			if i == 39 {
				occ = Micros(h.Add(time.Hour)) - 1
			}
			fixed = append(fixed, Observation{Key: keyLive, OpportunityID: fmt.Sprintf("fixed-%d-%d", hi, i), Class: Class(1 + i%3), Occurred: occ, Assessed: occ})
		}
	}
	apply := func(batch []Observation) {
		t.Helper()
		at := time.Now()
		got, err := store.Apply(ctx, batch, at)
		if err != nil {
			t.Fatal(err)
		}
		if want, _ := model.Apply(ctx, batch, at); got.Tallies[keyLive] != want.Tallies[keyLive] {
			t.Fatalf("redis %+v, model %+v", got.Tallies[keyLive], want.Tallies[keyLive])
		}
	}
	apply(fixed)
	asd := Micros(time.Now())
	for i := 0; i < 2000; i++ {
		asd++
		occ := hours[i%2].Add(30*time.Minute + time.Duration(i)*time.Microsecond)
		apply([]Observation{{Key: keyLive, OpportunityID: "bouncer", Class: Class(1 + i%3), Occurred: Micros(occ), Assessed: asd}})
	}
	span := retainedSpan(int64(ret / time.Microsecond))
	perGroup := map[string]int{}
	for f, n := range indexEntries(t, store, keyLive) {
		perGroup[strings.SplitN(f, ".", 2)[0]] += n
	}
	reasons := map[string]int{}
	for _, h := range hours {
		reasons[strconv.FormatInt(Micros(h)/hourUS/span, 10)] += 41
	}
	if len(perGroup) != len(reasons) {
		t.Fatalf("index groups %v, want those of the two hours %v", perGroup, reasons)
	}
	for g, r := range reasons {
		// r entries are listed for a reason (40 winners per hour, and the bouncer's horizon or
		// winner): a group is compacted once at least as many entries were left behind as others
		// plus 64, down to those with a reason, so it lists at most about 2 × (2 × r + 64) + 64.
		if n := perGroup[g]; n > 2*(2*r+64)+64 {
			t.Errorf("after 2 000 moves through the middle of hours of 40 winners, index group %s lists %d ids", g, n)
		}
	}
}

func TestIndexOfExpiredHoursIsCollected(t *testing.T) {
	// Hours of 1 500 opportunities each (several chunks) under 2h retention: once they expire,
	// their chunks and records go, a batch-sized amount at a time.
	ctx := context.Background()
	store, client := testStore(t, "gcindex", RedisConfig{Retention: 2 * time.Hour, IdleTTL: 24 * time.Hour})
	model := NewModel(2 * time.Hour)
	var at time.Time
	for hour := 0; hour < 8; hour++ {
		for b := 0; b < 5; b++ {
			var batch []Observation
			for i := 0; i < 300; i++ {
				occ := time.Duration(hour)*time.Hour + time.Duration(b*300+i)*2*time.Second
				batch = append(batch, obs(fmt.Sprintf("opportunity-%d-%d", hour, b*300+i), Class(1+i%3), occ, occ, 0))
			}
			at = time.UnixMicro(batch[len(batch)-1].Occurred)
			got, err := store.Apply(ctx, batch, at)
			if err != nil {
				t.Fatal(err)
			}
			if want, _ := model.Apply(ctx, batch, at); got.Tallies[keyLive] != want.Tallies[keyLive] {
				t.Fatalf("hour %d: redis %+v, model %+v", hour, got.Tallies[keyLive], want.Tallies[keyLive])
			}
		}
	}
	// A few batches of nothing new let the collection finish.
	for i := 0; i < 20; i++ {
		if _, err := store.Apply(ctx, []Observation{obs("opportunity-7-0", Passed, 7*time.Hour, 7*time.Hour, 0)}, at); err != nil {
			t.Fatal(err)
		}
	}
	cut := Micros(t0.Add(7*time.Hour+59*time.Minute-2*time.Hour)) / hourUS // hours 5, 6, 7 are retained
	listed := 0
	for f, n := range indexEntries(t, store, keyLive) {
		var h int64
		fmt.Sscan(strings.SplitN(f, ".", 2)[0], &h)
		if h < cut { // 2 hours' retention: index groups of one hour
			t.Errorf("index field %s (%d ids) of an expired hour remains", f, n)
		}
		listed += n
	}
	if listed != 3*1500 {
		t.Errorf("index lists %d ids, want the 4500 of the retained hours", listed)
	}
	if n := client.HLen(ctx, store.keys(keyLive)[0]).Val(); n != 3*1500 {
		t.Errorf("record hash holds %d records, want 4500", n)
	}
	if hours := client.ZCard(ctx, store.keys(keyLive)[3]).Val(); hours != 3 {
		t.Errorf("%d index groups (of one hour) listed, want 3", hours)
	}
	for _, k := range []string{store.keys(keyLive)[0], store.keys(keyLive)[1], store.keys(keyLive)[3]} {
		if ttl := client.PTTL(ctx, k).Val(); ttl <= 0 {
			t.Errorf("%s has no TTL (%v)", k, ttl)
		}
	}
}

func TestRecordAndStateHashesAreHashTables(t *testing.T) {
	// A hash of up to hash-max-listpack-entries fields (128 to 512) is a listpack, where every
	// field lookup scans the whole hash: as such, an aggregate's record hash cost more Redis CPU per
	// event than the rest of the apply script (TestApplyCost, today shape). Both hashes must be
	// hash tables from the first batch, and the record hash must hold the records alone.
	ctx := context.Background()
	store, client := testStore(t, "encoding", RedisConfig{Retention: 30 * 24 * time.Hour})
	now := time.Now()
	var batch []Observation
	for i := 0; i < 10; i++ {
		batch = append(batch, Observation{Key: keyLive, OpportunityID: fmt.Sprint("o", i), Class: Passed,
			Occurred: Micros(now) - int64(i)*1e6, Assessed: Micros(now)})
	}
	if _, err := store.Apply(ctx, batch, now); err != nil {
		t.Fatal(err)
	}
	keys := store.keys(keyLive)
	for _, k := range keys[:2] {
		if enc := client.ObjectEncoding(ctx, k).Val(); enc != "hashtable" {
			t.Errorf("%s is a %s", k, enc)
		}
	}
	if n := client.HLen(ctx, keys[0]).Val(); n != 10 {
		t.Errorf("record hash holds %d fields, want the 10 records", n)
	}
}

func TestRecordFieldsSplitBack(t *testing.T) {
	ids := []string{"a", "", strings.Repeat("x", 512), "0|:\x00\xff", strings.Repeat("y", maxIDBytes)}
	var obs []Observation
	for _, id := range ids {
		obs = append(obs, Observation{OpportunityID: id})
	}
	fields, err := recordFields(obs)
	if err != nil {
		t.Fatal(err)
	}
	// The index lists fields back to back and reads each length again.
	all := strings.Join(fields, "")
	for i, id := range ids {
		n, err := strconv.ParseInt(all[:3], 16, 64)
		if err != nil || all[3:3+n] != id {
			t.Fatalf("field %d: %q does not start with the length of %q", i, all, id)
		}
		all = all[3+n:]
	}
	if _, err := recordFields([]Observation{{OpportunityID: strings.Repeat("z", maxIDBytes+1)}}); err == nil {
		t.Error("an id longer than a record field can say was accepted")
	}
}
