package main

import (
	"runtime"
	"runtime/debug"
	"testing"
)

// The runtime defaults apply only where the environment sets nothing: at least minGOMAXPROCS Ps
// (a machine of fewer cores gets more Ps than cores), GOGC defaultGOGC; an explicit GOMAXPROCS or
// GOGC is left to the runtime, which has already read it.
func TestTuneRuntime(t *testing.T) {
	procs, gc := runtime.GOMAXPROCS(0), debug.SetGCPercent(100)
	t.Cleanup(func() { runtime.GOMAXPROCS(procs); debug.SetGCPercent(gc) })

	runtime.GOMAXPROCS(1)
	debug.SetGCPercent(100)
	tuneRuntime(func(string) string { return "" })
	if got := runtime.GOMAXPROCS(0); got < minGOMAXPROCS {
		t.Errorf("GOMAXPROCS unset: %d Ps, want at least %d", got, minGOMAXPROCS)
	}
	if got := debug.SetGCPercent(100); got != defaultGOGC {
		t.Errorf("GOGC unset: GC percent %d, want %d", got, defaultGOGC)
	}

	runtime.GOMAXPROCS(minGOMAXPROCS + 3)
	tuneRuntime(func(string) string { return "" })
	if got := runtime.GOMAXPROCS(0); got != minGOMAXPROCS+3 {
		t.Errorf("more Ps than the minimum: %d, want %d kept", got, minGOMAXPROCS+3)
	}

	runtime.GOMAXPROCS(1)
	debug.SetGCPercent(100)
	set := map[string]string{"GOMAXPROCS": "1", "GOGC": "100"}
	tuneRuntime(func(k string) string { return set[k] })
	if got := runtime.GOMAXPROCS(0); got != 1 {
		t.Errorf("GOMAXPROCS=1 set: %d Ps, want 1", got)
	}
	if got := debug.SetGCPercent(100); got != 100 {
		t.Errorf("GOGC=100 set: GC percent %d, want 100", got)
	}
}
