package consumer

import "testing"

func TestIdleReadTimeoutIsNotAWarning(t *testing.T) {
	for _, tc := range []struct {
		detail string
		idle   bool
	}{
		// kafka-go's words when a long-poll fetch on a quiet partition times out (kfake does this).
		{"the kafka reader got an unknown error reading partition 1 of telemetry.live-attempts at offset 42: read tcp 127.0.0.1:50012->127.0.0.1:9092: i/o timeout", true},
		// A real problem stays a warning.
		{"the kafka reader got an unknown error reading partition 1 of t at offset 3: EOF", false},
		{"failed to dial: dial tcp 127.0.0.1:9092: i/o timeout", false},
	} {
		if got := idleReadTimeout(tc.detail); got != tc.idle {
			t.Errorf("%q: idle %v, want %v", tc.detail, got, tc.idle)
		}
	}
}
