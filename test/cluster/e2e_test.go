package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/repeatrate/repeatrate/consumer"
	"github.com/repeatrate/repeatrate/internal/testenv"
	"github.com/repeatrate/repeatrate/schemas"
)

// bin is the repeatrate binary under test, built once by TestMain.
var bin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "repeatrate-cluster")
	if err != nil {
		panic(err)
	}
	bin = filepath.Join(dir, "repeatrate")
	build := exec.Command("go", "build", "-o", bin, "./cmd/repeatrate")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// kafkaCluster returns the three brokers of deploy/local/kafka-cluster.sh.
func kafkaCluster(t testing.TB) []string {
	t.Helper()
	base, _ := strconv.Atoi(env("KAFKA_CLUSTER_PORT", "19301"))
	var brokers []string
	for i := range 3 {
		brokers = append(brokers, "127.0.0.1:"+strconv.Itoa(base+i))
	}
	need(t, "Kafka cluster", brokers[0])
	return brokers
}

// brokerPid returns the pid of broker node id (1..3).
func brokerPid(t *testing.T, id int) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, ".cache/kafka", "cluster-"+env("KAFKA_CLUSTER_PORT", "19301"), "node-"+strconv.Itoa(id), "kafka.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// clusterEvents is the input size: enough batches to be in flight through both broker kills.
const clusterEvents = 30_000

// expected runs replay over the file and returns every aggregate's comparable snapshot.
func expected(t *testing.T, file string) map[string]string {
	t.Helper()
	dir := t.TempDir()
	out := filepath.Join(dir, "expected.ndjson")
	if b, err := exec.Command(bin, "replay", "--in", file, "--out", out, "--dlq", filepath.Join(dir, "dlq.ndjson")).CombinedOutput(); err != nil {
		t.Fatalf("replay: %v: %s", err, b)
	}
	want := map[string]string{}
	f, _ := os.ReadFile(out)
	for _, l := range bytes.Split(bytes.TrimSpace(f), []byte("\n")) {
		var e struct {
			Type string          `json:"type"`
			Data json.RawMessage `json:"data"`
		}
		if err := json.Unmarshal(l, &e); err != nil {
			t.Fatal(err)
		}
		if e.Type != schemas.TypeSnapshot {
			continue // suite snapshots and alerts: not what this test compares
		}
		var snap schemas.Snapshot
		if err := json.Unmarshal(e.Data, &snap); err != nil {
			t.Fatal(err)
		}
		want[snap.Aggregate.ID()] = comparable(snap)
	}
	return want
}

// comparable drops what streaming and replay legitimately differ in: observation time and version.
func comparable(s schemas.Snapshot) string {
	s.ObservedAt, s.Version = time.Time{}, 0
	b, _ := json.Marshal(s)
	return string(b)
}

