package aggregator

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// growingStore is one aggregate's records in Redis, kept by the commands a computing processor
// would send, beside a model of what Redis should hold: reads queues a call's reads, check fails
// the test unless they returned what the model holds, add puts the call's records in the model and
// queues the writes that bring Redis to it, and finish fails the test unless Redis holds the
// hashes the model says, as hash tables.
type growingStore interface {
	reads(p redis.Pipeliner, recs []modelRecord)
	check(t *testing.T, got []redis.Cmder, recs []modelRecord)
	add(p redis.Pipeliner, recs []modelRecord)
	finish(t *testing.T, rdb *redis.Client)
}

// makeHashTable queues what makes the hash at key a hash table for good, as apply.lua makes a new
// aggregate's record hash one: a field longer than hash-max-listpack-value, set and deleted. A
// listpack, Redis's encoding of a small hash, is read whole by every command. Queued after the
// hash's first fields: deleting a hash's last field deletes the hash.
func makeHashTable(p redis.Pipeliner, key string) {
	p.HSet(context.Background(), key, hashTableField, "")
	p.HDel(context.Background(), key, hashTableField)
}

// hashTableField is a field longer than hash-max-listpack-value (64 bytes by default): a hash
// that holds it, or once held it, is a hash table.
const hashTableField = "a field longer than hash-max-listpack-value makes this hash a hash table"

// checkHashTable fails the test unless the hash at key is a hash table of fields fields.
func checkHashTable(t *testing.T, rdb *redis.Client, key string, fields int64) {
	ctx := context.Background()
	if enc := rdb.ObjectEncoding(ctx, key).Val(); enc != "hashtable" {
		t.Fatalf("%s is a %q, not a hash table", key, enc)
	}
	if n := rdb.HLen(ctx, key).Val(); n != fields {
		t.Fatalf("%s holds %d fields, its model %d", key, n, fields)
	}
}

// addressesOf is the distinct pages (or buckets) of m that recs' first choices name, in order.
func addressesOf(m *placementModel, recs []modelRecord) []int64 {
	var as []int64
	for _, r := range recs {
		if a := m.addr(r.h[0]); !slices.Contains(as, a) {
			as = append(as, a)
		}
	}
	return as
}

// modelRecordBytes is a model record's bytes: its two hashes, then bytes that follow from them.
func modelRecordBytes(rec modelRecord) []byte {
	b := make([]byte, rec.size)
	binary.LittleEndian.PutUint32(b, rec.h[0])
	binary.LittleEndian.PutUint32(b[4:], rec.h[1])
	for i := 8; i < len(b); i++ {
		b[i] = byte(rec.h[0]>>(i%4*8)) + byte(i)
	}
	return b
}

// pageBytes is a model page's records end to end.
func pageBytes(recs []modelRecord) []byte {
	var b []byte
	for _, r := range recs {
		b = append(b, modelRecordBytes(r)...)
	}
	return b
}

// idFieldStore is layout 10's: an id (23 bytes) as the field of the aggregate's record hash, made
// a hash table when the aggregate is (as apply.lua makes it), its 28-byte record the value. A call
// reads its ids (HMGET) and writes its records (HSET).
type idFieldStore struct {
	key   string
	added int64
}

// idOf is a record's id, as a layout-10 record hash's field.
func idOf(rec modelRecord) string {
	return fmt.Sprintf("conv-%010d/t-%05d", rec.h[0], rec.h[1]%100_000)
}

func (s *idFieldStore) reads(p redis.Pipeliner, recs []modelRecord) {
	ids := make([]string, len(recs))
	for i, r := range recs {
		ids[i] = idOf(r)
	}
	p.HMGet(context.Background(), s.key, ids...)
}

func (s *idFieldStore) check(t *testing.T, got []redis.Cmder, recs []modelRecord) {
	if vals := got[0].(*redis.SliceCmd).Val(); len(vals) != len(recs) || slices.ContainsFunc(vals, func(v any) bool { return v != nil }) {
		t.Fatalf("%s: a new id read as present", s.key)
	}
}

func (s *idFieldStore) add(p redis.Pipeliner, recs []modelRecord) {
	args := make([]any, 0, 2*len(recs))
	for _, r := range recs {
		args = append(args, idOf(r), modelRecordBytes(modelRecord{h: r.h, size: 28}))
	}
	p.HSet(context.Background(), s.key, args...)
	if s.added == 0 {
		makeHashTable(p, s.key)
	}
	s.added += int64(len(recs))
}

func (s *idFieldStore) finish(t *testing.T, rdb *redis.Client) {
	checkHashTable(t, rdb, s.key, s.added)
}

