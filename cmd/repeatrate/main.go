// Command repeatrate is the repeat-rate stream processor and its tools: run (the processor), dev
// (everything in one process on embedded Kafka and Redis), replay (the same aggregation offline),
// produce and tail (NDJSON in and out of a topic), loadgen (synthetic traffic at a rate).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"syscall"
)

// defaultGOGC is the garbage collector's target when GOGC is not set. The processor's heap is
// small (tens of MB) and its garbage is per-batch; collecting at 4× the live heap instead of 2×
// cut its CPU per event by about a quarter for about 30 MB more peak RSS (BENCHMARKS.md).
const defaultGOGC = 400

// minGOMAXPROCS is the fewest Ps the process runs with when GOMAXPROCS is not set and no CPU
// limit lowered it. The apply stage's goroutine is the pipeline's critical path: Redis waits while
// it is not running. On a machine whose cores the processor shares with Redis and Kafka, a P whose
// thread the OS has descheduled holds up every goroutine queued on it; with two Ps on two cores
// the apply goroutine waited for one 0.13–0.21 of the time, with four 0.03–0.07, the OS's
// scheduler taking over (BENCHMARKS.md).
const minGOMAXPROCS = 4

// tuneRuntime sets the garbage collector's target and the number of Ps to the processor's
// defaults, each unless its environment variable (GOGC, GOMAXPROCS) says otherwise. The Ps are
// raised only where the runtime chose one per CPU (cpus: the CPUs the process may use): below
// that, a container's CPU limit chose them, and more Ps than the quota would only be throttled.
func tuneRuntime(getenv func(string) string, cpus int) {
	if getenv("GOGC") == "" {
		debug.SetGCPercent(defaultGOGC)
	}
	if procs := runtime.GOMAXPROCS(0); getenv("GOMAXPROCS") == "" && procs >= cpus && procs < minGOMAXPROCS {
		runtime.GOMAXPROCS(minGOMAXPROCS)
	}
}

func main() {
	tuneRuntime(os.Getenv, runtime.NumCPU())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdin, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "repeatrate:", err)
		os.Exit(1)
	}
}

const usage = `usage: repeatrate <command> [flags]

commands:
  run      the processor: Kafka in, Redis state, snapshots and dead letters out
  dev      everything in one process on an embedded Kafka and Redis (--demo feeds traffic)
  alert    the alerting rules alone, as a subscriber of the snapshot topics (run includes them)
  rebuild  recompute lost Redis state from the input topics into a fresh namespace and cut over
  migrate  move the Redis state from layout 10 to 11 while the processors run
  replay   the same aggregation offline over NDJSON CloudEvents
  produce  publish NDJSON CloudEvents to a topic
  import   turn Inspect AI or OpenCompass result files into eval-result events
  loadgen  publish synthetic telemetry at a steady rate, with the demo's mix
  tail     print a topic as NDJSON until it is idle

"repeatrate <command> -h" lists a command's flags; "repeatrate --version" prints the version.`

// commit is the commit the binary was built from when the build says so (`make build` sets it
// with -ldflags "-X main.commit=…", for toolchains run with -buildvcs=false).
var commit string

// version is the module's version and the commit it was built from, as the Go toolchain recorded
// them (or commit): "repeatrate (devel) 0f5e910a1b2c go1.26.8" from a checkout, the tag from
// `go install …@v1.2.3`.
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "repeatrate (unknown version)"
	}
	out := "repeatrate " + bi.Main.Version
	var rev, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = " (modified)"
			}
		}
	}
	if rev == "" {
		rev = commit
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if rev != "" {
		out += " " + rev + dirty
	}
	return out + " " + runtime.Version()
}

// run dispatches a subcommand. It is main without the process: tests call it directly.
func run(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprintln(stderr, usage)
		return fmt.Errorf("no command")
	}
	cmd, rest := args[0], args[1:]
	err := dispatch(ctx, cmd, rest, getenv, stdin, stdout, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil // -h: the flag set printed the command's usage; asking for it is no error
	}
	return err
}

// dispatch runs the subcommand cmd with its arguments.
func dispatch(ctx context.Context, cmd string, rest []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) error {
	switch cmd {
	case "run":
		return runCommand(ctx, rest, getenv, stderr)
	case "dev":
		return devCommand(ctx, rest, stdout, stderr)
	case "rebuild":
		return rebuildCommand(ctx, rest, getenv, stderr)
	case "migrate":
		return migrateCommand(ctx, rest, getenv, stderr)
	case "alert":
		return alertCommand(ctx, rest, getenv, stderr)
	case "replay":
		return replayCommand(ctx, rest, stdin, stdout, stderr)
	case "produce":
		return produceCommand(ctx, rest, stdin, stderr)
	case "import":
		return importCommand(ctx, rest, stdout, stderr)
	case "loadgen":
		return loadgenCommand(ctx, rest, stderr)
	case "tail":
		return tailCommand(ctx, rest, stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprintln(stdout, usage)
		return nil
	case "version", "--version", "-version":
		fmt.Fprintln(stdout, version())
		return nil
	}
	fmt.Fprintln(stderr, usage)
	return fmt.Errorf("unknown command %q", cmd)
}

// newFlagSet returns a command's flag set. Asked for help (-h), it prints the command's flags to
// stderr; on a mistake it prints nothing, and the error comes back from Parse for main to print
// once, on one line, instead of the flag package's message followed by every flag.
func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	out := &flagErrors{}
	fs.SetOutput(out)
	fs.Usage = func() {
		if out.wrote {
			return // a parse error: its message was swallowed, Parse returns it
		}
		fs.SetOutput(stderr)
		defer fs.SetOutput(out)
		fmt.Fprintf(stderr, "usage: repeatrate %s [flags]\n\n", name)
		fs.PrintDefaults()
	}
	return fs
}

// flagErrors swallows what the flag package writes before calling Usage on a parse error.
type flagErrors struct{ wrote bool }

func (o *flagErrors) Write(p []byte) (int, error) {
	o.wrote = true
	return len(p), nil
}
