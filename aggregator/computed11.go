package aggregator

import (
	"strconv"
)

// Layout 11 on the computed path: the same calls as layout 10's (computed.go), with what layout 11
// keeps differently computed as apply.lua and packed_records.lua compute it: the head's byte 11,
// the store's shape and its write count after the 21 numbers, a day's hours in one field, binary
// records in the packed store's buckets, and index entries of 4-byte fingerprint prefixes. The
// head names the buckets a call reads (its shape): the processor reads them with the state under
// the shape it expects (shapeCache), and again in a second round trip when the head says another.
// store.lua checks the state read, and the buckets read under a head without a write count; under
// one with it, the buckets' write stamp (bucketsWritten), read with them, stands for them.

const (
	// headBytes11 is a layout-11 head of 24 numbers, written before the store's write count:
	// the byte 11, the group span, the 21 numbers of layout 10's head and the store's shape.
	headBytes11 = 2 + 24*7
	// headBytesWC is a layout-11 head that ends with the store's write count, which every writer
	// of a bucket raises (apply.lua, store.lua through computeCall). A build before it refuses
	// such a head, and every script of this one that writes a bucket makes a new write stamp
	// (bucketsWritten), so under it the stamp stands for the buckets.
	headBytesWC = headBytes11 + 7
	// bucketsWritten is the packed store's field that holds the buckets' write stamp, which every
	// script of this build that writes a bucket makes new (one more, or Redis's clock in µs when
	// greater). Read in the same command as the buckets, it is what store.lua checks in their
	// place under a head with the count. Bucket fields are 1 to 4 bytes: it is no bucket's name.
	bucketsWritten = "written"
	// bucketsToken is the packed store's field that holds the random token of the computed call
	// that last wrote its buckets: store.lua writes it with them and checks it with the stamp; no
	// other script reads or writes it. A write Redis lost takes its token with it and no later
	// write makes that token again, so a token and the stamp its call made stand for the buckets
	// that call left whatever Redis's clock says since (a clock behind the stamps makes them one
	// more each, and after a loss another writer's stamp can be the lost one's); a stamp
	// apply.lua made beside an older call's token does not. 6 bytes: no bucket's name.
	bucketsToken = "wtoken"
	packLoad     = 8 // packed_records.lua's PACK_LOAD: records per bucket at which one splits
)

// packedShape returns the store's shape (level, split pointer, records) a layout-11 head keeps, or
// false for a shape packed_records.lua would refuse.
func packedShape(head string) (l, p, n int64, ok bool) {
	if !isHead11(head) {
		return 0, 0, 0, false
	}
	l, p, n = littleEndian(head[2+21*7:9+21*7]), littleEndian(head[2+22*7:9+22*7]), littleEndian(head[2+23*7:9+23*7])
	size := int64(1) << min(l, 62)
	if l > 31 || p >= size || n > packLoad*(size+p) || (size+p > 1 && 2*n < packLoad*(size+p-1)) {
		return 0, 0, 0, false
	}
	return l, p, n, true
}

// cachedMinute is the minute a layout-11 head's window sums are for, or -1 when head is none or
// holds no such minute.
func cachedMinute(head string) int64 {
	if !isHead11(head) {
		return -1
	}
	return littleEndian(head[2+4*7:9+4*7]) - 1
}

// isHead11 reports whether head is a layout-11 head, with or without the store's write count.
func isHead11(head string) bool {
	return (len(head) == headBytes11 || len(head) == headBytesWC) && head[0] == 11
}

// packedAddr is a fingerprint's bucket under level l and split pointer p: its first 4 bytes as a
// little-endian number x, x mod 2^l, or x mod 2^(l+1) when that is below p.
func packedAddr(fp string, l, p int64) int64 {
	x := int64(fp[0]) | int64(fp[1])<<8 | int64(fp[2])<<16 | int64(fp[3])<<24
	b := x & (1<<l - 1)
	if b < p {
		b = x & (1<<(l+1) - 1)
	}
	return b
}

// packedName is bucket b's field: b's little-endian bytes, as few as it takes, at least one.
func packedName(b int64) string {
	var buf [4]byte
	n := 1
	for buf[0] = byte(b); b >= 256 && n < 4; n++ {
		b >>= 8
		buf[n] = byte(b)
	}
	return string(buf[:n])
}

// bucketNames holds the fields of the first buckets, boxed as a command's arguments take them, so
// that naming a bucket of a store of a few thousand records or fewer allocates nothing.
var bucketNames = func() (names [1 << 12]any) {
	for b := range names {
		names[b] = packedName(int64(b))
	}
	return names
}()

// bucketName is bucket b's field (packedName) as a command's argument.
func bucketName(b int64) any {
	if b < int64(len(bucketNames)) {
		return bucketNames[b]
	}
	return packedName(b)
}

