package main

import (
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"golang.org/x/exp/trace"
)

// traceRoles names the goroutines traceStates reports by a frame of their stack when they block:
// the one that applies batches to Redis (the pipeline's critical path: Redis waits while it does
// anything but wait for Redis) and the one that collects and decodes them.
var traceRoles = []struct{ role, frame string }{
	{"apply", "aggregator.(*Redis).ApplyEncodedWith"},
	{"collect", "consumer.(*Group).collect"},
}

// traceStates reads an execution trace of the processor (BENCH_PPROF_KIND=trace) and returns, for
// each goroutine of traceRoles, the share of the trace it spent running, runnable (waiting for a
// P), waiting for the network and waiting otherwise (channels, timers): where the apply stage's
// time goes besides Redis.
func traceStates(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	r, err := trace.NewReader(f)
	if err != nil {
		return "", err
	}
	type g struct {
		role   string
		state  trace.GoState
		reason string
		since  trace.Time
		shares map[string]time.Duration
		at     string                   // where it waits now: the innermost frame of ours
		waits  map[string]time.Duration // time waiting (network or otherwise) by where
	}
	gs := map[trace.GoID]*g{}
	var first, last trace.Time
	for {
		ev, err := r.ReadEvent()
		if err == io.EOF {
			break
		}
		if err != nil {
			return "", err
		}
		if first == 0 {
			first = ev.Time()
		}
		last = ev.Time()
		if ev.Kind() != trace.EventStateTransition {
			continue
		}
		st := ev.StateTransition()
		if st.Resource.Kind != trace.ResourceGoroutine {
			continue
		}
		from, to := st.Goroutine()
		x := gs[st.Resource.Goroutine()]
		if x == nil {
			x = &g{state: from, since: ev.Time(), shares: map[string]time.Duration{}, waits: map[string]time.Duration{}}
			gs[st.Resource.Goroutine()] = x
		}
		x.shares[stateName(x.state, x.reason)] += ev.Time().Sub(x.since)
		if x.state == trace.GoWaiting {
			x.waits[stateName(x.state, x.reason)+" in "+x.at] += ev.Time().Sub(x.since)
		}
		x.state, x.reason, x.since = to, st.Reason, ev.Time()
		if to == trace.GoWaiting {
			x.at = waitSite(ev.Stack())
		}
		if to == trace.GoWaiting && x.role == "" {
			for fr := range ev.Stack().Frames() {
				for _, tr := range traceRoles {
					if strings.HasSuffix(fr.Func, tr.frame) {
						x.role = tr.role
					}
				}
			}
		}
	}
	span := last.Sub(first)
	if span <= 0 {
		return "", fmt.Errorf("empty trace")
	}
	var out []string
	for _, tr := range traceRoles {
		for _, x := range gs {
			if x.role != tr.role {
				continue
			}
			x.shares[stateName(x.state, x.reason)] += last.Sub(x.since)
			share := func(s string) float64 { return x.shares[s].Seconds() / span.Seconds() }
			out = append(out, fmt.Sprintf("%s: running %.3f, runnable %.3f, waiting for the network %.3f, waiting otherwise %.3f (%s)",
				tr.role, share("running"), share("runnable"), share("network"), share("waiting"), topWaits(x.waits, span)))
			break
		}
	}
	return strings.Join(out, "; "), nil
}

// waitSite names where a goroutine blocks: the innermost frame outside the runtime and the
// standard library's synchronisation (the select, lock or read of ours that waits).
func waitSite(st trace.Stack) string {
	for fr := range st.Frames() {
		f := fr.Func
		if strings.HasPrefix(f, "runtime.") || strings.HasPrefix(f, "internal/") || strings.HasPrefix(f, "sync.") ||
			strings.HasPrefix(f, "time.") || strings.HasPrefix(f, "net.") || strings.HasPrefix(f, "bufio.") ||
			strings.HasPrefix(f, "syscall.") || strings.HasPrefix(f, "os.") {
			continue
		}
		if i := strings.LastIndex(f, "/"); i >= 0 {
			f = f[i+1:]
		}
		return f
	}
	return "?"
}

// topWaits lists the four longest of a goroutine's waits by where, as shares of span.
func topWaits(waits map[string]time.Duration, span time.Duration) string {
	type w struct {
		at string
		d  time.Duration
	}
	var ws []w
	for at, d := range waits {
		ws = append(ws, w{at, d})
	}
	sort.Slice(ws, func(i, j int) bool { return ws[i].d > ws[j].d })
	var out []string
	for i := 0; i < len(ws) && i < 4; i++ {
		out = append(out, fmt.Sprintf("%s %.3f", ws[i].at, ws[i].d.Seconds()/span.Seconds()))
	}
	return strings.Join(out, ", ")
}

// stateName groups a goroutine state as traceStates reports it.
func stateName(s trace.GoState, reason string) string {
	switch s {
	case trace.GoRunning, trace.GoSyscall:
		return "running"
	case trace.GoRunnable:
		return "runnable"
	case trace.GoWaiting:
		if reason == "network" {
			return "network"
		}
		return "waiting"
	}
	return "other"
}
