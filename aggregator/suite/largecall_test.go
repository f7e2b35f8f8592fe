package suite

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestOneCallOfManyRuns applies 3 000 runs of one suite in one batch (one script call) on both
// servers, against the model: the embedded server's table.concat pushes every element onto a
// registry of 5 120 slots, and the call's outcomes, one per run, once overflowed it past 2 560.
func TestOneCallOfManyRuns(t *testing.T) {
	var obs []RunObservation
	for c := 0; len(obs) < 3000; c++ {
		for idx := int64(0); idx < 5; idx++ {
			obs = append(obs, adv("v1", fmt.Sprint("case-", c), idx, "pfpe"[(c+int(idx))%4], 1, 5, int64(c%50), int64(c%50), 0))
		}
	}
	cfg := Config{MinHistory: 2, MissingAfter: 30 * time.Minute}
	advBackends(t, true, func(t *testing.T, client *redis.Client) {
		st := advCompare(t, client, cfg, []advBatch{{obs: obs, at: t0.Add(time.Hour)}, {obs: obs[:2800], at: t0.Add(2 * time.Hour)}})
		if st.codes["N"] != len(obs) || st.codes["D"] != 2800 {
			t.Errorf("outcomes %v, want %d counted and 2 800 duplicates", st.codes, len(obs))
		}
	})
}