// Three processors run on the Redis Cluster and three brokers (topics at replication factor 3,
// min.insync.replicas 2). While they work, the broker that coordinates their group and then the
// leader of an input partition are SIGKILLed (each brought back before the next kill, so two
// in-sync replicas remain for every acknowledged write). The latest snapshot of every aggregate
// must equal replay's, and the dead-letter topic must hold exactly the poison.
func TestProcessorsOnClustersSurviveBrokerLossAndEqualReplay(t *testing.T) {
	ctx := context.Background()
	// The input goes in three parts: before the first kill, while the coordinator is down, while
	// a partition leader is down.
	s := newScenario(t, 14, clusterEvents, 3)
	s.produce(0)
	s.start(3)

	// Kill a broker once the processors are under way, wait until no partition of the input has
	// it as leader, feed the next part, wait until the processors publish again, bring it back.
	kill := func(what string, find func() (int, error), part int) {
		t.Helper()
		s.await(scenarioAggregates, 2*time.Minute)
		var id int
		var err error
		for try := 0; try < 100; try++ {
			if id, err = find(); err == nil {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if err != nil {
			s.fatalf("find the %s: %v", what, err)
		}
		t.Logf("SIGKILL broker %d (%s) after %d snapshots", id, what, s.seen.count())
		back := false
		defer func() {
			if !back { // the test failed on the way: leave the cluster whole for the next test
				exec.Command(filepath.Join(root, "deploy/local/kafka-cluster.sh"), "start-node", strconv.Itoa(id)).Run()
			}
		}()
		if err := syscall.Kill(brokerPid(t, id), syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		awaitLeadersOff(t, s.client, s.topic("in"), id)
		before := s.seen.count()
		s.produce(part)
		s.await(before+scenarioAggregates, 2*time.Minute)
		script(t, "kafka-cluster.sh", "start-node", strconv.Itoa(id))
		back = true
	}
	kill("group coordinator", func() (int, error) {
		coord, err := s.client.FindCoordinator(ctx, &kafka.FindCoordinatorRequest{Key: s.name, KeyType: kafka.CoordinatorKeyTypeConsumer})
		if err == nil && coord.Error != nil {
			err = coord.Error
		}
		if err != nil {
			return 0, err
		}
		return coord.Coordinator.NodeID, nil
	}, 1)
	awaitLeadersBalanced(t, s.client, s.topic("in"))
	kill("leader of "+s.topic("in")+"/0", func() (int, error) {
		meta, err := s.client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{s.topic("in")}})
		if err != nil {
			return 0, err
		}
		return meta.Topics[0].Partitions[0].Leader.ID, nil
	}, 2)
	s.converge(4 * time.Minute)
}

// awaitLeadersOff waits until no partition of topic is led by broker id (the controller fenced it).
func awaitLeadersOff(t *testing.T, c *kafka.Client, topic string, id int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		meta, err := c.Metadata(context.Background(), &kafka.MetadataRequest{Topics: []string{topic}})
		if err == nil && len(meta.Topics) == 1 {
			off := true
			for _, p := range meta.Topics[0].Partitions {
				off = off && p.Leader.ID != id && p.Leader.ID >= 0
			}
			if off {
				return
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("broker %d still leads partitions of %s", id, topic)
}

// awaitLeadersBalanced waits until every partition of topic has all three replicas in sync again.
func awaitLeadersBalanced(t *testing.T, c *kafka.Client, topic string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		meta, err := c.Metadata(context.Background(), &kafka.MetadataRequest{Topics: []string{topic}})
		if err == nil && len(meta.Topics) == 1 {
			ok := true
			for _, p := range meta.Topics[0].Partitions {
				ok = ok && len(p.Isr) == 3
			}
			if ok {
				return
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("partitions of %s not back in sync on three brokers", topic)
}

// checkDeadLetters requires the dead-letter topic to hold one letter for each poison message and
// nothing else, counted by origin (the input topic, partition and offset in its headers). A letter
// may be there twice with the same origin: a broker killed after it stored a write, before it
// answered, makes kafka-go send the write again (kafka-go has no idempotent producer), as
// docs/semantics.md says; a reader drops such a copy by its origin, and so does this check.
func checkDeadLetters(t testing.TB, brokers []string, topic string, poison map[string]int) error {
	t.Helper()
	total := 0
	for _, n := range poison {
		total += n
	}
	origins := map[string]map[string]bool{} // value → origins
	records := 0
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: 0, MaxWait: 200 * time.Millisecond})
	defer r.Close()
	for {
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		m, err := r.FetchMessage(rctx)
		cancel()
		if err != nil {
			break // idle: everything has been read
		}
		records++
		var from, partition, offset string
		for _, h := range m.Headers {
			switch h.Key {
			case consumer.HeaderDLQTopic:
				from = string(h.Value)
			case consumer.HeaderDLQPartition:
				partition = string(h.Value)
			case consumer.HeaderDLQOffset:
				offset = string(h.Value)
			}
		}
		if from == "" || partition == "" || offset == "" {
			return fmt.Errorf("dead letter at offset %d has no origin: %q", m.Offset, m.Value)
		}
		if origins[string(m.Value)] == nil {
			origins[string(m.Value)] = map[string]bool{}
		}
		origins[string(m.Value)][from+"/"+partition+"@"+offset] = true
		if records > 2*total+10 {
			return fmt.Errorf("dead-letter topic holds more than %d letters, for %d poison messages", records-1, total)
		}
	}
	distinct := 0
	for _, o := range origins {
		distinct += len(o)
	}
	for line, n := range poison {
		if got := len(origins[line]); got != n {
			return fmt.Errorf("poison %q dead-lettered for %d input messages, want %d", line, got, n)
		}
	}
	if len(origins) != len(poison) {
		return fmt.Errorf("dead-letter topic holds %d distinct messages, want the %d poison", len(origins), len(poison))
	}
	if records > distinct {
		t.Logf("dead-letter topic: %d letters for %d input messages (a write sent again after a broker died)", records, distinct)
	}
	return nil
}

// latest keeps the greatest-version snapshot of every aggregate on a topic.
type latest struct {
	mu sync.Mutex
	by map[string]schemas.Snapshot
	n  int
}

func (l *latest) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n
}

func (l *latest) await(t *testing.T, n int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for l.count() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d snapshots read, want %d", l.count(), n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// follow reads one partition from the start, replacing its reader whenever it fails (a broker
// died), at the next offset.
func (l *latest) follow(ctx context.Context, brokers []string, topic string, partition int) {
	next := kafka.FirstOffset
	for ctx.Err() == nil {
		func() {
			r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: partition, MaxWait: 200 * time.Millisecond, MaxBytes: 16 << 20})
			defer r.Close()
			if r.SetOffset(next) != nil {
				return
			}
			for {
				m, err := r.FetchMessage(ctx)
				if err != nil {
					return
				}
				next = m.Offset + 1
				var e struct {
					Data schemas.Snapshot `json:"data"`
				}
				if json.Unmarshal(m.Value, &e) != nil {
					continue
				}
				l.mu.Lock()
				l.n++
				if cur, ok := l.by[string(m.Key)]; !ok || e.Data.Version >= cur.Version {
					l.by[string(m.Key)] = e.Data
				}
				l.mu.Unlock()
			}
		}()
		select {
		case <-ctx.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func (l *latest) equal(want map[string]string) (bool, string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	missing, differ := 0, 0
	for k, w := range want {
		got, ok := l.by[k]
		switch {
		case !ok:
			missing++
		case comparable(got) != w:
			differ++
		}
	}
	if missing+differ == 0 && len(l.by) == len(want) {
		return true, ""
	}
	return false, fmt.Sprintf("%d aggregates missing, %d differ, %d seen of %d", missing, differ, len(l.by), len(want))
}

// proc is one processor process.
type proc = testenv.Proc
