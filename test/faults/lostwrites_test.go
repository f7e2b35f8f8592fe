package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"

	"github.com/repeatrate/repeatrate/internal/testenv"
	"github.com/repeatrate/repeatrate/schemas"
)

// Scenario 9: Redis comes back with less than it acknowledged. Persistence is RDB only: a
// snapshot is taken after 50 events, 10 more are applied, Redis is SIGKILLed and restarts from the
// older snapshot, nothing arrives for longer than the commit delay, then 5 more events do. The 10
// must be applied again, or the processor must stop with the state-lost error; never may their
// offsets be committed silently, and never may one version name two contents.
func TestRedisLosesAcknowledgedWrites(t *testing.T) {
	for _, tc := range []struct {
		name string
		// delay is the commit delay; killAfter is how long after the 60-event snapshot Redis dies.
		delay, killAfter time.Duration
		// stops: the loss reaches offsets already committed, so the processor must stop.
		stops bool
		// restart: the processor restarts with Redis (a node reboot), so its own marks are gone.
		restart bool
		// layout is the state layout of a new namespace (redis.state_layout).
		layout int
	}{
		// Redis dies while the 10 events' offsets wait for the commit delay: the check before the
		// commit finds the loss, and the batch is consumed and applied again.
		{"before the commit", 8 * time.Second, 0, false, false, 10},
		// The same in layout 11, whose processor keeps the buckets its calls wrote: those of the
		// 10 events are gone from Redis but not from the processor, which must read them again,
		// not count the 10 as duplicates. Two checks each catch it: the shape it expects (the
		// head's count went back) and the token and stamp Redis holds (no longer its call's).
		{"before the commit, layout 11's cached buckets", 8 * time.Second, 0, false, false, 11},
		// Redis dies after the offsets were committed: the next batch finds the loss before it
		// publishes anything, and the processor stops, pointing to rebuild.
		{"after the commit", time.Second, 4 * time.Second, true, false, 10},
		// The same, but the processor restarts with Redis: the offsets recorded beside the state
		// tell the new process that the group committed past what Redis holds.
		{"after the commit, processor restarted too", time.Second, 4 * time.Second, true, true, 10},
	} {
		t.Run(tc.name, func(t *testing.T) { lostWrites(t, tc.delay, tc.killAfter, tc.stops, tc.restart, tc.layout) })
	}
}

func lostWrites(t *testing.T, delay, killAfter time.Duration, stops, restart bool, layout int) {
	brokers := testenv.KafkaBrokers(t)
	rs := startRDBRedis(t)
	s := &scenario{t: t, name: testenv.Name(t, "lostwrites"), brokers: brokers, redis: rs.addr}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 30 * time.Second, Transport: &kafka.Transport{}}
	var topics []kafka.TopicConfig
	for _, suffix := range []string{"in", "snapshots", "suites", "alerts", "dlq"} {
		topics = append(topics, kafka.TopicConfig{Topic: s.topic(suffix), NumPartitions: 1, ReplicationFactor: 1})
	}
	if _, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: topics}); err != nil {
		t.Fatal(err)
	}
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: s.topic("in"), RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	defer w.Close()
	next := 0
	send := func(n int, outcome string) {
		t.Helper()
		var msgs []kafka.Message
		for range n {
			msgs = append(msgs, kafka.Message{Value: liveEvent(s.name, next, outcome)})
			next++
		}
		var err error
		for try := 0; try < 50; try++ { // a new topic may take a moment to have a leader
			if err = w.WriteMessages(ctx, msgs...); err == nil {
				return
			}
			time.Sleep(200 * time.Millisecond)
		}
		t.Fatal(err)
	}
	snaps := &history{}
	go snaps.follow(ctx, brokers, s.topic("snapshots"))

	// run starts a processor in the layout, serving its metrics at base.
	run := func() (p *proc, base string) {
		t.Helper()
		args, addr, err := testenv.ReadSideArgs([]string{s.name})
		if err != nil {
			t.Fatal(err)
		}
		args = append([]string{"run", fmt.Sprintf("--batch-commit-delay=%s", delay)}, args...)
		return s.startEnv([]string{fmt.Sprintf("REPEATRATE_REDIS_STATE_LAYOUT=%d", layout)}, args...), "http://" + addr
	}
	p, base := run()
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("processor log:\n%s", p.Tail(40))
		}
	})
	send(50, "passed")
	snaps.await(t, 50, 0)
	rs.save(t)
	send(10, "confirmed_repeat")
	snaps.await(t, 50, 10)
	if layout == 11 {
		// The 10 were applied by a call the processor computed, whose buckets it keeps: the
		// case the loss must not be read from.
		stored := metricSum(base, "repeatrate_computed_calls_total", `result="stored"`)
		buckets := metricSum(base, "repeatrate_computed_buckets_total")
		if stored == 0 || buckets == 0 {
			t.Fatalf("no call was computed and stored (%v), or none took buckets (%v): the cache is not in play", stored, buckets)
		}
		t.Logf("before the loss: %v calls computed and stored, %v buckets taken", stored, buckets)
	}
	time.Sleep(killAfter)
	if restart {
		p.Kill()
	}
	rs.crashAndRestart(t) // back to the 50
	if restart {
		p, _ = run()
	}
	time.Sleep(delay + 3*time.Second)
	send(5, "passed")

	if stops {
		err, exited := p.Wait(time.Minute)
		if !exited || err == nil {
			t.Fatalf("the processor went on after Redis lost committed work (exited %v, err %v)", exited, err)
		}
		if log := p.Tail(5); !strings.Contains(log, "redis state lost") || !strings.Contains(log, "rebuild") {
			t.Fatalf("the error does not say what happened and what to do:\n%s", log)
		}
		// Nothing computed on the lost state was published: 55 passed without the 10 confirmed.
		if bad := snaps.find(55, 0); bad != nil {
			t.Fatalf("a snapshot of the lost state was published: %+v", *bad)
		}
	} else {
		snaps.await(t, 55, 10)
		if _, exited := p.Wait(0); exited {
			t.Fatalf("the processor stopped on a loss it can recover from: %v", p.Err())
		}
	}
	snaps.versionsNameOneContent(t)
}

