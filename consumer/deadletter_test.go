package consumer

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/repeatrate/repeatrate/schemas/cloudevent"
	"github.com/repeatrate/repeatrate/sink"
)

// memoryTopic is a one-partition topic in memory: the writer and the log of one test.
type memoryTopic struct {
	msgs  []kafka.Message
	first int64     // offsets below first were deleted by retention
	clock time.Time // the time written letters get
	fail  bool      // fail the next write after storing half of it, as a partial write does
	// budget, when limited, is how many more records Read delivers before it fails, as a read cut
	// short by the batch deadline does.
	budget  int
	limited bool
	read    int // records delivered by Read, over all calls
}

func (m *memoryTopic) WriteMessages(_ context.Context, msgs ...kafka.Message) error {
	stamp := func(ms []kafka.Message) {
		for _, x := range ms {
			x.Time = m.clock
			m.msgs = append(m.msgs, x)
		}
	}
	if m.fail {
		m.fail = false
		stamp(msgs[:len(msgs)/2])
		return context.DeadlineExceeded
	}
	stamp(msgs)
	return nil
}

func (m *memoryTopic) Offsets(_ context.Context, since time.Time) (map[int]LogOffsets, error) {
	o := LogOffsets{First: m.first, End: int64(len(m.msgs)), Since: int64(len(m.msgs))}
	for i := m.first; i < int64(len(m.msgs)); i++ {
		if !m.msgs[i].Time.Before(since) {
			o.Since = i
			break
		}
	}
	return map[int]LogOffsets{0: o}, nil
}

// sender returns a dead-letter sender on the topic whose clock is the topic's.
func (m *memoryTopic) sender() *DeadLetters {
	d := NewDeadLetters(m, m)
	d.now = func() time.Time { return m.clock }
	return d
}

var errReadCut = errors.New("read cut short")

func (m *memoryTopic) Read(_ context.Context, _ int, from, to int64, fn func(int64, []kafka.Header)) error {
	for off := max(from, m.first); off < to && off < int64(len(m.msgs)); off++ {
		if m.limited && m.budget == 0 {
			return errReadCut
		}
		m.budget--
		m.read++
		fn(off, m.msgs[off].Headers)
	}
	return nil
}

// letters are dead letters for offsets [from, to) of input partition 1 of topic "in", produced at t.
func letters(from, to int64, t time.Time) []DeadLetter {
	var dls []DeadLetter
	for off := from; off < to; off++ {
		dls = append(dls, DeadLetter{Message: kafka.Message{Topic: "in", Partition: 1, Offset: off, Time: t, Value: []byte("x")}, Reason: "undecodable"})
	}
	return dls
}

// lettersPerOffset counts the letters of each input offset in topic.
func lettersPerOffset(t *testing.T, topic *memoryTopic) map[int64]int {
	t.Helper()
	seen := map[int64]int{}
	for _, m := range topic.msgs {
		o, ok := originOf(m.Headers)
		if !ok {
			t.Fatalf("dead letter without origin headers: %+v", m.Headers)
		}
		seen[o.offset]++
	}
	return seen
}

func TestDeadLettersOncePerMessage(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	topic := &memoryTopic{fail: true, clock: t0}
	d := topic.sender()
	dls := letters(0, 6, t0)
	ctx := context.Background()
	if err := d.Send(ctx, dls); err == nil {
		t.Fatal("the partial write must fail the send")
	}
	// The retry, a redelivery after a crash, and another instance's sender all write each letter once.
	if err := d.Send(ctx, dls); err != nil {
		t.Fatal(err)
	}
	if err := d.Send(ctx, dls[2:]); err != nil {
		t.Fatal(err)
	}
	if err := topic.sender().Send(ctx, dls); err != nil {
		t.Fatal(err)
	}
	seen := lettersPerOffset(t, topic)
	if len(seen) != 6 {
		t.Fatalf("letters for %d messages, want 6", len(seen))
	}
	for off, n := range seen {
		if n != 1 {
			t.Fatalf("offset %d has %d letters", off, n)
		}
	}
}

