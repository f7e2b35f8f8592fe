package secure

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/repeatrate/repeatrate/internal/auth"
	"github.com/repeatrate/repeatrate/internal/synth"
	"github.com/repeatrate/repeatrate/schemas"
)

// secureEvents is the input size: a few batches, enough for every script and store to run.
const secureEvents = 3000

// refusedByDesign are the commands the processor tries that the least-privilege user is refused
// on purpose: CONFIG GET (the eviction policy check, which then says it cannot tell; CONFIG GET
// would also read the server's secrets).
var refusedByDesign = map[string]bool{"config|get": true}

// Events in through `produce`, `run` with alerting and the read side, snapshots and dead letters
// out through `tail` — every connection over TLS, Kafka with SCRAM-SHA-512, Redis as the ACL user
// of the README's least-privilege line. Redis's ACL log must hold no refusal of the processor's
// user but the one by design, the snapshots must equal replay's, the dead letters must be exactly
// the poison, and the user must be refused a command and a key outside its grant.
func TestSecuredEndToEnd(t *testing.T) {
	s := load(t)
	ctx := t.Context()
	admin := s.redisAs(t, "admin", s.RedisAdminPass)
	if err := admin.Ping(ctx).Err(); err != nil {
		t.Fatalf("admin ping: %v", err)
	}
	// A fresh state under the prefix (this Redis is the test's own) and an empty ACL log.
	if err := deletePrefix(ctx, admin, s.Prefix); err != nil {
		t.Fatal(err)
	}
	if err := admin.Do(ctx, "ACL", "LOG", "RESET").Err(); err != nil {
		t.Fatal(err)
	}

	name := fmt.Sprintf("secure-%d-%d", os.Getpid(), time.Now().UnixNano()%1e9)
	topic := func(x string) string { return name + "." + x }
	gen := synth.New(synth.Config{Seed: 41, Workspaces: 2, Corrections: 3, Duplicates: 0.2, Reassessed: 0.1, Poison: 0.02, EvalShare: 0.3})
	now := time.Now()
	var lines [][]byte
	poison := map[string]int{}
	for range secureEvents {
		l, bad := gen.Line(now)
		lines = append(lines, l)
		if bad {
			poison[string(l)]++
		}
	}
	// A suite's results too, so the suite script and its stability runs go through the ACL.
	lines = append(lines, synth.Suite(synth.SuiteConfig{Seed: 3, Workspace: "ws-0", Suite: "qa|secure", Cases: 8, Versions: 6, Runs: 3,
		Duplicates: 0.1, Regrades: 0.05, LoopShare: 0.1}, now.Add(-2*time.Hour))...)
	dir := t.TempDir()
	file := filepath.Join(dir, "in.ndjson")
	if err := os.WriteFile(file, append(bytes.Join(lines, []byte("\n")), '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	want := expected(t, file)

	if out, errOut, err := command(ctx, s.kafkaEnv(), append([]string{"produce", "--topic", topic("in"), "--in", file}, s.kafkaFlags()...)...); err != nil {
		t.Fatalf("produce: %v\n%s%s", err, out, errOut)
	}

	httpAddr := freeAddr(t)
	const token = "rr_secure_test_token_0123456789"
	p := start(t, s.runEnv(
		"REPEATRATE_KAFKA_GROUP_ID="+name,
		"REPEATRATE_KAFKA_INPUT_TOPICS="+topic("in"),
		"REPEATRATE_KAFKA_SNAPSHOT_TOPIC="+topic("snapshots"),
		"REPEATRATE_KAFKA_SUITE_TOPIC="+topic("suites"),
		"REPEATRATE_KAFKA_ALERTS_TOPIC="+topic("alerts"),
		"REPEATRATE_KAFKA_DLQ_TOPIC="+topic("dlq"),
		"REPEATRATE_KAFKA_CREATE_TOPICS=true",
		"REPEATRATE_ALERT_RULES="+filepath.Join(root, "deploy/alert-rules.example.yaml"),
		"REPEATRATE_HTTP_ADDR="+httpAddr,
		"REPEATRATE_HTTP_TOKENS=secure:"+auth.Hash(token)+":*=read",
		"REPEATRATE_BATCH_COMMIT_DELAY=200ms",
	), "run")

	// Converged: the latest snapshot of every aggregate, read by tail, equals replay's.
	var got map[string]schemas.Snapshot
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if _, done := p.Wait(0); done {
			t.Fatalf("run exited: %v", p.Err())
		}
		checkACLLog(t, admin, s.RedisUser)
		got = tailSnapshots(t, s, topic("snapshots"))
		ok, diff := equal(got, want)
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("snapshots did not converge to replay's: %s", diff)
		}
		time.Sleep(time.Second)
	}
	checkDeadLetters(t, s, topic("dlq"), poison)
	if out, errOut, err := command(ctx, s.kafkaEnv(), append([]string{"tail", "--topic", topic("suites"), "--idle", "2s"}, s.kafkaFlags()...)...); err != nil || len(out) == 0 {
		t.Fatalf("tail suites: %v, %d bytes\n%s", err, len(out), errOut)
	}
	// loadgen takes the same TLS and SASL settings as every Kafka subcommand.
	if out, errOut, err := command(ctx, s.kafkaEnv(), append([]string{"loadgen", "--live-topic", topic("gen-live"), "--eval-topic", topic("gen-eval"),
		"--rate", "50", "--duration", "2s"}, s.kafkaFlags()...)...); err != nil {
		t.Fatalf("loadgen: %v\n%s%s", err, out, errOut)
	}
	if out, errOut, err := command(ctx, s.kafkaEnv(), append([]string{"tail", "--topic", topic("gen-live"), "--idle", "2s"}, s.kafkaFlags()...)...); err != nil || len(out) == 0 {
		t.Fatalf("tail what loadgen wrote: %v, %d bytes\n%s", err, len(out), errOut)
	}

	// The read side, through the same ACL user: one aggregate's snapshots over HTTP.
	var one schemas.Snapshot
	for _, sn := range got {
		one = sn
		break
	}
	q := url.Values{"workspace": {one.Aggregate.Workspace}, "model": {one.Aggregate.Model}, "run": {one.Aggregate.Run},
		"checkpoint": {one.Aggregate.Checkpoint}, "artifact": {one.Aggregate.Artifact}, "correction_id": {one.Aggregate.CorrectionID}}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+httpAddr+"/v1/snapshots?"+q.Encode(), nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !bytes.Contains(body, []byte(one.Aggregate.CorrectionID)) {
		t.Fatalf("GET /v1/snapshots: %d %s", resp.StatusCode, body)
	}

	p.Signal(syscall.SIGTERM)
	if err, done := p.Wait(30 * time.Second); !done || err != nil {
		t.Fatalf("run after SIGTERM: exited %v, %v", done, err)
	}

	// Nothing the processor did was refused, but what is refused by design.
	checkACLLog(t, admin, s.RedisUser)

	// Least privilege: a command and keys outside the grant are refused.
	user := s.redisAs(t, s.RedisUser, s.RedisPass)
	for _, c := range [][]any{
		{"FLUSHALL"},
		{"CONFIG", "GET", "requirepass"},
		{"KEYS", "*"},
		{"GET", "other:key"},
		{"SET", "other:key", "x"},
		{"EVALSHA", "0000000000000000000000000000000000000000", "1", "other:key"},
		{"PUBLISH", "other:feed", "x"},
	} {
		if err := user.Do(ctx, c...).Err(); err == nil || !strings.HasPrefix(err.Error(), "NOPERM") {
			t.Errorf("%v as %s: %v, want NOPERM", c, s.RedisUser, err)
		}
	}
	if err := user.Set(ctx, s.Prefix+":secure-test", "x", time.Minute).Err(); err != nil {
		t.Errorf("SET under the prefix as %s: %v", s.RedisUser, err)
	}
	t.Logf("%d events, %d aggregates, %d poison, over TLS, SCRAM-SHA-512 and the least-privilege ACL", len(lines), len(want), len(poison))
}

