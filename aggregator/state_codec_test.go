package aggregator

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/repeatrate/repeatrate/internal/testenv"
)

// Edge-case tests of state layout 8 (apply.lua): the state hash's numbers are fixed-width
// little-endian binary, made by Redis's struct library where the server has one and by a pure-Lua
// fallback where it has none (the embedded server of `repeatrate dev` and of tests). They check:
//   - the codec alone: both implementations, on both servers, make the bytes the layout names and
//     read them back, at every boundary of every width (TestStateCodecBytes);
//   - the same batches applied under the same prefix to the test Redis and to the embedded one
//     leave byte-identical keys (the head's server-clock stamp masked), and each is what the model
//     holds, with hours of every kind, 0/1/31/32/33+ winners, closed chunks, moves, expiry, 1970
//     and 2200 (TestBackendsAgreeByteForByte);
//   - counts of 5 bytes survive reads, writes, moves and expiry (TestStateCodecLargeCounts);
//   - a state of another layout is refused, not misread (TestStateCodecRefusesOtherLayouts).

const (
	codecHeadLen   = 2 + 21*7
	codecMinuteLen = 1 + 3*5
	codecMKeep     = 70 // apply.lua's MKEEP
)

// codecMaxUS is the last µs the decoder accepts (schemas: times before 2200-01-01).
var codecMaxUS = Micros(time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC)) - 1

// codecLe is x in width little-endian bytes.
func codecLe(x int64, width int) string {
	b := make([]byte, width)
	for i := range b {
		b[i] = byte(x >> (8 * i))
	}
	return string(b)
}

// codecHourBytes encodes an hour as the layout says: the byte 1 (exact) or 2 (loose), then C,P,U,a,b
// in 5 bytes each.
func codecHourBytes(h retainedHour) string {
	var b strings.Builder
	b.WriteByte(1)
	if h.loose {
		b.Reset()
		b.WriteByte(2)
	}
	for _, x := range []int64{h.c, h.p, h.u, h.a, h.b} {
		b.WriteString(codecLe(x, 5))
	}
	return b.String()
}

// codecGroupBytes encodes an index group as the layout says: the byte 0, then k,n,x in 5 bytes
// each, then the open chunk.
func codecGroupBytes(g retainedGroup) string {
	return "\x00" + codecLe(g.k, 5) + codecLe(g.n, 5) + codecLe(g.x, 5) + g.open
}

func codecMinute(c, p, u int64) string { return "\x00" + codecLe(c, 5) + codecLe(p, 5) + codecLe(u, 5) }

func codecHead(span byte, x []int64) string {
	var b strings.Builder
	b.WriteByte(10)
	b.WriteByte(span)
	for _, v := range x {
		b.WriteString(codecLe(v, 7))
	}
	return b.String()
}

// ---------------------------------------------------------------------------------------------
// The codec alone.

// codecCodecScript is apply.lua's codec (from "local spack, sunpack" to "local HEADR") in a harness:
// ARGV[1] 'fallback' hides the struct library from it; then groups of four arguments: a format,
// numbers to pack (decimal, comma-separated), bytes to unpack and the position to start at. It
// returns which implementation ran, then per group the packed bytes and the unpacked numbers
// (with the position after them) in %.17g.
func codecCodecScript(t *testing.T) string {
	from := strings.Index(applySource, "local spack, sunpack")
	to := strings.Index(applySource, "local HEADR")
	if from < 0 || to < from {
		t.Fatal("apply.lua has no codec between \"local spack, sunpack\" and \"local HEADR\"")
	}
	return `local realRawget = rawget
local rawget = function(t, k) if ARGV[1] == 'fallback' then return nil end return realRawget(t, k) end
local unpack, ipairs, tonumber, concat, byte, char = unpack, ipairs, tonumber, table.concat, string.byte, string.char
` + applySource[from:to] + `
local out = {struct and 'struct' or 'fallback'}
local i = 2
while i <= #ARGV do
  local f, vals, data, pos = ARGV[i], ARGV[i + 1], ARGV[i + 2], tonumber(ARGV[i + 3])
  local xs = {}
  for s in string.gmatch(vals, '[^,]+') do xs[#xs + 1] = tonumber(s) end
  out[#out + 1] = spack(f, unpack(xs))
  local got = {sunpack(f, data, pos)}
  for j = 1, #got do got[j] = string.format('%.17g', got[j]) end
  out[#out + 1] = concat(got, ',')
  i = i + 4
end
return out`
}