// liveEvent is a structured live attempt of the scenario's one aggregate.
func liveEvent(ws string, i int, outcome string) []byte {
	now := time.Now().UTC().Add(-time.Minute).Format(time.RFC3339Nano)
	data := map[string]any{
		"scope":          map[string]string{"workspace": ws, "model": "m", "run": "r", "checkpoint": "c", "artifact": "a"},
		"opportunity_id": fmt.Sprintf("o%d", i), "correction_id": "fix",
		"occurred_at": now, "assessed_at": now, "outcome": outcome,
	}
	b, _ := json.Marshal(map[string]any{"specversion": "1.0", "type": "repeatrate.live.attempt.v1",
		"source": "test/lostwrites", "id": fmt.Sprintf("%s-%d", ws, i), "datacontenttype": "application/json", "data": data})
	return b
}

// rdbRedis is a redis-server of the test's own that persists by RDB snapshots only.
type rdbRedis struct {
	addr, dir string
	cmd       *exec.Cmd
}

func startRDBRedis(t *testing.T) *rdbRedis {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("redis-server is required under CI=true (deploy/local/redis.sh installs it)")
		}
		t.Skip("redis-server not installed")
	}
	rs := &rdbRedis{addr: "127.0.0.1:16398", dir: t.TempDir()}
	rs.start(t)
	t.Cleanup(func() { rs.cmd.Process.Kill(); rs.cmd.Wait() })
	return rs
}

func (rs *rdbRedis) start(t *testing.T) {
	t.Helper()
	rs.cmd = exec.Command("redis-server", "--bind", "127.0.0.1", "--port", "16398", "--dir", rs.dir,
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

func (rs *rdbRedis) save(t *testing.T) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: rs.addr})
	defer c.Close()
	if err := c.Save(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
}

func (rs *rdbRedis) crashAndRestart(t *testing.T) {
	t.Helper()
	rs.cmd.Process.Signal(syscall.SIGKILL)
	rs.cmd.Wait()
	rs.start(t)
}

// history keeps every snapshot of the topic, in order.
type history struct {
	mu    sync.Mutex
	snaps []schemas.Snapshot
}

func (h *history) follow(ctx context.Context, brokers []string, topic string) {
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: 0, MaxWait: 100 * time.Millisecond})
	defer r.Close()
	for {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			return
		}
		var e struct {
			Data schemas.Snapshot `json:"data"`
		}
		if json.Unmarshal(m.Value, &e) == nil {
			h.mu.Lock()
			h.snaps = append(h.snaps, e.Data)
			h.mu.Unlock()
		}
	}
}

func (h *history) find(passed, confirmed int64) *schemas.Snapshot {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := range h.snaps {
		if a := h.snaps[i].Windows.All; a.Passed == passed && a.ConfirmedRepeats == confirmed {
			s := h.snaps[i]
			return &s
		}
	}
	return nil
}

// await waits for a snapshot with the given counts to be the newest one.
func (h *history) await(t *testing.T, passed, confirmed int64) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		h.mu.Lock()
		n := len(h.snaps)
		var last schemas.Snapshot
		if n > 0 {
			last = h.snaps[n-1]
		}
		h.mu.Unlock()
		if a := last.Windows.All; n > 0 && a.Passed == passed && a.ConfirmedRepeats == confirmed {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("no snapshot with %d passed and %d confirmed within a minute (%d snapshots seen)", passed, confirmed, len(h.snaps))
}

// versionsNameOneContent fails when one version was published with two different counts, or when
// versions went back.
func (h *history) versionsNameOneContent(t *testing.T) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	byVersion := map[int64]schemas.Window{}
	var prev int64
	for _, s := range h.snaps {
		a := s.Windows.All
		if w, ok := byVersion[s.Version]; ok && (w.Passed != a.Passed || w.ConfirmedRepeats != a.ConfirmedRepeats) {
			t.Fatalf("version %d names %d/%d and %d/%d (passed/confirmed)", s.Version, w.Passed, w.ConfirmedRepeats, a.Passed, a.ConfirmedRepeats)
		}
		byVersion[s.Version] = a
		if s.Version < prev {
			t.Logf("version went back from %d to %d (a redelivered snapshot)", prev, s.Version)
		}
		prev = max(prev, s.Version)
	}
	t.Logf("%d snapshots, %d versions, each naming one content", len(h.snaps), len(byVersion))
}