// bucketStore11 is layout 11's: records of 31 bytes end to end in buckets addressed by linear
// hashing, split past packLoad records a bucket on average, each bucket a field of the aggregate's
// hash. A call reads its records' buckets (HMGET) and writes every bucket it changed whole (HSET).
type bucketStore11 struct {
	key string
	m   placementModel
}

func newBucketStore11(key string) *bucketStore11 {
	return &bucketStore11{key, placementModel{capacity: math.MaxInt32, choices: 1, splitAt: packLoad * 31, pages: []modelPage{{}}}}
}

func (s *bucketStore11) reads(p redis.Pipeliner, recs []modelRecord) {
	var fields []string
	for _, b := range addressesOf(&s.m, recs) {
		fields = append(fields, packedName(b))
	}
	p.HMGet(context.Background(), s.key, fields...)
}

func (s *bucketStore11) check(t *testing.T, got []redis.Cmder, recs []modelRecord) {
	vals := got[0].(*redis.SliceCmd).Val()
	for i, b := range addressesOf(&s.m, recs) {
		v, _ := vals[i].(string)
		if want := pageBytes(s.m.pages[b].recs); v != string(want) {
			t.Fatalf("%s: bucket %d read %d bytes, holds %d", s.key, b, len(v), len(want))
		}
	}
}

func (s *bucketStore11) add(p redis.Pipeliner, recs []modelRecord) {
	s.m.changes = newPlacementChanges()
	for _, r := range recs {
		s.m.add(r)
	}
	changed := s.m.changes.rewritten
	for b := range s.m.changes.appendedFrom {
		changed[b] = true
	}
	var args []any
	for b := range changed {
		args = append(args, packedName(b), pageBytes(s.m.pages[b].recs))
	}
	p.HSet(context.Background(), s.key, args...)
	s.m.changes = nil
}

func (s *bucketStore11) finish(t *testing.T, rdb *redis.Client) {
	checkHashTable(t, rdb, s.key, int64(len(s.m.pages)))
}

// bucketKeyStore keeps an aggregate's records in buckets addressed by linear hashing as layout
// 11's are, split past bucketKeyLoad records a bucket on average, each bucket a key of its own: a
// small hash (a listpack) whose fields are the records' 16-byte fingerprints and whose values their
// other 15 bytes. A call reads its records' fields of each of their buckets (HMGET a bucket), and
// writes only the fields that changed: a new record's (HSET), and those a split moved (HDEL from
// the bucket split, HSET in the new one).
type bucketKeyStore struct {
	key    string
	m      placementModel
	stored map[int64]map[string]bool // the fields each bucket key holds, as written
}

const bucketKeyLoad = 32

func newBucketKeyStore(key string) *bucketKeyStore {
	return &bucketKeyStore{key: key, stored: map[int64]map[string]bool{},
		m: placementModel{capacity: math.MaxInt32, choices: 1, splitAt: bucketKeyLoad * 31, pages: []modelPage{{}}}}
}

func (s *bucketKeyStore) bucketKey(b int64) string { return s.key + ":" + strconv.FormatInt(b, 10) }

// fieldOf and valueOf split a model record of 31 bytes into its fingerprint and the rest.
func fieldOf(rec modelRecord) string { return string(modelRecordBytes(rec)[:16]) }
func valueOf(rec modelRecord) string { return string(modelRecordBytes(rec)[16:]) }

// byBucket groups recs by the bucket their first choice names, buckets in order of first use.
func (s *bucketKeyStore) byBucket(recs []modelRecord) ([]int64, map[int64][]string) {
	fields := map[int64][]string{}
	var order []int64
	for _, r := range recs {
		b := s.m.addr(r.h[0])
		if _, ok := fields[b]; !ok {
			order = append(order, b)
		}
		fields[b] = append(fields[b], fieldOf(r))
	}
	return order, fields
}

func (s *bucketKeyStore) reads(p redis.Pipeliner, recs []modelRecord) {
	order, fields := s.byBucket(recs)
	for _, b := range order {
		p.HMGet(context.Background(), s.bucketKey(b), fields[b]...)
	}
}

func (s *bucketKeyStore) check(t *testing.T, got []redis.Cmder, recs []modelRecord) {
	order, fields := s.byBucket(recs)
	if len(got) != len(order) {
		t.Fatalf("%s: %d reads for %d buckets", s.key, len(got), len(order))
	}
	for i, b := range order {
		if vals := got[i].(*redis.SliceCmd).Val(); len(vals) != len(fields[b]) || slices.ContainsFunc(vals, func(v any) bool { return v != nil }) {
			t.Fatalf("%s: a new record read as present in bucket %d", s.key, b)
		}
	}
}

