// Package faults proves effectively-once processing against real Kafka and Redis: each scenario
// runs the repeatrate binary as separate processes over 200 000 events with duplicates,
// re-assessments, stale re-assessments, shuffled order and poison, injects a fault, and requires the
// published snapshots to equal `repeatrate replay` and the dead-letter topic to hold exactly the
// poison. It kills and restarts the shared test services, so the README's test command runs it
// alone, after every other package.
package faults

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/repeatrate/repeatrate/internal/synth"
	"github.com/repeatrate/repeatrate/internal/testenv"
	"github.com/repeatrate/repeatrate/schemas"
)

var (
	bin      string // the repeatrate binary under test
	repoRoot string
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "repeatrate-faults")
	if err != nil {
		panic(err)
	}
	repoRoot, _ = filepath.Abs("../..")
	bin = filepath.Join(dir, "repeatrate")
	build := exec.Command("go", "build", "-o", bin, "./cmd/repeatrate")
	build.Dir = repoRoot
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// eventCount is the size of every scenario's input (the issue asks for at least 200 000).
const eventCount = 200_000

// input is one generated stream with what replay says of it.
type input struct {
	file     string
	lines    int
	poison   map[string]int    // poison line → occurrences
	expected map[string]string // aggregate ID → comparable snapshot JSON
}

var (
	inputOnce sync.Once
	shared    *input
	inputErr  error
)

// sharedInput generates the stream once per test binary: 20 % duplicates (byte-identical and
// re-emitted with a new CloudEvent id), 10 % re-assessments (newer and stale), 0.5 % poison,
// shuffled in windows of 500 lines.
func sharedInput(t *testing.T) *input {
	inputOnce.Do(func() {
		dir, err := os.MkdirTemp("", "repeatrate-faults-input")
		if err != nil {
			inputErr = err
			return
		}
		gen := synth.New(synth.Config{Seed: 2026, Workspaces: 6, Corrections: 4, Duplicates: 0.2, Reassessed: 0.1,
			Poison: 0.005, EvalShare: 0.3})
		start := time.Now()
		lines := make([][]byte, eventCount)
		in := &input{file: filepath.Join(dir, "in.ndjson"), lines: eventCount, poison: map[string]int{}}
		for i := range lines {
			line, bad := gen.Line(start)
			lines[i] = line
			if bad {
				in.poison[string(line)]++
			}
		}
		r := rand.New(rand.NewPCG(7, 7))
		for w := 0; w < len(lines); w += 500 {
			win := lines[w:min(w+500, len(lines))]
			r.Shuffle(len(win), func(i, j int) { win[i], win[j] = win[j], win[i] })
		}
		if inputErr = os.WriteFile(in.file, append(bytes.Join(lines, []byte("\n")), '\n'), 0o600); inputErr != nil {
			return
		}
		out := filepath.Join(dir, "expected.ndjson")
		cmd := exec.Command(bin, "replay", "--in", in.file, "--out", out, "--dlq", filepath.Join(dir, "dlq.ndjson"))
		if b, err := cmd.CombinedOutput(); err != nil {
			inputErr = fmt.Errorf("replay: %v: %s", err, b)
			return
		}
		in.expected = map[string]string{}
		f, _ := os.ReadFile(out)
		for _, l := range bytes.Split(bytes.TrimSpace(f), []byte("\n")) {
			var e struct {
				Type string          `json:"type"`
				Data json.RawMessage `json:"data"`
			}
			if err := json.Unmarshal(l, &e); err != nil {
				inputErr = err
				return
			}
			if e.Type != schemas.TypeSnapshot {
				continue // suite snapshots and alerts: not what these scenarios compare
			}
			var snap schemas.Snapshot
			if err := json.Unmarshal(e.Data, &snap); err != nil {
				inputErr = err
				return
			}
			in.expected[snap.Aggregate.ID()] = comparable(snap)
		}
		dl, _ := os.ReadFile(filepath.Join(dir, "dlq.ndjson"))
		if n := bytes.Count(dl, []byte("\n")); n != sum(in.poison) {
			inputErr = fmt.Errorf("replay dead-lettered %d lines, the generator made %d poison", n, sum(in.poison))
			return
		}
		shared = in
	})
	if inputErr != nil {
		t.Fatal(inputErr)
	}
	return shared
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// comparable drops what streaming and replay legitimately differ in: observation time and version.
func comparable(s schemas.Snapshot) string {
	s.ObservedAt, s.Version = time.Time{}, 0
	b, _ := json.Marshal(s)
	return string(b)
}

// scenario is one run: its own topics, group and Redis namespace.
type scenario struct {
	t       *testing.T
	name    string
	in      *input
	brokers []string
	redis   string // address the processors use for Redis
	procs   []*proc
	seen    *latest
	cancel  context.CancelFunc
	stopped chan struct{} // closed when the snapshot reader returns
	readErr error         // why it returned, once stopped is closed

	// The read side, busy throughout: every processor start() runs serves it, and readers loop
	// on its suite pages, suite API and SSE catch-ups beside the batches.
	readers *testenv.Readers
	mu      sync.Mutex
	addrs   map[*proc]string
	// mayLoseWrites says the scenario makes Redis lose acknowledged writes; any other scenario
	// in which a processor finds writes lost (and rewinds) fails.
	mayLoseWrites bool
}

// suiteWorkspaces are the workspaces of the generated input; its eval results are all of the
// suite "regressions".
var suiteWorkspaces = testenv.Workspaces(6)

// liveAddrs returns the read-side addresses of the processors still running.
func (s *scenario) liveAddrs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for p, a := range s.addrs {
		if _, exited := p.Wait(0); !exited {
			out = append(out, a)
		}
	}
	return out
}

