package quota

import (
	"fmt"
	"testing"
	"time"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time            { return c.t }
func (c *clock) advance(d time.Duration)   { c.t = c.t.Add(d) }
func newClock() *clock                     { return &clock{t: time.Unix(1_700_000_000, 0)} }
func admitted(b *Buckets, key string) bool { ok, _ := b.Admit(key); return ok }

// A key spends its burst, runs into debt by the last piece of work, and is refused until the debt
// is paid off at the refill rate: the wait it is told is exactly that long.
func TestDebtIsPaidOffAtTheRate(t *testing.T) {
	c := newClock()
	b := New(100, 1000, 10, c.now)
	b.Charge("a", 900)
	if !admitted(b, "a") {
		t.Fatal("a key with budget left was refused")
	}
	b.Charge("a", 400) // 300 in debt
	ok, wait := b.Admit("a")
	if ok || wait < 3*time.Second || wait > 3*time.Second+2*time.Millisecond {
		t.Fatalf("in debt by 300 at 100/s: admitted %v, wait %v; want refused for 3s", ok, wait)
	}
	c.advance(wait - 10*time.Millisecond)
	if admitted(b, "a") {
		t.Fatal("admitted before the debt was paid off")
	}
	c.advance(10 * time.Millisecond)
	if !admitted(b, "a") {
		t.Fatalf("refused after the wait it was told (level %v)", b.Level("a"))
	}
	if !admitted(b, "b") {
		t.Fatal("another key pays for a's debt")
	}
	c.advance(time.Hour)
	if l := b.Level("a"); l != 1000 {
		t.Fatalf("a budget refills to its burst, not past it: %v", l)
	}
}

// AdmitAll admits only when every key may start, and waits for the slowest.
func TestAdmitAllWaitsForTheSlowest(t *testing.T) {
	c := newClock()
	b := New(10, 10, 10, c.now)
	b.Charge("x", 20) // 1 s
	b.Charge("y", 40) // 3 s
	ok, wait := b.AdmitAll([]string{"z", "x", "y"})
	if ok || wait < 3*time.Second || wait > 3*time.Second+2*time.Millisecond {
		t.Fatalf("admitted %v, wait %v; want refused for 3 s", ok, wait)
	}
	if ok, _ := b.AdmitAll([]string{"z"}); !ok {
		t.Fatal("a key with its budget was refused")
	}
}

// The keys kept are bounded: keys whose budget is full are forgotten to make room, and while every
// kept key is still paying, a new one is refused rather than kept.
func TestKeysAreBounded(t *testing.T) {
	c := newClock()
	b := New(1, 5, 3, c.now)
	for i := range 3 {
		b.Charge(fmt.Sprint(i), 10)
	}
	if admitted(b, "new") {
		t.Fatal("a fourth key was kept beside three paying ones")
	}
	if len(b.keys) != 3 {
		t.Fatalf("%d keys kept, bound 3", len(b.keys))
	}
	c.advance(10 * time.Second) // every debt paid and the budgets full again
	if !admitted(b, "new") {
		t.Fatal("a new key was refused though every kept one was full again")
	}
	if len(b.keys) != 1 {
		t.Fatalf("full budgets kept: %d keys", len(b.keys))
	}
}

// A clock that steps back neither refills nor drains a budget.
func TestClockSteppingBackChangesNothing(t *testing.T) {
	c := newClock()
	b := New(10, 100, 10, c.now)
	b.Charge("a", 150)
	before := b.Level("a")
	c.advance(-time.Hour)
	if l := b.Level("a"); l != before {
		t.Fatalf("level %v after the clock stepped back, was %v", l, before)
	}
}

// Take charges every key or none: while one is in debt nothing is charged, and a give-back
// (a negative charge) never lifts a budget past its burst.
func TestTakeChargesAllOrNothing(t *testing.T) {
	c := newClock()
	b := New(10, 100, 10, c.now)
	if ok, _ := b.Take(map[string]float64{"a": 150, "b": 30}); !ok {
		t.Fatal("two keys with their budgets were refused")
	}
	if ok, wait := b.Take(map[string]float64{"a": 1, "b": 1}); ok || wait < 5*time.Second {
		t.Fatalf("a key 50 in debt at 10/s: admitted %v, wait %v", ok, wait)
	}
	if l := b.Level("b"); l != 70 {
		t.Fatalf("b charged by a refused take: level %v, want 70", l)
	}
	b.Charge("b", -500)
	if l := b.Level("b"); l != 100 {
		t.Fatalf("a give-back lifted b to %v, past its burst of 100", l)
	}
}
