package suite

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/internal/testenv"
	"github.com/repeatrate/repeatrate/schemas"
)

// Commit fbac5c6 sends a call's runs as one argument per (version, case) cell group, with the
// group's counts and index bitmap when its indexes are distinct and in one block of 16, and the
// call's per-index and per-length version sums as totals; the script takes a new cell's group as
// it is (the fast path) and otherwise walks the entries, taking back the share of runs found held.
// It means to change nothing observable.
//
// These tests run, side by side on one server under two prefixes, the current encoding (Encode,
// splitEncode) with the current script, and the encoding of 36ccb9d (three arguments per run,
// reimplemented here: a11OldArgs) with the script of 36ccb9d, beside the model. After every call
// the outcomes and summaries of both must be the model's, the raw replies of both scripts must be
// equal (hash replies compared as sets of pairs; field order differences are counted apart) and
// every stored key, field, value, member, score and expiry must be equal. At the end the stored
// runs and cells must be the model's (advStored) and Read must give the model's summary. Both the
// test Redis and the embedded one of `repeatrate dev` (gopher-lua).
//
// Environment: REPEATRATE_ADV11_OLD_FILE=<path> takes the old script from a file instead of `git
// show 36ccb9d:aggregator/suite/suite.lua`; REPEATRATE_ADV11_CUR_FILE=<path> runs a file in place of
// the current script (how the tests were checked against altered copies of suite.lua);
// REPEATRATE_ADV11_STRICT=order, =enc or =1 (both) also fails on differences of hash field order in
// the replies or of object encoding in the stored keys.
//
//	REPEATRATE_TEST_REDIS=127.0.0.1:16379 go test -count=1 -run TestGroupEncoding ./aggregator/suite/

const a11PrevRev = "36ccb9d"

var (
	a11Suite = Key{"ws11", "grp|encodingRig"}
	a11Other = Key{"ws11", "grp|other11"}
)

// a11 is a graded run of a11Suite (see adv), occurred idx%50 minutes after t0.
func a11(v, c string, idx int64, res byte, vseq, runs, as, seq int64) RunObservation {
	o := adv(v, c, idx, res, vseq, runs, idx%50, as, seq)
	o.Key.Key = a11Suite
	return o
}

func a11rep(o RunObservation, tok int, trig string) RunObservation { return withReply(o, tok, trig) }

// a11trig gives o an abnormal trigger without a reply.
func a11trig(o RunObservation, trig string) RunObservation {
	o.Record.Trigger = trig
	return o
}

var (
	a11OldOnce sync.Once
	a11OldSrc  string
	a11OldErr  error
)

// a11OldSource returns the script of 36ccb9d, "" when it cannot be had.
func a11OldSource(t *testing.T) string {
	a11OldOnce.Do(func() {
		if f := os.Getenv("REPEATRATE_ADV11_OLD_FILE"); f != "" {
			b, err := os.ReadFile(f)
			a11OldSrc, a11OldErr = string(b), err
			return
		}
		out, err := exec.Command("git", "show", a11PrevRev+":aggregator/suite/suite.lua").Output()
		a11OldSrc, a11OldErr = string(out), err
	})
	if a11OldErr != nil || a11OldSrc == "" {
		t.Logf("no script of %s (%v): comparing with the model only", a11PrevRev, a11OldErr)
		return ""
	}
	return a11OldSrc
}

// a11CurScript returns the script the current encoding runs with: suite.lua, or the file of
// REPEATRATE_ADV11_CUR_FILE.
func a11CurScript(t *testing.T) *redis.Script {
	if f := os.Getenv("REPEATRATE_ADV11_CUR_FILE"); f != "" {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		return redis.NewScript(string(b))
	}
	return suiteScript
}

// a11OldFlags and a11OldEntry are runFlags and appendEntry as 36ccb9d had them.
func a11OldFlags(r *RunRecord) int64 {
	res := int64(2)
	switch r.Result {
	case 'p':
		res = 0
	case 'f':
		res = 1
	}
	rep, trig := int64(0), int64(0)
	if r.Reply {
		rep = 1
	}
	if r.Trigger != "" {
		trig = 1
	}
	return int64(r.Tokens)*16 + res*4 + rep*2 + trig
}

func a11OldEntry(idx int64, r *RunRecord) string {
	return fmt.Sprintf("%d %d %d %d;", idx, r.Assessed, r.Seq, a11OldFlags(r))
}

// a11OldArgs appends the groups of observations idx as 36ccb9d's scriptArgs encoded them: per
// cell (in order of first appearance) version, case, n, greatest runs, least occurred, greatest
// version_seq, then run_index, flags and entry per run.
func a11OldArgs(args []any, obs []RunObservation, idx []int) ([]any, []int) {
	type g struct {
		v, c      string
		runs, occ int64
		vs        int64
		members   []int
	}
	at := map[[2]string]int{}
	var gs []*g
	for _, i := range idx {
		o := &obs[i]
		k := [2]string{o.Key.Version, o.Key.Case}
		n, ok := at[k]
		if !ok {
			n = len(gs)
			at[k] = n
			gs = append(gs, &g{v: o.Key.Version, c: o.Key.Case, runs: o.Record.Runs, occ: o.Record.Occurred, vs: o.Record.VersionSeq})
		}
		x := gs[n]
		x.runs, x.occ, x.vs = max(x.runs, o.Record.Runs), min(x.occ, o.Record.Occurred), max(x.vs, o.Record.VersionSeq)
		x.members = append(x.members, i)
	}
	var order []int
	for _, x := range gs {
		args = append(args, x.v, x.c, len(x.members), x.runs, x.occ, x.vs)
		for _, i := range x.members {
			o := &obs[i]
			args = append(args, o.Key.RunIndex, a11OldFlags(&o.Record), a11OldEntry(o.Key.RunIndex, &o.Record))
			order = append(order, i)
		}
	}
	return args, order
}