// newScenario makes the scenario's topics and writes the shared input to its input topic.
func newScenario(t *testing.T) *scenario {
	t.Helper()
	return startScenario(t, true)
}

// newEmptyScenario makes the scenario's topics and leaves its input topic empty: its processors
// consume only what the test writes, and there is no replay for converge or checkDeadLetters to
// compare with.
func newEmptyScenario(t *testing.T) *scenario {
	t.Helper()
	return startScenario(t, false)
}

func startScenario(t *testing.T, withInput bool) *scenario {
	t.Helper()
	s := &scenario{t: t, name: testenv.Name(t, "fault"), brokers: testenv.KafkaBrokers(t), redis: testenv.RedisAddr(t)}
	if withInput {
		s.in = sharedInput(t) // after the service checks: a skipped scenario generates nothing
	}
	ctx := context.Background()
	// A transport of its own: a pooled connection may have died with a restarted broker.
	client := &kafka.Client{Addr: kafka.TCP(s.brokers...), Timeout: 30 * time.Second, Transport: &kafka.Transport{}}
	var topics []kafka.TopicConfig
	for _, suffix := range []string{"in", "snapshots", "suites", "alerts", "dlq"} {
		parts := 4
		if suffix == "dlq" || suffix == "alerts" {
			parts = 1
		}
		topics = append(topics, kafka.TopicConfig{Topic: s.topic(suffix), NumPartitions: parts, ReplicationFactor: 1})
	}
	var err error
	for try := 0; try < 10; try++ { // a broker restarted by the previous scenario may still be settling
		if _, err = client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: topics}); err == nil {
			break
		}
		time.Sleep(time.Second)
	}
	if err != nil {
		t.Fatal(err)
	}
	if s.in != nil {
		produce := exec.Command(bin, "produce", "--brokers", strings.Join(s.brokers, ","), "--topic", s.topic("in"), "--in", s.in.file)
		if out, err := produce.CombinedOutput(); err != nil {
			t.Fatalf("produce: %v: %s", err, out)
		}
	}
	s.seen = &latest{by: map[string]schemas.Snapshot{}}
	tctx, cancel := context.WithCancel(ctx)
	s.cancel, s.stopped = cancel, make(chan struct{})
	go func() { s.readErr = s.seen.follow(tctx, s.brokers, s.topic("snapshots")); close(s.stopped) }()
	var suites []testenv.SuiteRef
	for _, w := range suiteWorkspaces {
		suites = append(suites, testenv.SuiteRef{Workspace: w, Suite: "regressions"})
	}
	s.addrs = map[*proc]string{}
	s.readers = testenv.StartReaders(3, s.liveAddrs, suites)
	t.Cleanup(func() {
		s.readers.Stop()
		for _, p := range s.procs {
			p.Kill()
		}
		cancel()
		<-s.stopped
		if t.Failed() {
			for _, p := range s.procs {
				t.Logf("log of %s:\n%s", p.Name, p.Tail(40))
			}
		}
	})
	return s
}