// splittingBuckets appends to bs the buckets that would split if adds new records were put in a
// store of shape l, p, n: packed_records.lua reads them with a call's lookups.
func splittingBuckets(bs []int64, l, p, n, adds int64) []int64 {
	q, size := p, int64(1)<<l
	nb := size + p
	for range min(nb, (n+adds)/packLoad-nb+1) {
		bs = append(bs, q)
		if q++; q == size {
			q, size = 0, 2*size
		}
	}
	return bs
}

// bucketStore is layout 11's record store as a call reads and changes it: the buckets read (by
// number; "" for one absent) and, once the call changes one, its records as they stand (appended
// to in place), under the shape as the call leaves it.
type bucketStore struct {
	l, p, n int64
	buckets []storeBucket
	// index finds a bucket in buckets once there are more than linearBuckets: a call reads a
	// bucket or a few per record, and most calls carry few records.
	index map[int64]int
}

// storeBucket is one bucket of a bucketStore: as read ("" for one absent) and, once changed, as
// the call leaves it.
type storeBucket struct {
	b       int64
	read    string
	now     []byte
	changed bool
}

// linearBuckets is the most buckets a bucketStore finds by scanning them.
const linearBuckets = 32

// find returns bucket b's index in s.buckets, or -1 for one the call did not read.
func (s *bucketStore) find(b int64) int {
	if s.index != nil {
		if i, ok := s.index[b]; ok {
			return i
		}
		return -1
	}
	for i := range s.buckets {
		if s.buckets[i].b == b {
			return i
		}
	}
	return -1
}

// add adds bucket b, read absent, unless the store has it, and reports whether it did.
func (s *bucketStore) add(b int64) bool {
	if s.find(b) >= 0 {
		return false
	}
	s.buckets = append(s.buckets, storeBucket{b: b})
	switch {
	case s.index != nil:
		s.index[b] = len(s.buckets) - 1
	case len(s.buckets) > linearBuckets:
		s.index = make(map[int64]int, 2*len(s.buckets))
		for i, bk := range s.buckets {
			s.index[bk.b] = i
		}
	}
	return true
}

// set makes v bucket b's records as the call leaves them; b is one the store has.
func (s *bucketStore) set(b int64, v []byte) {
	bk := &s.buckets[s.find(b)]
	bk.now, bk.changed = v, true
}

// validBucket reports whether v splits into whole records of known tags, as a bucket the store
// wrote does.
func validBucket(v string) bool {
	for at := 0; at < len(v); {
		if at+17 > len(v) {
			return false
		}
		size := recordLength(v[at+16])
		if size == 0 || at+16+size > len(v) {
			return false
		}
		at += 16 + size
	}
	return true
}

// locate returns where fp's record starts in bucket v and its end, or -1.
func locate[B string | []byte](v B, fp string) (int, int) {
	for at := 0; at < len(v); {
		end := at + 16 + recordLength(v[at+16])
		if string(v[at:at+16]) == fp {
			return at, end
		}
		at = end
	}
	return -1, -1
}

// get returns fp's record, or "" and whether the bucket it lies in was read. It reads the buckets
// as read, before any change.
func (s *bucketStore) get(fp string) (string, bool) {
	i := s.find(packedAddr(fp, s.l, s.p))
	if i < 0 {
		return "", false
	}
	v := s.buckets[i].read
	if at, end := locate(v, fp); at >= 0 {
		return v[at+16 : end], true
	}
	return "", true
}

// change returns bucket b's records for the call to change, or false for one it did not read.
func (s *bucketStore) change(b int64) ([]byte, bool) {
	i := s.find(b)
	if i < 0 {
		return nil, false
	}
	bk := &s.buckets[i]
	if !bk.changed {
		bk.now = append(make([]byte, 0, len(bk.read)+16+recordLength(recordTagSeq|recordTagHorizon|1)), bk.read...)
		bk.changed = true
	}
	return bk.now, true
}

// put stores rec as fp's record, in place of the one it has, splitting a bucket as
// packed_records.lua's put does; false when it needs a bucket the call did not read.
func (s *bucketStore) put(fp, rec string) bool {
	b := packedAddr(fp, s.l, s.p)
	v, ok := s.change(b)
	if !ok {
		return false
	}
	if at, end := locate(v, fp); at >= 0 {
		if end-at-16 == len(rec) {
			copy(v[at+16:], rec)
		} else {
			s.set(b, append(append(append(make([]byte, 0, len(v)-end+at+16+len(rec)), v[:at+16]...), rec...), v[end:]...))
		}
		return true
	}
	s.set(b, append(append(v, fp...), rec...))
	s.n++
	if size := int64(1) << s.l; s.n > packLoad*(size+s.p) {
		return s.split()
	}
	return true
}