// a11OldEncode is Encode (split false) or splitEncode (split true) in 36ccb9d's encoding.
func a11OldEncode(obs []RunObservation, split bool) *Encoded {
	e := &Encoded{n: len(obs), args: map[Key][]any{}, orders: map[Key][]int{}}
	bySuite := map[Key][]int{}
	for i := range obs {
		k := obs[i].Key.Key
		if _, ok := bySuite[k]; !ok {
			e.suites = append(e.suites, k)
		}
		bySuite[k] = append(bySuite[k], i)
	}
	for _, k := range e.suites {
		idx := bySuite[k]
		parts := [][]int{idx}
		if split {
			type cell struct{ v, c string }
			var cells []cell
			byCell := map[cell][]int{}
			for _, i := range idx {
				c := cell{obs[i].Key.Version, obs[i].Key.Case}
				if _, ok := byCell[c]; !ok {
					cells = append(cells, c)
				}
				byCell[c] = append(byCell[c], i)
			}
			var first, rest []int
			for _, c := range cells {
				m := byCell[c]
				h := (len(m) + 1) / 2
				first, rest = append(first, m[:h]...), append(rest, m[h:]...)
			}
			parts = [][]int{first, rest}
		}
		args := make([]any, headArgs)
		var order []int
		for _, p := range parts {
			if len(p) == 0 {
				continue
			}
			var o []int
			args, o = a11OldArgs(args, obs, p)
			order = append(order, o...)
		}
		e.args[k], e.orders[k] = args, order
	}
	return e
}

// a11Side is one store: a prefix, its encoding and its script.
type a11Side struct {
	name   string
	store  *Redis
	prefix string
	script *redis.Script
	encode func(obs []RunObservation, split bool) *Encoded
}

// apply runs the call on the side's script, returning what the store's ApplyEncoded would
// (parsed by the store's own code) and the raw replies.
func (s *a11Side) apply(ctx context.Context, client *redis.Client, obs []RunObservation, split bool, at time.Time) (Applied, []any, error) {
	e := s.encode(obs, split)
	s.store.fill(e, at)
	replies := make([]any, len(e.suites))
	for n, k := range e.suites {
		v, err := s.script.Run(ctx, client, s.store.scriptKeysOf(k, testVersions), e.args[k]...).Result()
		if err != nil {
			return Applied{}, nil, fmt.Errorf("%s script, suite %v: %w", s.name, k, err)
		}
		replies[n] = v
	}
	a, err := e.applied(replies)
	return a, replies, err
}

// read runs the side's script in read mode (Redis.Read's arguments).
func (s *a11Side) read(ctx context.Context, client *redis.Client, k Key, at time.Time) (*Summary, any, error) {
	v, err := s.script.Run(ctx, client, s.store.scriptKeysOf(k, testVersions), 0, s.store.suite.MinHistory, s.store.suite.JudgeLastVersions,
		aggregator.Micros(at)-s.store.suite.MissingAfter.Microseconds(), "r", schemas.MaxListedCases, schemas.MaxMissingRunIndexes).Result()
	if err != nil {
		return nil, nil, err
	}
	_, sum, err := parseSummary(k, v)
	return sum, v, err
}

// a11Norm returns a reply with every version's hash reply sorted by field, and whether sorting
// changed anything.
// a11Trim returns a reply of suite.lua without the parts the old script does not return: the
// snapshot version and the greatest version id.
func a11Trim(reply any) any {
	if top, ok := reply.([]any); ok && len(top) > 4 {
		return top[:4]
	}
	return reply
}

func a11Norm(reply any) (string, bool) {
	top, ok := a11Trim(reply).([]any)
	if !ok || len(top) != 4 {
		return fmt.Sprintf("%#v", reply), false
	}
	vs, _ := top[3].([]any)
	moved := false
	nvs := make([]any, len(vs))
	for i, e := range vs {
		f, ok := e.([]any)
		if !ok || len(f) != 3 {
			nvs[i] = e
			continue
		}
		flat, _ := f[1].([]any)
		type kv struct{ k, v any }
		var pairs []kv
		for j := 0; j+1 < len(flat); j += 2 {
			pairs = append(pairs, kv{flat[j], flat[j+1]})
		}
		sorted := slices.Clone(pairs)
		slices.SortStableFunc(sorted, func(a, b kv) int { return strings.Compare(fmt.Sprint(a.k), fmt.Sprint(b.k)) })
		if !reflect.DeepEqual(sorted, pairs) {
			moved = true
		}
		nf := make([]any, 0, len(flat))
		for _, p := range sorted {
			nf = append(nf, p.k, p.v)
		}
		nvs[i] = []any{f[0], nf, f[2]}
	}
	return fmt.Sprintf("%#v", []any{top[0], top[1], top[2], nvs}), moved
}