func (s *scenario) topic(suffix string) string { return s.name + "." + suffix }

func (s *scenario) env() []string {
	return append(os.Environ(),
		"REPEATRATE_KAFKA_BROKERS="+strings.Join(s.brokers, ","),
		"REPEATRATE_KAFKA_GROUP_ID="+s.name,
		"REPEATRATE_KAFKA_INPUT_TOPICS="+s.topic("in"),
		"REPEATRATE_KAFKA_SNAPSHOT_TOPIC="+s.topic("snapshots"),
		"REPEATRATE_KAFKA_SUITE_TOPIC="+s.topic("suites"),
		"REPEATRATE_KAFKA_ALERTS_TOPIC="+s.topic("alerts"),
		"REPEATRATE_KAFKA_DLQ_TOPIC="+s.topic("dlq"),
		"REPEATRATE_KAFKA_SESSION_TIMEOUT=6s",
		"REPEATRATE_REDIS_ADDRS="+s.redis,
		"REPEATRATE_REDIS_KEY_PREFIX="+s.name,
		"REPEATRATE_LOG_LEVEL=info",
	)
}

// start runs one more processor, its read side served for the busy readers.
func (s *scenario) start() *proc {
	s.t.Helper()
	args, addr, err := testenv.ReadSideArgs(suiteWorkspaces)
	if err != nil {
		s.t.Fatal(err)
	}
	p := s.startArgs(append([]string{"run"}, args...)...)
	s.mu.Lock()
	s.addrs[p] = addr
	s.mu.Unlock()
	return p
}

// startArgs runs the binary with args and the scenario's configuration.
func (s *scenario) startArgs(args ...string) *proc {
	s.t.Helper()
	return s.startEnv(nil, args...)
}

// startEnv runs the binary with args, the scenario's configuration and env besides.
func (s *scenario) startEnv(env []string, args ...string) *proc {
	s.t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(s.env(), env...)
	p, err := testenv.StartProc(fmt.Sprintf("%s-%d", args[0], len(s.procs)), cmd)
	if err != nil {
		s.t.Fatal(err)
	}
	s.procs = append(s.procs, p)
	return p
}