// split moves the records of bucket p whose address has bit l set to the new bucket p + 2^l, each
// side keeping their order.
func (s *bucketStore) split() bool {
	v, ok := s.change(s.p)
	if !ok || s.l == 31 && s.p == 1<<31-1 {
		return false
	}
	var move []byte
	kept := 0
	for at := 0; at < len(v); {
		end := at + 16 + recordLength(v[at+16])
		if v[at+int(s.l/8)]>>(s.l%8)&1 == 1 {
			move = append(move, v[at:end]...)
		} else {
			kept += copy(v[kept:], v[at:end])
		}
		at = end
	}
	size := int64(1) << s.l
	s.set(s.p, v[:kept])
	s.add(s.p + size) // a bucket the split makes: the hash holds none (the head says so)
	s.set(s.p+size, move)
	if s.p++; s.p == size {
		s.l, s.p = s.l+1, 0
	}
	return true
}

// writes returns the bucket fields the call changed and their records, and the fields of the
// buckets it emptied (a split that moves every record of its bucket), which packed_records.lua
// deletes.
func (s *bucketStore) writes() (sets, dels []any) {
	sets = make([]any, 0, 2*len(s.buckets))
	for _, bk := range s.buckets {
		if !bk.changed || string(bk.now) == bk.read {
			continue
		}
		if len(bk.now) == 0 {
			dels = append(dels, bucketName(bk.b))
		} else {
			sets = append(sets, bucketName(bk.b), bk.now)
		}
	}
	return sets, dels
}

// parseRecord11 reads a layout-11 record as apply.lua's parse does, for the records the
// processor writes (parseRecord's checks), or reports false.
func parseRecord11(v string) (record10, bool) {
	r, err := parseRecord([]byte(v))
	if err != nil {
		return record10{}, false
	}
	return record10{class: int8(r.class) - 1, occurred: r.occurred, assessed: r.assessed, seq: r.seq, horizon: r.horizon}, true
}

// withHorizon11 is record rec (no horizon) with horizon z added, as apply.lua's withHorizon.
func withHorizon11(rec string, z int64) string {
	return string(rec[0]|recordTagHorizon) + rec[1:] + string(appendNumber(nil, z))
}

// dayWidths are a day entry's count widths by the code in its first byte's top two bits.
var dayWidths = [4]int{1, 2, 3, 5}

// parseDay reads layout 11's day field v of day d into hours (the hour of the day's entry), or
// reports false for a field apply.lua could not have written: what its dayOf and parseHour refuse,
// checked for every entry.
func parseDay(v string, d int64, hours *[24]computedHour) bool {
	if len(v) == 0 {
		return false
	}
	last := -1
	for at := 0; at < len(v); {
		e := v[at]
		hk, w := int(e&31), dayWidths[e>>6]
		size := 1 + 3*w + 8
		if hk >= 24 || hk <= last || at+size > len(v) {
			return false
		}
		last = hk
		t := &hours[hk]
		for j := range t.c {
			t.c[j] = littleEndian(v[at+1+j*w : at+1+(j+1)*w])
		}
		a, b := littleEndian(v[at+1+3*w:at+5+3*w]), littleEndian(v[at+5+3*w:at+size])
		top := max(t.c[0], t.c[1], t.c[2])
		if top == 0 || countCode(top) != e>>6 || a > b || b >= hourUS {
			return false
		}
		start := (d*24 + int64(hk)) * hourUS
		t.a, t.b, t.bounded, t.loose = start+a, start+b, true, e&32 != 0
		at += size
	}
	return true
}

// countCode is the code of the fewest bytes that hold count top (1, 2, 3 or 5).
func countCode(top int64) byte {
	switch {
	case top < 1<<8:
		return 0
	case top < 1<<16:
		return 1
	case top < 1<<24:
		return 2
	}
	return 3
}

// appendDay appends day d's field as apply.lua writes it: an entry per hour that holds winners, in
// hour order.
func appendDay(buf []byte, d int64, hours *[24]computedHour) []byte {
	for hk := range hours {
		t := &hours[hk]
		top := max(t.c[0], t.c[1], t.c[2])
		if top == 0 {
			continue
		}
		code := countCode(top)
		e := byte(hk) | code<<6
		if t.loose {
			e |= 32
		}
		buf = append(buf, e)
		for _, c := range t.c {
			buf = appendLittleEndian(buf, c, dayWidths[code])
		}
		start := (d*24 + int64(hk)) * hourUS
		buf = appendLittleEndian(buf, t.a-start, 4)
		buf = appendLittleEndian(buf, t.b-start, 4)
	}
	return buf
}