// a11Call is one script call: its runs and time; whether each cell is sent as two groups, whether
// it is applied twice in a row, whether the revived cases it reports are then announced.
type a11Call struct {
	obs                   []RunObservation
	at                    time.Time
	split, twice, announc bool
	want                  string
}

// a11Stats is what a comparison exercised.
type a11Stats struct {
	codes                    map[byte]int
	fast, slowNew, slowOld   int // groups the current encoding sent with counts (to a new cell or not) and without
	splitCalls, prevCompared int
	orderDiffs, encDiffs     int
	firstOrderDiff           string
	firstEncDiff             string
}

// withoutSnapshotVersion drops the discrimination hash's snapshot version (field sv) from a
// dump: scripts before it kept none, and everything else they stored must be equal.
func withoutSnapshotVersion(d map[string]string) map[string]string {
	out := make(map[string]string, len(d))
	for k, v := range d {
		out[k] = snapshotVersionField.ReplaceAllString(v, "")
	}
	return out
}

var snapshotVersionField = regexp.MustCompile(`\n  "sv" = "[0-9]+"`)

// a11Strip drops the object encodings from a dump.
func a11Strip(d map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range d {
		if i := strings.Index(v, "\n  encoding "); i >= 0 {
			v = v[:i]
		}
		out[k] = v
	}
	return out
}