// TestStateCodecBytes packs and unpacks every format apply.lua uses, with values at every
// byte boundary of their widths (and the largest hour offset and time that can occur), on the test
// Redis with its struct library, on the test Redis with the fallback, and on the embedded Redis:
// the bytes must be the layout's (little-endian, fixed width, no padding) and read back exactly,
// from any position, whatever follows.
func TestStateCodecBytes(t *testing.T) {
	b1 := []int64{0, 1, 2, 3}
	b5 := []int64{0, 1, 0xff, 0x100, 0xffff, 0x10000, 0xffffff, 0x1000000, 0xffffffff, 0x100000000,
		hourUS - 1, hourUS, 0x0102030405, 1<<40 - 1}
	b7 := []int64{0, 1, 0xff, 0x100, 0xffffffff, 0x100000000, 1<<40 - 1, 1 << 40, 1<<48 - 1, 1 << 48,
		0x01020304050607, codecMaxUS, codecMaxUS + 1, 1<<53 - 1, Micros(t0) + 1}
	type format struct {
		f      string
		widths []int
	}
	ws := func(s string) []int {
		var out []int
		for _, c := range s {
			out = append(out, int(c-'0'))
		}
		return out
	}
	formats := []format{
		{"<I5I5I5", ws("555")},
		{"<BI5I5I5", ws("1555")},
		{"<BI5I5I5I5", ws("15555")},
		{"<BI5I5I5I5I5I5I5", ws("15555555")},
		{"<BI5I5I5I5I5I5I5I5", ws("155555555")},
		{"<" + strings.Repeat("I7", 20), ws(strings.Repeat("7", 20))},
		{"<B" + strings.Repeat("I7", 20), ws("1" + strings.Repeat("7", 20))},
	}
	r := rand.New(rand.NewPCG(7, 8))
	var args []any
	type want struct {
		packed string
		nums   string
	}
	var wants []want
	for _, f := range formats {
		for rot := 0; rot < 16; rot++ {
			var nums []string
			var packed strings.Builder
			for i, w := range f.widths {
				var x int64
				switch w {
				case 1:
					x = b1[(rot+i)%len(b1)]
				case 5:
					x = b5[(rot+i)%len(b5)]
				default:
					x = b7[(rot+i)%len(b7)]
				}
				nums = append(nums, strconv.FormatInt(x, 10))
				packed.WriteString(codecLe(x, w))
			}
			before := strings.Repeat("\x01", r.IntN(4)) // bytes before the numbers: read from pos
			after := []string{"", "\x00", "014conv-0000001/turn-1", "\x03\xff\xff"}[r.IntN(4)]
			pos := len(before) + 1
			args = append(args, f.f, strings.Join(nums, ","), before+packed.String()+after, strconv.Itoa(pos))
			wants = append(wants, want{packed.String(), strings.Join(nums, ",") + "," + strconv.Itoa(pos+packed.Len())})
		}
	}
	src := codecCodecScript(t)
	run := func(t *testing.T, c *redis.Client, mode, impl string) {
		ctx := context.Background()
		res, err := c.Eval(ctx, src, nil, append([]any{mode}, args...)...).Slice()
		if err != nil {
			t.Fatal(err)
		}
		if res[0] != impl {
			t.Fatalf("the codec ran as %v, want %s", res[0], impl)
		}
		for i, w := range wants {
			f, nums := args[4*i], args[4*i+1]
			if got := res[1+2*i].(string); got != w.packed {
				t.Errorf("%s pack %s (%s): %q, want %q", impl, f, nums, got, w.packed)
			}
			if got := res[2+2*i].(string); got != w.nums {
				t.Errorf("%s unpack %s of %q: %s, want %s", impl, f, args[4*i+2], got, w.nums)
			}
		}
	}
	t.Run("redis struct", func(t *testing.T) { run(t, testenv.Redis(t), "struct", "struct") })
	t.Run("redis fallback", func(t *testing.T) { run(t, testenv.Redis(t), "fallback", "fallback") })
	t.Run("embedded", func(t *testing.T) {
		m := miniredis.RunT(t)
		run(t, redis.NewClient(&redis.Options{Addr: m.Addr()}), "struct", "fallback")
	})
}

// ---------------------------------------------------------------------------------------------
// The state's numbers, read from the stored bytes.

// codecSeen is what the stored states showed, so that a test can require its cases were reached.
type codecSeen struct {
	kinds    map[byte]int
	closed   int            // index groups with closed chunks
	winners  map[string]int // "1", "31", "32", "33+"
	edges    map[string]int // "a=0", "b=HOUR-1"
	bigMin   int            // minute buckets with a count above 255
	minTotal int
}

func newCodecSeen() *codecSeen {
	return &codecSeen{kinds: map[byte]int{}, winners: map[string]int{}, edges: map[string]int{}}
}

// codecNumbers checks the numbers of aggregate k's state that retainedRig.check does not read, against the
// model and the stored bytes: every hour, minute and head field has its layout's size and encodes
// back to the same bytes; every minute bucket the script still reads or writes (the last 70 minutes
// behind the watermark) holds the model's counts (plus extra, per minute), and none is stored below
// the head's pruned-up-to minute; the head's cached window sums are the sums of the stored buckets
// of the minute and hour they are cached for; its server-clock stamp is the server's time.
func codecNumbers(x *retainedRig, what string, k Key, extra map[int64][3]int64, seen *codecSeen) {
	t := x.t
	t.Helper()
	ctx := context.Background()
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("%s, %s: %s\n%s", what, k, fmt.Sprintf(format, args...), x.history(2))
	}
	st, err := x.c.HGetAll(ctx, x.s.keys(k)[1]).Result()
	if err != nil {
		t.Fatal(err)
	}
	a := x.m.aggs[k]
	if a == nil {
		return
	}
	head, ok := st["H"]
	if !ok || len(head) != codecHeadLen {
		fail("head of %d bytes, want %d", len(head), codecHeadLen)
	}
	hx, _ := headNumbers(head)
	w := a.watermark
	cutH := floorDiv(w-x.ret, hourUS)
	mfloor := floorDiv(w, minuteUS) - codecMKeep

	model := map[int64][3]int64{}
	for _, r := range a.opps {
		if r.occ < cutH*hourUS {
			continue
		}
		c := model[r.occ/minuteUS]
		c[int(r.class)-1]++
		model[r.occ/minuteUS] = c
	}
	for m, e := range extra {
		c := model[m]
		for i := range c {
			c[i] += e[i]
		}
		model[m] = c
	}
	if Confirmed != 1 || Passed != 2 || Unscored != 3 {
		t.Fatal("class numbering changed: fix codecNumbers")
	}
	minutes := map[int64][3]int64{}
	hours := map[int64][3]int64{}
	for f, v := range st {
		switch {
		case strings.HasPrefix(f, "m"):
			m, err := strconv.ParseInt(f[1:], 10, 64)
			if err != nil {
				fail("state field %q", f)
			}
			if len(v) != codecMinuteLen {
				fail("minute %s of %d bytes %q", f, len(v), v)
			}
			n, _ := minuteNumbers(v)
			if codecMinute(n[0], n[1], n[2]) != v {
				fail("minute %s does not encode back", f)
			}
			if n[0]+n[1]+n[2] == 0 {
				fail("minute %s holds nothing but is stored", f)
			}
			minutes[m] = [3]int64{n[0], n[1], n[2]}
			if max(n[0], n[1], n[2]) > 255 {
				seen.bigMin++
			}
			seen.minTotal++
		case strings.HasPrefix(f, "h") && !strings.Contains(f, "."):
			h, err := strconv.ParseInt(f[1:], 10, 64)
			if err != nil {
				fail("state field %q", f)
			}
			hv, err := retainedParseHour(v)
			if err != nil {
				fail("%s: %v", f, err)
			}
			if codecHourBytes(hv) != v {
				fail("hour %s %q does not encode back (%q)", f, v, codecHourBytes(hv))
			}
			hours[h] = [3]int64{hv.c, hv.p, hv.u}
			seen.kinds[v[0]]++
			switch n := hv.c + hv.p + hv.u; {
			case n == 1 || n == 31 || n == 32:
				seen.winners[strconv.FormatInt(n, 10)]++
			case n > 32:
				seen.winners["33+"]++
			}
			if hv.bounded && hv.a == 0 {
				seen.edges["a=0"]++
			}
			if hv.bounded && hv.b == hourUS-1 {
				seen.edges["b=HOUR-1"]++
			}
		case strings.HasPrefix(f, "i") && !strings.Contains(f, "."):
			gv, err := retainedParseGroup(v)
			if err != nil {
				fail("%s: %v", f, err)
			}
			if codecGroupBytes(gv) != v {
				fail("index group %s %q does not encode back (%q)", f, v, codecGroupBytes(gv))
			}
			if gv.k > 0 {
				seen.closed++
			}
		}
	}
	for m, c := range model {
		if m >= mfloor && c != minutes[m] && c != [3]int64{} {
			fail("minute %d holds %v, the model %v", m, minutes[m], c)
		}
	}
	if hx[1] == 0 {
		fail("the head keeps no pruned-up-to minute")
	}
	pm := hx[1] - 1
	if pm > max(floorDiv(w, minuteUS)-codecMKeep, 0) {
		fail("pruned up to minute %d, past the floor %d", pm, floorDiv(w, minuteUS)-codecMKeep)
	}
	for m, c := range minutes {
		if m >= mfloor && c != model[m] {
			fail("minute %d holds %v, the model %v", m, c, model[m])
		}
		if m < pm {
			fail("minute %d is stored below the pruned-up-to minute %d", m, pm)
		}
	}
	// The cached window sums.
	if hx[4] == 0 || hx[5] == 0 {
		fail("the head caches no window sums (%d, %d)", hx[4], hx[5])
	}
	cm, ch := hx[4]-1, hx[5]-1
	var sums [9]int64
	for m := cm - 59; m <= cm; m++ {
		for i := range 3 {
			sums[i] += minutes[m][i]
		}
	}
	for h := ch - 167; h <= ch; h++ {
		for i := range 3 {
			if h >= ch-23 {
				sums[3+i] += hours[h][i]
			}
			sums[6+i] += hours[h][i]
		}
	}
	if !reflect.DeepEqual(sums[:], hx[11:20]) {
		fail("cached window sums %v for minute %d and hour %d; the stored buckets sum to %v", hx[11:20], cm, ch, sums)
	}
	now, err := x.c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if rt := hx[6] - 1; hx[6] == 0 || rt < now.Unix()-30 || rt > now.Unix()+1 {
		fail("server-clock stamp %d (stored %d), the server's time is %d", rt, hx[6], now.Unix())
	}
}

