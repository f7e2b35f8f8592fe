package consumer

import (
	"context"
	"errors"
	"time"

	"github.com/segmentio/kafka-go"
)

// LeaderMoves and LeaderWait bound how long a read waits out a partition leader or a group
// coordinator that is moving (a topic just made, a broker restarting), which Kafka answers with a
// temporary error such as Not Leader For Partition: 40 tries 250 ms apart, about 10 s, longer than
// the 6 s within which kafka-go's client refreshes the cluster's layout it keeps.
const (
	LeaderMoves = 40
	LeaderWait  = 250 * time.Millisecond
)

// Temporary reports whether err is a temporary Kafka error (kafka.Error's Temporary: a leader or
// a group coordinator moving, still loading or not there yet), one worth asking again.
func Temporary(err error) bool {
	var ke kafka.Error
	return errors.As(err, &ke) && ke.Temporary()
}

// RetryTemporary returns what do returns once it succeeds or fails with an error that is not a
// temporary Kafka error (kafka.Error's Temporary: a leader or a group coordinator moving or still
// loading), trying at most tries times, wait apart; ctx ends the waiting.
func RetryTemporary[T any](ctx context.Context, tries int, wait time.Duration, do func() (T, error)) (T, error) {
	for try := 1; ; try++ {
		v, err := do()
		if err == nil || try >= tries || !Temporary(err) {
			return v, err
		}
		select {
		case <-ctx.Done():
			return v, err
		case <-time.After(wait):
		}
	}
}
