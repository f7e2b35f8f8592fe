package cloudevent

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/repeatrate/repeatrate/schemas"
)

// TestPartitionKeys decodes random live attempts, correction checks and suite-only eval
// results whose identities are made of the bytes the escaping is about ('|', '%', braces, space,
// non-ASCII, digits; up to the 512-byte limit), and requires of Event.PartitionKey
// (docs/semantics.md#message-keys): an observation is keyed by its aggregate ID, any other eval
// result by JoinEscaped(workspace, suite, case_id), which splits back into exactly those three;
// the key of a suite-only result depends on nothing else (version, run, model, result, prediction);
// and no two different identities share a key — in particular no case key equals an aggregate ID.
func TestPartitionKeys(t *testing.T) {
	dec, err := NewDecoder(DefaultDecoderConfig)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	at := now.Add(-time.Hour).Format(time.RFC3339)
	r := rand.New(rand.NewPCG(5, 5))
	alphabet := []string{"|", "%", "%7C", "{", "}", " ", "é", "a", "7", "||", "%25"}
	ident := func() string {
		if r.IntN(20) == 0 {
			return strings.Repeat(alphabet[r.IntN(len(alphabet))], 1000)[:schemas.MaxIdentityBytes-schemas.MaxIdentityBytes%6]
		}
		var b strings.Builder
		for range 1 + r.IntN(4) {
			b.WriteString(alphabet[r.IntN(len(alphabet))])
		}
		return b.String()
	}
	// Few distinct values per field, so that identities repeat and collide in their parts.
	pool := make([]string, 12)
	for i := range pool {
		pool[i] = ident()
	}
	pick := func() string { return pool[r.IntN(len(pool))] }
	owner := map[string]string{} // key -> the identity it was given for
	var suiteOnly, observations int
	caseKeys := map[string]bool{}
	aggKeys := map[string]bool{}
	for n := range 3000 {
		scope := map[string]string{"workspace": pick(), "model": pick(), "run": pick(), "checkpoint": pick(), "artifact": pick()}
		var typ string
		data := map[string]any{"scope": scope, "occurred_at": at, "assessed_at": at}
		kind := r.IntN(3)
		switch kind {
		case 0:
			typ = schemas.TypeLiveAttempt
			data["opportunity_id"], data["correction_id"], data["outcome"] = fmt.Sprint("o", n), pick(), "passed"
		default:
			typ = schemas.TypeEvalResult
			data["suite"], data["case_id"], data["version"] = pick(), pick(), pick()
			data["version_seq"], data["run_index"], data["runs"], data["result"] = r.IntN(5), r.IntN(3), 3, []string{"pass", "fail", "error"}[r.IntN(3)]
			if r.IntN(2) == 0 {
				data["prediction"] = pick()
			}
			if kind == 2 {
				data["correction_id"], data["opportunity_id"] = pick(), fmt.Sprint("o", n)
			}
		}
		b, err := json.Marshal(map[string]any{"specversion": "1.0", "id": fmt.Sprint("e", n), "source": "t", "type": typ, "data": data})
		if err != nil {
			t.Fatal(err)
		}
		ev, err := dec.DecodeStructured(b, now)
		if err != nil {
			t.Fatalf("event %d does not decode: %v\n%s", n, err, b)
		}
		key, ok := ev.PartitionKey()
		if !ok {
			t.Fatalf("event %d has no partition key", n)
		}
		parts, err := schemas.SplitEscaped(key)
		if err != nil {
			t.Fatalf("event %d: key %q does not split: %v", n, key, err)
		}
		var identity string
		if o, isObs := ev.Observation(); isObs {
			observations++
			if key != o.Key.String() {
				t.Fatalf("event %d, an observation, keyed %q, not by its aggregate %q", n, key, o.Key.String())
			}
			if len(parts) != 7 {
				t.Fatalf("event %d: aggregate key %q splits into %d parts", n, key, len(parts))
			}
			identity = "aggregate " + fmt.Sprintf("%q", o.Key.Aggregate())
			aggKeys[key] = true
		} else {
			suiteOnly++
			want := []string{scope["workspace"], data["suite"].(string), data["case_id"].(string)}
			if !slices.Equal(parts, want) {
				t.Fatalf("event %d: case key %q splits into %q, want %q", n, key, parts, want)
			}
			identity = fmt.Sprintf("case %q", want)
			caseKeys[key] = true
		}
		if prev, seen := owner[key]; seen && prev != identity {
			t.Fatalf("key %q is given to %s and to %s", key, prev, identity)
		}
		owner[key] = identity
	}
	for k := range caseKeys {
		if aggKeys[k] {
			t.Fatalf("case key %q equals an aggregate ID", k)
		}
	}
	// Enough of each, and keys shared by several events of one identity.
	if suiteOnly < 500 || observations < 500 || suiteOnly-len(caseKeys) < 100 {
		t.Fatalf("%d suite-only results, %d observations, %d distinct keys: the stream does not test sharing", suiteOnly, observations, len(owner))
	}
	t.Logf("%d suite-only results, %d observations, %d distinct keys (%d case keys)", suiteOnly, observations, len(owner), len(caseKeys))
}
