package consumer

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

// A partition whose leader is moving (a dead-letter topic just made, a broker restarting) answers
// with a temporary error for a moment: the dead-letter log asks again rather than failing the
// batch or the rebuild that reads it, and gives up on anything else at once.
func TestDeadLetterReadsWaitOutAMovingLeader(t *testing.T) {
	ctx := context.Background()
	// calls returns a do that fails with errs in turn, then returns 42, and counts its calls.
	calls := func(errs ...error) (func() (int, error), *int) {
		n := 0
		return func() (int, error) {
			n++
			if n <= len(errs) {
				return 0, errs[n-1]
			}
			return 42, nil
		}, &n
	}

	t.Run("temporary errors, then an answer", func(t *testing.T) {
		do, n := calls(kafka.NotLeaderForPartition, kafka.LeaderNotAvailable, kafka.NotLeaderForPartition)
		v, err := retryTemporary(ctx, 20, time.Millisecond, do)
		if err != nil || v != 42 || *n != 4 {
			t.Fatalf("got %d, %v after %d calls; want 42 after 4", v, err, *n)
		}
	})
	t.Run("an error that is not temporary, at once", func(t *testing.T) {
		for _, e := range []error{kafka.TopicAuthorizationFailed, io.ErrUnexpectedEOF} {
			do, n := calls(e, kafka.NotLeaderForPartition)
			if _, err := retryTemporary(ctx, 20, time.Millisecond, do); !errors.Is(err, e) || *n != 1 {
				t.Fatalf("%v: got %v after %d calls; want it after 1", e, err, *n)
			}
		}
	})
	t.Run("a leader that does not come, after the tries", func(t *testing.T) {
		errs := make([]error, 50)
		for i := range errs {
			errs[i] = kafka.NotLeaderForPartition
		}
		do, n := calls(errs...)
		if _, err := retryTemporary(ctx, 20, time.Millisecond, do); !errors.Is(err, kafka.NotLeaderForPartition) || *n != 20 {
			t.Fatalf("got %v after %d calls; want Not Leader For Partition after 20", err, *n)
		}
	})
	t.Run("a context that ends, without waiting the tries out", func(t *testing.T) {
		ctx, cancel := context.WithCancel(ctx)
		cancel()
		do, n := calls(kafka.NotLeaderForPartition, kafka.NotLeaderForPartition)
		if _, err := retryTemporary(ctx, 20, time.Hour, do); !errors.Is(err, kafka.NotLeaderForPartition) || *n != 1 {
			t.Fatalf("got %v after %d calls; want the error after 1, at once", err, *n)
		}
	})
}