// TestDeadLettersProducerClockAhead: a message's time is its producer's to set, while letters
// carry the senders' clocks. A poison message stamped two hours ahead used to get a letter on
// every delivery: the index read only letters stamped from the message's time less an hour on.
// Message times are now taken at most at the sender's clock (and not at all when more than the
// allowed skew ahead), and a sender remembers the letters it wrote.
func TestDeadLettersProducerClockAhead(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	type delivery struct {
		later    time.Duration // after the first delivery, on the sender's and the topic's clock
		another  bool          // by a new sender (a restart, or another instance), not the first one
		wantRead int           // records the sender reads from the topic
	}
	tests := []struct {
		name       string
		ahead      time.Duration // the message's time less the first delivery's
		deliveries []delivery    // after the first
	}{
		// The reviewer's case: delivered three times in a row. The same sender knows its letter
		// and reads nothing.
		{"2 h ahead, redelivered at once", 2 * time.Hour, []delivery{{0, false, 0}, {0, false, 0}}},
		// Another sender finds the letter: the bound is the receiving clock less an hour.
		{"2 h ahead, another sender at once", 2 * time.Hour, []delivery{{0, true, 1}}},
		// Three hours later the bound (the message time less an hour) is past the letter; the
		// sender that wrote it remembers it.
		{"2 h ahead, the same sender 3 h later", 2 * time.Hour, []delivery{{3 * time.Hour, false, 0}}},
		// Still more than an hour ahead of another sender two hours later: the time is not
		// trusted and the whole topic is read.
		{"4 h ahead, another sender 2 h later", 4 * time.Hour, []delivery{{2 * time.Hour, true, 1}}},
		// An honest time, for comparison.
		{"on time, another sender 3 h later", 0, []delivery{{3 * time.Hour, true, 1}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			topic := &memoryTopic{clock: t0}
			dls := letters(0, 1, t0.Add(tc.ahead))
			first := topic.sender()
			ctx := context.Background()
			if err := first.Send(ctx, dls); err != nil {
				t.Fatal(err)
			}
			for i, d := range tc.deliveries {
				topic.clock = t0.Add(d.later)
				s := first
				if d.another {
					s = topic.sender()
				}
				topic.read = 0
				if err := s.Send(ctx, dls); err != nil {
					t.Fatal(err)
				}
				if topic.read != d.wantRead {
					t.Errorf("delivery %d read %d records, want %d", i+2, topic.read, d.wantRead)
				}
			}
			if n := lettersPerOffset(t, topic)[0]; n != 1 {
				t.Fatalf("input offset 0 has %d dead letters after %d deliveries, want 1", n, 1+len(tc.deliveries))
			}
		})
	}
}

// TestDeadLetterIndexResumes: a read of the dead-letter topic cut short by the batch deadline
// keeps its progress, so a topic too large to read in one attempt still lets the batch finish,
// reading each record about once; before, the position advanced only when a read completed, and
// every attempt started over.
func TestDeadLetterIndexResumes(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	const total, perAttempt = 20000, 5000
	tests := []struct {
		name string
		// prepare returns the sender whose next Send must read the whole topic.
		prepare func(topic *memoryTopic) *DeadLetters
	}{
		// Forward: the sender last looked when the topic was empty; another instance wrote since.
		{"forward", func(topic *memoryTopic) *DeadLetters {
			d := topic.sender()
			d.idx.cover(0, 0, 0)
			return d
		}},
		// Into older history: the sender has read only letters of new messages; a redelivery of
		// old messages sends it back through the topic.
		{"into older history", func(topic *memoryTopic) *DeadLetters {
			topic.clock = t0.Add(48 * time.Hour)
			d := topic.sender()
			if err := d.Send(context.Background(), letters(total, total+1, topic.clock)); err != nil {
				t.Fatal(err)
			}
			return d
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			topic := &memoryTopic{clock: t0}
			old := letters(0, total, t0)
			if err := NewDeadLetters(topic, nil).Send(context.Background(), old); err != nil {
				t.Fatal(err)
			}
			d := tc.prepare(topic)
			written := len(topic.msgs)
			topic.read, topic.limited = 0, true
			attempts := 0
			var err error
			for attempts = 1; attempts <= 20; attempts++ {
				topic.budget = perAttempt // each attempt reads this much before its deadline
				if err = d.Send(context.Background(), old[total-10:]); err == nil {
					break
				}
				if !errors.Is(err, errReadCut) {
					t.Fatal(err)
				}
			}
			if err != nil {
				t.Fatalf("the batch never finished: %v", err)
			}
			if topic.read > written { // each record once
				t.Errorf("read %d records over %d attempts for a topic of %d", topic.read, attempts, written)
			}
			if n := len(topic.msgs); n != written {
				t.Errorf("%d letters written again", n-written)
			}
		})
	}
}