// checkACLLog fails the test when Redis refused user anything but what is refused by design.
func checkACLLog(t *testing.T, admin *redis.Client, user string) {
	t.Helper()
	entries, err := admin.Do(t.Context(), "ACL", "LOG", "128").Slice()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if f := aclEntry(e); f["username"] == user && !refusedByDesign[f["object"]] {
			t.Fatalf("the processor's user was refused (add it to the README's ACL line and deploy/local/secure.sh if it is needed): %v", f)
		}
	}
}

// aclEntry turns one ACL LOG entry (alternating field names and values) into a map.
func aclEntry(e any) map[string]string {
	out := map[string]string{}
	switch v := e.(type) {
	case []any:
		for i := 0; i+1 < len(v); i += 2 {
			out[fmt.Sprint(v[i])] = fmt.Sprint(v[i+1])
		}
	case map[any]any:
		for k, x := range v {
			out[fmt.Sprint(k)] = fmt.Sprint(x)
		}
	}
	return out
}

func deletePrefix(ctx context.Context, c *redis.Client, prefix string) error {
	iter := c.Scan(ctx, 0, prefix+":*", 1000).Iterator()
	for iter.Next(ctx) {
		if err := c.Del(ctx, iter.Val()).Err(); err != nil {
			return err
		}
	}
	return iter.Err()
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// expected runs replay over the file and returns every aggregate's comparable snapshot.
func expected(t *testing.T, file string) map[string]string {
	t.Helper()
	dir := t.TempDir()
	out := filepath.Join(dir, "expected.ndjson")
	if b, err := exec.Command(bin, "replay", "--in", file, "--out", out, "--dlq", filepath.Join(dir, "dlq.ndjson")).CombinedOutput(); err != nil {
		t.Fatalf("replay: %v: %s", err, b)
	}
	f, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for _, sn := range snapshots(t, f) {
		want[sn.Aggregate.ID()] = comparable(sn)
	}
	return want
}

// snapshots decodes the repeat-rate snapshots among NDJSON CloudEvents, the latest version of each
// aggregate.
func snapshots(t *testing.T, b []byte) map[string]schemas.Snapshot {
	t.Helper()
	out := map[string]schemas.Snapshot{}
	for _, l := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
		if len(l) == 0 {
			continue
		}
		var e struct {
			Type string          `json:"type"`
			Data json.RawMessage `json:"data"`
		}
		if err := json.Unmarshal(l, &e); err != nil {
			t.Fatalf("%v: %s", err, l)
		}
		if e.Type != schemas.TypeSnapshot {
			continue
		}
		var sn schemas.Snapshot
		if err := json.Unmarshal(e.Data, &sn); err != nil {
			t.Fatal(err)
		}
		if cur, ok := out[sn.Aggregate.ID()]; !ok || sn.Version >= cur.Version {
			out[sn.Aggregate.ID()] = sn
		}
	}
	return out
}

