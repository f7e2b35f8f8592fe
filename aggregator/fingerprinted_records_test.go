package aggregator

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/repeatrate/repeatrate/internal/testenv"
	"github.com/repeatrate/repeatrate/schemas"
)

// testFingerprinter is a fingerprinter under a fixed secret, for stores of layout 11 in tests.
func testFingerprinter(t testing.TB) *Fingerprinter {
	t.Helper()
	f, err := newFingerprinter(bytes.Repeat([]byte{11}, fingerprintSecretBytes))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestFingerprintedRecordsMatchModel holds layout 11 (apply.lua on the packed record store, fingerprints
// and binary records) to the model on every stream layout 10 is held to: the same outcome for
// every event and the same tallies after every batch, on Redis and on the embedded server.
func TestFingerprintedRecordsMatchModel(t *testing.T) {
	for _, tc := range modelCases {
		t.Run(fmt.Sprint("seed", tc.seed, map[bool]string{true: " embedded"}[tc.embedded]), func(t *testing.T) {
			matchModel(t, tc, testFingerprinter(t))
		})
	}
}

// TestFingerprintedRecordsMatchModelWhenPrefixesCollide: fingerprints that share their first 4 bytes (a
// handful of prefixes, or only their low bits), which a keyed hash makes all but impossible and
// which is where one index entry finds several records and one bucket holds what its address
// cannot split, still give the model's outcomes and tallies, and a store whose every record is
// where its shape says.
func TestFingerprintedRecordsMatchModelWhenPrefixesCollide(t *testing.T) {
	for _, tc := range []struct {
		name string
		mc   modelCase
		fp   *Fingerprinter
	}{
		{"4 prefixes", modelCase{1, 10 * 24 * time.Hour, 3 * 24 * time.Hour, 0, false, 6000}, collidingFingerprinter(4, 0)},
		{"1 prefix, 1h", modelCase{7, 12 * time.Hour, time.Hour, 0, false, 6000}, collidingFingerprinter(1, 0)},
		{"low 12 bits shared", modelCase{2, 10 * 24 * time.Hour, 24 * time.Hour, 0, false, 6000}, collidingFingerprinter(0, 12)},
		{"4 prefixes, embedded", modelCase{8, 2 * time.Hour, time.Hour, 700, true, 6000}, collidingFingerprinter(4, 0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store, c, keys := matchModel(t, tc.mc, tc.fp)
			for _, k := range keys {
				fingerprintedRecords(t, c, store, k)
			}
		})
	}
}

// collidingFingerprinter makes fingerprints whose first 4 bytes are one of k values (k > 0), or
// share their low `low` bits; the rest is SHA-256 of the id.
func collidingFingerprinter(k uint32, low uint) *Fingerprinter {
	f := &Fingerprinter{}
	f.macs.New = func() any { return &fingerprintMAC{h: &collidingMAC{k: k, low: low}} }
	return f
}

// collidingMAC is a hash.Hash standing in for the fingerprint's HMAC (see collidingFingerprinter).
type collidingMAC struct {
	buf []byte
	k   uint32
	low uint
}

func (m *collidingMAC) Write(p []byte) (int, error) { m.buf = append(m.buf, p...); return len(p), nil }
func (m *collidingMAC) Reset()                      { m.buf = m.buf[:0] }
func (m *collidingMAC) Size() int                   { return sha256.Size }
func (m *collidingMAC) BlockSize() int              { return sha256.BlockSize }
func (m *collidingMAC) Sum(b []byte) []byte {
	s := sha256.Sum256(m.buf)
	x := binary.LittleEndian.Uint32(s[:4])
	if m.k > 0 {
		x = 0x9e3779b1 * (x % m.k)
	} else {
		x <<= m.low
	}
	binary.LittleEndian.PutUint32(s[:4], x)
	return append(b, s[:]...)
}

// fingerprintedRecords walks the record store of aggregate k and returns the records it holds by
// fingerprint, failing when a bucket does not split into whole records, holds a record its
// fingerprint does not address under the head's shape, is empty or is none the shape names, or
// when the head's count of records differs from what the buckets hold.
func fingerprintedRecords(t *testing.T, c *redis.Client, store *Redis, k Key) map[string]storedRecord {
	t.Helper()
	ctx := context.Background()
	keys := store.keys(k)
	buckets, err := c.HGetAll(ctx, keys[2]).Result()
	if err != nil {
		t.Fatal(err)
	}
	head, err := c.HGet(ctx, keys[1], "H").Result()
	if err != nil {
		if len(buckets) > 0 {
			t.Fatalf("%s: no head, %d buckets", k, len(buckets))
		}
		return nil
	}
	if len(head) != headBytesWC || head[0] != 11 {
		t.Fatalf("%s: head of %d bytes starting %d, want layout 11's", k, len(head), head[0])
	}
	num := func(i int) uint64 { // the head's i-th number
		var b [8]byte
		copy(b[:], head[2+i*7:2+(i+1)*7])
		return binary.LittleEndian.Uint64(b[:])
	}
	level, split, count := num(21), num(22), num(23)
	size := uint64(1) << level
	out := map[string]storedRecord{}
	delete(buckets, bucketsWritten) // the buckets' write stamp and token, no buckets
	delete(buckets, bucketsToken)
	for name, v := range buckets {
		var b uint64
		for i := len(name) - 1; i >= 0; i-- {
			b = b<<8 | uint64(name[i])
		}
		if v == "" || len(name) == 0 || b >= size+split {
			t.Fatalf("%s: bucket %x (%d of %d) holds %d bytes", k, name, b, size+split, len(v))
		}
		for at := 0; at < len(v); {
			if len(v) < at+FingerprintBytes+1 || recordLength(v[at+FingerprintBytes]) == 0 || len(v) < at+FingerprintBytes+recordLength(v[at+FingerprintBytes]) {
				t.Fatalf("%s: bucket %x does not split into records at byte %d", k, name, at)
			}
			end := at + FingerprintBytes + recordLength(v[at+FingerprintBytes])
			rec, err := parseRecord([]byte(v[at+FingerprintBytes : end]))
			if err != nil {
				t.Fatalf("%s: bucket %x at byte %d: %v", k, name, at, err)
			}
			fp := v[at : at+FingerprintBytes]
			x := uint64(binary.LittleEndian.Uint32([]byte(fp[:4])))
			a := x % size
			if a < split {
				a = x % (2 * size)
			}
			if a != b {
				t.Fatalf("%s: record %x in bucket %d, which its address (L=%d p=%d) is not", k, fp, b, level, split)
			}
			if _, dup := out[fp]; dup {
				t.Fatalf("%s: fingerprint %x stored twice", k, fp)
			}
			out[fp] = rec
			at = end
		}
	}
	if count != uint64(len(out)) {
		t.Fatalf("%s: the head counts %d records, the buckets hold %d", k, count, len(out))
	}
	return out
}

// TestFingerprintedRecordsAllCollectedOnceExpired: once a random history (re-assessments moving winners
// and horizons across index groups, so entries are left behind and groups compacted) has wholly
// expired, garbage collection leaves exactly the records of the opportunities that came after,
// and the store's count of records stays the records its buckets hold.
func TestFingerprintedRecordsAllCollectedOnceExpired(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		seed      uint64
		retention time.Duration
	}{{21, time.Hour}, {22, 24 * time.Hour}, {23, 3 * 24 * time.Hour}} {
		t.Run(fmt.Sprint("seed", tc.seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(tc.seed, 11))
			store, c := testStore(t, "gc-fingerprinted", RedisConfig{Retention: tc.retention, Fingerprint: testFingerprinter(t)})
			model := NewModel(tc.retention)
			stream := randomStreamOver(r, 8000, 10*24*time.Hour, 0)
			var maxOcc int64
			for i := 0; i < len(stream); {
				batch := stream[i:min(i+1+r.IntN(300), len(stream))]
				i += len(batch)
				for _, o := range batch {
					maxOcc = max(maxOcc, o.Occurred)
				}
				at := time.UnixMicro(maxOcc)
				if _, err := store.Apply(ctx, batch, at); err != nil {
					t.Fatal(err)
				}
				model.Apply(ctx, batch, at)
			}
			later := maxOcc + int64(2*tc.retention/time.Microsecond) + int64(time.Hour/time.Microsecond)
			for _, k := range model.Keys() {
				collectAll(t, store, c, model, k, later)
			}
		})
	}
}

