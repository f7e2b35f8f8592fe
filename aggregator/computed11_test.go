package aggregator

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// TestComputedPathReadsDaysAsWritten: every day field appendDay writes reads back as written,
// and a field apply.lua refuses (its dayOf and parseHour) is refused here too, so that the
// processor never computes a call apply.lua would fail.
func TestComputedPathReadsDaysAsWritten(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 24))
	const d = 20513
	for range 20000 {
		var hours [24]computedHour
		for hk := range hours {
			if r.IntN(3) > 0 {
				continue
			}
			h := &hours[hk]
			for j := range h.c {
				h.c[j] = []int64{0, 1, 255, 256, 65535, 65536, 1<<24 - 1, 1 << 24, 1<<40 - 1}[r.IntN(9)]
			}
			if h.c == [3]int64{} {
				h.c[r.IntN(3)] = 1
			}
			start := (d*24 + int64(hk)) * hourUS
			a := r.Int64N(hourUS)
			h.a, h.b, h.bounded, h.loose = start+a, start+a+r.Int64N(hourUS-a), true, r.IntN(2) == 0
		}
		v := string(appendDay(nil, d, &hours))
		if v == "" {
			continue
		}
		var got [24]computedHour
		if !parseDay(v, d, &got) || got != hours {
			t.Fatalf("day %q read back as %+v, want %+v", v, got, hours)
		}
	}
	one := func(hk, code byte, c [3]int64, a, b int64) string {
		buf := []byte{hk | code<<6}
		for _, n := range c {
			buf = appendLittleEndian(buf, n, dayWidths[code])
		}
		return string(appendLittleEndian(appendLittleEndian(buf, a, 4), b, 4))
	}
	good := one(3, 0, [3]int64{1, 2, 3}, 5, 9)
	var hours [24]computedHour
	if !parseDay(good, d, &hours) {
		t.Fatal("a day of one hour refused")
	}
	for name, v := range map[string]string{
		"empty":               "",
		"hour 24":             one(24, 0, [3]int64{1, 0, 0}, 0, 0),
		"hours out of order":  one(5, 0, [3]int64{1, 0, 0}, 0, 0) + good,
		"an hour twice":       good + good,
		"cut short":           good[:len(good)-1],
		"stray bytes":         good + "x",
		"no counts":           one(3, 0, [3]int64{}, 5, 9),
		"counts wider":        one(3, 1, [3]int64{1, 2, 3}, 5, 9),
		"bounds crossed":      one(3, 0, [3]int64{1, 2, 3}, 9, 5),
		"bound past the hour": one(3, 0, [3]int64{1, 2, 3}, 5, hourUS),
	} {
		if parseDay(v, d, &hours) {
			t.Errorf("%s: day %q read", name, v)
		}
	}
}

// TestComputedPathReadsOnlyBucketsAndShapesTheStoreLeaves: a bucket that does not split into
// whole records of known tags, and a shape packed_records.lua refuses, are refused.
func TestComputedPathReadsOnlyBucketsAndShapesTheStoreLeaves(t *testing.T) {
	fp := strings.Repeat("f", 16)
	rec := string(append([]byte{1}, make([]byte, 14)...))
	for name, tc := range map[string]struct {
		v    string
		want bool
	}{
		"empty":              {"", true},
		"two records":        {fp + rec + fp + rec, true},
		"cut short":          {fp + rec[:10], false},
		"a fingerprint only": {fp, false},
		"an unknown tag":     {fp + "\x04" + rec[1:], false},
		"stray bytes":        {fp + rec + "x", false},
	} {
		if validBucket(tc.v) != tc.want {
			t.Errorf("%s: validBucket = %v, want %v", name, !tc.want, tc.want)
		}
	}
	head := func(l, p, n int64) string {
		b := append(make([]byte, 0, headBytes11), 11, 3)
		for range 21 {
			b = appendLittleEndian(b, 1, 7)
		}
		for _, x := range []int64{l, p, n} {
			b = appendLittleEndian(b, x, 7)
		}
		return string(b)
	}
	for _, tc := range []struct {
		l, p, n int64
		want    bool
	}{
		{0, 0, 0, true}, {0, 0, 8, true}, {0, 0, 9, false}, {1, 0, 8, true}, {1, 0, 3, false},
		{1, 1, 12, true}, {1, 2, 12, false}, {3, 5, 104, true}, {3, 5, 105, false}, {3, 5, 47, false},
		{32, 0, 1 << 35, false},
	} {
		if _, _, _, ok := packedShape(head(tc.l, tc.p, tc.n)); ok != tc.want {
			t.Errorf("shape %d,%d,%d: accepted %v, want %v", tc.l, tc.p, tc.n, ok, tc.want)
		}
	}
	if _, _, _, ok := packedShape(head(0, 0, 0)[1:]); ok {
		t.Error("a head cut short accepted")
	}
}