// ---------------------------------------------------------------------------------------------
// Both servers, byte for byte.

// codecPair applies every batch to the test Redis and to an embedded one under the same prefix,
// each checked against its own model (retainedRig.check and codecNumbers), and requires equal replies and
// byte-identical keys after every batch.
type codecPair struct {
	t      *testing.T
	prefix string
	sides  [2]*retainedRig
	seen   *codecSeen
	dumps  int
}

func newCodecPair(t *testing.T, what string, retention time.Duration) *codecPair {
	prefix := testenv.Name(t, what)
	m := miniredis.RunT(t)
	clients := [2]*redis.Client{testenv.Redis(t), redis.NewClient(&redis.Options{Addr: m.Addr()})}
	p := &codecPair{t: t, prefix: prefix, seen: newCodecSeen()}
	for i, c := range clients {
		testenv.CleanPrefix(t, c, prefix)
		s, err := NewRedis(c, RedisConfig{Prefix: prefix, Retention: retention})
		if err != nil {
			t.Fatal(err)
		}
		p.sides[i] = &retainedRig{t: t, s: s, c: c, m: NewModel(retention), ret: int64(retention / time.Microsecond), spanRet: int64(retention / time.Microsecond),
			outs: map[Outcome]int{}, seen: map[string]int{}}
	}
	return p
}

var codecSideNames = [2]string{"redis", "embedded"}

// codecDump renders every key under prefix: type, hash fields (the head's server-clock stamp,
// bytes [43, 50), masked), sorted-set members and scores, and whether it expires; not the pending
// tokens of batches.
func codecDump(t *testing.T, c *redis.Client, prefix string) map[string]string {
	t.Helper()
	return renderKeys(t, c, prefix, false)
}

// codecDumpAcross is codecDump for comparing two stores written at different moments: layout 11's
// buckets' write stamp, Redis's clock when written, shows only whether it is there.
func codecDumpAcross(t *testing.T, c *redis.Client, prefix string) map[string]string {
	t.Helper()
	return renderKeys(t, c, prefix, true)
}

// renderKeys is codecDump, with the buckets' write stamps masked when stampless.
func renderKeys(t *testing.T, c *redis.Client, prefix string, stampless bool) map[string]string {
	t.Helper()
	ctx := context.Background()
	keys, err := c.Keys(ctx, prefix+":*").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, k := range keys {
		if equivIgnorePending(k) { // the batch's pending token, not the state
			continue
		}
		typ := c.Type(ctx, k).Val()
		var b strings.Builder
		b.WriteString(typ)
		switch typ {
		case "hash":
			h := c.HGetAll(ctx, k).Val()
			fs := make([]string, 0, len(h))
			for f := range h {
				fs = append(fs, f)
			}
			sort.Strings(fs)
			for _, f := range fs {
				v := h[f]
				if f == "H" && strings.HasSuffix(k, "}:s") && (len(v) == codecHeadLen || len(v) == headBytes11 || len(v) == headBytesWC) {
					v = v[:44] + "<rt...>" + v[51:]
				}
				if f == bucketsToken && strings.HasSuffix(k, "}:e") {
					continue // a computed call's random token: no script writes one
				}
				if stampless && f == bucketsWritten && strings.HasSuffix(k, "}:e") {
					v = "<Redis's clock>" // the buckets' write stamp: present or absent, as written
				}
				fmt.Fprintf(&b, "\n  %q = %q", f, v)
			}
		case "zset":
			for _, z := range c.ZRangeWithScores(ctx, k, 0, -1).Val() {
				fmt.Fprintf(&b, "\n  %q %v", z.Member, z.Score)
			}
		case "string":
			fmt.Fprintf(&b, "\n  %q", c.Get(ctx, k).Val())
		default:
			t.Fatalf("key %s of type %s", k, typ)
		}
		fmt.Fprintf(&b, "\n  expires %v", c.PTTL(ctx, k).Val() > 0)
		out[k] = b.String()
	}
	return out
}