// TestFingerprintedRecordsKeptByHorizonThroughCompaction: a record whose winner moved to an earlier index
// group keeps an entry in its horizon's group only; when that group is compacted (others left it),
// the entry stays, so the record is collected once its horizon expires.
func TestFingerprintedRecordsKeptByHorizonThroughCompaction(t *testing.T) {
	ctx := context.Background()
	store, c := testStore(t, "gc-horizon", RedisConfig{Retention: 24 * time.Hour, Fingerprint: testFingerprinter(t)})
	model := NewModel(24 * time.Hour)
	span := int64(3 * time.Hour / time.Microsecond) // G: an eighth of the retention
	base := (Micros(t0)/span + 10) * span
	at := time.UnixMicro(base + 4*span)
	apply := func(batch []Observation) {
		t.Helper()
		got, err := store.Apply(ctx, batch, at)
		if err != nil {
			t.Fatal(err)
		}
		if want, _ := model.Apply(ctx, batch, at); got.Tallies[keyLive] != want.Tallies[keyLive] {
			t.Fatalf("redis %+v, model %+v", got.Tallies[keyLive], want.Tallies[keyLive])
		}
	}
	at1 := func(id string, occ, asd int64) Observation {
		return Observation{Key: keyLive, OpportunityID: id, Class: Passed, Occurred: occ, Assessed: asd}
	}
	var b1, b2, b3, b4 []Observation
	for i := 0; i < 200; i++ { // winner in group 1, then moved back to group 0: horizon left in group 1
		id := fmt.Sprint("back-", i)
		b1 = append(b1, at1(id, base+span+int64(i), base+span+int64(i)))
		b2 = append(b2, at1(id, base+int64(i), base+2*span+int64(i)))
	}
	for i := 0; i < 300; i++ { // in group 1, then moved on to group 2: they leave group 1
		id := fmt.Sprint("on-", i)
		b3 = append(b3, at1(id, base+span+int64(i), base+span+int64(i)))
		b4 = append(b4, at1(id, base+2*span+int64(i), base+3*span+int64(i)))
	}
	for _, b := range [][]Observation{b1, b2, b3, b4} {
		apply(b)
	}
	collectAll(t, store, c, model, keyLive, base+20*span)
}

