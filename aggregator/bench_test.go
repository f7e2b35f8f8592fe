package aggregator

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// go test -run '^$' -bench ApplyBatch -benchmem ./aggregator   (needs the test Redis)
func BenchmarkApplyBatch(b *testing.B) {
	ctx := context.Background()
	store, _ := testStore(b, "bench", RedisConfig{Retention: 30 * 24 * time.Hour})
	const batch = 2000
	r := rand.New(rand.NewPCG(1, 2))
	var keys []Key
	for i := 0; i < 100; i++ {
		k := keyLive
		k.CorrectionID = fmt.Sprint("fix-", i)
		keys = append(keys, k)
	}
	obs := make([]Observation, batch)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		for j := range obs {
			occ := Micros(t0) + int64(i*batch+j)*1000
			obs[j] = Observation{Key: keys[r.IntN(len(keys))], OpportunityID: fmt.Sprint("o", i*batch+j), Class: Class(1 + r.IntN(3)), Occurred: occ, Assessed: occ}
		}
		b.StartTimer()
		if _, err := store.Apply(ctx, obs, t0.Add(time.Duration(i*batch)*time.Millisecond)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "events/s")
}

func BenchmarkModelApplyBatch(b *testing.B) {
	m := NewModel(30 * 24 * time.Hour)
	obs := make([]Observation, 2000)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		for j := range obs {
			occ := Micros(t0) + int64(i*2000+j)*1000
			obs[j] = Observation{Key: keyLive, OpportunityID: fmt.Sprint("o", (i*2000+j)%50000), Class: Passed, Occurred: occ, Assessed: occ}
		}
		m.ApplyBatch(obs)
	}
}
