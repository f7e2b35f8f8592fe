package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/consumer"
	"github.com/repeatrate/repeatrate/internal/testenv"
	"github.com/repeatrate/repeatrate/rebuild"
	"github.com/repeatrate/repeatrate/schemas"
	"github.com/repeatrate/repeatrate/sink"
)

// stallingDialer returns Kafka clients whose partition connections (the dialer's) stop delivering
// for pause once, when one connection has read more than after bytes: a broker that stalls in
// the middle of a fetch response. stalled reports whether the stall happened.
func stallingDialer(t *testing.T, after int, pause time.Duration) (kc *kafkaClients, stalled func() bool) {
	t.Helper()
	kc, err := newKafkaClients(KafkaConfig{Brokers: testenv.KafkaBrokers(t)})
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	var did atomic.Bool
	var d net.Dialer
	kc.dialer.DialFunc = func(ctx context.Context, network, address string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, address)
		if err != nil {
			return nil, err
		}
		return &stallingConn{Conn: c, after: after, stall: func() {
			once.Do(func() { time.Sleep(pause); did.Store(true) })
		}}, nil
	}
	return kc, did.Load
}

type stallingConn struct {
	net.Conn
	read, after int
	stall       func()
}

func (c *stallingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.read += n
	if c.read > c.after {
		c.stall() // before these bytes reach the reader
	}
	return n, err
}

// snapshotOf returns a snapshot of aggregate i of a test scope at version v.
func snapshotOf(i int, v int64) schemas.Snapshot {
	return schemas.Snapshot{Aggregate: schemas.Aggregate{Workspace: "w", Model: "m", Run: "r", Checkpoint: "c",
		Artifact: "a", CorrectionID: fmt.Sprint("fix-", i), Source: "live"}, Version: v, ObservedAt: time.Now().UTC()}
}

func keyOf(s schemas.Snapshot) aggregator.Key {
	a := s.Aggregate
	src, _ := aggregator.ParseSource(a.Source)
	return aggregator.Key{Scope: schemas.Scope{Workspace: a.Workspace, Model: a.Model, Run: a.Run, Checkpoint: a.Checkpoint,
		Artifact: a.Artifact}, CorrectionID: a.CorrectionID, Source: src}
}

// The versions a rebuild continues from are read up to the snapshot topic's end as noted on entry,
// however long the broker takes: a 4 s stall in the middle of a fetch (longer than the silence the
// rebuild used to take for the end) must not leave any aggregate seeded below its published
// version, or subscribers would drop the rebuilt snapshots.
func TestRebuildReadsPublishedVersionsThroughAStall(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	kc, stalled := stallingDialer(t, 64<<10, 4*time.Second)
	topic := testenv.Name(t, "rebuild-versions")
	if err := kc.ensureTopics(ctx, []topicSpec{{name: topic, partitions: 2, compacted: true}}); err != nil {
		t.Fatal(err)
	}
	const aggregates, perAggregate = 10, 300
	want := map[aggregator.Key]int64{}
	var msgs []kafka.Message
	for v := int64(1); v <= perAggregate; v++ {
		for i := 0; i < aggregates; i++ {
			s := snapshotOf(i, v)
			b, err := sink.EncodeSnapshot(&s)
			if err != nil {
				t.Fatal(err)
			}
			msgs = append(msgs, kafka.Message{Key: []byte(s.Aggregate.ID()), Value: b})
			want[keyOf(s)] = v
		}
	}
	msgs = append(msgs, kafka.Message{Key: []byte("junk"), Value: []byte("not a snapshot")})
	w := kc.writer(topic)
	defer w.Close()
	for len(msgs) > 0 { // in slices that stay below the broker's batch limit
		n := min(len(msgs), 500)
		if err := w.WriteMessages(ctx, msgs[:n]...); err != nil {
			t.Fatalf("write snapshots: %.300v", err)
		}
		msgs = msgs[n:]
	}

	got, err := rebuild.PublishedVersions(ctx, rebuildKafka{kafkaClients: kc}, topic)
	if err != nil {
		t.Fatal(err)
	}
	if !stalled() {
		t.Fatal("the connection never stalled: the test did not test anything")
	}
	if len(got) != len(want) {
		t.Errorf("versions of %d aggregates, want %d", len(got), len(want))
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: version %d, want %d", k, got[k], v)
		}
	}

	// A topic that does not exist has published nothing.
	none, err := rebuild.PublishedVersions(ctx, rebuildKafka{kafkaClients: kc}, topic+"-missing")
	if err != nil || len(none) != 0 {
		t.Fatalf("missing topic: %v %v, want no versions", none, err)
	}
}