func (s *bucketKeyStore) add(p redis.Pipeliner, recs []modelRecord) {
	ctx := context.Background()
	c := newPlacementChanges()
	s.m.changes = c
	for _, r := range recs {
		s.m.add(r)
	}
	s.m.changes = nil
	changed := c.rewritten
	for b := range c.appendedFrom {
		changed[b] = true
	}
	for b := range changed {
		held := s.stored[b]
		if held == nil {
			held = map[string]bool{}
			s.stored[b] = held
		}
		want := map[string]bool{}
		var set []any
		for _, r := range s.m.pages[b].recs {
			f := fieldOf(r)
			if want[f] = true; !held[f] {
				set = append(set, f, valueOf(r))
				held[f] = true
			}
		}
		var gone []string
		for f := range held {
			if !want[f] {
				gone = append(gone, f)
				delete(held, f)
			}
		}
		if len(gone) > 0 {
			p.HDel(ctx, s.bucketKey(b), gone...)
		}
		if len(set) > 0 {
			p.HSet(ctx, s.bucketKey(b), set...)
		}
	}
}

func (s *bucketKeyStore) finish(t *testing.T, rdb *redis.Client) {
	ctx := context.Background()
	p := rdb.Pipeline()
	for b := range s.m.pages {
		p.ObjectEncoding(ctx, s.bucketKey(int64(b)))
		p.HGetAll(ctx, s.bucketKey(int64(b)))
	}
	cmds, _ := p.Exec(ctx)
	for b, pg := range s.m.pages {
		enc, got := cmds[2*b].(*redis.StringCmd).Val(), cmds[2*b+1].(*redis.MapStringStringCmd).Val()
		if len(got) != len(pg.recs) || (len(got) > 0 && enc != "listpack") {
			t.Fatalf("%s: bucket %d is a %q of %d fields, its model %d", s.key, b, enc, len(got), len(pg.recs))
		}
		for _, r := range pg.recs {
			if v, ok := got[fieldOf(r)]; !ok || v != valueOf(r) {
				t.Fatalf("%s: bucket %d holds other than its model's record for a fingerprint", s.key, b)
			}
		}
	}
}

// inPlacePageStore is layout 11's buckets with their first whole records in place: pages of 248
// bytes, 66 a key made at its size (16 368 bytes, in jemalloc's 16 KiB class), split at a load of
// 1.0, a page's excess in its field of a hash of the aggregate's made a hash table from the start.
// The hash keeps a field of its own besides, so that it is never emptied (deleting a hash's last
// field deletes the hash, and it would come back a listpack).
// A call reads its records' pages apart (GETRANGE) and their fields by one HMGET; it writes a page
// only appended to from where it ended (SETRANGE), a page a split rewrote whole, and each changed
// field whole (HSET, or HDEL once empty).
type inPlacePageStore struct {
	key      string
	m        placementModel
	segments int
}

const inPlacePageBytes, inPlacePagesAKey = 248, 66

func newInPlacePageStore(key string) *inPlacePageStore {
	return &inPlacePageStore{key: key, m: placementModel{capacity: inPlacePageBytes, choices: 1, splitAt: inPlacePageBytes, pages: []modelPage{{}}}}
}

// where is the key and offset of page pg.
func (s *inPlacePageStore) where(pg int64) (string, int64) {
	return s.key + ":s" + strconv.FormatInt(pg/inPlacePagesAKey, 10), pg % inPlacePagesAKey * inPlacePageBytes
}

func (s *inPlacePageStore) reads(p redis.Pipeliner, recs []modelRecord) {
	ctx := context.Background()
	var fields []string
	for _, pg := range addressesOf(&s.m, recs) {
		k, off := s.where(pg)
		p.GetRange(ctx, k, off, off+inPlacePageBytes-1)
		fields = append(fields, packedName(pg))
	}
	p.HMGet(ctx, s.key+":o", fields...)
}

func (s *inPlacePageStore) check(t *testing.T, got []redis.Cmder, recs []modelRecord) {
	pages := addressesOf(&s.m, recs)
	over := got[len(pages)].(*redis.SliceCmd).Val()
	for i, pg := range pages {
		want := pageBytes(s.m.pages[pg].recs)
		if pg < int64(s.segments*inPlacePagesAKey) { // a page of a key not yet made reads empty
			want = append(want, make([]byte, inPlacePageBytes-len(want))...)
		}
		if v := got[i].(*redis.StringCmd).Val(); v != string(want) {
			t.Fatalf("%s: page %d read %d bytes other than it holds", s.key, pg, len(v))
		}
		v, _ := over[i].(string)
		if w := pageBytes(s.m.pages[pg].over); v != string(w) {
			t.Fatalf("%s: page %d's overflow read %d bytes, holds %d", s.key, pg, len(v), len(w))
		}
	}
}

