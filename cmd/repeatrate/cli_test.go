package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

func TestCommandExitCodes(t *testing.T) {
	ctx := context.Background()
	noenv := func(string) string { return "" }
	for _, tc := range []struct {
		name string
		args []string
		ok   bool
		says string // in the error or the usage printed
	}{
		// Asking for help is no error, for every command.
		{"help", []string{"help"}, true, "usage: repeatrate"},
		{"version", []string{"--version"}, true, "repeatrate "},
		{"run -h", []string{"run", "-h"}, true, "-kafka-brokers"},
		{"dev --help", []string{"dev", "--help"}, true, "-demo"},
		{"rebuild --help", []string{"rebuild", "--help"}, true, "-kafka-brokers"},
		{"replay --help", []string{"replay", "--help"}, true, "-in"},
		{"produce --help", []string{"produce", "--help"}, true, "-topic"},
		{"tail --help", []string{"tail", "--help"}, true, "-topic"},
		{"loadgen --help", []string{"loadgen", "--help"}, true, "-rate"},
		// Mistakes are errors that say what was wrong.
		{"no command", nil, false, "no command"},
		{"unknown command", []string{"bogus"}, false, `unknown command "bogus"`},
		{"unknown flag", []string{"replay", "--nope"}, false, "flag provided but not defined: -nope"},
		{"bad flag value", []string{"tail", "--idle", "soon"}, false, "invalid value"},
		{"unknown flag of run", []string{"run", "--kafka-brokerz", "x"}, false, "flag provided but not defined: -kafka-brokerz"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			err := run(ctx, tc.args, noenv, strings.NewReader(""), &out, &errOut)
			if (err == nil) != tc.ok {
				t.Fatalf("err = %v, want ok %v", err, tc.ok)
			}
			if tc.name != "no command" && tc.name != "unknown command" && err != nil && errOut.Len() > 0 {
				// main prints the error on one line; nothing else may precede it.
				t.Fatalf("a mistake printed more than its error:\n%s", errOut.String())
			}
			said := out.String() + errOut.String()
			if err != nil {
				said += err.Error()
			}
			if !strings.Contains(said, tc.says) {
				t.Fatalf("output and error do not mention %q:\n%s", tc.says, said)
			}
		})
	}
}

func TestDevExitsZeroOnInterrupt(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	cmd := exec.Command(buildBinary(t), "dev", "--demo", "--kafka-addr=127.0.0.1:0", "--redis-addr=127.0.0.1:0", "--http-addr=127.0.0.1:0")
	var out lockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	// Wait until the demo prints its first summary, then interrupt it as Ctrl-C does.
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(out.String(), "events/s in") && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("dev exited with %v on Ctrl-C, want 0\n%s", err, lastLines(out.String(), 10))
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Signal(syscall.SIGKILL)
		t.Fatalf("dev did not stop within 30 s of Ctrl-C\n%s", lastLines(out.String(), 10))
	}
}

// The demo keeps processing: on the embedded broker and Redis the counted opportunities grow past
// what the first batches hold, and no batch fails. (The embedded Redis runs another Lua than the
// real one; a script that is fine on Redis once stalled every batch of the demo there.)
func TestDevDemoProcessesTraffic(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	cmd := exec.Command(buildBinary(t), "dev", "--demo", "--rate", "200", "--kafka-addr=127.0.0.1:0", "--redis-addr=127.0.0.1:0", "--http-addr=127.0.0.1:0")
	var out lockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(os.Interrupt)
		cmd.Wait()
	}()
	counted := regexp.MustCompile(`counted (\d+)`)
	const want = 300
	deadline := time.Now().Add(90 * time.Second)
	for n := 0; n < want; time.Sleep(200 * time.Millisecond) {
		text := out.String()
		if strings.Contains(text, `"level":"error"`) {
			t.Fatalf("the demo logged an error:\n%s", lastLines(text, 10))
		}
		if m := counted.FindAllStringSubmatch(text, -1); len(m) > 0 {
			n, _ = strconv.Atoi(m[len(m)-1][1])
		}
		if time.Now().After(deadline) {
			t.Fatalf("the demo counted %d opportunities in 90 s, want %d:\n%s", n, want, lastLines(text, 12))
		}
	}
}