// same requires both servers to hold the same keys, byte for byte.
func (p *codecPair) same(what string) {
	p.t.Helper()
	a, b := codecDumpAcross(p.t, p.sides[0].c, p.prefix), codecDumpAcross(p.t, p.sides[1].c, p.prefix)
	if len(a) == 0 {
		p.t.Fatalf("%s: nothing stored under %s", what, p.prefix)
	}
	keys := map[string]bool{}
	for k := range a {
		keys[k] = true
	}
	for k := range b {
		keys[k] = true
	}
	for k := range keys {
		if a[k] != b[k] {
			p.t.Fatalf("%s: key %s differs\nredis:    %s\nembedded: %s\n%s", what, k, a[k], b[k], p.sides[0].history(2))
		}
	}
	p.dumps++
}

func (p *codecPair) apply(what string, batch []Observation, at time.Time) {
	p.t.Helper()
	var got [2]Applied
	for i, x := range p.sides {
		got[i] = x.apply(codecSideNames[i]+": "+what, batch, at)
		for _, k := range got[i].Keys {
			codecNumbers(x, codecSideNames[i]+": "+what, k, nil, p.seen)
		}
	}
	if !reflect.DeepEqual(got[0], got[1]) {
		p.t.Fatalf("%s: replies differ\nredis:    %+v\nembedded: %+v", what, got[0], got[1])
	}
	p.same(what)
}

func (p *codecPair) again(what string, batch []Observation, at time.Time) {
	p.t.Helper()
	for i, x := range p.sides {
		x.again(codecSideNames[i]+": "+what, batch, at)
	}
	p.same(what)
}

func (p *codecPair) tallies(at time.Time) {
	p.t.Helper()
	for _, x := range p.sides {
		x.tallies(at)
	}
	p.same("after tallies")
}

func (p *codecPair) collect(k Key, at time.Time) {
	p.t.Helper()
	for _, x := range p.sides {
		x.collect(k, at, 20)
	}
	p.same("after garbage collection")
}

// codecBinID is an opportunity id whose bytes look like a state number or kind byte.
func codecBinID(i int) string {
	return string([]byte{byte(i % 4), byte(i), 0, 0, 0, 0, 0xff, ',', '|', ';'}) + fmt.Sprint(i)
}

// TestBackendsAgreeByteForByte applies the same batches to the test Redis (struct) and
// to the embedded Redis (the Lua fallback) under the same prefix: replies and every stored key and
// field must be equal byte for byte, and each side what the model holds.
func TestBackendsAgreeByteForByte(t *testing.T) {
	t.Run("hour kinds", codecRunKinds)
	t.Run("1970 and 2200", codecRunEdges)
	t.Run("short retention", codecRunShort)
	t.Run("streams", codecRunStreams)
	t.Run("wide batches", codecRunWide)
}

// codecRunKinds builds hours of 1, 31, 32, 40 (long ids: bounds and closed chunks), 12 (longer ids:
// closed chunks, no bounds) and 300 winners (in one minute: counts past one byte), whose ids look
// like numbers and kind bytes, then moves winners across the 32 line both ways, empties an hour
// whose group keeps listing an id, moves a bound holder at each edge, retries and redelivers.
func codecRunKinds(t *testing.T) {
	p := newCodecPair(t, "kinds", 30*24*time.Hour)
	h0 := Micros(t0)/hourUS - 8
	at := time.UnixMicro((h0 + 8) * hourUS)
	asd := (h0 + 20) * hourUS
	next := func(id string, cls Class, occ int64) Observation {
		asd++
		return Observation{Key: keyLive, OpportunityID: id, Class: cls, Occurred: occ, Assessed: asd}
	}
	long := func(i, n int) string { return fmt.Sprintf("%05d-", i) + strings.Repeat("L", n) }
	spread := func(h int64, i, n int) int64 { // i of n in hour h, the first at 0 and the last at HOUR-1
		if n == 1 {
			return h * hourUS
		}
		return h*hourUS + int64(i)*(hourUS-1)/int64(n-1)
	}
	var b []Observation
	b = append(b, next("one", Confirmed, h0*hourUS))
	for i := 0; i < 31; i++ {
		b = append(b, next(fmt.Sprint("t31-", i), Class(1+i%3), spread(h0+1, i, 31)))
	}
	for i := 0; i < 32; i++ {
		b = append(b, next(codecBinID(i), Class(1+i%3), spread(h0+2, i, 32)))
	}
	for i := 0; i < 40; i++ {
		b = append(b, next(long(i, 120), Class(1+i%3), spread(h0+3, i, 40)))
	}
	for i := 0; i < 12; i++ {
		b = append(b, next(long(100+i, 200), Class(1+i%3), spread(h0+4, i, 12)))
	}
	for i := 0; i < 300; i++ { // one minute: 300 winners, 270 of them passed (counts past one byte)
		cls := Passed
		if i >= 270 {
			cls = Class(1 + i%3)
		}
		b = append(b, next(fmt.Sprint("min-", i), cls, (h0+7)*hourUS+int64(i)*1000))
	}
	p.apply("build", b, at)
	for _, want := range []string{"1", "31", "32", "33+"} {
		if p.seen.winners[want] == 0 {
			t.Fatalf("no hour of %s winners after the build: %v", want, p.seen.winners)
		}
	}
	p.again("build again", b, at)

	// Across the 32 line: two of hour 2's (32) go to hour 1 (31): 30 and 33. Two of hour 3's bound
	// holders (offset 0 and HOUR-1) leave for hour 5; one of hour 4's leaves for an earlier hour
	// (hour 4 keeps listing it for its horizon); "one" leaves hour 0 for hour 6 (hour 0: 0 winners,
	// its field deleted, its group still listing it).
	b = []Observation{
		next(codecBinID(0), Passed, spread(h0+1, 5, 31)+7),
		next(codecBinID(31), Unscored, (h0+1)*hourUS+hourUS-1),
		next(long(0, 120), Confirmed, (h0+5)*hourUS),
		next(long(39, 120), Passed, (h0+5)*hourUS+hourUS-1),
		next(long(105, 200), Confirmed, (h0-1)*hourUS+3),
		next("one", Unscored, (h0+6)*hourUS+1),
	}
	p.apply("across the line", b, at)
	p.again("across the line, retried", b, at)
	// And back, with stale and duplicate ones mixed in.
	b = []Observation{
		next(codecBinID(0), Passed, spread(h0+2, 0, 32)),
		b[1], // the same again: a duplicate
		next(long(0, 120), Unscored, (h0+3)*hourUS),
		next(long(39, 120), Passed, (h0+3)*hourUS+hourUS-1),
	}
	stale := b[2]
	stale.Assessed -= 100
	stale.Occurred += hourUS
	b = append(b, stale)
	p.apply("back", b, at)

	// Random moves among hours 0..7, many within a batch, now and then retried.
	r := rand.New(rand.NewPCG(7, 1))
	ids := []string{"one"}
	for i := 0; i < 31; i++ {
		ids = append(ids, fmt.Sprint("t31-", i), codecBinID(i))
	}
	for i := 0; i < 40; i++ {
		ids = append(ids, long(i, 120))
	}
	for round := 0; round < 12; round++ {
		b = b[:0]
		for range 1 + r.IntN(40) {
			b = append(b, next(ids[r.IntN(len(ids))], Class(1+r.IntN(3)), (h0+int64(r.IntN(8)))*hourUS+retainedOffset(r)))
		}
		p.apply(fmt.Sprint("round ", round), b, at)
		if r.IntN(3) == 0 {
			p.again(fmt.Sprint("round ", round, " again"), b, at)
		}
	}
	p.tallies(at)
	if p.seen.kinds[1] == 0 || p.seen.closed == 0 {
		t.Errorf("no hour (kinds %v) or no index group with closed chunks (%d) was stored", p.seen.kinds, p.seen.closed)
	}
	if p.seen.edges["a=0"] == 0 || p.seen.edges["b=HOUR-1"] == 0 || p.seen.bigMin == 0 {
		t.Errorf("bounds at the hour's edges %v, minute buckets past one byte %d", p.seen.edges, p.seen.bigMin)
	}
	t.Logf("%d dumps compared; kinds %v, winners %v, edges %v", p.dumps, p.seen.kinds, p.seen.winners, p.seen.edges)
}

