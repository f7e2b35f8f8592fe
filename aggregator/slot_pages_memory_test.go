package aggregator

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestSlotPagesMemoryUnderLinearHashing computes, without Redis, what a record would take in a
// layout that writes each record in place, in a slot of a page of fixed size (docs/performance.md,
// "The fourteenth slice"): records of 32 bytes in pages of 8 or 16 slots, the pages addressed by
// linear hashing as layout 11's buckets are (a fingerprint's first 32 bits; the page at the split
// pointer splits once the records pass a load factor of the slots), every page in keys of as many
// pages as fill jemalloc's 16 KiB class, each key costing its keyspace entry, name and expiry
// besides (about 140 bytes), and a page's records past its slots kept either in overflow pages of
// the same size or packed end to end in a field of their own (about 48 bytes besides). Linear
// hashing leaves the pages behind the split pointer about half as full as those ahead, so fixed
// pages hold empty slots where layout 11's buckets, strings of any length, hold none. It reports
// bytes a record (records only: no index entry, hours or head), both ways, and the share of
// records past their page, by load factor and aggregate size; it checks that every record lies in
// the page its address names (packedAddr, layout 11's own) and that the pages are as many as the
// load factor makes them. A fraction of a second. What it leaves out favours the slots: every
// record takes 32 bytes (layout 11's with a seq or a horizon take 38 or 45), records are only
// added (no expiry, no merges), and the overflow fields' values and their hash are not rounded to
// jemalloc's classes; only the last key, charged whole, counts against them.
func TestSlotPagesMemoryUnderLinearHashing(t *testing.T) {
	const slotBytes = 32
	sizes := []int{1_000, 10_000, 100_000, 300_000}
	for _, slots := range []int{8, 16} {
		for _, load := range []float64{0.6, 0.75, 0.85, 0.9, 1, 1.2} {
			r := rand.New(rand.NewPCG(uint64(slots), uint64(load*100)))
			pages := [][]uint32{nil}
			level, split := int64(0), int64(0)
			line := ""
			for n, next := 0, 0; next < len(sizes); {
				x := r.Uint32()
				b := int64(x) & (1<<level - 1)
				if b < split {
					b = int64(x) & (1<<(level+1) - 1)
				}
				pages[b] = append(pages[b], x)
				n++
				for float64(n) > load*float64(slots*len(pages)) {
					var stay, move []uint32
					for _, y := range pages[split] {
						if y>>level&1 == 1 {
							move = append(move, y)
						} else {
							stay = append(stay, y)
						}
					}
					pages[split] = stay
					pages = append(pages, move)
					if split++; split == 1<<level {
						level, split = level+1, 0
					}
				}
				if n != sizes[next] {
					continue
				}
				if fill := load * float64(slots); float64(n) <= fill*float64(len(pages)-1) || float64(n) > fill*float64(len(pages)) {
					t.Fatalf("%d records in %d pages of %d slots at load %.2f", n, len(pages), slots, load)
				}
				overflowPages, overflowRecords, overflowFields := 0, 0, 0
				for p, recs := range pages {
					for _, y := range recs {
						if a := packedAddr(prefixOf(y), level, split); a != int64(p) {
							t.Fatalf("a record at page %d addresses page %d (level %d, split %d)", p, a, level, split)
						}
					}
					if over := len(recs) - slots; over > 0 {
						overflowRecords += over
						overflowPages += (over + slots - 1) / slots
						overflowFields++
					}
				}
				main := float64(segmentBytes(len(pages), slots*slotBytes))
				inPages := main + float64(segmentBytes(overflowPages, slots*slotBytes))
				// Or a page's excess packed end to end in a field of its own, as layout 11 keeps a
				// bucket (a dict entry and an sds besides its bytes: about 48).
				packed := main + float64(overflowFields*48+overflowRecords*slotBytes)
				line += " " + formatSlotPages(n, inPages/float64(n), packed/float64(n), float64(overflowRecords)/float64(n))
				next++
			}
			t.Logf("%2d slots a page, load %.2f:%s", slots, load, line)
		}
	}
}

// formatSlotPages is one aggregate size's figures as TestSlotPagesMemoryUnderLinearHashing logs them.
func formatSlotPages(n int, inPages, packed, overflow float64) string {
	return fmt.Sprintf("%dk %.1f B, %.1f B with overflow packed (%.1f %% overflow);", n/1000, inPages, packed, 100*overflow)
}