// TestDeadLetterIndexReadsOnlySince: letters are written after their messages, so the index reads
// only the records from the oldest message's time (less the allowed skew) on; older messages make
// it read further back.
func TestDeadLetterIndexReadsOnlySince(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	topic := &memoryTopic{clock: t0}
	if err := NewDeadLetters(topic, nil).Send(context.Background(), letters(0, 10000, t0)); err != nil {
		t.Fatal(err)
	}
	topic.clock = t0.Add(48 * time.Hour)
	if err := NewDeadLetters(topic, nil).Send(context.Background(), letters(10000, 10010, t0.Add(48*time.Hour))); err != nil {
		t.Fatal(err)
	}
	d := topic.sender()
	// New messages: only the 10 letters of the last two days are read.
	if err := d.Send(context.Background(), letters(10010, 10020, t0.Add(48*time.Hour))); err != nil {
		t.Fatal(err)
	}
	if topic.read != 10 {
		t.Errorf("read %d records for messages of the last hour, want the 10 written since", topic.read)
	}
	// A redelivery of old messages: the index reads back far enough to find their letters.
	if err := d.Send(context.Background(), letters(9990, 10000, t0)); err != nil {
		t.Fatal(err)
	}
	for off, n := range lettersPerOffset(t, topic) {
		if n != 1 {
			t.Fatalf("offset %d has %d letters", off, n)
		}
	}
}

// TestDeadLetterIndexBounded: the index holds at most maxOrigins origins, forgetting the lowest
// offsets of the busiest input partition; recent letters are still recognised.
func TestDeadLetterIndexBounded(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	topic := &memoryTopic{clock: t0}
	if err := NewDeadLetters(topic, nil).Send(context.Background(), letters(0, 5000, t0)); err != nil {
		t.Fatal(err)
	}
	d := topic.sender()
	d.idx.maxOrigins = 1000
	if err := d.Send(context.Background(), letters(4990, 5000, t0)); err != nil {
		t.Fatal(err)
	}
	if d.idx.n > 1000 {
		t.Fatalf("index holds %d origins, limit 1000", d.idx.n)
	}
	if len(topic.msgs) != 5000 {
		t.Fatalf("%d letters after a redelivery of recent messages, want 5000", len(topic.msgs))
	}
	if d.idx.has(origin{"in", 1, 0}) || !d.idx.has(origin{"in", 1, 4999}) {
		t.Fatal("the index must forget the oldest offsets and keep the newest")
	}
}