// codecRunEdges dates one aggregate at the first hours of 1970 (bounds at µs 0, first retained at
// 0) and another at the last hours before 2200 (the last µs the decoder accepts as watermark, last
// and bound), moves winners, expires them under 2h retention and collects their records.
func codecRunEdges(t *testing.T) {
	p := newCodecPair(t, "edges", 2*time.Hour)
	late := keyLive
	late.Source = Evaluation
	r := rand.New(rand.NewPCG(2200, 1970))
	var asd int64 = 1
	next := func(k Key, id string, occ int64) Observation {
		asd++
		return Observation{Key: k, OpportunityID: id, Class: Class(1 + r.IntN(3)), Occurred: occ, Assessed: asd}
	}
	// 1970: hour 0 with 35 winners at 0 .. HOUR-1, hour 1 with 3.
	var b []Observation
	for i := 0; i < 35; i++ {
		b = append(b, next(keyLive, fmt.Sprint("e", i), int64(i)*(hourUS-1)/34))
	}
	for i := 0; i < 3; i++ {
		b = append(b, next(keyLive, fmt.Sprint("f", i), hourUS+int64(i)))
	}
	p.apply("1970", b, time.UnixMicro(2*hourUS-1))
	// 2200: the last hour with 33 winners up to the last µs, the hour before with 2, and one too
	// old to retain.
	hm := codecMaxUS / hourUS
	b = b[:0]
	asd = codecMaxUS - 10*hourUS
	for i := 0; i < 33; i++ {
		b = append(b, next(late, fmt.Sprint("z", i), hm*hourUS+int64(i)*(hourUS-1)/32))
	}
	b = append(b, next(late, "y0", (hm-1)*hourUS), next(late, "y1", codecMaxUS-hourUS), next(late, "old", (hm-3)*hourUS))
	p.apply("2200", b, time.UnixMicro(codecMaxUS))
	for _, x := range p.sides {
		st := x.c.HGetAll(context.Background(), x.s.keys(late)[1]).Val()
		hx, _ := headNumbers(st["H"])
		hv, _ := retainedParseHour(st[fmt.Sprint("h", hm)])
		if hx[0] != codecMaxUS+1 || hx[3] != codecMaxUS+1 || !hv.bounded || hv.b != hourUS-1 || hv.a != 0 {
			t.Fatalf("2200: head watermark %d and last %d (want %d stored), hour bounds %v [%d, %d]", hx[0], hx[3], codecMaxUS+1, hv.bounded, hv.a, hv.b)
		}
	}
	// Moves within and across the hours, at both ends of time.
	for round := 0; round < 8; round++ {
		b = b[:0]
		for range 1 + r.IntN(12) {
			b = append(b, next(keyLive, fmt.Sprint("e", r.IntN(38)), int64(r.IntN(2))*hourUS+retainedOffset(r)))
		}
		p.apply(fmt.Sprint("1970 round ", round), b, time.UnixMicro(2*hourUS-1))
		b = b[:0]
		for range 1 + r.IntN(12) {
			occ := min((hm-int64(r.IntN(2)))*hourUS+retainedOffset(r), codecMaxUS)
			b = append(b, next(late, fmt.Sprint("z", r.IntN(36)), occ))
		}
		p.apply(fmt.Sprint("2200 round ", round), b, time.UnixMicro(codecMaxUS))
	}
	p.tallies(time.UnixMicro(2*hourUS - 1))
	// 1970 expires: the watermark passes hours 0 and 1, then garbage collection takes them.
	p.apply("1970 expires", []Observation{next(keyLive, "later", 5*hourUS)}, time.UnixMicro(5*hourUS))
	p.collect(keyLive, time.UnixMicro(5*hourUS))
	p.tallies(time.UnixMicro(5 * hourUS))
	if p.seen.edges["a=0"] == 0 || p.seen.edges["b=HOUR-1"] == 0 {
		t.Errorf("bounds at the hour's edges %v", p.seen.edges)
	}
}

