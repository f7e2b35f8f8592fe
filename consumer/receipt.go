package consumer

import (
	"sync"
	"time"
)

// ReceiptClock is the receipt time events are judged "from the future" against: the wall clock,
// but never behind the previous receipt time plus the time that has really passed since (the
// monotonic clock). A wall clock stepped back — an NTP correction, a resumed VM — would otherwise
// dead-letter, for good, every valid event newer than the stepped clock plus max_future_skew; a
// clock stepped forward is followed at once (that only lets more events through). The price: after
// a backward step the receipt time stays ahead of the wall clock by the step until the process
// restarts, which loosens the future check by that much and nothing else.
type ReceiptClock struct {
	wall    func() time.Time
	elapsed func() time.Duration // monotonic, from any fixed origin

	mu      sync.Mutex
	last    time.Time // the previous receipt time
	lastMon time.Duration
	set     bool
}

// NewReceiptClock returns the receipt clock of the process: time.Now's wall reading and its
// monotonic reading.
func NewReceiptClock() *ReceiptClock {
	origin := time.Now()
	return newReceiptClock(func() time.Time { return time.Now().Round(0) }, func() time.Duration { return time.Since(origin) })
}

func newReceiptClock(wall func() time.Time, elapsed func() time.Duration) *ReceiptClock {
	return &ReceiptClock{wall: wall, elapsed: elapsed}
}

// Now returns the receipt time. Safe for concurrent use.
func (c *ReceiptClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	now, mon := c.wall(), c.elapsed()
	if c.set {
		if steady := c.last.Add(mon - c.lastMon); steady.After(now) {
			now = steady
		}
	}
	c.last, c.lastMon, c.set = now, mon, true
	return now
}
