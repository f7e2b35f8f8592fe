package cluster

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/repeatrate/repeatrate/internal/synth"
	"github.com/repeatrate/repeatrate/internal/testenv"
	"github.com/repeatrate/repeatrate/schemas"
)

// scenario is one fault scenario on the clusters: a synthetic input cut in parts, what replay
// makes of all of it, its topics at replication factor 3 and the processors that consume it.
type scenario struct {
	t          *testing.T
	name       string
	brokers    []string
	redisAddrs []string
	parts      []string
	poison     map[string]int
	want       map[string]string
	client     *kafka.Client
	seen       *latest
	procs      []*proc
	env        []string // added to the processors' environment

	// The read side, busy throughout: every processor serves it, and readers loop on its suite
	// pages, suite API and SSE catch-ups beside the batches.
	readers *testenv.Readers
	addrs   []string
	// mayLoseWrites says the scenario makes Redis lose acknowledged writes; in any other, a
	// processor that finds writes lost (and rewinds) fails the test.
	mayLoseWrites bool
	tailsLogged   bool
}

// fatalf fails the test after logging the processors' last lines, so that the reason is the
// last thing the test prints (a CI excerpt shows the end of the output).
func (s *scenario) fatalf(format string, args ...any) {
	s.t.Helper()
	s.logTails()
	s.t.Fatalf(format, args...)
}

func (s *scenario) logTails() {
	s.tailsLogged = true
	for _, p := range s.procs {
		s.t.Logf("log of %s:\n%s", p.Name, p.Tail(30))
	}
}

// scenarioAggregates is how many aggregates a scenario's input holds (6 workspaces × 2 models × 4
// corrections, live and eval; newScenario checks it). A part of thousands of events touches every
// one, so processing a part publishes at least this many snapshots however the processors batch
// it, and the waits for processors under way count that many. A fixed 100 did not hold:
// processors that took a whole part in one batch each published exactly 96, and the wait timed out.
const scenarioAggregates = 96

// newScenario generates events lines (seed), cuts them in nparts files, runs replay over the
// whole, creates the topics and starts following the snapshot topic.
func newScenario(t *testing.T, seed uint64, events, nparts int) *scenario {
	t.Helper()
	s := &scenario{t: t, brokers: kafkaCluster(t), redisAddrs: redisCluster(t), poison: map[string]int{}}
	script(t, "kafka-cluster.sh", "status")
	script(t, "redis-cluster.sh", "status") // every primary with an in-sync replica
	s.name = testenv.Name(t, "cluster")

	gen := synth.New(synth.Config{Seed: seed, Workspaces: 6, Corrections: 4, Duplicates: 0.2, Reassessed: 0.1, Poison: 0.005, EvalShare: 0.3})
	now := time.Now()
	var lines [][]byte
	for range events {
		l, bad := gen.Line(now)
		lines = append(lines, l)
		if bad {
			s.poison[string(l)]++
		}
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "in.ndjson")
	if err := os.WriteFile(file, append(bytes.Join(lines, []byte("\n")), '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	for i := range nparts {
		part := filepath.Join(dir, fmt.Sprintf("part%d.ndjson", i))
		chunk := lines[i*len(lines)/nparts : (i+1)*len(lines)/nparts]
		if err := os.WriteFile(part, append(bytes.Join(chunk, []byte("\n")), '\n'), 0o600); err != nil {
			t.Fatal(err)
		}
		s.parts = append(s.parts, part)
	}
	s.want = expected(t, file)
	if len(s.want) != scenarioAggregates {
		t.Fatalf("the input holds %d aggregates, want scenarioAggregates (%d)", len(s.want), scenarioAggregates)
	}

	ctx := context.Background()
	s.client = &kafka.Client{Addr: kafka.TCP(s.brokers...), Timeout: 30 * time.Second, Transport: &kafka.Transport{}}
	isr2 := []kafka.ConfigEntry{{ConfigName: "min.insync.replicas", ConfigValue: "2"}}
	var topics []kafka.TopicConfig
	for _, name := range []string{"in", "snapshots", "suites", "alerts", "dlq"} {
		n := 6
		if name == "dlq" || name == "alerts" {
			n = 1
		}
		topics = append(topics, kafka.TopicConfig{Topic: s.topic(name), NumPartitions: n, ReplicationFactor: 3, ConfigEntries: isr2})
	}
	res, err := s.client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: topics})
	if err != nil {
		t.Fatal(err)
	}
	for tp, err := range res.Errors {
		if err != nil {
			t.Fatalf("create %s: %v", tp, err)
		}
	}
	s.seen = &latest{by: map[string]schemas.Snapshot{}}
	rctx, stopReading := context.WithCancel(ctx)
	t.Cleanup(stopReading)
	for p := range 6 {
		go s.seen.follow(rctx, s.brokers, s.topic("snapshots"), p)
	}
	return s
}

func (s *scenario) topic(name string) string { return s.name + "." + name }

// produce writes part i to the input topic (acks=all).
func (s *scenario) produce(i int) {
	s.t.Helper()
	if out, err := exec.Command(bin, "produce", "--brokers", strings.Join(s.brokers, ","), "--topic", s.topic("in"), "--in", s.parts[i]).CombinedOutput(); err != nil {
		s.fatalf("produce: %v: %s", err, out)
	}
}

