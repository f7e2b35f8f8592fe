package suite

import "time"

// t0 is the tests' reference time.
var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
