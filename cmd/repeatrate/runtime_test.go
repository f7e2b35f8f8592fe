package main

import (
	"runtime"
	"runtime/debug"
	"testing"
)

// The runtime defaults apply only where nothing else decided: at least minGOMAXPROCS Ps where the
// runtime chose one per CPU (a machine of fewer cores gets more Ps than cores), none added where a
// CPU limit chose fewer Ps than CPUs, GOGC defaultGOGC; an explicit GOMAXPROCS or GOGC is left to
// the runtime, which has already read it.
func TestTuneRuntime(t *testing.T) {
	procs, gc := runtime.GOMAXPROCS(0), debug.SetGCPercent(100)
	t.Cleanup(func() { runtime.GOMAXPROCS(procs); debug.SetGCPercent(gc) })
	unset := func(string) string { return "" }

	runtime.GOMAXPROCS(2)
	debug.SetGCPercent(100)
	tuneRuntime(unset, 2)
	if got := runtime.GOMAXPROCS(0); got != minGOMAXPROCS {
		t.Errorf("2 CPUs, GOMAXPROCS unset: %d Ps, want %d", got, minGOMAXPROCS)
	}
	if got := debug.SetGCPercent(100); got != defaultGOGC {
		t.Errorf("GOGC unset: GC percent %d, want %d", got, defaultGOGC)
	}

	runtime.GOMAXPROCS(2)
	tuneRuntime(unset, 8)
	if got := runtime.GOMAXPROCS(0); got != 2 {
		t.Errorf("2 Ps on 8 CPUs (a CPU limit): %d Ps, want 2 kept", got)
	}

	runtime.GOMAXPROCS(minGOMAXPROCS + 3)
	tuneRuntime(unset, minGOMAXPROCS+3)
	if got := runtime.GOMAXPROCS(0); got != minGOMAXPROCS+3 {
		t.Errorf("more Ps than the minimum: %d, want %d kept", got, minGOMAXPROCS+3)
	}

	runtime.GOMAXPROCS(1)
	debug.SetGCPercent(100)
	set := map[string]string{"GOMAXPROCS": "1", "GOGC": "100"}
	tuneRuntime(func(k string) string { return set[k] }, 1)
	if got := runtime.GOMAXPROCS(0); got != 1 {
		t.Errorf("GOMAXPROCS=1 set: %d Ps, want 1", got)
	}
	if got := debug.SetGCPercent(100); got != 100 {
		t.Errorf("GOGC=100 set: GC percent %d, want 100", got)
	}
}
