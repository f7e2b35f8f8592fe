package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
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
		{"run -h", []string{"run", "-h"}, true, "-kafka-brokers"},
		{"dev --help", []string{"dev", "--help"}, true, "-demo"},
		{"rebuild --help", []string{"rebuild", "--help"}, true, "-kafka-brokers"},
		{"replay --help", []string{"replay", "--help"}, true, "-in"},
		{"produce --help", []string{"produce", "--help"}, true, "-topic"},
		{"tail --help", []string{"tail", "--help"}, true, "-topic"},
		// Mistakes are errors that say what was wrong.
		{"no command", nil, false, "no command"},
		{"unknown command", []string{"bogus"}, false, `unknown command "bogus"`},
		{"unknown flag", []string{"replay", "--nope"}, false, "flag provided but not defined: -nope"},
		{"bad flag value", []string{"tail", "--idle", "soon"}, false, "invalid value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			err := run(ctx, tc.args, noenv, strings.NewReader(""), &out, &errOut)
			if (err == nil) != tc.ok {
				t.Fatalf("err = %v, want ok %v", err, tc.ok)
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
	bin := filepath.Join(t.TempDir(), "repeatrate")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "dev", "--demo", "--kafka-addr=127.0.0.1:0", "--redis-addr=127.0.0.1:0", "--http-addr=127.0.0.1:0")
	var out lockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	// Wait until the demo prints a snapshot line, then interrupt it as Ctrl-C does.
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(out.String(), " v") && time.Now().Before(deadline) {
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