// codecRunShort is a random stream under 1h retention: hours and their minute buckets expire as the
// watermark moves by minutes, records are collected, batches are retried and redelivered.
func codecRunShort(t *testing.T) {
	p := newCodecPair(t, "short", time.Hour)
	r := rand.New(rand.NewPCG(77, 1))
	clock := Micros(t0)
	asd := clock
	var done [][]Observation
	var ats []time.Time
	for i := 0; i < 45; i++ {
		clock += int64(r.IntN(12)) * minuteUS
		var b []Observation
		for range retainedSize(r) {
			asd += int64(r.IntN(2))
			occ := clock - int64(r.IntN(100))*minuteUS + int64(r.IntN(60e6))
			b = append(b, Observation{Key: keyLive, OpportunityID: retainedID(r.IntN(80)), Class: Class(1 + r.IntN(3)),
				Occurred: min(occ, clock), Assessed: asd - int64(r.IntN(3)), Seq: int64(r.IntN(2))})
		}
		at := time.UnixMicro(clock + int64(r.IntN(60))*1e6)
		p.apply(fmt.Sprint("batch ", i), b, at)
		done, ats = append(done, b), append(ats, at)
		if r.IntN(6) == 0 {
			j := r.IntN(len(done))
			p.again(fmt.Sprint("batch ", j, " redelivered after ", i), done[j], at)
		}
	}
	p.tallies(ats[len(ats)-1])
	x := p.sides[0]
	if x.outs[Expired] == 0 || x.outs[Reassessed] == 0 {
		t.Errorf("outcomes %v, seen %v: the stream does not expire or re-assess", x.outs, x.seen)
	}
}

// ---------------------------------------------------------------------------------------------
// Counts of five bytes.

// TestStateCodecLargeCounts gives an hour of 40 winners, one of its minutes and the head counts
// that need the fifth byte (2^32+5, 2^40-2^20, 2^24+3; written in the layout's bytes, as if that
// many records had come), then moves winners into and out of the hour and adds new ones: every
// stored count must be the model's plus those, on both servers byte for byte; when the hour
// expires, the totals must be the model's again (the large counts leave exactly).
func TestStateCodecLargeCounts(t *testing.T) {
	p := newCodecPair(t, "largecounts", 3*time.Hour)
	off := [3]int64{1<<32 + 5, 1<<40 - 1<<20, 1<<24 + 3}
	h0 := Micros(t0) / hourUS
	base := h0 * hourUS
	asd := base + 10*hourUS
	next := func(id string, cls Class, occ int64) Observation {
		asd++
		return Observation{Key: keyLive, OpportunityID: id, Class: cls, Occurred: occ, Assessed: asd}
	}
	var b []Observation
	for i := 0; i < 40; i++ {
		b = append(b, next(fmt.Sprint("big-", i), Class(1+i%3), base+int64(i)*minuteUS+int64(i)))
	}
	at := time.UnixMicro(base + 45*minuteUS)
	p.apply("40 winners", b, at)
	m0 := base / minuteUS
	ctx := context.Background()
	for _, x := range p.sides {
		st := x.s.keys(keyLive)[1]
		all := x.c.HGetAll(ctx, st).Val()
		hv, err := retainedParseHour(all[fmt.Sprint("h", h0)])
		if err != nil || !hv.bounded {
			t.Fatalf("hour %d: %+v %v", h0, hv, err)
		}
		hv.c, hv.p, hv.u = hv.c+off[0], hv.p+off[1], hv.u+off[2]
		mv, _ := minuteNumbers(all[fmt.Sprint("m", m0)])
		hx, _ := headNumbers(all["H"])
		for i := range 3 {
			hx[8+i] += off[i]
		}
		hx[4], hx[5] = 0, 0 // no cached window sums: the next batch sums the buckets
		x.c.HSet(ctx, st, fmt.Sprint("h", h0), codecHourBytes(hv), fmt.Sprint("m", m0),
			codecMinute(mv[0]+off[0], mv[1]+off[1], mv[2]+off[2]), "H", codecHead(all["H"][1], hx))
	}
	p.same("seeded")
	// The model's tally plus the large counts, wherever hour h0 and minute m0 count.
	check := func(what string, at time.Time, gone, numbers bool) {
		t.Helper()
		for i, x := range p.sides {
			want := x.m.Tally(keyLive, at)
			if !gone {
				add := func(c *Counts) { c.Confirmed += off[0]; c.Passed += off[1]; c.Unscored += off[2] }
				add(&want.All)
				hour, day, week := windowOf(base, Micros(at))
				if hour {
					add(&want.Hour)
				}
				if day {
					add(&want.Day)
				}
				if week {
					add(&want.Week)
				}
			}
			got, err := x.s.Tally(ctx, keyLive, at)
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Fatalf("%s, %s: tally %+v, want %+v", what, codecSideNames[i], got, want)
			}
			var extra map[int64][3]int64
			if !gone {
				extra = map[int64][3]int64{m0: off}
			}
			all := x.c.HGetAll(ctx, x.s.keys(keyLive)[1]).Val()
			hv, _ := retainedParseHour(all[fmt.Sprint("h", h0)])
			var mc, mp, mu int64
			for _, r := range x.m.aggs[keyLive].opps {
				if r.occ/hourUS == h0 && r.occ >= x.m.aggs[keyLive].cut {
					switch r.class {
					case Confirmed:
						mc++
					case Passed:
						mp++
					default:
						mu++
					}
				}
			}
			if !gone {
				mc, mp, mu = mc+off[0], mp+off[1], mu+off[2]
			}
			if hv.c != mc || hv.p != mp || hv.u != mu {
				t.Fatalf("%s, %s: hour %d holds %d,%d,%d, want %d,%d,%d", what, codecSideNames[i], h0, hv.c, hv.p, hv.u, mc, mp, mu)
			}
			if numbers { // not before a batch has run since the seeding (no cached sums)
				codecNumbers(x, what, keyLive, extra, p.seen)
			}
		}
		p.same(what)
	}
	applyBoth := func(what string, b []Observation, at time.Time) {
		t.Helper()
		var got [2]Applied
		for i, x := range p.sides {
			var err error
			if got[i], err = x.s.Apply(ctx, b, at); err != nil {
				t.Fatal(err)
			}
			want, _ := x.m.Apply(ctx, b, at)
			if !reflect.DeepEqual(got[i].Outcomes, want.Outcomes) {
				t.Fatalf("%s, %s: outcomes %v, model %v", what, codecSideNames[i], got[i].Outcomes, want.Outcomes)
			}
		}
		if !reflect.DeepEqual(got[0], got[1]) {
			t.Fatalf("%s: replies differ\n%+v\n%+v", what, got[0], got[1])
		}
	}
	check("seeded", at, false, false)
	// Into, out of and within hour h0 (minute m0 among them), bound holders too, and new ones.
	b = []Observation{
		next("big-0", Unscored, base+3),            // within minute m0, another class
		next("big-39", Passed, base-hourUS+5),      // the top bound holder leaves for h0-1
		next("big-20", Confirmed, base+hourUS/2+1), // within the hour
		next("new-1", Confirmed, base+17),          // a new one in minute m0
		next("new-2", Passed, base+44*minuteUS),    // a new one in another minute of the window
		next("big-1", Confirmed, base+hourUS+100),  // out to h0+1
	}
	// Observed within 10 minutes of the watermark, where the 1h window is exact.
	atm := time.UnixMicro(base + 55*minuteUS)
	applyBoth("moves", b, atm)
	check("moves", atm, false, true)
	applyBoth("moves again", b, atm)
	check("moves again", atm, false, true)
	at2 := time.UnixMicro(base + 90*minuteUS) // the 1h window no longer holds minute m0
	applyBoth("an hour on", []Observation{next("new-3", Unscored, base+89*minuteUS)}, at2)
	check("an hour on", at2, false, true)
	// Hour h0 leaves retention (3h): the large counts leave with it, exactly.
	at3 := time.UnixMicro(base + 4*hourUS + 1)
	applyBoth("h0 expires", []Observation{next("new-4", Passed, base+4*hourUS+1)}, at3)
	check("h0 expires", at3, true, true)
	for i, x := range p.sides {
		hx, _ := headNumbers(x.c.HGet(ctx, x.s.keys(keyLive)[1], "H").Val())
		want := x.m.Tally(keyLive, at3).All
		if hx[8] != want.Confirmed || hx[9] != want.Passed || hx[10] != want.Unscored {
			t.Fatalf("%s: head counts %v after the large hour expired, model %+v", codecSideNames[i], hx[8:11], want)
		}
	}
}