// collectAll applies new opportunities to aggregate k at later (a retention and more after its
// history), in batches until garbage collection has had budget for every record the history
// left, and requires the store to hold exactly the new records then.
func collectAll(t *testing.T, store *Redis, c *redis.Client, model *Model, k Key, later int64) {
	t.Helper()
	ctx := context.Background()
	before := fingerprintedRecords(t, c, store, k)
	var fresh []Observation
	for b := 0; b < 2+len(before)/100; b++ {
		var batch []Observation
		for i := 0; i < 100; i++ {
			occ := later + int64(b*100+i)
			batch = append(batch, Observation{Key: k, OpportunityID: fmt.Sprintf("new-%d-%d", b, i), Class: Passed, Occurred: occ, Assessed: occ})
		}
		at := time.UnixMicro(later + 1e6)
		got, err := store.Apply(ctx, batch, at)
		if err != nil {
			t.Fatal(err)
		}
		if want, _ := model.Apply(ctx, batch, at); got.Tallies[k] != want.Tallies[k] {
			t.Fatalf("%s: redis %+v, model %+v", k, got.Tallies[k], want.Tallies[k])
		}
		fresh = append(fresh, batch...)
	}
	after := fingerprintedRecords(t, c, store, k)
	if len(after) != len(fresh) {
		t.Fatalf("%s: %d records before, %d after the history expired, want only the %d new ones", k, len(before), len(after), len(fresh))
	}
	for _, o := range fresh {
		fp := string(store.mode.Load().fp.Append(nil, o.OpportunityID))
		if rec, ok := after[fp]; !ok || rec.occurred != o.Occurred {
			t.Fatalf("%s: %s is not stored as applied: %+v, %v", k, o.OpportunityID, rec, ok)
		}
	}
}

// TestTiesOnAssessedGoBySeq: assessments of one opportunity at one assessed time are ordered by
// their seq, which layout 11 keeps in 7 bytes beside the times: a higher seq wins, a lower or
// equal one is stale or a duplicate, up to the largest seq the schemas admit.
func TestTiesOnAssessedGoBySeq(t *testing.T) {
	ctx := context.Background()
	for _, fp := range []*Fingerprinter{nil, testFingerprinter(t)} {
		store, _ := testStore(t, "seq-ties", RedisConfig{Retention: 24 * time.Hour, Fingerprint: fp})
		model := NewModel(24 * time.Hour)
		top := int64(schemas.MaxAssessmentSeq)
		steps := []Observation{
			obs("a", Confirmed, 0, time.Minute, 1),
			obs("a", Passed, 0, time.Minute, 2),
			obs("a", Unscored, 0, time.Minute, 1),
			obs("a", Passed, 0, time.Minute, 2),
			obs("a", Confirmed, 0, time.Minute, top),
			obs("a", Passed, 0, time.Minute, top-1),
			obs("b", Passed, time.Minute, time.Minute, top),
			obs("b", Confirmed, time.Minute, time.Minute, 0),
		}
		for i, o := range steps {
			at := t0.Add(time.Hour)
			got, err := store.Apply(ctx, []Observation{o}, at)
			if err != nil {
				t.Fatal(err)
			}
			want, _ := model.Apply(ctx, []Observation{o}, at)
			if got.Outcomes[0] != want.Outcomes[0] || got.Tallies[o.Key] != want.Tallies[o.Key] {
				t.Fatalf("layout 11 %v, step %d (%+v): %v %+v, model %v %+v", fp != nil, i, o, got.Outcomes[0], got.Tallies[o.Key], want.Outcomes[0], want.Tallies[o.Key])
			}
		}
	}
}

