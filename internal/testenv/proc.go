package testenv

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// OwnCPU is this process's user and system CPU time so far: a test's own work and its clients',
// not that of the servers it talks to (a child is not counted until it is waited for).
func OwnCPU(t testing.TB) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Proc is a process a test started, with its standard output and error kept together in memory,
// so that a failing test can show what the process said.
type Proc struct {
	// Name tells the process apart in a test's messages.
	Name   string
	cmd    *exec.Cmd
	out    syncBuffer
	exited chan struct{}
	err    error
}

// StartProc starts cmd (its Stdout and Stderr are set here) and returns its Proc.
func StartProc(name string, cmd *exec.Cmd) (*Proc, error) {
	p := &Proc{Name: name, cmd: cmd, exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = &p.out, &p.out
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() { p.err = cmd.Wait(); close(p.exited) }()
	return p, nil
}

// Pid is the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Signal sends sig to the process.
func (p *Proc) Signal(sig os.Signal) { p.cmd.Process.Signal(sig) }

// Kill stops the process for good (resuming it first, should a test have stopped it) and waits
// for its end; a process that has ended already is left as it is.
func (p *Proc) Kill() {
	select {
	case <-p.exited:
	default:
		p.cmd.Process.Signal(syscall.SIGCONT)
		p.cmd.Process.Kill()
		<-p.exited
	}
}

// Wait waits up to within for the process to end and returns its error (nil for exit 0) and
// whether it ended.
func (p *Proc) Wait(within time.Duration) (error, bool) {
	select {
	case <-p.exited:
		return p.err, true
	case <-time.After(within):
		return nil, false
	}
}

// Err is the process's exit error once it has ended (nil before, and for exit 0).
func (p *Proc) Err() error {
	select {
	case <-p.exited:
		return p.err
	default:
		return nil
	}
}

// Output returns everything the process wrote so far.
func (p *Proc) Output() []byte { return p.out.snapshot() }

// Tail returns the last n lines the process wrote.
func (p *Proc) Tail(n int) string {
	lines := strings.Split(strings.TrimSpace(string(p.Output())), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// syncBuffer is a bytes.Buffer safe for a process's stdout and stderr together.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) snapshot() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Clone(b.buf.Bytes())
}