// checkFields checks every state field a call read as apply.lua checks those it reads (an hour or
// a day, an index group, a minute it could have written; apply.lua reads fewer of them for
// duplicates, and refusing more only leaves a call to it) and parses layout 11's days into
// fields, or reports false.
func checkFields(plan *callRead, state []any, fields []computedField) bool {
	for p := 2; p < len(plan.state); p++ {
		name, _ := plan.state[p].(string)
		v, ok := state[p].(string)
		switch name[0] {
		case 'd':
			d, err := strconv.ParseInt(name[1:], 10, 64)
			fields[p].day = new([24]computedHour)
			if err != nil || ok && !parseDay(v, d, fields[p].day) {
				return false
			}
		case 'h':
			if ok && (len(v) != hourBytes || (v[0] != 1 && v[0] != 2)) {
				return false
			}
		case 'i':
			if ok && (len(v) < groupHead || v[0] != 0) {
				return false
			}
		case 'm':
			if ok && (len(v) != minuteBytes || v[0] != 0) {
				return false
			}
		}
	}
	return true
}

// packedHeld takes the buckets a call read (as HMGET replied got, in the order of the store's
// buckets, which bucketRead named) into store and returns each fingerprint's record as the call
// meets it first (nil when absent), or false when a bucket is none the store could have written
// or a fingerprint's bucket was not read.
func packedHeld(store *bucketStore, got, fps []any) ([]any, bool) {
	if len(got) != len(store.buckets) {
		return nil, false
	}
	for i := range got {
		v, _ := got[i].(string)
		if got[i] != nil && (v == "" || !validBucket(v)) {
			return nil, false
		}
		store.buckets[i].read = v
	}
	held := make([]any, len(fps))
	for i, fp := range fps {
		s, _ := fp.(string)
		rec, ok := store.get(s)
		if !ok {
			return nil, false
		}
		if rec != "" {
			held[i] = rec
		}
	}
	return held, true
}

// packedShapeOf is a packed store's shape: level, split pointer, records.
type packedShapeOf [3]int64

// maxShapes bounds shapeCache: past it an aggregate's shape takes an arbitrary other's place, so
// that with more aggregates than that in rotation most calls still find theirs.
const maxShapes = 1 << 16

// shapeCache holds, per aggregate of layout 11, the shape of its packed store as this processor
// expects the head to say: what its last computed call wrote, or what the head said when last
// read grown by the records apply.lua counted since. With it a batch reads each call's buckets
// with its state, in one round trip; a call whose head says otherwise (another processor wrote
// it, or garbage collection merged buckets) reads them again in a second. Guarded by sealMu.
type shapeCache map[Key]packedShapeOf

// put records that aggregate k's head says shape.
func (c *shapeCache) put(k Key, shape packedShapeOf) {
	boundedPut((*map[Key]packedShapeOf)(c), k, shape)
}

// boundedPut sets (*c)[k] to v, making the map when it is nil; past maxShapes aggregates, k takes
// an arbitrary other's place.
func boundedPut[V any](c *map[Key]V, k Key, v V) {
	if *c == nil {
		*c = make(map[Key]V)
	}
	if _, ok := (*c)[k]; !ok && len(*c) >= maxShapes {
		for other := range *c { // a map's iteration starts at a random entry
			delete(*c, other)
			break
		}
	}
	(*c)[k] = v
}

// grow records that apply.lua counted added new records in aggregate k, splitting buckets as
// packed_records.lua does.
func (c shapeCache) grow(k Key, added int64) {
	s, ok := c[k]
	if !ok || added == 0 {
		return
	}
	l, p, n := s[0], s[1], s[2]+added
	for size := int64(1) << l; n > packLoad*(size+p) && l < 31; {
		if p++; p == size {
			l, p, size = l+1, 0, 2*size
		}
	}
	c[k] = packedShapeOf{l, p, n}
}

// bucketRead returns a store for a call of fingerprints fps under shape, its buckets those the
// call reads (those of fps and those adds new records could split, each once), and their fields
// in the store's order.
func bucketRead(fps []any, shape packedShapeOf, adds int64) (*bucketStore, []any) {
	l, p, n := shape[0], shape[1], shape[2]
	bs := make([]int64, 0, len(fps)+4)
	for _, fp := range fps {
		s, _ := fp.(string)
		bs = append(bs, packedAddr(s, l, p))
	}
	bs = splittingBuckets(bs, l, p, n, adds)
	store := &bucketStore{l: l, p: p, n: n, buckets: make([]storeBucket, 0, len(bs))}
	names := make([]any, 0, len(bs))
	for _, b := range bs {
		if store.add(b) {
			names = append(names, bucketName(b))
		}
	}
	return store, names
}