// tailSnapshots reads the snapshot topic with `tail` over SASL_SSL.
func tailSnapshots(t *testing.T, s services, topic string) map[string]schemas.Snapshot {
	t.Helper()
	out, errOut, err := command(t.Context(), s.kafkaEnv(), append([]string{"tail", "--topic", topic, "--idle", "1s"}, s.kafkaFlags()...)...)
	if err != nil {
		// The topic appears when the processor creates it.
		if bytes.Contains(errOut, []byte("Unknown Topic Or Partition")) {
			return nil
		}
		t.Fatalf("tail: %v\n%s", err, errOut)
	}
	return snapshots(t, out)
}

// comparable drops what streaming and replay legitimately differ in: observation time and version.
func comparable(s schemas.Snapshot) string {
	s.ObservedAt, s.Version = time.Time{}, 0
	b, _ := json.Marshal(s)
	return string(b)
}

func equal(got map[string]schemas.Snapshot, want map[string]string) (bool, string) {
	missing, differ := 0, 0
	for k, w := range want {
		g, ok := got[k]
		switch {
		case !ok:
			missing++
		case comparable(g) != w:
			differ++
		}
	}
	if missing+differ == 0 && len(got) == len(want) {
		return true, ""
	}
	return false, fmt.Sprintf("%d aggregates missing, %d differ, %d seen of %d", missing, differ, len(got), len(want))
}

// checkDeadLetters requires the dead-letter topic, read by `tail --headers`, to hold exactly the
// poison.
func checkDeadLetters(t *testing.T, s services, topic string, poison map[string]int) {
	t.Helper()
	out, errOut, err := command(t.Context(), s.kafkaEnv(), append([]string{"tail", "--topic", topic, "--idle", "2s"}, s.kafkaFlags()...)...)
	if err != nil {
		t.Fatalf("tail dlq: %v\n%s", err, errOut)
	}
	got := map[string]int{}
	for _, l := range bytes.Split(bytes.TrimSpace(out), []byte("\n")) {
		if len(l) > 0 {
			got[string(l)]++
		}
	}
	for line, n := range poison {
		if got[line] != n {
			t.Fatalf("poison %q dead-lettered %d times, want %d", line, got[line], n)
		}
	}
	if len(got) != len(poison) {
		t.Fatalf("dead-letter topic holds %d distinct messages, want the %d poison", len(got), len(poison))
	}
}
