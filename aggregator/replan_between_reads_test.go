package aggregator

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/repeatrate/repeatrate/internal/testenv"
)

// TestReplannedCallReadsItsBucketsUnderTheShapeItsStateSays: layout 11, a processor's first call on
// an aggregate (a restart, or another processor wrote last) reads its buckets in a second round
// trip and, planned from the head's minute, its state there again. Another processor adds a record
// between the two round trips, in the head's minute: the state read in the second holds the new
// shape, the buckets were named under the first head's. The call must be refused or left to
// apply.lua, leaving what apply.lua leaves, and count nothing twice.
func TestReplannedCallReadsItsBucketsUnderTheShapeItsStateSays(t *testing.T) {
	for _, held := range []int{1, 8} { // 8: the other's record splits the one bucket
		t.Run(fmt.Sprint(held, " records held"), func(t *testing.T) {
			fp := testFingerprinter(t)
			c := testenv.Redis(t)
			prefix, ref := testenv.Name(t, "replan"), testenv.Name(t, "replan-script")
			testenv.CleanPrefix(t, c, prefix)
			testenv.CleanPrefix(t, c, ref)
			hook := &beforeBucketsHook{}
			hooked := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
			t.Cleanup(func() { hooked.Close() })
			hooked.AddHook(hook)
			open := func(c *redis.Client, prefix string, compute bool) *Redis {
				s, err := NewRedis(c, RedisConfig{Prefix: prefix, Retention: 24 * time.Hour, ComputeCalls: compute, Fingerprint: fp})
				if err != nil {
					t.Fatal(err)
				}
				return s
			}
			mine, other, script := open(hooked, prefix, true), open(c, prefix, false), open(c, ref, false)
			k := Key{Scope: collisionScopes[0], CorrectionID: "replan", Source: Live}
			hour := Micros(t0) / hourUS * hourUS
			ob, at := inMinutes(k, hour)
			apply := func(s *Redis, b []Observation, m int64) Applied {
				got, err := s.Apply(context.Background(), b, at(m))
				if err != nil {
					t.Fatal(err)
				}
				return got
			}
			var first []Observation
			for i := range held {
				first = append(first, ob(fmt.Sprint("a", i), 50))
			}
			apply(other, first, 50)
			apply(script, first, 50)
			// Before the second round trip, the first pipeline that reads the buckets (the
			// computing processor does not know their shape yet, so the first reads none).
			hook.key = mine.keys(k)[2]
			hook.before = func() {
				apply(other, []Observation{ob("b", 50)}, 50)
				apply(script, []Observation{ob("b", 50)}, 50)
			}
			got := apply(mine, []Observation{ob("c", 52)}, 52)
			want := apply(script, []Observation{ob("c", 52)}, 52)
			if hook.before != nil {
				t.Fatal("the other writer did not come between the reads")
			}
			stored, refused := mine.ComputedCalls()
			t.Logf("computed and stored %d, refused %d", stored, refused)
			// Then every record again: all duplicates.
			again := append(append(first, ob("b", 50)), ob("c", 52))
			gotAgain, wantAgain := apply(mine, again, 53), apply(script, again, 53)
			dump := func(prefix string) map[string]string {
				out := map[string]string{}
				for key, v := range codecDumpAcross(t, c, prefix) {
					out[strings.TrimPrefix(key, prefix)] = v
				}
				return out
			}
			if !reflect.DeepEqual(got, want) || !reflect.DeepEqual(gotAgain, wantAgain) {
				t.Errorf("replies differ\ncomputing: %+v\n then %+v\napply.lua: %+v\n then %+v", got, gotAgain, want, wantAgain)
			}
			g, w := dump(prefix), dump(ref)
			for key, v := range w {
				if g[key] != v {
					t.Errorf("key %s differs\ncomputing: %s\napply.lua: %s", key, g[key], v)
				}
			}
		})
	}
}
