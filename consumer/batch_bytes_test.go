package consumer

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/repeatrate/repeatrate/aggregator"
)

// MaxBatchBytes bounds a batch's memory, so a message's headers count as well as its key and
// value: messages whose bulk is in their headers (a poison producer's, say, up to the broker's
// message limit each) must not gather 16 000 to a batch.
func TestBatchBytesCountHeaders(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := &trace{}
		store := &gateStore{tr: tr, model: aggregator.NewModel(30 * 24 * time.Hour)}
		r := newPipelineRig(t, 1, store, &gatePublisher{tr: tr})
		var msgs []kafka.Message
		junk := strings.Repeat("x", 4000)
		for i := range 5 {
			m := liveMessage(int64(i), fmt.Sprint("o", i), "passed")
			m.Headers = append(m.Headers, kafka.Header{Key: "x-junk", Value: []byte(junk)})
			msgs = append(msgs, m)
		}
		r.group.cfg.MaxBatch, r.group.cfg.Linger = 100, time.Hour
		r.group.cfg.MaxBatchBytes = len(msgs[0].Value) + len("x-junk") + len(junk) + 1 // reached by the second message
		ctx, cancel := context.WithCancel(t.Context())
		done := r.run(ctx, msgs)
		if !within(tr.seen("commit 4"), 10*time.Minute) {
			t.Fatalf("batches of two not committed: %s", tr)
		}
		cancel()
		<-done
		for _, first := range []int{0, 2} {
			if tr.index(fmt.Sprint("prepared ", first)) < 0 {
				t.Errorf("no batch began at offset %d: %s", first, tr)
			}
		}
		if tr.index("prepared 1") >= 0 || tr.index("prepared 3") >= 0 {
			t.Errorf("a batch began inside a pair: %s", tr)
		}
	})
}
