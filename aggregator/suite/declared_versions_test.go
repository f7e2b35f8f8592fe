package suite

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/internal/testenv"
)

// A store that does not know how many versions its suites have (a restart, another processor
// adding versions, a memory of suites smaller than the batch) declares too few, the script
// declines having written nothing, and the call is made again with what the script asked for:
// the batch applies, whatever the store remembers. Before, the memory was wiped when full in the
// middle of a round, and a batch of more suites than it held never converged.
func TestCallsConvergeWhateverTheStoreRemembers(t *testing.T) {
	ctx := context.Background()
	client := testenv.Redis(t)
	prefix := testenv.Name(t, "declared")
	testenv.CleanPrefix(t, client, prefix)
	cfg := aggregator.RedisConfig{Prefix: prefix, Retention: time.Hour}
	runs := func(version string, seq int64) []RunObservation {
		var out []RunObservation
		for s := range 10 {
			out = append(out, RunObservation{Key: RunKey{Key: Key{Workspace: "w", Suite: fmt.Sprint("s", s)}, Version: version, Case: "c"},
				Record: RunRecord{Result: 'p', VersionSeq: seq, Runs: 1}})
		}
		return out
	}
	first, err := NewRedis(client, cfg, Config{})
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range []string{"v1", "v2", "v3"} {
		if _, err := first.Apply(ctx, runs(v, int64(i+1)), t0); err != nil {
			t.Fatal(err)
		}
	}
	// A new store remembering two suites at most applies runs of a known version to all ten.
	fresh, err := NewRedis(client, cfg, Config{})
	if err != nil {
		t.Fatal(err)
	}
	fresh.versions.limit = 2
	if _, err := fresh.Apply(ctx, runs("v1", 1), t0); err != nil {
		t.Fatalf("a batch of 10 suites on a store remembering 2: %v", err)
	}
	// And through the read side, which declares as the batches do.
	s, err := fresh.Read(ctx, Key{Workspace: "w", Suite: "s9"}, t0)
	if err != nil || s == nil || len(s.Versions) != 3 {
		t.Fatalf("read: %+v %v", s, err)
	}
}