func (s *inPlacePageStore) add(p redis.Pipeliner, recs []modelRecord) {
	ctx := context.Background()
	if s.segments == 0 {
		p.HSet(ctx, s.key+":o", hashTableField, "") // kept: the hash is never emptied
	}
	c := newPlacementChanges()
	s.m.changes = c
	for _, r := range recs {
		s.m.add(r)
	}
	s.m.changes = nil
	for ; s.segments*inPlacePagesAKey < len(s.m.pages); s.segments++ {
		k, _ := s.where(int64(s.segments * inPlacePagesAKey))
		p.Set(ctx, k, make([]byte, inPlacePagesAKey*inPlacePageBytes), 0)
	}
	for pg := range c.rewritten {
		b := pageBytes(s.m.pages[pg].recs)
		k, off := s.where(pg)
		p.SetRange(ctx, k, off, string(append(b, make([]byte, inPlacePageBytes-len(b))...)))
	}
	for pg, from := range c.appendedFrom {
		if !c.rewritten[pg] {
			k, off := s.where(pg)
			p.SetRange(ctx, k, off+int64(from), string(pageBytes(s.m.pages[pg].recs)[from:]))
		}
	}
	var set []any
	var gone []string
	for pg := range c.overflows {
		if over := s.m.pages[pg].over; len(over) > 0 {
			set = append(set, packedName(pg), pageBytes(over))
		} else {
			gone = append(gone, packedName(pg))
		}
	}
	if len(set) > 0 {
		p.HSet(ctx, s.key+":o", set...)
	}
	if len(gone) > 0 {
		p.HDel(ctx, s.key+":o", gone...)
	}
}

func (s *inPlacePageStore) finish(t *testing.T, rdb *redis.Client) {
	fields := int64(1) // hashTableField
	for _, pg := range s.m.pages {
		if len(pg.over) > 0 {
			fields++
		}
	}
	checkHashTable(t, rdb, s.key+":o", fields)
	if n := rdb.Exists(context.Background(), s.key+":s"+strconv.Itoa(s.segments-1)).Val(); n != 1 {
		t.Fatalf("%s: its last page key is missing", s.key)
	}
}

