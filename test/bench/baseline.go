package main

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// binary is a repeatrate build the harness runs: the working tree's ("current") or the one to
// compare it with ("baseline").
type binary struct {
	name string
	path string
}

// buildCurrent builds the working tree's cmd/repeatrate into dir.
func buildCurrent(dir string) (binary, error) {
	b := binary{name: "current", path: filepath.Join(dir, "repeatrate")}
	if out, err := exec.Command("go", "build", "-o", b.path, "./cmd/repeatrate").CombinedOutput(); err != nil {
		return b, fmt.Errorf("build: %v: %s", err, out)
	}
	return b, nil
}

// baselineBinary resolves BENCH_BASELINE: the path of an existing repeatrate binary, or a git
// revision of this repository, exported with git archive (the working tree, index and worktree
// list are not touched) into dir and built there.
func baselineBinary(spec, dir string) (binary, error) {
	if st, err := os.Stat(spec); err == nil && !st.IsDir() {
		abs, err := filepath.Abs(spec)
		return binary{name: "baseline", path: abs}, err
	}
	out, err := exec.Command("git", "rev-parse", "--verify", "--short", spec+"^{commit}").Output()
	if err != nil {
		return binary{}, fmt.Errorf("BENCH_BASELINE %q is neither a file nor a git revision", spec)
	}
	rev := strings.TrimSpace(string(out))
	src := filepath.Join(dir, "baseline-src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		return binary{}, err
	}
	archive := exec.Command("git", "archive", "--format=tar", rev)
	untar := exec.Command("tar", "-x", "-C", src)
	pipe, err := archive.StdoutPipe()
	if err != nil {
		return binary{}, err
	}
	untar.Stdin = pipe
	if err := untar.Start(); err != nil {
		return binary{}, err
	}
	if err := archive.Run(); err != nil {
		return binary{}, fmt.Errorf("git archive %s: %w", rev, err)
	}
	if err := untar.Wait(); err != nil {
		return binary{}, fmt.Errorf("untar %s: %w", rev, err)
	}
	b := binary{name: "baseline", path: filepath.Join(dir, "repeatrate-baseline")}
	build := exec.Command("go", "build", "-o", b.path, "./cmd/repeatrate")
	build.Dir = src
	if out, err := build.CombinedOutput(); err != nil {
		return binary{}, fmt.Errorf("build baseline %s: %v: %s", rev, err, out)
	}
	logf("baseline: %s built from %s", spec, rev)
	return b, nil
}

// kafkaBrokerPID finds the Kafka broker's process, for its CPU time: BENCH_KAFKA_PID, else the pid
// file deploy/local/kafka.sh writes for the broker's port, else the process holding the listening
// socket of that port (found through /proc/net/tcp and the processes' file descriptors). It
// returns 0 when none is found (Kafka in a container, another user's process).
func kafkaBrokerPID(broker string) (int, string) {
	if v := os.Getenv("BENCH_KAFKA_PID"); v != "" {
		pid, _ := strconv.Atoi(v)
		return pid, "BENCH_KAFKA_PID"
	}
	_, port, err := net.SplitHostPort(broker)
	if err != nil {
		return 0, ""
	}
	pidfile := filepath.Join(".cache", "kafka", "node-"+port, "kafka.pid")
	if b, err := os.ReadFile(pidfile); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && cpuReadable(pid) {
			return pid, pidfile
		}
	}
	if pid := listenerPID(port); pid > 0 {
		return pid, "the listener of port " + port
	}
	return 0, ""
}

func cpuReadable(pid int) bool {
	_, err := os.Stat(fmt.Sprintf("/proc/%d/stat", pid))
	return err == nil
}

// listenerPID returns the process that owns the TCP socket listening on port, or 0.
func listenerPID(port string) int {
	p, err := strconv.Atoi(port)
	if err != nil {
		return 0
	}
	hexPort := fmt.Sprintf(":%04X", p)
	var inodes []string
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		fh, err := os.Open(f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			fs := strings.Fields(sc.Text())
			if len(fs) > 9 && strings.HasSuffix(fs[1], hexPort) && fs[3] == "0A" {
				inodes = append(inodes, "socket:["+fs[9]+"]")
			}
		}
		fh.Close()
	}
	if len(inodes) == 0 {
		return 0
	}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, dir := range procs {
		fds, _ := os.ReadDir(filepath.Join(dir, "fd"))
		for _, fd := range fds {
			link, err := os.Readlink(filepath.Join(dir, "fd", fd.Name()))
			if err != nil {
				continue
			}
			for _, in := range inodes {
				if link == in {
					pid, _ := strconv.Atoi(filepath.Base(dir))
					return pid
				}
			}
		}
	}
	return 0
}