// start runs n processors in one group on both clusters; they are killed when the test ends.
func (s *scenario) start(n int) {
	s.t.Helper()
	s.t.Cleanup(func() {
		for _, p := range s.procs {
			p.Kill()
		}
		if s.t.Failed() && !s.tailsLogged {
			s.logTails()
		}
	})
	envv := append(os.Environ(),
		"REPEATRATE_KAFKA_BROKERS="+strings.Join(s.brokers, ","),
		"REPEATRATE_KAFKA_GROUP_ID="+s.name,
		"REPEATRATE_KAFKA_INPUT_TOPICS="+s.topic("in"),
		"REPEATRATE_KAFKA_SNAPSHOT_TOPIC="+s.topic("snapshots"),
		"REPEATRATE_KAFKA_SUITE_TOPIC="+s.topic("suites"),
		"REPEATRATE_KAFKA_ALERTS_TOPIC="+s.topic("alerts"),
		"REPEATRATE_KAFKA_DLQ_TOPIC="+s.topic("dlq"),
		"REPEATRATE_KAFKA_SESSION_TIMEOUT=6s",
		"REPEATRATE_REDIS_ADDRS="+strings.Join(s.redisAddrs, ","),
		"REPEATRATE_REDIS_KEY_PREFIX="+s.name,
		"REPEATRATE_LOG_LEVEL=info",
		// Many batches while the faults come: the default bound (16 000) would take a part of the
		// input in one or two.
		"REPEATRATE_BATCH_MAX_MESSAGES=2000",
	)
	envv = append(envv, s.env...)
	workspaces := testenv.Workspaces(6)
	for i := range n {
		args, addr, err := testenv.ReadSideArgs(workspaces)
		if err != nil {
			s.t.Fatal(err)
		}
		s.addrs = append(s.addrs, addr)
		cmd := exec.Command(bin, append([]string{"run"}, args...)...)
		cmd.Env = envv
		p, err := testenv.StartProc(fmt.Sprintf("run-%d", i), cmd)
		if err != nil {
			s.t.Fatal(err)
		}
		s.procs = append(s.procs, p)
	}
	var suites []testenv.SuiteRef
	for _, w := range workspaces {
		suites = append(suites, testenv.SuiteRef{Workspace: w, Suite: "regressions"})
	}
	addrs := s.addrs
	s.readers = testenv.StartReaders(3, func() []string { return addrs }, suites)
	s.t.Cleanup(s.readers.Stop)
}

// alive fails the test when a processor has exited: they must run through every fault.
func (s *scenario) alive() {
	s.t.Helper()
	for _, p := range s.procs {
		if err, exited := p.Wait(0); exited {
			s.fatalf("%s exited: %v", p.Name, err)
		}
	}
}

// await waits for n snapshots in all, the processors running.
func (s *scenario) await(n int, within time.Duration) {
	s.t.Helper()
	deadline := time.Now().Add(within)
	for s.seen.count() < n {
		s.alive()
		if time.Now().After(deadline) {
			s.fatalf("%d snapshots read, want %d", s.seen.count(), n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// converge waits until the latest snapshot of every aggregate equals replay's, the processors
// running throughout, then requires exactly the poison on the dead-letter topic.
func (s *scenario) converge(within time.Duration) {
	s.t.Helper()
	deadline := time.Now().Add(within)
	for {
		ok, why := s.seen.equal(s.want)
		if ok {
			break
		}
		if time.Now().After(deadline) {
			s.fatalf("snapshots did not converge to replay: %s", why)
		}
		s.alive()
		time.Sleep(250 * time.Millisecond)
	}
	s.alive()
	if err := checkDeadLetters(s.t, s.brokers, s.topic("dlq"), s.poison); err != nil {
		s.fatalf("%v", err)
	}
	if err := s.readers.Problem(s.procs, s.mayLoseWrites); err != nil {
		s.fatalf("%v", err)
	}
	s.t.Logf("read side busy: %d requests, %d suite answers", s.readers.Requests.Load(), s.readers.SuiteAnswers.Load())
}

// awaitCommitted waits until the group committed the end of every input partition.
func (s *scenario) awaitCommitted(within time.Duration) {
	s.t.Helper()
	ctx := context.Background()
	parts := make([]kafka.OffsetRequest, 6)
	ids := make([]int, 6)
	for p := range parts {
		parts[p], ids[p] = kafka.LastOffsetOf(p), p
	}
	ends, err := s.client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{s.topic("in"): parts}})
	if err != nil {
		s.t.Fatal(err)
	}
	want := map[int]int64{}
	for _, p := range ends.Topics[s.topic("in")] {
		if p.Error != nil {
			s.t.Fatalf("end offset of partition %d: %v", p.Partition, p.Error)
		}
		want[p.Partition] = p.LastOffset
	}
	deadline := time.Now().Add(within)
	for {
		res, err := s.client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: s.name, Topics: map[string][]int{s.topic("in"): ids}})
		behind := fmt.Sprint(err)
		if err == nil {
			behind = ""
			for _, p := range res.Topics[s.topic("in")] {
				if p.CommittedOffset < want[p.Partition] {
					behind += fmt.Sprintf(" partition %d at %d of %d;", p.Partition, p.CommittedOffset, want[p.Partition])
				}
			}
		}
		if behind == "" {
			return
		}
		if time.Now().After(deadline) {
			s.fatalf("the group did not commit the input's end:%s", behind)
		}
		s.alive()
		time.Sleep(250 * time.Millisecond)
	}
}
