package main

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// A start that waits for a group coordinator says so: awaitCoordinator asks again while the answer
// is a temporary Kafka error, warning with the group, the time waited and the error, and returns
// the first answer that is not; a group that never committed is an answer; ctx ends the wait.
func TestWaitingForTheGroupCoordinatorIsLogged(t *testing.T) {
	t.Run("temporary errors, then an answer", func(t *testing.T) {
		core, logs := observer.New(zapcore.WarnLevel)
		calls := 0
		want := &kafka.OffsetFetchResponse{}
		got, err := awaitCoordinator(t.Context(), zap.New(core), "g1", time.Nanosecond, func() (*kafka.OffsetFetchResponse, error) {
			if calls++; calls <= 3 {
				return nil, kafka.GroupCoordinatorNotAvailable
			}
			return want, nil
		})
		if err != nil || got != want || calls != 4 {
			t.Fatalf("got %v, %v after %d calls; want the fourth call's answer", got, err, calls)
		}
		if logs.Len() != 3 {
			t.Fatalf("%d warnings for 3 temporary errors: %v", logs.Len(), logs.All())
		}
		for _, e := range logs.All() {
			f := e.ContextMap()
			if f["group"] != "g1" || f["error"] == nil || f["waited"] == nil {
				t.Fatalf("warning without the group, the error or the time waited: %v", f)
			}
		}
	})
	t.Run("warnings spaced", func(t *testing.T) {
		core, logs := observer.New(zapcore.WarnLevel)
		calls := 0
		awaitCoordinator(t.Context(), zap.New(core), "g2", time.Hour, func() (*kafka.OffsetFetchResponse, error) {
			if calls++; calls <= 2 {
				return nil, kafka.NotCoordinatorForGroup
			}
			return &kafka.OffsetFetchResponse{}, nil
		})
		if logs.Len() != 0 {
			t.Fatalf("%d warnings within the first hour of waiting", logs.Len())
		}
	})
	t.Run("warnings spaced once the backoff is at its cap", func(t *testing.T) {
		// Past 2 s the backoff asks every 2 s; a spacing of 2.5 s then skips every other ask,
		// which only the warning's own clock does (the first warning comes at about 3.1 s, the
		// second at about 7.1).
		core, logs := observer.New(zapcore.WarnLevel)
		const every = 2500 * time.Millisecond
		calls := 0
		awaitCoordinator(t.Context(), zap.New(core), "g5", every, func() (*kafka.OffsetFetchResponse, error) {
			if calls++; logs.Len() < 2 && calls < 20 {
				return nil, kafka.GroupCoordinatorNotAvailable
			}
			return &kafka.OffsetFetchResponse{}, nil
		})
		if logs.Len() != 2 {
			t.Fatalf("%d warnings in %d asks, want 2", logs.Len(), calls)
		}
		var last time.Duration
		for i, e := range logs.All() {
			waited, _ := e.ContextMap()["waited"].(time.Duration)
			if i > 0 && waited-last < every {
				t.Fatalf("warnings at %v and %v waited: less than %v apart", last, waited, every)
			}
			last = waited
		}
	})
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"a group that never committed", kafka.GroupIdNotFound},
		{"an error that is not temporary", kafka.GroupAuthorizationFailed},
		{"an error that is not Kafka's", errors.New("connection refused")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			_, err := awaitCoordinator(t.Context(), nil, "g3", time.Nanosecond, func() (*kafka.OffsetFetchResponse, error) {
				calls++
				return nil, tc.err
			})
			if !errors.Is(err, tc.err) || calls != 1 {
				t.Fatalf("%v after %d calls, want %v at once", err, calls, tc.err)
			}
		})
	}
	t.Run("cancelled while waiting", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		_, err := awaitCoordinator(ctx, nil, "g4", time.Hour, func() (*kafka.OffsetFetchResponse, error) {
			cancel()
			return nil, kafka.GroupLoadInProgress
		})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("%v, want the context's error", err)
		}
	})
}