// ---------------------------------------------------------------------------------------------
// Other layouts.

// TestStateCodecRefusesOtherLayouts: a namespace whose epoch marker names an older layout is
// refused at start and by the per-batch check; and the script itself refuses an hour field that is
// not of this layout (layout 7's text, layout 8's kinds, an unknown kind byte, too few or too many
// bytes), an index group field that is not (layout 7's text, too short), and a layout-7 or layout-8
// minute or head (text: its first byte is a hex digit, not this layout's 0 or 9; layout 8's head
// of 141 bytes), with an error, changing nothing, on both servers.
func TestStateCodecRefusesOtherLayouts(t *testing.T) {
	ctx := context.Background()
	t.Run("epoch marker", func(t *testing.T) {
		client := testenv.Redis(t)
		prefix := testenv.Name(t, "codeclayout")
		testenv.CleanPrefix(t, client, prefix)
		st, err := OpenState(ctx, client, prefix, false)
		if err != nil || !strings.HasSuffix(st.Epoch, "/layout10") {
			t.Fatalf("new namespace: %+v %v", st, err)
		}
		store, err := NewRedis(client, RedisConfig{Prefix: st.Namespace, Retention: time.Hour, Epoch: st.Epoch})
		if err != nil {
			t.Fatal(err)
		}
		batch := []Observation{obs("x", Confirmed, 0, 0, 0)}
		if _, err := store.Apply(ctx, batch, t0); err != nil {
			t.Fatal(err)
		}
		for _, old := range []string{"/layout9", "/layout8", "/layout7", "/layout", "/layout10/layout9", "/layout100", "/layout1"} {
			client.Set(ctx, EpochKey(st.Namespace), strings.TrimSuffix(st.Epoch, "/layout10")+old, 0)
			if _, err := OpenState(ctx, client, prefix, true); !errors.Is(err, ErrStateLost) {
				t.Errorf("open of a namespace marked %q: %v, want ErrStateLost", old, err)
			}
			if _, err := store.Apply(ctx, batch, t0); !errors.Is(err, ErrStateLost) {
				t.Errorf("apply on a namespace marked %q: %v, want ErrStateLost", old, err)
			}
		}
		client.Set(ctx, EpochKey(st.Namespace), st.Epoch, 0)
		if got, err := OpenState(ctx, client, prefix, true); err != nil || got != st {
			t.Fatalf("reopen: %+v %v", got, err)
		}
	})
	h0 := Micros(t0) / hourUS
	bad := []struct {
		name, field, v string // field "h": the hour's, "i": its index group's, "m": the minute's, "H": the head
		kind           bool   // refused for its kind byte or size (apply.lua's own error)
	}{
		{"layout 7 counts", "h", "1,0,0|", true},
		{"layout 7 bounded", "h", "21,0,0,0,e10,21,21|0041abc", true},
		{"layout 7 chunks", "h", "3,1,0;2|", true},
		{"empty", "h", "", true},
		{"layout 8 kind 0", "h", "\x00" + codecLe(1, 5) + codecLe(0, 10), true},
		{"layout 8 kind 0 listing", "h", "\x00" + codecLe(1, 5) + codecLe(0, 10) + "001a", true},
		{"layout 8 kind 1", "h", "\x01" + codecLe(40, 5) + codecLe(0, 30), true},
		{"layout 8 kind 3", "h", "\x03" + codecLe(40, 5) + codecLe(0, 35), true},
		{"layout 8 kind 2", "h", "\x02" + codecLe(1, 5) + codecLe(0, 15), true},
		{"kind 3 of 26 bytes", "h", "\x03" + codecLe(1, 5) + codecLe(0, 20), true},
		{"kind 4", "h", "\x04" + codecLe(1, 5) + codecLe(0, 20), true},
		{"kind 255", "h", "\xff" + codecLe(1, 5) + codecLe(0, 20), true},
		{"kind 1 truncated", "h", "\x01" + codecLe(1, 5) + codecLe(0, 19), true},
		{"kind 1 and more", "h", "\x01" + codecLe(1, 5) + codecLe(0, 20) + "001a", true},
		{"group as layout 7 text", "i", "3,1,0;2|001a", true},
		{"group truncated", "i", "\x00" + codecLe(1, 5) + codecLe(0, 9), true},
		{"group of kind 1", "i", "\x01" + codecLe(0, 15) + "001a", true},
		{"layout 7 minute", "m", "0,1,0", false},
		{"layout 7 minute of 15 bytes", "m", "1a,2b,3c,4d,5ef", false},
		{"layout 7 head", "H", "", false},                           // the head's numbers in layout 7's hex, filled in below
		{"layout 7 head of 140 bytes and more", "H", "wide", false}, // each number in 8 hex digits
		{"layout 8 head", "H", "layout 8", false},                   // the byte 8 and the same 20 numbers
		{"layout 9 head", "H", "layout 9", false},                   // the byte 9, the span and the same 20 numbers
	}
	retainedBackends(t, true, func(t *testing.T, c *redis.Client) {
		for _, tc := range bad {
			t.Run(tc.name, func(t *testing.T) {
				s, _ := storeOn(t, c, "codecbad", RedisConfig{Retention: time.Hour})
				first := []Observation{{Key: keyLive, OpportunityID: "a", Class: Passed, Occurred: h0*hourUS + 5, Assessed: h0 * hourUS}}
				if _, err := s.Apply(ctx, first, time.UnixMicro(h0*hourUS+5)); err != nil {
					t.Fatal(err)
				}
				field, v := fmt.Sprint("h", h0), tc.v
				switch tc.field {
				case "i":
					field = fmt.Sprint("i", h0) // an hour's retention: groups of one hour
				case "m":
					field = fmt.Sprint("m", h0*60)
				case "H":
					hx, err := headNumbers(c.HGet(ctx, s.keys(keyLive)[1], "H").Val())
					if err != nil {
						t.Fatal(err)
					}
					hex := make([]string, len(hx))
					for i, x := range hx {
						hex[i] = strconv.FormatInt(x, 16)
						if tc.v == "wide" {
							hex[i] = fmt.Sprintf("%08x", x)
						}
					}
					field, v = "H", strings.Join(hex, ",")
					if tc.v == "layout 8" {
						v = "\x08" + codecHead(0, hx[:20])[2:]
					}
					if tc.v == "layout 9" {
						v = "\x09" + codecHead(1, hx[:20])[1:]
					}
					if tc.v == "wide" && len(v) < 140 {
						t.Fatalf("head %q: shorter than the binary head", v)
					}
				}
				if c.HGet(ctx, s.keys(keyLive)[1], field).Val() == "" {
					t.Fatalf("no field %s to overwrite", field)
				}
				c.HSet(ctx, s.keys(keyLive)[1], field, v)
				before := codecDump(t, c, s.cfg.Prefix)
				// A new winner in that hour (read with the head), and a re-assessment of the stored one.
				for _, o := range []Observation{
					{Key: keyLive, OpportunityID: "b", Class: Confirmed, Occurred: h0*hourUS + 9, Assessed: h0 * hourUS},
					{Key: keyLive, OpportunityID: "a", Class: Confirmed, Occurred: h0*hourUS + 6, Assessed: h0*hourUS + 1},
				} {
					_, err := s.Apply(ctx, []Observation{o}, time.UnixMicro(h0*hourUS+9))
					if err == nil {
						t.Fatalf("field %s = %q was read as this layout's", field, v)
					}
					if tc.kind && !strings.Contains(err.Error(), "is no hour of this layout") && !strings.Contains(err.Error(), "is no index group of this layout") {
						t.Errorf("field %s = %q: %v, want apply.lua's layout error", field, v, err)
					}
					after := codecDump(t, c, s.cfg.Prefix)
					if !reflect.DeepEqual(before, after) {
						t.Fatalf("a refused batch changed the state:\nbefore %v\nafter  %v", before, after)
					}
				}
			})
		}
	})
}

