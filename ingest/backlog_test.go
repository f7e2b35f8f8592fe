package ingest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/repeatrate/repeatrate/sink"
)

// hungWriter is a Kafka writer whose broker hangs, as kafka-go behaves then: a write ignores its
// context (kafka-go keeps a cancelled write queued and sends it later) and finishes, written, only
// once the broker resumes.
type hungWriter struct {
	resume chan struct{}
	mu     sync.Mutex
	got    int // messages handed to the writer
	done   int // messages written
}

func (w *hungWriter) WriteMessages(_ context.Context, msgs ...kafka.Message) error {
	w.mu.Lock()
	w.got += len(msgs)
	w.mu.Unlock()
	<-w.resume
	w.mu.Lock()
	w.done += len(msgs)
	w.mu.Unlock()
	return nil
}

func (w *hungWriter) counts() (got, done int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.got, w.done
}

// With the broker hung, no event is answered "failed" (each may yet be written: it is "unknown"),
// the bytes handed to the writer stay within the in-flight budget (a request past it is answered
// 503 at once, nothing of it sent), Retry-After grows with the backlog, and the handler reports
// its backlog for /readyz until the writes finish.
func TestHungBrokerAnswersUnknownWithinTheBudget(t *testing.T) {
	w := &hungWriter{resume: make(chan struct{})}
	const perRequest = 4
	body := func(r int) []byte {
		var evs []any
		for i := range perRequest {
			evs = append(evs, live(fmt.Sprintf("r%d-e%d", r, i), "acme"))
		}
		return mustJSON(evs)
	}
	// One request's records fit the budget twice, not three times.
	h := newHandler(t, w, Config{WriteTimeout: 20 * time.Millisecond, MaxInFlightBytes: 2*recordBytes(t, body(0)) + 1})
	statuses := map[string]int{}
	var codes []int
	for r := range 6 {
		rec := post(h, request{token: tokenAcme, ctype: ceBatch, body: body(r)})
		codes = append(codes, rec.Code)
		if rec.Code != http.StatusServiceUnavailable {
			t.Fatalf("request %d with the broker hung: %d %s", r, rec.Code, rec.Body)
		}
		if ra, err := strconv.Atoi(rec.Header().Get("Retry-After")); err != nil || ra < 1 {
			t.Fatalf("request %d: Retry-After %q", r, rec.Header().Get("Retry-After"))
		}
		var ans Answer
		json.Unmarshal(rec.Body.Bytes(), &ans)
		for _, e := range ans.Events {
			statuses[e.Status]++
		}
	}
	if statuses[StatusFailed] != 0 || statuses[StatusAccepted] != 0 {
		t.Errorf("answers with the broker hung: %v; no event may be failed (it may yet be written) or accepted", statuses)
	}
	if statuses[StatusUnknown] != 2*perRequest || statuses[StatusNotWritten] != 4*perRequest {
		t.Errorf("answers %v: want the 2 requests within the budget unknown, the 4 past it not_written", statuses)
	}
	if got, _ := w.counts(); got != 2*perRequest {
		t.Errorf("%d messages handed to the hung writer, want only the budget's %d", got, 2*perRequest)
	}
	if err := h.Backlog(); err == nil {
		t.Error("no backlog reported while writes outlive their requests")
	}
	close(w.resume)
	if err := h.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, done := w.counts(); done != 2*perRequest {
		t.Errorf("%d messages written once the broker resumed, want %d: exactly those answered unknown", done, 2*perRequest)
	}
	if err := h.Backlog(); err != nil {
		t.Errorf("backlog after every write finished: %v", err)
	}
	// The budget is free again: the next request is written.
	w2 := &fakeWriter{}
	h.w = w2
	if rec := post(h, request{token: tokenAcme, ctype: ceBatch, body: body(9)}); rec.Code != http.StatusAccepted {
		t.Fatalf("after the backlog cleared: %d %s", rec.Code, rec.Body)
	}
}

// recordBytes is what one request's events weigh against the budget.
func recordBytes(t *testing.T, body []byte) int64 {
	t.Helper()
	w := &fakeWriter{}
	h := newHandler(t, w, Config{})
	post(h, request{token: tokenAcme, ctype: ceBatch, body: body})
	n := int64(0)
	for i := range w.msgs {
		n += int64(sink.RecordSize(&w.msgs[i]))
	}
	return n
}