// TestDeadLetterRecordWithin: a letter that would not fit its topic is cut, value first, keeping
// every header, the reason, the origin and the original size; one that fits is left whole.
func TestDeadLetterRecordWithin(t *testing.T) {
	hdrs := func(n, size int) []kafka.Header {
		var hs []kafka.Header
		for i := range n {
			hs = append(hs, kafka.Header{Key: "h" + strconv.Itoa(i), Value: []byte(strings.Repeat("v", size))})
		}
		return hs
	}
	const limit = 100_000
	tests := []struct {
		name       string
		msg        kafka.Message
		truncated  string // "" when whole
		keptHeader int
	}{
		// Fits: unchanged, no size header.
		{"fits", kafka.Message{Key: []byte("k"), Value: []byte(strings.Repeat("x", 1000)), Headers: hdrs(3, 10)}, "", 3},
		// One byte too many once the letter's headers are added: the value is cut.
		{"just over", kafka.Message{Key: []byte("k"), Value: []byte(strings.Repeat("x", limit-100)), Headers: hdrs(3, 10)}, "value", 3},
		// A compressed-then-inflated 3 MiB value.
		{"large value", kafka.Message{Key: []byte("k"), Value: []byte(strings.Repeat("x", 3<<20)), Headers: hdrs(5, 100)}, "value", 5},
		// A key that alone is over: value gone, key cut.
		{"large key", kafka.Message{Key: []byte(strings.Repeat("k", 2*limit)), Value: []byte("v"), Headers: hdrs(2, 10)}, "value,key", 2},
		// Headers that alone are over: the last ones are dropped.
		{"large headers", kafka.Message{Key: []byte("k"), Value: []byte("v"), Headers: hdrs(30, 5000)}, "headers", 19},
		// Headers and a value that are over: the value goes too.
		{"large headers and value", kafka.Message{Key: []byte("k"), Value: []byte(strings.Repeat("x", limit)), Headers: hdrs(30, 5000)}, "value,headers", 19},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.msg.Topic, tc.msg.Partition, tc.msg.Offset = "in", 3, 77
			d := DeadLetter{Message: tc.msg, Reason: "too_large", Detail: strings.Repeat("d", 5000)}
			r := d.RecordWithin(limit)
			if n := sink.RecordSize(&r); n > limit {
				t.Fatalf("letter of %d bytes, limit %d", n, limit)
			}
			got := map[string]string{}
			for _, h := range r.Headers {
				got[h.Key] = string(h.Value)
			}
			if o, ok := originOf(r.Headers); !ok || o != (origin{"in", 3, 77}) || got[HeaderDLQReason] != "too_large" ||
				len(got[HeaderDLQDetail]) != maxDetailBytes {
				t.Fatalf("letter headers %v", got)
			}
			for i := range tc.keptHeader {
				if _, ok := got["h"+strconv.Itoa(i)]; !ok {
					t.Fatalf("original header h%d dropped", i)
				}
			}
			if len(r.Headers) != tc.keptHeader+5+2*btoi(tc.truncated != "") {
				t.Fatalf("%d headers, want %d original ones kept", len(r.Headers), tc.keptHeader)
			}
			if got[HeaderDLQTruncated] != tc.truncated {
				t.Fatalf("truncated %q, want %q", got[HeaderDLQTruncated], tc.truncated)
			}
			if tc.truncated == "" {
				if string(r.Value) != string(tc.msg.Value) {
					t.Fatal("a letter that fits must carry the whole value")
				}
				return
			}
			if got[HeaderDLQOriginalSize] != strconv.Itoa(cloudevent.MessageSize(&tc.msg)) {
				t.Fatalf("original size %s, want %d", got[HeaderDLQOriginalSize], cloudevent.MessageSize(&tc.msg))
			}
			if !strings.HasPrefix(string(tc.msg.Value), string(r.Value)) || !strings.HasPrefix(string(tc.msg.Key), string(r.Key)) {
				t.Fatal("key and value must be cut to prefixes")
			}
			if tc.truncated == "value" && sink.RecordSize(&r) != limit {
				t.Fatalf("value cut to %d bytes leaves %d bytes unused", len(r.Value), limit-sink.RecordSize(&r))
			}
		})
	}
	// Record uses the output limit.
	big := DeadLetter{Message: kafka.Message{Value: make([]byte, 2<<20)}, Reason: "too_large"}
	if r := big.Record(); sink.RecordSize(&r) > sink.MaxRecordBytes {
		t.Fatalf("Record gives %d bytes", sink.RecordSize(&r))
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestDeadLetterRecordWithinManyHeaders: a letter of very many headers is cut in one pass over
// them, keeping the longest prefix that fits. Cutting used to measure the whole record again for
// every header it dropped: quadratic, 25 s for half a million empty headers and over ten minutes
// for 600 000, so the batch outlived its deadline and came back forever. The test counts the
// whole-record measurements, which must not grow with the headers.
func TestDeadLetterRecordWithinManyHeaders(t *testing.T) {
	headers := func(n int, key, value string) []kafka.Header {
		hs := make([]kafka.Header, n)
		for i := range hs {
			hs[i] = kafka.Header{Key: key, Value: []byte(value)}
		}
		return hs
	}
	tests := []struct {
		name      string
		msg       kafka.Message
		truncated string
	}{
		// The reviewer's message, larger: 600 000 empty headers (1.2 MB as Kafka holds them).
		{"empty headers", kafka.Message{Value: []byte("garbage"), Headers: headers(600_000, "", "")}, "value,headers"},
		// 300 000 one-byte headers, a key and no value.
		{"small headers and a key", kafka.Message{Key: []byte("k"), Headers: headers(300_000, "h", "v")}, "key,headers"},
		// Headers that fit (400 kB) beside a value that does not: only the value is cut.
		{"headers and a large value", kafka.Message{Value: []byte(strings.Repeat("x", 900_000)), Headers: headers(200_000, "", "")}, "value"},
	}
	const maxMeasures = 3 // the whole letter, the headers that must stay, the cut letter
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			measures := 0
			recordSize = func(m *kafka.Message) int {
				if measures++; measures > maxMeasures {
					t.Fatalf("record measured %d times for one letter of %d headers", measures, len(tc.msg.Headers))
				}
				return sink.RecordSize(m)
			}
			t.Cleanup(func() { recordSize = sink.RecordSize })
			tc.msg.Topic, tc.msg.Partition, tc.msg.Offset = "in", 2, 9
			r := DeadLetter{Message: tc.msg, Reason: "too_large", Detail: "message too large"}.Record()
			if n := sink.RecordSize(&r); n > sink.MaxRecordBytes {
				t.Fatalf("letter of %d bytes, limit %d", n, sink.MaxRecordBytes)
			}
			got := map[string]string{}
			for _, h := range r.Headers {
				got[h.Key] = string(h.Value)
			}
			if o, ok := originOf(r.Headers); !ok || o != (origin{"in", 2, 9}) || got[HeaderDLQReason] != "too_large" {
				t.Fatalf("letter headers %v", got)
			}
			if got[HeaderDLQTruncated] != tc.truncated {
				t.Fatalf("truncated %q, want %q", got[HeaderDLQTruncated], tc.truncated)
			}
			own := r.Headers[len(r.Headers)-7:] // reason, detail, origin, original size, truncated
			kept := len(r.Headers) - len(own)
			for i, h := range r.Headers[:kept] {
				if h.Key != tc.msg.Headers[i].Key || string(h.Value) != string(tc.msg.Headers[i].Value) {
					t.Fatalf("header %d is %+v, want the original's", i, h)
				}
			}
			if kept == len(tc.msg.Headers) {
				return
			}
			// The prefix is the longest: one more original header does not fit without key and
			// value, beside the letter's own headers sized with the longest truncation note.
			more := kafka.Message{Headers: append(append([]kafka.Header{}, tc.msg.Headers[:kept+1]...), own...)}
			more.Headers[len(more.Headers)-1].Value = []byte("value,key,headers")
			if n := sink.RecordSize(&more); n <= sink.MaxRecordBytes {
				t.Fatalf("kept %d of %d headers, but %d fit (%d bytes)", kept, len(tc.msg.Headers), kept+1, n)
			}
		})
	}
}