// TestFingerprintedRecordsPastTheArgumentChunks: one call of 9 000 events for one aggregate (past the
// 4 000 arguments a command built in the script carries) gives the model's outcomes and tallies
// when they are new, when the same call comes again, and when they are re-assessed (moving hours)
// and met by stale assessments that grow their horizons; then, once all of it has expired, calls
// of 4 500 new events leave the store exactly their records. On Redis and the embedded server.
func TestFingerprintedRecordsPastTheArgumentChunks(t *testing.T) {
	onBackends(t, true, func(t *testing.T, addr string) {
		ctx := context.Background()
		c := packedClient(t, addr)
		store, err := NewRedis(c, RedisConfig{Prefix: testenv.Name(t, "chunks-fingerprinted"), Retention: 24 * time.Hour, Fingerprint: testFingerprinter(t)})
		if err != nil {
			t.Fatal(err)
		}
		testenv.CleanPrefix(t, c, store.cfg.Prefix)
		model := NewModel(24 * time.Hour)
		apply := func(what string, batch []Observation, at time.Time) {
			t.Helper()
			got, err := store.Apply(ctx, batch, at)
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			want, _ := model.Apply(ctx, batch, at)
			for j := range batch {
				if got.Outcomes[j] != want.Outcomes[j] {
					t.Fatalf("%s, event %d (%+v): %v, model %v", what, j, batch[j], got.Outcomes[j], want.Outcomes[j])
				}
			}
			if got.Tallies[keyLive] != want.Tallies[keyLive] {
				t.Fatalf("%s: %+v, model %+v", what, got.Tallies[keyLive], want.Tallies[keyLive])
			}
			fingerprintedRecords(t, c, store, keyLive)
		}
		base := Micros(t0)
		const n = 9000
		var fresh, moved []Observation
		for i := 0; i < n; i++ {
			occ := base + int64(i)*1e6
			o := Observation{Key: keyLive, OpportunityID: fmt.Sprint("h", i), Class: Class(1 + i%3), Occurred: occ, Assessed: occ, Seq: int64(i % 2)}
			fresh = append(fresh, o)
			re := o // a newer assessment, up to 4 hours earlier
			re.Assessed += 1e6
			re.Occurred -= int64(i%5) * int64(time.Hour/time.Microsecond)
			re.Class = Class(1 + (i+1)%3)
			stale := o // an older assessment than re, 7 s later: the horizon grows
			stale.Occurred += 7e6
			moved = append(moved, re, stale)
		}
		at := time.UnixMicro(base + n*1e6)
		apply("new", fresh, at)
		apply("the same again", fresh, at)
		apply("re-assessed and stale", moved, at)
		apply("re-assessed and stale again", moved, at)
		later := base + int64(5*24*time.Hour/time.Microsecond)
		var all []Observation
		for b := 0; b < 4; b++ {
			var batch []Observation
			for i := 0; i < 4500; i++ {
				occ := later + int64(b*4500+i)
				batch = append(batch, Observation{Key: keyLive, OpportunityID: fmt.Sprintf("n%d-%d", b, i), Class: Passed, Occurred: occ, Assessed: occ})
			}
			apply(fmt.Sprint("after expiry, call ", b), batch, time.UnixMicro(later+1e7))
			all = append(all, batch...)
		}
		if got := fingerprintedRecords(t, c, store, keyLive); len(got) != len(all) {
			t.Fatalf("%d records once the first 9 000 expired, want the %d new ones", len(got), len(all))
		}
	})
}