// PartitionReader.Read feeds exactly the messages below the end it is given, in order: none written
// after the end was noted, and an empty partition returns at once.
func TestRebuildReadPartitionStopsAtEnd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	kc, err := newKafkaClients(KafkaConfig{Brokers: testenv.KafkaBrokers(t)})
	if err != nil {
		t.Fatal(err)
	}
	topic := testenv.Name(t, "rebuild-read")
	if err := kc.ensureTopics(ctx, []topicSpec{{name: topic, partitions: 2}}); err != nil {
		t.Fatal(err)
	}
	w := kc.writer(topic)
	w.Balancer = kafka.BalancerFunc(func(kafka.Message, ...int) int { return 0 })
	defer w.Close()
	write := func(from, to int) {
		t.Helper()
		var ms []kafka.Message
		for i := from; i < to; i++ {
			ms = append(ms, kafka.Message{Value: []byte(fmt.Sprint(i))})
		}
		if err := w.WriteMessages(ctx, ms...); err != nil {
			t.Fatal(err)
		}
	}
	write(0, 7)
	ends, err := kc.endOffsets(ctx, []string{topic})
	if err != nil {
		t.Fatal(err)
	}
	if ends[topic][0] != 7 || ends[topic][1] != 0 {
		t.Fatalf("end offsets %v, want partition 0 at 7 and 1 at 0", ends[topic])
	}
	write(7, 10)

	var got []string
	var sizes []int
	n, err := kc.partitionReader().Read(ctx, topic, 0, ends[topic][0], 3, func(b []kafka.Message) error {
		sizes = append(sizes, len(b))
		for i, m := range b {
			if m.Topic != topic || m.Partition != 0 || m.Offset != int64(len(got)) {
				return fmt.Errorf("message %d: %s/%d@%d", len(got)+i, m.Topic, m.Partition, m.Offset)
			}
			got = append(got, string(m.Value))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n != 7 || fmt.Sprint(got) != "[0 1 2 3 4 5 6]" || slices.Max(sizes) > 3 {
		t.Fatalf("read %d messages %v in batches %v, want the 7 before the end in batches of at most 3", n, got, sizes)
	}
	if n, err := kc.partitionReader().Read(ctx, topic, 1, ends[topic][1], 3, func([]kafka.Message) error {
		return errors.New("a message from an empty partition")
	}); n != 0 || err != nil {
		t.Fatalf("empty partition: %d %v", n, err)
	}
	// fn's error ends the reading.
	stop := errors.New("stop")
	if _, err := kc.partitionReader().Read(ctx, topic, 0, 10, 100, func([]kafka.Message) error { return stop }); !errors.Is(err, stop) {
		t.Fatalf("fn error: %v, want it returned", err)
	}
}

// evalLine is one eval result of case c of suite "s" in version v (sequence seq), a correction check.
func evalLine(c string, seq int, result string, at time.Time) string {
	return fmt.Sprintf(`{"specversion":"1.0","id":"e-%s-%d","source":"test","type":%q,"datacontenttype":"application/json",`+
		`"data":{"scope":{"workspace":"w","model":"m","run":"r","checkpoint":"k","artifact":"a"},"suite":"s","case_id":%q,`+
		`"version":"v%02d","version_seq":%d,"run_index":0,"runs":1,"result":%q,"correction_id":"fix","opportunity_id":"%s/v%d",`+
		`"occurred_at":%q,"assessed_at":%q}}`,
		c, seq, schemas.TypeEvalResult, c, seq, seq, result, c, seq, at.Format(time.RFC3339Nano), at.Format(time.RFC3339Nano))
}

// rebuildFixture is an installation on real Kafka and Redis, on topics, a group and a key prefix of
// its own, whose processor has stopped.
type rebuildFixture struct {
	cfg Config
	kc  *kafkaClients
}

func newRebuildFixture(ctx context.Context, t *testing.T) *rebuildFixture {
	t.Helper()
	cfg, kc := isolated(ctx, t, "rebuild", 2)
	cfg.Batch.CommitDelay = 0
	return &rebuildFixture{cfg: cfg, kc: kc}
}

// readAll returns every message of topic up to its current end.
func (f *rebuildFixture) readAll(ctx context.Context, t *testing.T, topic string) []kafka.Message {
	t.Helper()
	ends, err := f.kc.endOffsets(ctx, []string{topic})
	if err != nil {
		t.Fatal(err)
	}
	var out []kafka.Message
	for p, end := range ends[topic] {
		if _, err := f.kc.partitionReader().Read(ctx, topic, p, end, 1000, func(b []kafka.Message) error {
			out = append(out, b...)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// A rebuild after the state was lost: it publishes the revived case the history holds (the old
// rebuild only marked it announced, so it was never announced if the processor had not), seeds
// versions above what was published, commits the group at the end offsets, cuts over, and a store
// still open on the old namespace fails with ErrStateLost. A second rebuild of the same input
// publishes the same revived event (same CloudEvent id), so its copy is recognisable.
func TestRebuildPublishesRevivedCasesAndRetiresTheOldNamespace(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	f := newRebuildFixture(ctx, t)
	cfg, kc := f.cfg, f.kc
	rdb, err := newRedisClient(cfg.Redis)
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()

	// The processor's namespace, with a store open on it as a running processor would have.
	old, err := aggregator.OpenState(ctx, rdb, cfg.Redis.KeyPrefix, false)
	if err != nil {
		t.Fatal(err)
	}
	oldStore, err := aggregator.NewRedis(rdb, aggregator.RedisConfig{Prefix: old.Namespace, Retention: cfg.Retention, Epoch: old.Epoch})
	if err != nil {
		t.Fatal(err)
	}

	// Case c1 passes five versions, then fails: revived (a regression). Plus one poison message.
	base := time.Now().Add(-time.Hour).UTC().Truncate(time.Second)
	var in bytes.Buffer
	for seq := 1; seq <= 6; seq++ {
		result := "pass"
		if seq == 6 {
			result = "fail"
		}
		fmt.Fprintln(&in, evalLine("c1", seq, result, base.Add(time.Duration(seq)*time.Minute)))
	}
	fmt.Fprintln(&in, "poison")
	w := kc.writer(cfg.Kafka.InputTopics[0])
	if n, err := produce(ctx, &in, w); err != nil || n != 7 {
		t.Fatalf("produced %d of 7: %v", n, err)
	}
	w.Close()

	// The aggregate was published up to version 7 before the state was lost.
	agg := schemas.Aggregate{Workspace: "w", Model: "m", Run: "r", Checkpoint: "k", Artifact: "a", CorrectionID: "fix", Source: "evaluation"}
	prior := schemas.Snapshot{Aggregate: agg, Version: 7, ObservedAt: base}
	b, err := sink.EncodeSnapshot(&prior)
	if err != nil {
		t.Fatal(err)
	}
	sw := kc.writer(cfg.Kafka.SnapshotTopic)
	if err := sw.WriteMessages(ctx, kafka.Message{Key: []byte(agg.ID()), Value: b}); err != nil {
		t.Fatal(err)
	}
	sw.Close()

	log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	if err := runRebuild(ctx, cfg, log); err != nil {
		t.Fatalf("rebuild: %v", err)
	}

	// Revived: published, once.
	revivedIDs := func() []string {
		var ids []string
		for _, m := range f.readAll(ctx, t, cfg.Kafka.AlertsTopic) {
			var ev struct {
				ID   string              `json:"id"`
				Type string              `json:"type"`
				Data schemas.CaseRevived `json:"data"`
			}
			if err := json.Unmarshal(m.Value, &ev); err != nil {
				t.Fatalf("alert: %v", err)
			}
			if ev.Type == schemas.TypeCaseRevived && ev.Data.CaseID == "c1" && ev.Data.Version == "v06" {
				ids = append(ids, ev.ID)
			}
		}
		return ids
	}
	if ids := revivedIDs(); len(ids) != 1 {
		t.Errorf("revived events of c1 on the alerts topic: %d, want 1", len(ids))
	}

	// The rebuilt snapshot continues above the published version and counts 1 repeat, 5 passed.
	var rebuilt *schemas.Snapshot
	for _, m := range f.readAll(ctx, t, cfg.Kafka.SnapshotTopic) {
		var ev struct {
			Data schemas.Snapshot `json:"data"`
		}
		if json.Unmarshal(m.Value, &ev) == nil && ev.Data.Aggregate == agg && (rebuilt == nil || ev.Data.Version > rebuilt.Version) {
			rebuilt = &ev.Data
		}
	}
	if rebuilt == nil || rebuilt.Version <= 7 || rebuilt.Windows.All.ConfirmedRepeats != 1 || rebuilt.Windows.All.Passed != 5 {
		t.Errorf("rebuilt snapshot %+v: want version above 7, 1 confirmed repeat, 5 passed", rebuilt)
	}

	// The poison was dead-lettered, once.
	if dls := f.readAll(ctx, t, cfg.Kafka.DLQTopic); len(dls) != 1 {
		t.Errorf("dead letters: %d, want 1", len(dls))
	}

	// The group stands at the end of the input, the installation on the new namespace, and the
	// old namespace's store is stopped.
	end, err := kc.endOffsets(ctx, cfg.Kafka.InputTopics)
	if err != nil {
		t.Fatal(err)
	}
	committed, err := kc.committed(ctx, cfg.Kafka.GroupID, cfg.Kafka.InputTopics, nil)
	if err != nil {
		t.Fatal(err)
	}
	for topic, parts := range end {
		for p, off := range parts {
			if c, ok := committed[topic][p]; off > 0 && (!ok || c != off) {
				t.Errorf("%s/%d committed at %d (%v), want %d", topic, p, c, ok, off)
			}
		}
	}
	now, err := aggregator.OpenState(ctx, rdb, cfg.Redis.KeyPrefix, true)
	if err != nil || now.Namespace == old.Namespace {
		t.Fatalf("state after the rebuild: %+v %v, want a new namespace", now, err)
	}
	x := aggregator.Observation{Key: keyOf(prior), OpportunityID: "late", Class: aggregator.Passed,
		Occurred: aggregator.Micros(base), Assessed: aggregator.Micros(base)}
	if _, err := oldStore.Apply(ctx, []aggregator.Observation{x}, time.Now()); !errors.Is(err, aggregator.ErrStateLost) {
		t.Errorf("apply on the old namespace after the rebuild: %v, want ErrStateLost", err)
	}

	// A second rebuild of the same input: same revived event, same id.
	if err := runRebuild(ctx, cfg, log); err != nil {
		t.Fatalf("second rebuild: %v", err)
	}
	if ids := revivedIDs(); len(ids) != 2 || ids[0] != ids[1] {
		t.Errorf("revived event ids after two rebuilds: %v, want two copies of one id", ids)
	}
	again, err := aggregator.OpenState(ctx, rdb, cfg.Redis.KeyPrefix, true)
	if err != nil || again.Namespace == now.Namespace {
		t.Fatalf("state after the second rebuild: %+v %v, want another namespace", again, err)
	}
}

// liveAt is a live attempt of opportunity id, occurred (and assessed) at occ.
func liveAt(id string, occ time.Time) string {
	at := occ.UTC().Format(time.RFC3339Nano)
	return fmt.Sprintf(`{"specversion":"1.0","id":%q,"source":"test","type":%q,"datacontenttype":"application/json",`+
		`"data":{"scope":{"workspace":"w","model":"m","run":"r","checkpoint":"k","artifact":"a"},"opportunity_id":%q,`+
		`"correction_id":"fix","occurred_at":%q,"assessed_at":%q,"outcome":"passed"}}`, id, schemas.TypeLiveAttempt, id, at, at)
}

// Future-dated events are judged against each message's own timestamp, capped at the rebuild's
// start: a timestamp stamped ahead of the clock (the producer's to choose) never lets an event
// through that lies more than max_future_skew ahead of the rebuild's clock, and an event that lay
// ahead of its own message's time is dead-lettered as the processor, which received it no earlier,
// did too.
func TestRebuildJudgesFutureEventsByMessageTimeUpToItsStart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	f := newRebuildFixture(ctx, t)
	cfg, kc := f.cfg, f.kc
	now := time.Now()
	cases := []struct {
		id       string
		occ, ts  time.Time // occurred_at, message timestamp
		deadLine bool
	}{
		{"on-time", now.Add(-time.Hour), now.Add(-time.Hour), false},
		{"skew-within", now.Add(-time.Hour + 4*time.Minute), now.Add(-time.Hour), false},
		{"ahead-of-its-message", now.Add(-time.Hour + 6*time.Minute), now.Add(-time.Hour), true},
		// Stamped 50 minutes ahead (brokers accept up to an hour by default), occurring 40 minutes
		// ahead: within the skew of its own stamp, far beyond the rebuild's clock.
		{"stamped-ahead", now.Add(40 * time.Minute), now.Add(50 * time.Minute), true},
	}
	var msgs []kafka.Message
	wantPassed, wantDL := 0, 0
	for _, c := range cases {
		msgs = append(msgs, kafka.Message{Key: []byte("k"), Value: []byte(liveAt(c.id, c.occ)), Time: c.ts})
		if c.deadLine {
			wantDL++
		} else {
			wantPassed++
		}
	}
	w := kc.writer(cfg.Kafka.InputTopics[0])
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	w.Close()
	if err := runRebuild(ctx, cfg, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))); err != nil {
		t.Fatalf("rebuild: %v", err)
	}

	var dead []string
	for _, m := range f.readAll(ctx, t, cfg.Kafka.DLQTopic) {
		reason := ""
		for _, h := range m.Headers {
			if h.Key == consumer.HeaderDLQReason {
				reason = string(h.Value)
			}
		}
		var ev struct {
			ID string `json:"id"`
		}
		json.Unmarshal(m.Value, &ev)
		dead = append(dead, ev.ID+":"+reason)
	}
	sort.Strings(dead)
	if want := "[ahead-of-its-message:future_event stamped-ahead:future_event]"; fmt.Sprint(dead) != want {
		t.Errorf("dead letters %v, want %s", dead, want)
	}
	var passed int64 = -1
	for _, m := range f.readAll(ctx, t, cfg.Kafka.SnapshotTopic) {
		var ev struct {
			Data schemas.Snapshot `json:"data"`
		}
		if json.Unmarshal(m.Value, &ev) == nil {
			passed = ev.Data.Windows.All.Passed
		}
	}
	if passed != int64(wantPassed) || len(dead) != wantDL {
		t.Errorf("rebuilt snapshot counts %d passed with %d dead letters, want %d and %d", passed, len(dead), wantPassed, wantDL)
	}
}

// With redis.wait_replicas, a rebuild whose replica lags (stopped for a few seconds) waits for it
// rather than failing: the rebuilt state is committed once the replica acknowledged it.
func TestRebuildWaitsForAReplicaThatLags(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	f := newRebuildFixture(ctx, t)
	cfg, kc := f.cfg, f.kc
	primary, replica := testenv.StartReplicated(t)
	cfg.Redis.Addrs = []string{primary.Addr}
	cfg.Redis.WaitReplicas, cfg.Redis.WaitTimeout = 1, 100*time.Millisecond
	w := kc.writer(cfg.Kafka.InputTopics[0])
	if err := w.WriteMessages(ctx, kafka.Message{Key: []byte("k"), Value: []byte(liveAt("o1", time.Now().Add(-time.Minute)))}); err != nil {
		t.Fatal(err)
	}
	w.Close()

	if err := replica.Proc.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := time.AfterFunc(3*time.Second, func() { replica.Proc.Signal(syscall.SIGCONT) })
	defer resumed.Stop()
	core, logs := observer.New(zap.WarnLevel)
	begin := time.Now()
	if err := runRebuild(ctx, cfg, zap.New(core)); err != nil {
		t.Fatalf("rebuild: %v", err)
	}
	if took := time.Since(begin); took < 3*time.Second {
		t.Fatalf("the rebuild ended after %v, before the replica was running again", took)
	}
	if n := logs.FilterMessageSnippet("not yet on enough replicas").Len(); n == 0 {
		t.Fatal("no wait for the replica was logged")
	}
	committed, err := kc.committed(ctx, cfg.Kafka.GroupID, cfg.Kafka.InputTopics, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := committed[cfg.Kafka.InputTopics[0]]; got[0]+got[1] != 1 {
		t.Fatalf("committed %v, want the one message's offset", committed)
	}
}