// TestGrowingStoreCostByHistory measures what Redis spends a new record in a store that starts
// empty and in one whose aggregates already hold records, as the prefill target compares them
// (docs/performance.md, "The fifteenth slice"), by how an aggregate keeps its records: layout 10's
// id fields, layout 11's packed buckets, layout 11's buckets with their first 248 bytes in place
// in pages (inPlacePageStore), and buckets as keys of their own (bucketKeyStore; "The nineteenth
// slice"), each kept by the commands a computing processor would send,
// splits and new keys included, beside a model that every read is checked against. 200
// aggregates; each gains 1 500 records while timed, in calls of 10 new records, a call's reads of
// every aggregate in one pipeline and then its writes; the empty store's aggregates start with
// none, the grown store's with REPEATRATE_GROWING_PREFILL records each (1 000, as the prefill
// target's), put by the same calls untimed. The two alternated twice, the lower Redis CPU of each
// kept; Redis's CPU a new record, grown ÷ empty, the commands a new record and the time inside each
// command reported. No script: what a layout's scripts add is not here. REPEATRATE_STRUCTURES=a,b
// keeps the structures whose names hold a or b; REPEATRATE_GROWING_WRITES_ONLY=1 leaves out the
// reads, as a processor that holds its aggregates' records sends none. It fails if a read finds other than the model
// holds (a new id present, a bucket, page or overflow other than its records), or a hash is not a
// hash table of the fields its model says, or a bucket key not a listpack of exactly its model's
// records (the first aggregate's after its first call, every aggregate's after the last).
//
//	REPEATRATE_APPLY_MEMORY_REDIS=127.0.0.1:16479 go test -count=1 -run TestGrowingStoreCostByHistory -v -timeout 60m ./aggregator
func TestGrowingStoreCostByHistory(t *testing.T) {
	rdb := redisOfItsOwn(t)
	ctx := context.Background()
	const aggregates, perCall, timed = 200, 10, 1500
	prefill := 1000
	if v := os.Getenv("REPEATRATE_GROWING_PREFILL"); v != "" {
		var err error
		if prefill, err = strconv.Atoi(v); err != nil || prefill < perCall {
			t.Fatalf("REPEATRATE_GROWING_PREFILL=%q: want a number of records of at least %d", v, perCall)
		}
	}
	// A processor that holds what its calls wrote (layout 11's bucket cache) reads nothing before
	// a call's writes: REPEATRATE_GROWING_WRITES_ONLY set sends only the writes (and checks only
	// what finish checks).
	writesOnly := os.Getenv("REPEATRATE_GROWING_WRITES_ONLY") != ""
	type kind struct {
		name string
		open func(key string) growingStore
	}
	kinds := []kind{
		{"id fields (layout 10)", func(k string) growingStore { return &idFieldStore{key: k + ":r"} }},
		{"packed buckets (layout 11)", func(k string) growingStore { return newBucketStore11(k + ":e") }},
		{"pages in place, overflows in a hash table", func(k string) growingStore { return newInPlacePageStore(k + ":p") }},
		{"buckets as keys of their own (listpacks of ~32)", func(k string) growingStore { return newBucketKeyStore(k + ":b") }},
	}
	kinds = keepStructures(kinds, func(k kind) string { return k.name })
	type figures struct {
		cpu, commands float64
		usec          map[string]float64 // time inside each command a new record
	}
	measure := func(open func(string) growingStore, before int) figures {
		prefix := fmt.Sprintf("growing-%d", time.Now().UnixNano())
		defer deleteUnder(ctx, rdb, prefix)
		r := rand.New(rand.NewPCG(uint64(before), 11))
		stores := make([]growingStore, aggregates)
		for a := range stores {
			stores[a] = open(layoutTag(prefix, a))
		}
		recs := make([][]modelRecord, aggregates)
		run := func(records int) {
			for call := range records / perCall {
				reads := rdb.Pipeline()
				ends := make([]int, aggregates)
				for a := range stores {
					recs[a] = recs[a][:0]
					for range perCall {
						recs[a] = append(recs[a], modelRecord{h: [2]uint32{r.Uint32(), r.Uint32()}, size: 31})
					}
					if !writesOnly {
						stores[a].reads(reads, recs[a])
					}
					ends[a] = reads.Len()
				}
				if !writesOnly {
					cmds, err := reads.Exec(ctx)
					if err != nil {
						t.Fatal(err)
					}
					start := 0
					for a := range stores {
						stores[a].check(t, cmds[start:ends[a]], recs[a])
						start = ends[a]
					}
				}
				writes := rdb.Pipeline()
				for a := range stores {
					stores[a].add(writes, recs[a])
				}
				if _, err := writes.Exec(ctx); err != nil {
					t.Fatal(err)
				}
				if call == 0 { // a young aggregate's hashes are hash tables already
					stores[0].finish(t, rdb)
				}
			}
		}
		run(before)
		c0, err := readCost(ctx, rdb)
		if err != nil {
			t.Fatal(err)
		}
		run(timed)
		c1, err := readCost(ctx, rdb)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range stores {
			s.finish(t, rdb)
		}
		commands := 0.0
		for k, v := range c1.calls {
			if k != "info" {
				commands += float64(v - c0.calls[k])
			}
		}
		n := float64(aggregates * timed)
		usec := map[string]float64{}
		for k, v := range c1.usec {
			if k != "info" && v > c0.usec[k] {
				usec[k] = float64(v-c0.usec[k]) / n
			}
		}
		return figures{(c1.cpu - c0.cpu) * 1e6 / n, commands / n, usec}
	}
	for _, k := range kinds {
		var empty, grown figures
		for i := range 2 {
			if e := measure(k.open, 0); i == 0 || e.cpu < empty.cpu {
				empty = e
			}
			if g := measure(k.open, prefill); i == 0 || g.cpu < grown.cpu {
				grown = g
			}
		}
		t.Logf("%-45s Redis CPU µs a new record%s, empty / %d records an aggregate before: %5.2f / %5.2f (%.2f); commands a record %.2f / %.2f",
			k.name, map[bool]string{true: " (writes only)"}[writesOnly], prefill, empty.cpu, grown.cpu, grown.cpu/empty.cpu, empty.commands, grown.commands)
		var by []string
		for c, g := range grown.usec {
			by = append(by, fmt.Sprintf("%s %.2f / %.2f", c, empty.usec[c], g))
		}
		slices.Sort(by)
		t.Logf("%-45s µs inside each command a new record, empty / grown: %s", "", strings.Join(by, ", "))
	}
}