// TestFingerprintedRecordsKeepADayOfHoursInOneField: layout 11 keeps the hours of a day in one
// field of the state hash, d<day>, and refuses a day field it could not have written (empty,
// an hour past 23, hours out of order or twice, an entry cut short or followed by stray bytes,
// and an entry it reads that holds no counts, counts wider than they need, or bounds past the
// hour or crossed) instead of reading it as counts, and changes nothing (a day read late in a
// call: TestRefusedBatchWritesNothing).
func TestFingerprintedRecordsKeepADayOfHoursInOneField(t *testing.T) {
	ctx := context.Background()
	day := Micros(t0)/(24*hourUS) - 3
	h0 := day * 24
	retainedBackends(t, true, func(t *testing.T, c *redis.Client) {
		// Winners in hours 0, 5 and 23 of one day and hour 0 of the next, 800 in hour 5 (counts
		// past one byte).
		var obs []Observation
		for i, h := range []int64{0, 5, 23, 24} {
			n := 1
			if h == 5 {
				n = 800
			}
			for j := 0; j < n; j++ {
				occ := (h0+h)*hourUS + int64(j+1)*1e6
				obs = append(obs, Observation{Key: keyLive, OpportunityID: fmt.Sprintf("o%d-%d", i, j), Class: Class(1 + j%3), Occurred: occ, Assessed: occ + 1})
			}
		}
		at := time.UnixMicro((h0 + 25) * hourUS)
		s, _ := storeOn(t, c, "days", RedisConfig{Retention: 30 * 24 * time.Hour, Fingerprint: testFingerprinter(t)})
		if _, err := s.Apply(ctx, obs, at); err != nil {
			t.Fatal(err)
		}
		st := s.keys(keyLive)[1]
		fields := c.HKeys(ctx, st).Val()
		var hours []string
		for _, f := range fields {
			if f[0] == 'h' || f[0] == 'd' {
				hours = append(hours, f)
			}
		}
		slices.Sort(hours)
		if want := []string{fmt.Sprint("d", day), fmt.Sprint("d", day+1)}; !slices.Equal(hours, want) {
			t.Fatalf("hour fields %v, want %v", hours, want)
		}
		stored := c.HGet(ctx, st, fmt.Sprint("d", day)).Val()
		if len(stored) != 12+15+12 { // hours 0 and 23 in counts of a byte, hour 5 in 2 bytes
			t.Fatalf("day of %d bytes, want 39: %q", len(stored), stored)
		}
		entry := func(hk byte) string { return string([]byte{hk, 1, 0, 0, 5, 0, 0, 0, 5, 0, 0, 0}) }
		// hour 7's entry (the hour the batch below reads) with counts c and bounds a, b.
		hour7 := func(code byte, c []byte, a, b uint32) string {
			e := append([]byte{7 + 64*code}, c...)
			return string(binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(e, a), b))
		}
		for _, tc := range []struct{ name, v string }{
			{"empty", ""},
			{"hour 24", entry(24)},
			{"hour 31", entry(31)},
			{"hours out of order", entry(5) + entry(3)},
			{"an hour twice", entry(5) + entry(5)},
			{"an entry cut short", entry(2)[:11]},
			{"a stray byte after", entry(2) + "\x00"},
			{"a wider entry cut short", stored[:len(stored)-1]},
			{"an hour without counts", hour7(0, []byte{0, 0, 0}, 5, 5)},
			{"counts wider than they need", hour7(1, []byte{1, 0, 0, 0, 0, 0}, 5, 5)},
			{"a bound past the hour", hour7(0, []byte{1, 0, 0}, 5, 3_600_000_000)},
			{"bounds crossed", hour7(0, []byte{1, 0, 0}, 6, 5)},
		} {
			t.Run(tc.name, func(t *testing.T) {
				c.HSet(ctx, st, fmt.Sprint("d", day), tc.v)
				before := codecDump(t, c, s.cfg.Prefix)
				next := []Observation{{Key: keyLive, OpportunityID: "new", Class: Passed, Occurred: (h0+7)*hourUS + 9, Assessed: (h0 + 8) * hourUS}}
				_, err := s.Apply(ctx, next, at)
				if err == nil || !strings.Contains(err.Error(), "is no day of this layout") {
					t.Fatalf("day field %q: %v, want apply.lua's layout error", tc.v, err)
				}
				if after := codecDump(t, c, s.cfg.Prefix); !reflect.DeepEqual(before, after) {
					t.Fatalf("a refused batch changed the state:\nbefore %v\nafter  %v", before, after)
				}
			})
		}
	})
}
