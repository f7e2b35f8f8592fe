package aggregator

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestRecordStructureCostByAggregateSize measures what Redis spends to look up and insert a new
// record in an aggregate of 600 records and in one of 24 000, by how the aggregate holds its
// records, with no script in between but in the variants that say so: the commands a processor
// that computes its calls would send (docs/performance.md, "The fourteenth slice"). In layout 11
// the same calls cost Redis about twice as much in aggregates of 24 000 as in young ones, layout
// 10's about 1.2 times, and this tells apart what a structure costs from what the scripts add:
//
//   - id fields: layout 10's, a 22-byte id as the field of one hash, its 28-byte record the value;
//     a call reads its ids (HMGET) and writes its records (HSET).
//   - packed buckets: layout 11's, 8 records of 31 bytes concatenated in a field of one hash; a
//     call reads the buckets its records fall in (HMGET) and writes each back whole (HSET).
//   - slots in pages: 256-byte pages of 8 slots of 32 bytes in one string made at its size (SET),
//     6 slots of each page used; a record reads its page (GETRANGE) and writes its slot (SETRANGE),
//     the string never growing. Not a layout: how the split and the expiry of records would go is
//     not built, and a page never fills: a new record overwrites one of its two free slots.
//     Variants: a call's slots written by one script (as store.lua would write them, without its
//     checks), and the pages kept in keys of 63 pages made at their size (Redis grows a string
//     written past its end greedily), read apart or by a script; and those keys with overflows,
//     as linear hashing leaves fixed pages: every other page's excess in a field of a hash of the
//     aggregate's (a hash table), read by one HMGET a call, and every fifth new record written there
//     whole.
//
// 200 aggregates, 30 calls of 10 new records each, the calls' reads of every aggregate in one
// pipeline and then their writes, as a processor's batch; the two sizes alternated twice and the
// lower Redis CPU of each kept. Buckets never split here, so a young aggregate's are read fuller
// than a grown one's, and a young aggregate grows by half while timed. It reports Redis's CPU
// (used_cpu) a new record, its commands a new record (those scripts call among them), and the
// bytes a record of the grown store takes (records only: no index, head or hours). It fails if a
// read does not find what the structure holds: a new id present, a bucket shorter than 8 records,
// a page not whole, a script reading other than a page a record, or an overflow not found.
// REPEATRATE_STRUCTURE_SIZES=young,grown sets the two sizes, REPEATRATE_STRUCTURES=a,b keeps the
// structures whose names hold a or b.
//
//	REPEATRATE_APPLY_MEMORY_REDIS=127.0.0.1:16479 go test -count=1 -run TestRecordStructureCostByAggregateSize -v -timeout 30m ./aggregator
func TestRecordStructureCostByAggregateSize(t *testing.T) {
	rdb := redisOfItsOwn(t)
	ctx := context.Background()
	const aggregates, perCall, calls = 200, 10, 30
	young, grown := 600, 24_000
	if v := os.Getenv("REPEATRATE_STRUCTURE_SIZES"); v != "" { // young,grown
		// At least 60 records, so that every structure has some buckets and pages (of 8 and 6).
		if _, err := fmt.Sscanf(v, "%d,%d", &young, &grown); err != nil || young < 60 || grown <= young {
			t.Fatalf("REPEATRATE_STRUCTURE_SIZES=%q: want young,grown, 60 <= young < grown", v)
		}
	}
	const recordBytes, bucketRecords, pageSlots, pageUsed, slotBytes = 31, 8, 8, 6, 32
	type structure struct {
		name  string
		fill  func(p redis.Pipeliner, key string, n int, r *rand.Rand)
		reads func(p redis.Pipeliner, key string, n int, at []int)
		write func(p redis.Pipeliner, key string, n int, r *rand.Rand, at []int, got []redis.Cmder)
	}
	randomBytes := func(r *rand.Rand, n int) string {
		b := make([]byte, n)
		for i := 0; i < n; i += 8 {
			var w [8]byte
			binary.LittleEndian.PutUint64(w[:], r.Uint64())
			copy(b[i:], w[:])
		}
		return string(b)
	}
	id := func(a, i int) string { return fmt.Sprintf("conv-%06d/turn-%05d", a, i) } // 22 bytes
	// place is where record i falls among n places (buckets, pages): a hash of its number.
	place := func(i, n int) int { return int(uint64(i) * 0x9E3779B97F4A7C15 >> 32 % uint64(n)) }
	// page is the page record i falls in, in a store of n records; free is the offset in its page of
	// the free slot the k-th record of a call writes (one of the two each page leaves free).
	page := func(i, n int) int { return place(i, n/pageUsed) }
	free := func(k int) int64 { return int64(pageUsed+k%(pageSlots-pageUsed)) * slotBytes }
	// checkPages fails the test unless every page read is whole.
	checkPages := func(key string, got []redis.Cmder) {
		for _, c := range got {
			if v := c.(*redis.StringCmd).Val(); len(v) != pageSlots*slotBytes {
				t.Fatalf("%s: a page read %d bytes", key, len(v))
			}
		}
	}
	structures := []structure{
		{
			name: "id fields (layout 10)",
			fill: func(p redis.Pipeliner, key string, n int, r *rand.Rand) {
				for i := 0; i < n; i += 1000 {
					var args []any
					for j := i; j < min(i+1000, n); j++ {
						args = append(args, id(0, j), randomBytes(r, 28))
					}
					p.HSet(ctx, key, args...)
				}
				makeHashTable(p, key) // as apply.lua makes it, at any size
			},
			reads: func(p redis.Pipeliner, key string, n int, at []int) {
				var ids []string
				for _, i := range at {
					ids = append(ids, id(1, i))
				}
				p.HMGet(ctx, key, ids...)
			},
			write: func(p redis.Pipeliner, key string, n int, r *rand.Rand, at []int, got []redis.Cmder) {
				if vals := got[0].(*redis.SliceCmd).Val(); len(vals) != len(at) || slices.ContainsFunc(vals, func(v any) bool { return v != nil }) {
					t.Fatalf("%s: a new id read as present: %v", key, vals)
				}
				var args []any
				for _, i := range at {
					args = append(args, id(1, i), randomBytes(r, 28))
				}
				p.HSet(ctx, key, args...)
			},
		},
		{
			name: "packed buckets (layout 11)",
			fill: func(p redis.Pipeliner, key string, n int, r *rand.Rand) {
				nb := n / bucketRecords
				for b := 0; b < nb; b += 500 {
					var args []any
					for j := b; j < min(b+500, nb); j++ {
						args = append(args, packedName(int64(j)), randomBytes(r, bucketRecords*recordBytes))
					}
					p.HSet(ctx, key, args...)
				}
			},
			reads: func(p redis.Pipeliner, key string, n int, at []int) {
				var fields []string
				for _, i := range at {
					fields = append(fields, packedName(int64(place(i, n/bucketRecords))))
				}
				p.HMGet(ctx, key, fields...)
			},
			write: func(p redis.Pipeliner, key string, n int, r *rand.Rand, at []int, got []redis.Cmder) {
				vals := got[0].(*redis.SliceCmd).Val()
				var args []any
				for k, i := range at {
					old, _ := vals[k].(string)
					if len(old) < bucketRecords*recordBytes {
						t.Fatalf("%s: bucket %d read %d bytes", key, place(i, n/bucketRecords), len(old))
					}
					args = append(args, packedName(int64(place(i, n/bucketRecords))), old+randomBytes(r, recordBytes))
				}
				p.HSet(ctx, key, args...)
			},
		},
		{
			name: "slots in pages of a string",
			fill: func(p redis.Pipeliner, key string, n int, r *rand.Rand) {
				pages := n / pageUsed
				var b strings.Builder
				for range pages {
					b.WriteString(randomBytes(r, pageUsed*slotBytes))
					b.WriteString(strings.Repeat("\x00", (pageSlots-pageUsed)*slotBytes))
				}
				p.Set(ctx, key, b.String(), 0)
			},
			reads: func(p redis.Pipeliner, key string, n int, at []int) {
				for _, i := range at {
					off := int64(page(i, n)) * pageSlots * slotBytes
					p.GetRange(ctx, key, off, off+pageSlots*slotBytes-1)
				}
			},
			write: func(p redis.Pipeliner, key string, n int, r *rand.Rand, at []int, got []redis.Cmder) {
				checkPages(key, got)
				for k, i := range at {
					off := int64(page(i, n))*pageSlots*slotBytes + free(k)
					p.SetRange(ctx, key, off, randomBytes(r, slotBytes))
				}
			},
		},
	}
	// The same pages, a call's slots written by one script (as store.lua would write them, but
	// without its checks): KEYS[1] the string, ARGV offset, slot pairs.
	setSlots := redis.NewScript(`for i = 1, #ARGV, 2 do redis.call('SETRANGE', KEYS[1], ARGV[i], ARGV[i + 1]) end return 1`)
	pages := structures[2]
	pages.name = "slots in pages, script writes"
	pages.write = func(p redis.Pipeliner, key string, n int, r *rand.Rand, at []int, got []redis.Cmder) {
		checkPages(key, got)
		var args []any
		for k, i := range at {
			off := int64(page(i, n))*pageSlots*slotBytes + free(k)
			args = append(args, off, randomBytes(r, slotBytes))
		}
		setSlots.EvalSha(ctx, p, []string{key}, args...)
	}
	structures = append(structures, pages)
	// The same pages in keys of 63 pages each, made at their size (16 128 bytes, in jemalloc's
	// 16 KiB class), so that a store grows a key at a time and never past a key's end; a call's
	// pages read by one script and its slots written by another. KEYS a record's segment each;
	// ARGV its page's offset (getPages), or its slot's offset and the slot (setSegmentSlots).
	const segmentPages = 63
	getPages := redis.NewScript(`local out = {}
for i = 1, #KEYS do out[i] = redis.call('GETRANGE', KEYS[i], ARGV[i], ARGV[i] + 255) end
return out`)
	setSegmentSlots := redis.NewScript(`for i = 1, #KEYS do redis.call('SETRANGE', KEYS[i], ARGV[2 * i - 1], ARGV[2 * i]) end return 1`)
	segment := func(key string, page int) (string, int64) {
		return key + ":" + strconv.Itoa(page/segmentPages), int64(page%segmentPages) * pageSlots * slotBytes
	}
	// writeSegmentSlots writes a call's new records, each in a free slot of its page, by one script.
	writeSegmentSlots := func(p redis.Pipeliner, key string, n int, r *rand.Rand, at []int) {
		var keys []string
		var args []any
		for k, i := range at {
			sk, off := segment(key, page(i, n))
			keys = append(keys, sk)
			args = append(args, off+free(k), randomBytes(r, slotBytes))
		}
		setSegmentSlots.EvalSha(ctx, p, keys, args...)
	}
	structures = append(structures, structure{
		name: "slots in pages in keys of 63 pages, scripts read and write",
		fill: func(p redis.Pipeliner, key string, n int, r *rand.Rand) {
			pages := n / pageUsed
			for first := 0; first < pages; first += segmentPages {
				var b strings.Builder
				for pg := first; pg < first+segmentPages; pg++ {
					if pg < pages {
						b.WriteString(randomBytes(r, pageUsed*slotBytes))
						b.WriteString(strings.Repeat("\x00", (pageSlots-pageUsed)*slotBytes))
					} else {
						b.WriteString(strings.Repeat("\x00", pageSlots*slotBytes))
					}
				}
				k, _ := segment(key, first)
				p.Set(ctx, k, b.String(), 0)
			}
		},
		reads: func(p redis.Pipeliner, key string, n int, at []int) {
			var keys []string
			var args []any
			for _, i := range at {
				k, off := segment(key, page(i, n))
				keys, args = append(keys, k), append(args, off)
			}
			getPages.EvalSha(ctx, p, keys, args...)
		},
		write: func(p redis.Pipeliner, key string, n int, r *rand.Rand, at []int, got []redis.Cmder) {
			read, _ := got[0].(*redis.Cmd).Slice()
			if len(read) != len(at) {
				t.Fatalf("%s: %d pages read for %d records", key, len(read), len(at))
			}
			for _, v := range read {
				if v, _ := v.(string); len(v) != pageSlots*slotBytes {
					t.Fatalf("%s: a page read %d bytes", key, len(v))
				}
			}
			writeSegmentSlots(p, key, n, r, at)
		},
	})
	// The same, each page read by a command of its own (pipelined), not through a script.
	segments := structures[len(structures)-1]
	segments.name = "slots in pages in keys of 63 pages, reads apart, script writes"
	segments.reads = func(p redis.Pipeliner, key string, n int, at []int) {
		for _, i := range at {
			k, off := segment(key, page(i, n))
			p.GetRange(ctx, k, off, off+pageSlots*slotBytes-1)
		}
	}
	segments.write = func(p redis.Pipeliner, key string, n int, r *rand.Rand, at []int, got []redis.Cmder) {
		checkPages(key, got)
		writeSegmentSlots(p, key, n, r, at)
	}
	structures = append(structures, segments)
	// The same pages with overflows, as linear hashing leaves fixed pages (TestPagePlacementMemory:
	// at a load of about 1, a fifth of the records lie in a field of their page's, and half the
	// lookups of new records must read one): every other page's overflow holds a record in a field
	// of the aggregate's overflow hash (KEY:o), a call reads its pages apart and their overflow
	// fields by one HMGET, and every fifth new record goes to its page's overflow (an HSET of the
	// field, read and written whole), the others to a free slot of their page by one script.
	structures = append(structures, structure{
		name: "slots in pages in keys of 63 pages, with overflows",
		fill: func(p redis.Pipeliner, key string, n int, r *rand.Rand) {
			segments.fill(p, key, n, r)
			var args []any
			for pg := 0; pg < n/pageUsed; pg += 2 {
				if args = append(args, packedName(int64(pg)), randomBytes(r, recordBytes)); len(args) == 1000 {
					p.HSet(ctx, key+":o", args...)
					args = args[:0]
				}
			}
			if len(args) > 0 {
				p.HSet(ctx, key+":o", args...)
			}
			makeHashTable(p, key+":o")
		},
		reads: func(p redis.Pipeliner, key string, n int, at []int) {
			segments.reads(p, key, n, at)
			var fields []string
			for _, i := range at {
				fields = append(fields, packedName(int64(page(i, n))))
			}
			p.HMGet(ctx, key+":o", fields...)
		},
		write: func(p redis.Pipeliner, key string, n int, r *rand.Rand, at []int, got []redis.Cmder) {
			checkPages(key, got[:len(at)])
			over := got[len(at)].(*redis.SliceCmd).Val()
			var inPages []int
			fields := map[string]any{} // two of a call's records may share a page
			for k, i := range at {
				if k%5 != 0 {
					inPages = append(inPages, i)
					continue
				}
				f := packedName(int64(page(i, n)))
				old, ok := fields[f].(string)
				if !ok {
					old, _ = over[k].(string)
				}
				if len(old)%recordBytes != 0 || page(i, n)%2 == 0 && len(old) == 0 {
					t.Fatalf("%s: page %d's overflow read %d bytes", key, page(i, n), len(old))
				}
				fields[f] = old + randomBytes(r, recordBytes)
			}
			writeSegmentSlots(p, key, n, r, inPages)
			p.HSet(ctx, key+":o", fields)
		},
	})
	structures = keepStructures(structures, func(s structure) string { return s.name })
	for _, s := range []*redis.Script{setSlots, getPages, setSegmentSlots} {
		if err := s.Load(ctx, rdb).Err(); err != nil {
			t.Fatal(err)
		}
	}
	type figures struct{ cpu, commands, bytes float64 }
	measure := func(s structure, size int) figures {
		prefix := fmt.Sprintf("structure-%d", time.Now().UnixNano())
		defer deleteUnder(ctx, rdb, prefix)
		r := rand.New(rand.NewPCG(uint64(size), 7))
		key := func(a int) string { return layoutTag(prefix, a) + ":r" }
		before := usedMemory(ctx, rdb)
		for a := range aggregates {
			p := rdb.Pipeline()
			s.fill(p, key(a), size, r)
			if _, err := p.Exec(ctx); err != nil {
				t.Fatal(err)
			}
		}
		held := usedMemory(ctx, rdb) - before
		c0, err := readCost(ctx, rdb)
		if err != nil {
			t.Fatal(err)
		}
		at := make([][]int, aggregates)
		for c := range calls {
			reads := rdb.Pipeline()
			for a := range aggregates {
				at[a] = at[a][:0]
				for k := range perCall { // new records, numbered past the fill's
					at[a] = append(at[a], size+c*perCall+k)
				}
				s.reads(reads, key(a), size, at[a])
			}
			cmds, err := reads.Exec(ctx)
			if err != nil {
				t.Fatal(err)
			}
			per := len(cmds) / aggregates
			writes := rdb.Pipeline()
			for a := range aggregates {
				s.write(writes, key(a), size, r, at[a], cmds[a*per:(a+1)*per])
			}
			if _, err := writes.Exec(ctx); err != nil {
				t.Fatal(err)
			}
		}
		c1, err := readCost(ctx, rdb)
		if err != nil {
			t.Fatal(err)
		}
		n := float64(aggregates * calls * perCall)
		commands := 0.0
		for k, v := range c1.calls {
			if k != "info" {
				commands += float64(v - c0.calls[k])
			}
		}
		return figures{(c1.cpu - c0.cpu) * 1e6 / n, commands / n, held / float64(aggregates*size)}
	}
	for _, s := range structures {
		var y, g figures
		for range 2 { // alternated, the lower of each kept
			fy, fg := measure(s, young), measure(s, grown)
			if y.cpu == 0 || fy.cpu < y.cpu {
				y = fy
			}
			if g.cpu == 0 || fg.cpu < g.cpu {
				g = fg
			}
		}
		t.Logf("%-60s Redis CPU µs a new record in %d / %d records %5.2f / %5.2f (%.2f), %.1f commands a record; %5.1f bytes a record held",
			s.name, young, grown, y.cpu, g.cpu, g.cpu/y.cpu, g.commands, g.bytes)
	}
}

// keepStructures is those of all whose names hold any of REPEATRATE_STRUCTURES's comma-separated
// words, or all when it is unset: the measurements that take minutes a structure run those asked.
func keepStructures[T any](all []T, name func(T) string) []T {
	only := os.Getenv("REPEATRATE_STRUCTURES")
	if only == "" {
		return all
	}
	return slices.DeleteFunc(all, func(x T) bool {
		return !slices.ContainsFunc(strings.Split(only, ","), func(w string) bool { return strings.Contains(name(x), w) })
	})
}