// codecRunStreams applies random streams over a dozen aggregates (duplicates, re-assessments across
// hours, stale and far too late events, watermark leaps that expire whole aggregates, short
// retention), cut into batches with redeliveries.
func codecRunStreams(t *testing.T) {
	for _, tc := range []struct {
		name      string
		seed      uint64
		n         int
		span      time.Duration
		retention time.Duration
		jumpEvery int
		maxBatch  int
	}{
		{"leaps", 2, 2000, 10 * 24 * time.Hour, 3 * 24 * time.Hour, 300, 300},
		{"short retention, leaps", 4, 1500, 2 * time.Hour, time.Hour, 400, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(tc.seed, 7))
			p := newCodecPair(t, "streams", tc.retention)
			batches := equivCut(r, randomStreamOver(r, tc.n, tc.span, tc.jumpEvery), tc.maxBatch)
			for i, b := range batches {
				p.apply(fmt.Sprint("batch ", i), b.obs, b.at)
			}
			p.tallies(batches[len(batches)-1].at)
			for _, o := range []Outcome{Counted, Reassessed, Duplicate, Stale, Expired} {
				if p.sides[0].outs[o] == 0 {
					t.Errorf("the stream never produced %v", o)
				}
			}
		})
	}
}

// codecRunWide applies large batches of one aggregate over a hundred hours, with long ids (many
// closed chunks), then most of them again, then later ones that expire most of it and collect its
// records. (Not past the script's chunk of 4 000 arguments: the embedded server's Lua fails a batch
// of more than about 2 550 observations of one aggregate, "registry overflow" in table.concat of
// the outcomes, in layout 7 as in layout 8.)
func codecRunWide(t *testing.T) {
	r := rand.New(rand.NewPCG(8, 7))
	p := newCodecPair(t, "wide", 3*24*time.Hour)
	end := t0.Add(30 * 24 * time.Hour)
	wide := equivWide(r, 4500, 100, end) // past CHUNK (4 000), and past the 2 560 outcomes the embedded concat once overflowed on
	p.apply("wide", wide, end)
	p.apply("wide, most again", wide[:4200], end)
	for i := 1; i <= 3; i++ {
		at := end.Add(time.Duration(i) * 40 * time.Hour)
		p.apply(fmt.Sprint("later ", i), equivWide(r, 1500, 100, at), at)
	}
	if p.seen.closed == 0 {
		t.Error("no index group with closed chunks")
	}
}