// waitCommitted waits until the scenario's group has committed an offset of the input topic.
func (s *scenario) waitCommitted(within time.Duration) {
	s.t.Helper()
	client := &kafka.Client{Addr: kafka.TCP(s.brokers...), Timeout: 10 * time.Second, Transport: &kafka.Transport{}}
	deadline := time.Now().Add(within)
	for {
		res, err := client.OffsetFetch(context.Background(), &kafka.OffsetFetchRequest{GroupID: s.name,
			Topics: map[string][]int{s.topic("in"): {0, 1, 2, 3}}})
		if err == nil {
			for _, p := range res.Topics[s.topic("in")] {
				if p.CommittedOffset > 0 {
					return
				}
			}
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("the group committed no offset within %s (last error %v)", within, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// converge waits until the latest snapshot of every aggregate equals replay's.
func (s *scenario) converge(within time.Duration) {
	s.t.Helper()
	s.needInput()
	deadline := time.Now().Add(within)
	for {
		ok, why := s.seen.equal(s.in.expected)
		if ok {
			s.readers.Check(s.t, s.procs, s.mayLoseWrites)
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("snapshots did not converge to replay within %s: %s", within, why)
		}
		select {
		case <-s.stopped:
			s.t.Fatalf("snapshot reader stopped: %v", s.readErr)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// needInput fails a scenario made without input (newEmptyScenario): it has no replay to compare.
func (s *scenario) needInput() {
	s.t.Helper()
	if s.in == nil {
		s.t.Fatal("a scenario without input (newEmptyScenario) has no replay to compare with")
	}
}

// checkDeadLetters requires the dead-letter topic to hold exactly the poison, each line once.
func (s *scenario) checkDeadLetters() {
	s.t.Helper()
	s.needInput()
	got := map[string]int{}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: s.brokers, Topic: s.topic("dlq"), Partition: 0, MaxWait: 200 * time.Millisecond})
	defer r.Close()
	for sum(got) < sum(s.in.poison)+1 {
		rctx, rcancel := context.WithTimeout(ctx, 3*time.Second)
		m, err := r.FetchMessage(rctx)
		rcancel()
		if err != nil {
			break // idle: everything has been read
		}
		got[string(m.Value)]++
	}
	if sum(got) != sum(s.in.poison) {
		s.t.Fatalf("dead-letter topic holds %d messages, want exactly the %d poison", sum(got), sum(s.in.poison))
	}
	for line, n := range s.in.poison {
		if got[line] != n {
			s.t.Fatalf("poison %q dead-lettered %d times, want %d", line, got[line], n)
		}
	}
}

// proc is one processor process.
type proc = testenv.Proc

// latest keeps the greatest-version snapshot of every aggregate on a topic.
type latest struct {
	mu sync.Mutex
	by map[string]schemas.Snapshot
	n  int
}

func (l *latest) follow(ctx context.Context, brokers []string, topic string) error {
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for p := 0; p < 4; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			next := kafka.FirstOffset
			for ctx.Err() == nil {
				// A reader that fails (a broker restart, say) is replaced at the next offset.
				if err := l.read(ctx, brokers, topic, p, &next); err != nil {
					errs <- err
					return
				}
				select {
				case <-ctx.Done():
				case <-time.After(500 * time.Millisecond):
				}
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

// read follows one partition from *next until the reader fails (nil: retry) or the data is bad.
func (l *latest) read(ctx context.Context, brokers []string, topic string, partition int, next *int64) error {
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: partition, MaxWait: 200 * time.Millisecond, MaxBytes: 16 << 20})
	defer r.Close()
	if err := r.SetOffset(*next); err != nil {
		return nil
	}
	for {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			return nil
		}
		*next = m.Offset + 1
		var e struct {
			Data schemas.Snapshot `json:"data"`
		}
		if err := json.Unmarshal(m.Value, &e); err != nil {
			return fmt.Errorf("snapshot at %s/%d@%d: %w", topic, partition, m.Offset, err)
		}
		l.mu.Lock()
		l.n++
		if cur, ok := l.by[string(m.Key)]; !ok || e.Data.Version >= cur.Version {
			l.by[string(m.Key)] = e.Data
		}
		l.mu.Unlock()
	}
}

func (l *latest) equal(want map[string]string) (bool, string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var missing, differ []string
	for k, w := range want {
		got, ok := l.by[k]
		switch {
		case !ok:
			missing = append(missing, k)
		case comparable(got) != w:
			differ = append(differ, k)
		}
	}
	if len(missing)+len(differ) == 0 && len(l.by) == len(want) {
		return true, ""
	}
	slices.Sort(differ)
	why := fmt.Sprintf("%d snapshots read, %d aggregates (want %d), %d missing, %d differ", l.n, len(l.by), len(want), len(missing), len(differ))
	if len(differ) > 0 {
		why += fmt.Sprintf("; e.g. %s:\n got %s\nwant %s", differ[0], comparable(l.by[differ[0]]), want[differ[0]])
	}
	return false, why
}

// service runs one of deploy/local's service scripts; the scenarios that need it skip (or fail
// under CI=true) when the service was not started by those scripts.
func service(t *testing.T, script string, args ...string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(repoRoot, "deploy/local", script), args...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v: %s", script, args, err, out)
	}
}

func needScripts(t *testing.T, script string) {
	t.Helper()
	if exec.Command(filepath.Join(repoRoot, "deploy/local", script), "status").Run() == nil {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("deploy/local/%s does not manage the running service; under CI it must", script)
	}
	t.Skipf("deploy/local/%s does not manage the running service", script)
}