// a11Compare applies calls to the current side, the old side (when its script can be had) and
// the model, failing on the first difference.
func a11Compare(t *testing.T, client *redis.Client, cfg Config, calls []a11Call) a11Stats {
	t.Helper()
	ctx := context.Background()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	strictEnv := os.Getenv("REPEATRATE_ADV11_STRICT")
	strictOrder := strictEnv == "1" || strings.Contains(strictEnv, "order")
	strictEnc := strictEnv == "1" || strings.Contains(strictEnv, "enc")
	mk := func(name string) *a11Side {
		p := testenv.Name(t, "encodingRig"+name)
		testenv.CleanPrefix(t, client, p)
		st, err := NewRedis(client, aggregator.RedisConfig{Prefix: p, Retention: time.Hour}, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return &a11Side{name: name, store: st, prefix: p}
	}
	cur := mk("cur")
	cur.script = a11CurScript(t)
	cur.encode = func(obs []RunObservation, split bool) *Encoded {
		if split {
			return splitEncode(obs)
		}
		return Encode(obs)
	}
	sides := []*a11Side{cur}
	if src := a11OldSource(t); src != "" {
		old := mk("old")
		old.script = redis.NewScript(src)
		old.encode = a11OldEncode
		sides = append(sides, old)
	}
	model := NewMemory(cfg)
	st := a11Stats{codes: map[byte]int{}}
	known := map[cellKey]bool{}  // cells the model held before the call (for the fast-path count)
	var lastObs []RunObservation // the runs of the last call applied (for the reports)
	runsOf := func(obs []RunObservation) string {
		var b strings.Builder
		for _, o := range obs {
			fmt.Fprintf(&b, "(%s %s %d %c as%d seq%d) ", o.Key.Version, o.Key.Case, o.Key.RunIndex, o.Record.Result,
				(o.Record.Assessed-aggregator.Micros(t0))/60e6, o.Record.Seq)
		}
		return b.String()
	}
	compareDumps := func(what string) {
		t.Helper()
		if len(sides) < 2 {
			return
		}
		dc := withoutSnapshotVersion(testenv.DumpKeys(t, client, cur.prefix, equivNoIgnore, equivNoNorm))
		do := withoutSnapshotVersion(testenv.DumpKeys(t, client, sides[1].prefix, equivNoIgnore, equivNoNorm))
		testenv.SameDumps(t, what+" (contents)", a11Strip(dc), a11Strip(do))
		if !reflect.DeepEqual(dc, do) {
			st.encDiffs++
			if st.firstEncDiff == "" {
				for k := range dc {
					if dc[k] != do[k] {
						st.firstEncDiff = fmt.Sprintf("%s (runs %s): key %s\ncurrent: %s\nold:     %s", what, runsOf(lastObs), k,
							dc[k][strings.LastIndex(dc[k], "\n  encoding"):], do[k][strings.LastIndex(do[k], "\n  encoding"):])
						break
					}
				}
			}
			if strictEnc {
				testenv.SameDumps(t, what+" (with encodings)", dc, do)
			}
		}
	}
	apply := func(n int, c a11Call, what string) Applied {
		t.Helper()
		want, _ := model.Apply(ctx, c.obs, c.at)
		w := advOutcomes(want.Outcomes)
		lastObs = c.obs
		if what == "first" {
			if c.want != "" && w != c.want {
				t.Fatalf("call %d: the model's outcomes are %s, the scenario expects %s", n, w, c.want)
			}
			for i := range len(w) {
				st.codes[w[i]]++
			}
			if c.split {
				st.splitCalls++
			}
			e := cur.encode(c.obs, c.split)
			for _, k := range e.suites {
				a := e.args[k]
				for b := headArgs + 1 + 3*a[headArgs].(int); b < len(a); b += groupWidth {
					counts, _ := a[b+7].([]byte)
					switch {
					case len(counts) == 0:
						st.slowOld++
					case known[cellKey{a[b].(string), a[b+1].(string)}]:
						st.slowNew++ // sent with counts, but the cell exists: the script walks it
					default:
						st.fast++
					}
				}
			}
		}
		var replies [][]any
		var got []Applied
		for _, s := range sides {
			g, raw, err := s.apply(ctx, client, c.obs, c.split, c.at)
			if err != nil {
				t.Fatalf("call %d (%s), %s: %v", n, what, s.name, err)
			}
			if gw := advOutcomes(g.Outcomes); gw != w {
				t.Fatalf("call %d (%s), %s side: outcomes\n%s, model\n%s", n, what, s.name, gw, w)
			}
			if !reflect.DeepEqual(g.Suites, want.Suites) {
				t.Fatalf("call %d (%s), %s side: suites %v, model %v", n, what, s.name, g.Suites, want.Suites)
			}
			for _, k := range want.Suites {
				if d := summaryDiff(g.Summaries[k], want.Summaries[k]); d != "" {
					t.Fatalf("call %d (%s), %s side: summary of %v differs from the model's: %s", n, what, s.name, k, d)
				}
			}
			replies, got = append(replies, raw), append(got, g)
		}
		if len(sides) == 2 {
			st.prevCompared++
			// The old script keeps no snapshot version: everything else must be equal.
			for _, k := range got[0].Suites {
				if s := got[0].Summaries[k]; s != nil {
					c := *s
					c.SnapshotVersion = 0
					got[0].Summaries[k] = &c
				}
			}
			if !reflect.DeepEqual(got[0], got[1]) {
				t.Fatalf("call %d (%s): parsed replies differ\ncurrent %+v\nold     %+v", n, what, got[0], got[1])
			}
			for j := range replies[0] {
				nc, mc := a11Norm(replies[0][j])
				no, mo := a11Norm(replies[1][j])
				if nc != no {
					t.Fatalf("call %d (%s): replies differ\ncurrent: %s\nold:     %s", n, what, nc, no)
				}
				if ec, eo := fmt.Sprintf("%#v", a11Trim(replies[0][j])), fmt.Sprintf("%#v", a11Trim(replies[1][j])); ec != eo {
					st.orderDiffs++
					if st.firstOrderDiff == "" {
						st.firstOrderDiff = fmt.Sprintf("call %d (%s), moved %v/%v\ncurrent: %s\nold:     %s", n, what, mc, mo, ec, eo)
					}
					if strictOrder {
						t.Fatalf("call %d (%s): replies differ in order\ncurrent: %s\nold:     %s", n, what, ec, eo)
					}
				}
			}
		}
		for _, o := range c.obs {
			known[cellKey{o.Key.Version, o.Key.Case}] = true
		}
		return want
	}
	for n, c := range calls {
		want := apply(n, c, "first")
		compareDumps(fmt.Sprint("after call ", n))
		if c.twice {
			before := blocksDump(t, client, cur.prefix)
			apply(n, c, "again")
			testenv.SameDumps(t, fmt.Sprintf("call %d applied again, current", n), blocksDump(t, client, cur.prefix), before)
			compareDumps(fmt.Sprint("after call ", n, " again"))
		}
		if c.announc {
			for _, k := range want.Suites {
				var cases []string
				for _, r := range want.Summaries[k].Revived {
					cases = append(cases, r.CaseID)
				}
				for _, sd := range sides {
					if err := sd.store.MarkAnnounced(ctx, k, cases); err != nil {
						t.Fatal(err)
					}
				}
				model.MarkAnnounced(ctx, k, cases)
			}
			compareDumps(fmt.Sprint("after the announcement of call ", n))
		}
	}
	last := calls[len(calls)-1].at
	for _, late := range []time.Time{last, last.Add(48 * time.Hour)} {
		if late != last {
			// Read also compares Cases, stored runs and cells; before the late read, which moves
			// the deadline of missing runs for good.
			advReadAll(t, client, cur.store, model, cfg, last)
		}
		for _, k := range model.Model.Suites() {
			want := model.Model.Summary(k, slices.Sorted(slices.Values(model.Model.Versions(k))), model.announced[k], cfg, late)
			var raws []string
			for _, s := range sides {
				got, raw, err := s.read(ctx, client, k, late)
				if err != nil {
					t.Fatalf("read of %v, %s: %v", k, s.name, err)
				}
				if d := summaryDiff(got, &want); d != "" {
					t.Fatalf("read of %v at %v, %s side, differs from the model's: %s", k, late, s.name, d)
				}
				nr, _ := a11Norm(raw)
				raws = append(raws, nr)
			}
			if len(raws) == 2 && raws[0] != raws[1] {
				t.Fatalf("read of %v at %v differs\ncurrent: %s\nold:     %s", k, late, raws[0], raws[1])
			}
		}
		compareDumps(fmt.Sprint("after the reads at ", late))
	}
	for _, s := range sides {
		for _, k := range model.Model.Suites() {
			advStored(t, client, s.store, model.Model, k)
		}
	}
	t.Logf("outcomes %v; groups: %d fast, %d with counts to an existing cell, %d walked; %d split calls; %d calls compared with %s; "+
		"%d replies differing only in hash field order, %d dumps only in encoding",
		st.codes, st.fast, st.slowNew, st.slowOld, st.splitCalls, st.prevCompared, a11PrevRev, st.orderDiffs, st.encDiffs)
	if st.firstOrderDiff != "" {
		t.Logf("first field order difference: %s", st.firstOrderDiff)
	}
	if st.firstEncDiff != "" {
		t.Logf("first encoding difference: %s", st.firstEncDiff)
	}
	return st
}

// a11Need fails unless the comparison saw every outcome code in codes and groups of each path.
func a11Need(t *testing.T, st a11Stats, codes string) {
	t.Helper()
	for i := range len(codes) {
		if st.codes[codes[i]] == 0 {
			t.Errorf("no run had outcome %c (%v)", codes[i], st.codes)
		}
	}
	if st.fast == 0 || st.slowOld == 0 {
		t.Errorf("paths: %d fast groups, %d walked", st.fast, st.slowOld)
	}
}

// TestGroupEncodingEdges: hand-made calls at the edges of the fast path and its encoding.
func TestGroupEncodingEdges(t *testing.T) {
	at := t0.Add(time.Hour)
	p, f, e := byte('p'), byte('f'), byte('e')
	// Call 0: new cells only.
	var c0 []RunObservation
	for i := int64(0); i < 16; i++ { // block 0 full: bitmap 0xff 0xff
		c0 = append(c0, a11("v1", "b0full", i, "pfe"[i%3], 1, 16, 0, 0))
	}
	for i := int64(31); i >= 16; i-- { // block 1 full, descending: bitmap 0 0 0xff 0xff
		c0 = append(c0, a11rep(a11("v1", "b1full", i, "pf"[i%2], 1, 40, 0, 0), int(i), ""))
	}
	c0 = append(c0,
		a11("v1", "cross", 15, p, 1, 20, 0, 0), a11("v1", "cross", 16, f, 1, 20, 0, 0), // crossing: walked
		a11("v1", "e7", 7, p, 1, 8, 0, 0),
		a11("v1", "e8", 8, f, 1, 9, 0, 0),
		a11("v1", "e15", 15, p, 1, 16, 0, 0),
		a11("v1", "e16", 16, p, 1, 17, 0, 0),
		a11("v1", "e17", 17, e, 1, 18, 0, 0),
		a11("v1", "e255", 255, p, 1, 256, 0, 0), a11("v1", "e255", 254, f, 1, 256, 0, 0), a11("v1", "e255", 240, p, 1, 256, 0, 0),
		a11("v1", "e256", 256, p, 1, 300, 0, 0),
		a11("v1", "e9999", 9999, f, 1, 10000, 0, 0), a11("v1", "e9999", 9984, p, 1, 10000, 0, 0),
		a11("v1", "dupD", 3, p, 1, 5, 0, 0), a11("v1", "dupD", 3, p, 1, 5, 0, 0), // N D
		a11("v1", "dupR", 3, p, 1, 5, 0, 0), a11("v1", "dupR", 4, f, 1, 5, 0, 0), a11("v1", "dupR", 3, f, 1, 5, 1, 0), // N N R
		a11("v1", "dupS", 3, p, 1, 5, 1, 0), a11("v1", "dupS", 3, f, 1, 5, 0, 0), // N S
		a11("v1", "dup3", 9, p, 1, 12, 0, 0), a11("v1", "dup3", 9, f, 1, 12, 0, 1), a11("v1", "dup3", 9, e, 1, 12, 0, 1), a11("v1", "dup3", 9, p, 1, 12, 0, 0), // N R D S
		a11rep(a11("v1", "tok", 0, p, 1, 8, 0, 0), 0, ""),
		a11rep(a11("v1", "tok", 1, f, 1, 8, 0, 0), 0, "loop"),
		a11rep(a11("v1", "tok", 2, e, 1, 8, 0, 0), 16383, "gzip_ratio"),
		a11rep(a11("v1", "tok", 3, p, 1, 8, 0, 0), 16384, ""),
		a11rep(a11("v1", "tok", 4, p, 1, 8, 0, 0), 16385, "loop"),
		a11rep(a11("v1", "tok", 5, f, 1, 8, 0, 0), 1<<20, "loop"),
		a11trig(a11("v1", "tok", 6, p, 1, 8, 0, 0), "loop"), // trigger without reply
		a11trig(a11("v1", "tok", 7, e, 1, 8, 0, 0), "loop"),
		a11("v2", "b0full", 5, p, 2, 16, 0, 0), // a second version in the call
		a11("v2", "e7", 7, f, 2, 8, 0, 0),
		a11rep(a11("v2", "tok", 0, p, 2, 8, 0, 0), 0, ""),
	)
	// Call 1: call 0 again (every run held: D, the totals taken back), within a larger call.
	c1 := slices.Clone(c0)
	// Call 2: re-assessments of held runs, new runs in existing cells (blocks held and not), new
	// cells in blocks > 0, a version created ranked first, one reordered.
	c2 := []RunObservation{
		a11("v1", "b0full", 0, f, 1, 16, 1, 0),                               // R p→f
		a11("v1", "b0full", 1, p, 1, 16, 0, 1),                               // R f→p (seq)
		a11("v1", "b0full", 2, e, 1, 16, 0, 0),                               // D
		a11("v1", "b0full", 3, e, 1, 16, -1, 0),                              // S
		a11rep(a11("v1", "b1full", 16, f, 1, 40, 1, 0), 99, "loop"),          // R with another reply
		a11("v1", "b1full", 32, p, 1, 40, 0, 0),                              // N block 2
		a11("v1", "b1full", 15, p, 1, 40, 0, 0),                              // N block 0, not held
		a11("v1", "e7", 6, p, 5, 8, 0, 0),                                    // N, v1 reordered (vseq 5)
		a11("v1", "e7", 7, f, 1, 8, 1, 0),                                    // R
		a11("v1", "e8", 8, f, 1, 9, 0, 0), a11("v1", "e8", 8, p, 1, 9, 1, 0), // D R
		a11("v1", "e255", 255, p, 1, 256, 2, 0), a11("v1", "e255", 253, p, 1, 256, 0, 0),
		a11("v1", "newb3", 48, p, 1, 64, 0, 0), a11("v1", "newb3", 63, f, 1, 64, 0, 0), // new, block 3
		a11("v0", "b0full", 0, p, 0, 16, 0, 0),                    // a new version ranked first
		a11("v0", "b0full", 0, p, 0, 16, 0, 0),                    // D within the call, in a new cell
		a11rep(a11("v1", "tok", 2, p, 1, 8, 3, 0), 16384, ""),     // R across the dense boundary
		a11rep(a11("v1", "tok", 5, f, 1, 8, 0, 0), 1<<20, "loop"), // D
		a11rep(a11("v1", "tok", 6, p, 1, 8, 1, 0), 7, "loop"),     // R: now with a reply
	}
	// Call 3: a prefix of calls 0 and 2 again, and errored runs without a reply in a new cell.
	c3 := append(slices.Clone(c0[:40]), c2[:9]...)
	c3 = append(c3, a11("v1", "erronly", 0, e, 1, 4, 0, 0), a11("v1", "erronly", 1, e, 1, 4, 0, 0))
	// Call 4: only errored runs without reply (no totals at all).
	c4 := []RunObservation{a11("v3", "erronly", 2, e, 3, 4, 0, 0), a11("v3", "erronly", 3, e, 3, 4, 0, 0), a11("v3", "x", 17, e, 3, 18, 0, 0)}
	// Call 5 (split): new cells sent as two groups: the first half takes the fast path, the second
	// is walked and finds runs of the first held.
	c5 := []RunObservation{
		a11("v1", "sp1", 0, p, 1, 4, 0, 0), a11("v1", "sp1", 1, f, 1, 4, 0, 0), a11("v1", "sp1", 0, f, 1, 4, 1, 0), a11("v1", "sp1", 1, f, 1, 4, 0, 0), // N N | R D
		a11("v1", "sp2", 15, p, 1, 40, 0, 0), a11("v1", "sp2", 14, p, 1, 40, 0, 0), a11("v1", "sp2", 16, p, 1, 40, 0, 0), a11("v1", "sp2", 15, p, 1, 40, -1, 0), // N N | N S
		a11("v1", "sp3", 31, p, 1, 40, 0, 0), a11("v1", "sp3", 16, f, 1, 40, 0, 0), a11("v1", "sp3", 32, p, 1, 40, 0, 0), // N N | N
		a11("v1", "b0full", 4, p, 1, 16, 0, 0), a11("v1", "b0full", 4, p, 1, 16, 5, 0), // existing cell: D | R
	}
	// Call 6: a second suite beside the first, and cells over many blocks.
	var c6 []RunObservation
	for i := int64(0); i < 70; i++ {
		o := a11("v1", "wide", i*7%97, "pfe"[i%3], 1, 100, 0, i/50)
		c6 = append(c6, o)
		q := a11("v1", "other", i, 'p', 1, 80, 0, 0)
		q.Key.Key = a11Other
		c6 = append(c6, q)
	}
	// Call 7: assessed times at and below zero, sequences at the largest exact value, version_seq
	// large, case ids and version labels with the separators the script's keys use.
	big := int64(1<<53 - 1)
	odd := func(v, c string, idx int64, res byte, vs, as, seq int64) RunObservation {
		o := a11(v, c, idx, res, vs, 40, 0, 0)
		o.Record.Assessed, o.Record.Seq = as, seq
		return o
	}
	c7 := []RunObservation{
		odd("v1", "neg", 3, p, 1, -5, 0), odd("v1", "neg", 3, f, 1, -6, 0), odd("v1", "neg", 4, p, 1, 0, 0), // N S N
		odd("v1", "neg", 4, f, 1, 0, big), odd("v1", "neg", 4, e, 1, 0, big-1), odd("v1", "neg", 4, e, 1, 0, big), // R S D
		odd("v1", "a|b|0", 0, p, 1, 1, 0), odd("v1", "a|b|0", 16, f, 1, 1, 0), // crossing blocks, in a case id with '|'
		odd("v1", "a|b", 0, f, 1, 1, 0), odd("v1", "x y;1 2 3 4;", 5, p, 1, 1, 0),
		odd("v|9 big", "a|b", 17, p, big, 1, 0), odd("v|9 big", "a|b", 17, p, big, 1, 0), // N D
	}
	calls := []a11Call{
		{obs: c7, at: at.Add(-time.Minute), want: "NSNRSD" + "NN" + "NN" + "ND"},
		{obs: c0, at: at, want: "NNNNNNNNNNNNNNNN" + "NNNNNNNNNNNNNNNN" + "NN" + "NNNNN" + "NNN" + "N" + "NN" + "ND" + "NNR" + "NS" + "NRDS" + "NNNNNNNN" + "NNN"},
		{obs: c1, at: at.Add(time.Minute), twice: true},
		{obs: c2, at: at.Add(2 * time.Minute), announc: true},
		{obs: c3, at: at.Add(3 * time.Hour), twice: true},
		{obs: c4, at: at.Add(3 * time.Hour)},
		{obs: c5, at: at.Add(4 * time.Hour), split: true, want: "NNRD" + "NNNS" + "NNN" + "DR"},
		{obs: c6, at: at.Add(5 * time.Hour), twice: true},
	}
	for _, mh := range []int{1, 2} {
		t.Run(fmt.Sprint("min_history=", mh), func(t *testing.T) {
			advBackends(t, true, func(t *testing.T, client *redis.Client) {
				st := a11Compare(t, client, Config{MinHistory: mh, MissingAfter: 20 * time.Minute}, calls)
				a11Need(t, st, "NRDS")
			})
		})
	}
}

// a11Stream returns random calls for a11Suite (and sometimes a11Other): run indexes biased to
// block and byte edges, the same run several times in a call, earlier runs delivered again as they
// were or re-assessed, prefixes of everything so far delivered again, several versions (created
// in a call, reordered), replies of lengths around the processor's dense range, triggers without
// replies, errors.
func a11Stream(r *rand.Rand, calls int, maxRuns int) []a11Call {
	edges := []int64{0, 1, 6, 7, 8, 9, 14, 15, 16, 17, 23, 24, 31, 32, 33, 47, 48, 127, 128, 255, 256, 257, 1000, 4095, 4096, 9983, 9984, 9999}
	toks := []int{0, 1, 2, 15, 16, 17, 255, 256, 16383, 16384, 16385, 1 << 20}
	versions := []string{"va", "vb", "vc", "vd"}
	vseq := map[string]int64{"va": 1, "vb": 2, "vc": 3, "vd": 4}
	var out []a11Call
	var hist []RunObservation
	at := t0.Add(time.Hour)
	cases := []string{"c0", "c1", "c2", "c3", "c4", "c5", "c6"}
	for n := 0; n < calls; n++ {
		at = at.Add(time.Duration(r.IntN(40)) * time.Minute)
		var obs []RunObservation
		k := 1 + r.IntN(maxRuns)
		mode := r.IntN(10)
		switch {
		case mode == 0 && len(hist) > 0: // a prefix of everything so far, again
			m := 1 + r.IntN(len(hist))
			obs = slices.Clone(hist[:m])
		case mode == 1 && len(out) > 0: // one earlier call again, maybe with more runs
			obs = slices.Clone(out[r.IntN(len(out))].obs)
		}
		for len(obs) < k {
			var o RunObservation
			if len(hist) > 0 && r.IntN(4) == 0 {
				o = hist[r.IntN(len(hist))]
				switch r.IntN(3) {
				case 0: // as it was
				case 1: // re-assessed, newer or older
					o.Record.Assessed += int64(r.IntN(3)-1) * 60e6
					o.Record.Result = "pfe"[r.IntN(3)]
				case 2:
					o.Record.Seq = int64(r.IntN(3))
					o.Record.Result = "pfe"[r.IntN(3)]
				}
			} else {
				v := versions[r.IntN(len(versions))]
				if r.IntN(15) == 0 {
					vseq[v] += int64(r.IntN(5)) - 1 // reorder, sometimes older
				}
				var idx int64
				switch r.IntN(3) {
				case 0:
					idx = edges[r.IntN(len(edges))]
				case 1:
					idx = int64(r.IntN(20))
				default:
					base := int64(r.IntN(5)) * 16
					idx = base + int64(r.IntN(16))
				}
				runs := idx + 1 + int64(r.IntN(20))
				if runs > 10000 {
					runs = 10000
				}
				o = adv(v, cases[r.IntN(len(cases))], idx, "pfe"[r.IntN(3)], vseq[v], runs, int64(r.IntN(60)), int64(r.IntN(3)), int64(r.IntN(2)))
				o.Key.Key = a11Suite
				if r.IntN(8) == 0 {
					o.Key.Key = a11Other
				}
				switch r.IntN(4) {
				case 0:
					o = withReply(o, toks[r.IntN(len(toks))], "")
				case 1:
					o = withReply(o, toks[r.IntN(len(toks))], "loop")
				case 2:
					if r.IntN(3) == 0 {
						o.Record.Trigger = "loop"
					}
				}
			}
			obs = append(obs, o)
			if r.IntN(6) == 0 { // the same run again at once, as it is or re-assessed
				q := o
				if r.IntN(2) == 0 {
					q.Record.Seq++
					q.Record.Result = "pfe"[r.IntN(3)]
				}
				obs = append(obs, q)
			}
		}
		if r.IntN(3) == 0 {
			r.Shuffle(len(obs), func(i, j int) { obs[i], obs[j] = obs[j], obs[i] })
		}
		c := a11Call{obs: obs, at: at, twice: r.IntN(6) == 0, announc: r.IntN(3) == 0}
		single := true
		for _, o := range obs {
			single = single && o.Key.Key == obs[0].Key.Key
		}
		c.split = single && r.IntN(3) == 0
		out = append(out, c)
		hist = append(hist, obs...)
	}
	return out
}

// TestGroupEncodingRandomStreams: random streams on both backends (the embedded one with fewer calls).
func TestGroupEncodingRandomStreams(t *testing.T) {
	cfgs := []Config{
		{MinHistory: 1, MissingAfter: 10 * time.Minute},
		{MinHistory: 2, JudgeLastVersions: 2, MissingAfter: 30 * time.Minute},
		{MinHistory: 3, MissingAfter: time.Hour},
	}
	for n, cfg := range cfgs {
		t.Run(fmt.Sprint("cfg", n), func(t *testing.T) {
			t.Run("redis", func(t *testing.T) {
				client := testenv.Redis(t)
				for seed := uint64(0); seed < 4; seed++ {
					r := rand.New(rand.NewPCG(11, seed*10+uint64(n)))
					st := a11Compare(t, client, cfg, a11Stream(r, 25, 30))
					a11Need(t, st, "NRDS")
				}
			})
			t.Run("embedded", func(t *testing.T) {
				addr := a9Addr(t, true)
				client := redis.NewClient(&redis.Options{Addr: addr})
				t.Cleanup(func() { client.Close() })
				r := rand.New(rand.NewPCG(12, uint64(n)))
				st := a11Compare(t, client, cfg, a11Stream(r, 12, 20))
				a11Need(t, st, "NRDS")
			})
		})
	}
}

// TestGroupEncodingManyFields: one version's sums hash held at exactly hash-max-listpack-entries
// fields (128 by default) by call 0 — R and D, p<i> and n<i> of as many passed runs, one per cell, and
// c1,1 and t1,1 — then calls that take k of the p<i> fields to zero (re-assessed pass → fail) while
// they create c1,0 and t1,0, and some add new fields: whether the hash passes 129 fields on the way
// depends on the order the script writes the sums in; contents must be equal whatever it is, and
// encoding differences are counted (REPEATRATE_ADV11_STRICT=1 fails on them).
func TestGroupEncodingManyFields(t *testing.T) {
	client := testenv.Redis(t)
	limit := int64(128)
	if v, err := client.ConfigGet(context.Background(), "hash-max-listpack-entries").Result(); err == nil {
		if n, err := strconv.ParseInt(v["hash-max-listpack-entries"], 10, 64); err == nil {
			limit = n
		}
	}
	m := int((limit - 4) / 2) // R, D, c1,1, t1,1 and p<i>, n<i> of m runs
	planned := int64(m + 70)
	enc, order := 0, 0
	for seed := uint64(0); seed < 30; seed++ {
		r := rand.New(rand.NewPCG(21, seed))
		at := t0.Add(30 * time.Minute) // no case matures before the late read: no M field
		var c0 []RunObservation
		for i := int64(0); i < int64(m); i++ {
			c0 = append(c0, a11("v1", fmt.Sprint("m", i), i, 'p', 1, planned, 0, 0))
		}
		calls := []a11Call{{obs: c0, at: at}}
		for n := 0; n < 4; n++ {
			var obs []RunObservation
			k := 2 + r.IntN(4)
			for _, i := range r.Perm(m)[:k] {
				obs = append(obs, a11("v1", fmt.Sprint("m", i), int64(i), 'f', 1, planned, int64(n+1), 0))
			}
			for j := 0; n > 0 && j < r.IntN(3); j++ { // call 1: deletions and c1,0 / t1,0 only
				i := m + r.IntN(60)
				obs = append(obs, a11rep(a11("v1", fmt.Sprint("n", n, "-", j), int64(i), 'p', 1, planned, 0, 0), r.IntN(300), "loop"))
			}
			r.Shuffle(len(obs), func(i, j int) { obs[i], obs[j] = obs[j], obs[i] })
			calls = append(calls, a11Call{obs: obs, at: at.Add(time.Duration(n+1) * time.Minute)})
		}
		st := a11Compare(t, client, Config{MinHistory: 2, MissingAfter: time.Hour}, calls)
		enc += st.encDiffs
		order += st.orderDiffs
	}
	t.Logf("%d dumps differing only in object encoding, %d replies only in hash field order", enc, order)
}