// lastLines returns the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// lockedBuffer is a bytes.Buffer that a process writes while the test reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func TestTailWithHeaders(t *testing.T) {
	for _, tc := range []struct {
		name string
		msg  kafka.Message
		want string
	}{
		// A dead letter: its reason headers in order, the original bytes as text.
		{"dead letter", kafka.Message{Topic: TopicDLQ, Partition: 0, Offset: 7, Value: []byte("not json"),
			Headers: []kafka.Header{{Key: "repeatrate-dlq-reason", Value: []byte("undecodable")}, {Key: "repeatrate-dlq-offset", Value: []byte("41")}}},
			`{"topic":"repeatrate.dlq","partition":0,"offset":7,"headers":[{"key":"repeatrate-dlq-reason","value":"undecodable"},{"key":"repeatrate-dlq-offset","value":"41"}],"value":"not json"}`},
		// A JSON value stays JSON; the key is shown.
		{"snapshot", kafka.Message{Topic: TopicSnapshots, Partition: 2, Offset: 1, Key: []byte("a|b"), Value: []byte(`{"version":3}`)},
			`{"topic":"repeatrate.snapshots","partition":2,"offset":1,"key":"a|b","headers":[],"value":{"version":3}}`},
		// Bytes that are not UTF-8 are replaced, never printed raw.
		{"binary", kafka.Message{Topic: "t", Value: []byte{0xff, 'x'}, Headers: []kafka.Header{{Key: "h", Value: []byte{0xfe}}}},
			`{"topic":"t","partition":0,"offset":0,"headers":[{"key":"h","value":"` + "\uFFFD" + `"}],"value":"` + "\uFFFD" + `x"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := json.Marshal(tailedOf(tc.msg))
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != tc.want {
				t.Fatalf("got  %s\nwant %s", b, tc.want)
			}
		})
	}
}

var (
	buildOnce sync.Once
	builtBin  string
	buildErr  error
)

// buildBinary builds the command once per test binary and returns its path.
func buildBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "repeatrate-cli")
		if err != nil {
			buildErr = err
			return
		}
		builtBin = filepath.Join(dir, "repeatrate")
		if out, err := exec.Command("go", "build", "-o", builtBin, ".").CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return builtBin
}

// TestDevMemoryBounded runs the demo at 25 times its default rate for 40 s (about 20 000 events,
// an hour and more of the default demo's traffic, with state and broker retention short enough to
// be reached) and requires its resident memory to stay under 300 MB (README, "The two commands").
func TestDevMemoryBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the demo for 40 s")
	}
	cmd := exec.Command(buildBinary(t), "dev", "--demo", "--rate=500", "--retention=1h", "--kafka-retention=10s",
		"--kafka-addr=127.0.0.1:0", "--redis-addr=127.0.0.1:0", "--http-addr=127.0.0.1:0")
	var out lockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Signal(os.Interrupt); cmd.Wait() }()
	var peak int64
	for range 40 {
		time.Sleep(time.Second)
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", cmd.Process.Pid))
		if err != nil {
			t.Skipf("no /proc here: %v", err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
				peak = max(peak, kb<<10)
			}
		}
	}
	if !strings.Contains(out.String(), "events/s in") {
		t.Fatalf("the demo printed no summary:\n%s", lastLines(out.String(), 10))
	}
	t.Logf("peak RSS %d MB over 40 s at 500 events/s", peak>>20)
	if peak > 300<<20 {
		t.Fatalf("the demo's resident memory reached %d MB, over the 300 MB bound", peak>>20)
	}
}

// TestDevLiveViewInTerminal runs the demo in a real terminal (tmux), reads the screen as a person
// would, and stops it with Ctrl-C.
func TestDevLiveViewInTerminal(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the demo in tmux")
	}
	if _, err := exec.LookPath("tmux"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("tmux is required under CI=true")
		}
		t.Skip("tmux not installed")
	}
	session := fmt.Sprintf("rr-test-%d", os.Getpid())
	tmux := func(args ...string) string {
		out, err := exec.Command("tmux", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("tmux %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	tmux("new-session", "-d", "-s", session, "-x", "160", "-y", "30",
		buildBinary(t)+" dev --demo --kafka-addr 127.0.0.1:0 --redis-addr 127.0.0.1:0 --http-addr 127.0.0.1:0; echo EXIT=$?; sleep 60")
	defer exec.Command("tmux", "kill-session", "-t", session).Run()
	screen := ""
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		time.Sleep(500 * time.Millisecond)
		if screen = tmux("capture-pane", "-p", "-t", session); strings.Contains(screen, "ws-") {
			break
		}
	}
	for _, want := range []string{"events/s in", "snapshots out", "dead letters:", "live, all time", "evaluation, all time",
		"m|small", "run-1 ckpt-7 prod fix-", "(Ctrl-C stops the demo)"} {
		if !strings.Contains(screen, want) {
			t.Fatalf("the screen does not show %q:\n%s", want, screen)
		}
	}
	// In place: one header on the screen however long it ran, not a scrolling log.
	time.Sleep(2 * time.Second)
	screen = tmux("capture-pane", "-p", "-t", session)
	if n := strings.Count(screen, "live, all time"); n != 1 {
		t.Fatalf("the view shows its header %d times: it scrolls instead of refreshing in place:\n%s", n, screen)
	}
	t.Logf("the live view:\n%s", screen)
	tmux("send-keys", "-t", session, "C-c")
	for time.Now().Before(deadline.Add(30 * time.Second)) {
		time.Sleep(500 * time.Millisecond)
		if screen = tmux("capture-pane", "-p", "-t", session); strings.Contains(screen, "EXIT=") {
			break
		}
	}
	if !strings.Contains(screen, "EXIT=0") {
		t.Fatalf("Ctrl-C did not end the demo with 0:\n%s", screen)
	}
}

// dev on a busy HTTP port says so in one line and prints nothing else: no banner, token or URL
// that would belong to the process holding the port.
func TestDevOnABusyPortSaysSoFirst(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var out, errOut bytes.Buffer
	err = run(context.Background(), []string{"dev", "--http-addr", l.Addr().String(), "--kafka-addr", "127.0.0.1:0", "--redis-addr", "127.0.0.1:0"},
		func(string) string { return "" }, strings.NewReader(""), &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "address already in use") || !strings.Contains(err.Error(), l.Addr().String()) {
		t.Fatalf("dev on a busy port: %v", err)
	}
	if out.Len() != 0 {
		t.Errorf("dev printed before failing:\n%s", out.String())
	}
}

// Each subcommand's -h lists the settings it uses, not every one of run's: the evaluator alone
// has no batches or read side, a rebuild no read side or alerting.
func TestSubcommandHelpListsItsOwnFlags(t *testing.T) {
	for _, c := range []struct {
		cmd        string
		has, lacks []string
	}{
		{"run", []string{"-batch-linger", "-http-tokens", "-alert-rules", "-suite-min-history"}, nil},
		{"alert", []string{"-alert-rules", "-alertmanager-url", "-kafka-snapshot-topic", "-redis-addrs", "-kafka-sasl-mechanism"},
			[]string{"-batch-linger", "-http-tokens", "-suite-min-history", "-kafka-input-topics", "-pprof"}},
		{"rebuild", []string{"-kafka-input-topics", "-suite-min-history", "-retention", "-batch-commit-delay"},
			[]string{"-http-tokens", "-alert-rules", "-http-addr", "-batch-linger"}},
	} {
		var out, errOut bytes.Buffer
		if err := run(context.Background(), []string{c.cmd, "-h"}, func(string) string { return "" }, strings.NewReader(""), &out, &errOut); err != nil {
			t.Fatalf("%s -h: %v", c.cmd, err)
		}
		help := errOut.String() + out.String()
		for _, f := range c.has {
			if !strings.Contains(help, f+" ") && !strings.Contains(help, f+"\n") {
				t.Errorf("%s -h does not list %s", c.cmd, f)
			}
		}
		for _, f := range c.lacks {
			if strings.Contains(help, f+" ") || strings.Contains(help, f+"\n") {
				t.Errorf("%s -h lists %s, which it does not use", c.cmd, f)
			}
		}
	}
}
