package aggregator

import (
	"context"
	"errors"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/repeatrate/repeatrate/internal/testenv"
)

// A pipeline whose reply was lost is sent again by the client: its token write then replaces the
// token it wrote itself the first time. That is no loss; a token nobody held still is.
func TestPendingTokenWrittenTwiceIsNoLoss(t *testing.T) {
	client := testenv.Redis(t)
	ctx := context.Background()
	prefix := testenv.Name(t, "pending")
	testenv.CleanPrefix(t, client, prefix)
	pend := NewPending()
	run := func(before func(next string)) error {
		var done func() error
		_, err := client.Pipelined(ctx, func(p redis.Pipeliner) error {
			if before != nil {
				before("2") // the token the second pipeline writes
			}
			done = pend.Append(ctx, client, p, prefix, nil)
			return nil
		})
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatal(err)
		}
		if err := done(); err != nil {
			t.Fatal(err)
		}
		return pend.check(marksTag, client.Get(ctx, pend.key(prefix, marksTag)).Val())
	}
	if err := run(nil); err != nil {
		t.Fatalf("first pipeline: %v", err)
	}
	// The same write already ran once (its reply lost): no loss.
	if err := run(func(next string) { client.Set(ctx, pend.key(prefix, marksTag), next, 0) }); err != nil {
		t.Fatalf("pipeline sent again after a lost reply: %v, want no loss", err)
	}
	// A token this process never wrote: writes were lost.
	if err := run(func(string) { client.Set(ctx, pend.key(prefix, marksTag), "1", 0) }); !errors.Is(err, ErrWritesLost) {
		t.Fatalf("token replaced from an older write: %v, want ErrWritesLost", err)
	}
}
