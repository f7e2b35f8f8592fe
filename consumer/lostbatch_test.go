package consumer

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/aggregator/suite"
	"github.com/repeatrate/repeatrate/schemas"
)

// rdbRedis is a redis-server of the test's own that persists by RDB snapshots only, so that a
// SIGKILL brings it back with exactly the writes before its last SAVE.
type rdbRedis struct {
	addr, port, dir string
	cmd             *exec.Cmd
}

func startRDBRedis(t *testing.T, port string) *rdbRedis {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("redis-server is required under CI=true (deploy/local/redis.sh installs it)")
		}
		t.Skip("redis-server not installed")
	}
	rs := &rdbRedis{addr: "127.0.0.1:" + port, port: port, dir: t.TempDir()}
	rs.start(t)
	t.Cleanup(func() { rs.cmd.Process.Kill(); rs.cmd.Wait() })
	return rs
}

func (rs *rdbRedis) start(t *testing.T) {
	t.Helper()
	rs.cmd = exec.Command("redis-server", "--bind", "127.0.0.1", "--port", rs.port, "--dir", rs.dir,
		"--save", "", "--appendonly", "no", "--protected-mode", "yes")
	if err := rs.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: rs.addr})
	defer c.Close()
	for range 100 {
		if c.Ping(context.Background()).Err() == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("redis-server did not answer")
}

// crashAndRestart SIGKILLs the server and starts it again from its last SAVE.
func (rs *rdbRedis) crashAndRestart(t *testing.T) {
	t.Helper()
	rs.cmd.Process.Signal(syscall.SIGKILL)
	rs.cmd.Wait()
	rs.start(t)
}

// crashingStore and crashingSuites run a hook before the next Seal or suite Apply.
type crashingStore struct {
	Store
	beforeSeal func()
}

func (s *crashingStore) Seal(ctx context.Context, _ aggregator.Offsets) (int64, error) {
	if f := s.beforeSeal; f != nil {
		s.beforeSeal = nil
		f()
	}
	return s.Store.Seal(ctx, nil)
}

type crashingSuites struct {
	SuiteStore
	beforeApply func()
}

func (s *crashingSuites) Apply(ctx context.Context, obs []suite.RunObservation, at time.Time) (suite.Applied, error) {
	if f := s.beforeApply; f != nil {
		s.beforeApply = nil
		f()
	}
	return s.SuiteStore.Apply(ctx, obs, at)
}

// Redis loses exactly the writes of batch N (made after mark N−1 was durable) and comes back
// before Seal(N): mark N−1 is where Seal expects it, so only the pending token written after the
// batch's writes can tell. The processor must rewind (consume again from the committed offsets),
// never seal N and let its offsets be committed; applied again, the batch counts once.
func TestSealFindsTheLostWritesOfItsOwnBatch(t *testing.T) {
	ctx := context.Background()
	rs := startRDBRedis(t, "16433")
	client := redis.NewClient(&redis.Options{Addr: rs.addr})
	defer client.Close()
	evalRun := func(off int64, run int) kafka.Message {
		v := strings.NewReplacer(`"id":"e1"`, fmt.Sprintf(`"id":"ev%d"`, off), `"type":"repeatrate.live.attempt.v1"`, `"type":"repeatrate.eval.result.v1"`,
			`"opportunity_id":"o","correction_id":"fix",`, "",
			`"outcome":"confirmed_repeat"`, fmt.Sprintf(`"suite":"s","case_id":"k","version":"v1","version_seq":1,"run_index":%d,"runs":3,"result":"fail"`, run)).Replace(structured)
		return kafka.Message{Topic: "in", Offset: off, Value: []byte(v)}
	}
	batch1 := []kafka.Message{liveMessage(0, "o1", "passed"), evalRun(1, 0)}
	batch2 := []kafka.Message{liveMessage(2, "o2", "confirmed_repeat"), evalRun(3, 1)}
	k := aggregator.Key{Scope: schemas.Scope{Workspace: "w", Model: "m", Run: "r", Checkpoint: "c", Artifact: "a"}, CorrectionID: "fix", Source: aggregator.Live}

	for _, tc := range []struct {
		name string
		// where Redis crashes during batch 2 and comes back from the SAVE made after batch 1
		beforeSeal, beforeSuiteApply bool
		rewind                       bool
	}{
		{"lost after the whole batch was applied", true, false, true},
		{"lost between the rates and the suite writes", false, true, true},
		{"nothing lost: crash before the batch", false, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prefix := fmt.Sprintf("lostbatch%d", time.Now().UnixNano())
			cfg := aggregator.RedisConfig{Prefix: prefix, Retention: 30 * 24 * time.Hour, Pending: aggregator.NewPending()}
			rates, suites := redisStores(t, client, cfg)
			store, ss := &crashingStore{Store: rates}, &crashingSuites{SuiteStore: suites}
			p, err := NewProcessor(ProcessorConfig{RetryMin: time.Millisecond}, newTestDecoder(t), store, ss, &recordingPublisher{}, &recordingDLQ{},
				func() time.Time { return now }, zap.NewNop(), NewMetrics(prometheus.NewRegistry()))
			if err != nil {
				t.Fatal(err)
			}
			if err := p.Handle(ctx, batch1); err != nil {
				t.Fatal(err)
			}
			if err := client.Save(ctx).Err(); err != nil { // mark 1 and everything before it are durable
				t.Fatal(err)
			}
			crash := func() { rs.crashAndRestart(t) }
			switch {
			case tc.beforeSeal:
				store.beforeSeal = crash
			case tc.beforeSuiteApply:
				ss.beforeApply = crash
			default:
				rs.crashAndRestart(t)
			}
			err = p.Handle(ctx, batch2)
			if tc.rewind != errors.Is(err, ErrRewind) || (!tc.rewind && err != nil) {
				t.Fatalf("handle batch 2 = %v, want rewind %v", err, tc.rewind)
			}
			if tc.rewind {
				if !errors.Is(err, aggregator.ErrWritesLost) {
					t.Fatalf("rewind for %v, want the lost writes named", err)
				}
				// The group consumes batch 2 again from the committed offsets.
				if err := p.Handle(ctx, batch2); err != nil {
					t.Fatalf("batch 2 applied again: %v", err)
				}
			}
			if err := rates.Verify(ctx, 0, nil); err != nil {
				t.Fatalf("verify before the commit: %v", err)
			}
			tally, err := rates.Tally(ctx, k, now)
			if err != nil {
				t.Fatal(err)
			}
			if w := tally.Snapshot(k, now).Windows.All; w.Passed != 1 || w.ConfirmedRepeats != 1 {
				t.Fatalf("redis holds %d passed and %d confirmed, want 1 and 1", w.Passed, w.ConfirmedRepeats)
			}
		})
	}
}
