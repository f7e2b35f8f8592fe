package consumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
)

// origin names one input message: what a dead letter is about.
type origin struct {
	topic     string
	partition int
	offset    int64
}

func originOf(headers []kafka.Header) (origin, bool) {
	var o origin
	var okT, okP, okO bool
	for _, h := range headers {
		switch h.Key {
		case HeaderDLQTopic:
			o.topic, okT = string(h.Value), true
		case HeaderDLQPartition:
			p, err := strconv.Atoi(string(h.Value))
			o.partition, okP = p, err == nil
		case HeaderDLQOffset:
			off, err := strconv.ParseInt(string(h.Value), 10, 64)
			o.offset, okO = off, err == nil
		}
	}
	return o, okT && okP && okO
}

// LogOffsets are the offsets of one dead-letter topic partition that the index needs.
type LogOffsets struct {
	// First is the partition's first retained offset, End the next offset to be written.
	First, End int64
	// Since is the first offset whose record time is at or after the time asked for; End when
	// there is none.
	Since int64
}

// DeadLetterLog reads the dead-letter topic for the index: offsets, and the headers of records.
// Values are never handed out, so what the index holds does not grow with them.
type DeadLetterLog interface {
	// Offsets returns the offsets of every partition; Since is for time since.
	Offsets(ctx context.Context, since time.Time) (map[int]LogOffsets, error)
	// Read calls fn with the offset and headers of each record of partition in [from, to), in
	// offset order, and returns nil once it has passed to−1 (or the partition's end). fn is called
	// as records arrive, so what it saw before an error stays seen.
	Read(ctx context.Context, partition int, from, to int64, fn func(offset int64, headers []kafka.Header)) error
}

// defaultMaxOrigins bounds the origins the index holds: 8 bytes each, so about 8 MiB.
const defaultMaxOrigins = 1 << 20

// dlqIndex remembers which input messages already have a dead letter, so that a batch redelivered
// after a crash (or retried after a partial write) does not quarantine them twice. It learns from
// the dead-letter topic itself, so it also covers letters another instance wrote.
//
// It is bounded in memory and time (issue 9, fault 7):
//   - It reads headers only and keeps only origins, at most maxOrigins of them: past that it
//     forgets the lowest input offsets of the input partition with the most (a redelivery reaches
//     only offsets above the group's committed ones, so the highest are what it needs). A
//     redelivery reaching a forgotten origin writes a second letter, which readers drop by its
//     origin headers.
//   - It reads only the part of the topic that can hold letters for the messages at hand that it
//     does not know yet: letters are written after their messages, so records older than the
//     oldest message (less a clock skew, and with message times taken at most at the sender's
//     clock: see lettersSince) are never read. The sender also adds the letters it wrote itself,
//     which a later read bounded by a producer's clock might not reach.
//   - Progress is kept record by record, even when a read fails: a read cut short by the batch
//     deadline resumes where it stopped, so a large topic cannot keep a batch from ever finishing.
type dlqIndex struct {
	log DeadLetterLog
	mu  sync.Mutex
	// read holds, per dead-letter partition, the offset ranges whose records have been read:
	// ascending, disjoint and not adjacent.
	read       map[int][]span
	seen       map[inputPartition][]int64 // dead-lettered offsets of each input partition, ascending
	n          int                        // offsets held in seen
	maxOrigins int
}

// span is the offsets [lo, hi).
type span struct{ lo, hi int64 }

// cover adds [lo, hi) to the ranges read of partition p.
func (x *dlqIndex) cover(p int, lo, hi int64) {
	var out []span
	for _, s := range x.read[p] {
		if s.hi < lo || s.lo > hi { // apart: keep
			out = append(out, s)
			continue
		}
		lo, hi = min(lo, s.lo), max(hi, s.hi) // overlapping or adjacent: merge
	}
	out = append(out, span{lo, hi})
	slices.SortFunc(out, func(a, b span) int { return cmp.Compare(a.lo, b.lo) })
	x.read[p] = out
}

// gaps returns the ranges of [from, to) of partition p not read yet.
func (x *dlqIndex) gaps(p int, from, to int64) []span {
	var out []span
	pos := from
	for _, s := range x.read[p] {
		if s.hi <= pos {
			continue
		}
		if s.lo > pos {
			out = append(out, span{pos, min(s.lo, to)})
		}
		pos = max(pos, s.hi)
		if pos >= to {
			break
		}
	}
	if pos < to {
		out = append(out, span{pos, to})
	}
	return slices.DeleteFunc(out, func(s span) bool { return s.lo >= s.hi })
}

type inputPartition struct {
	topic     string
	partition int
}

func newDLQIndex(log DeadLetterLog, maxOrigins int) *dlqIndex {
	return &dlqIndex{log: log, read: map[int][]span{}, seen: map[inputPartition][]int64{}, maxOrigins: maxOrigins}
}

// sync reads what the topic holds about messages of time since or later and has not been read.
func (x *dlqIndex) sync(ctx context.Context, since time.Time) error {
	offs, err := x.log.Offsets(ctx, since)
	if err != nil {
		return fmt.Errorf("dead-letter topic offsets: %w", err)
	}
	parts := make([]int, 0, len(offs))
	for p := range offs {
		parts = append(parts, p)
	}
	slices.Sort(parts)
	learn := func(_ int64, h []kafka.Header) {
		if o, ok := originOf(h); ok {
			x.add(o)
		}
	}
	for _, p := range parts {
		o := offs[p]
		// Records below First are gone; letters of these messages lie in [need, End).
		need := min(max(o.Since, o.First), o.End)
		for _, g := range x.gaps(p, need, o.End) {
			next := g.lo
			err := x.log.Read(ctx, p, g.lo, g.hi, func(off int64, h []kafka.Header) {
				learn(off, h)
				next = off + 1
			})
			if err == nil {
				next = g.hi
			}
			if next > g.lo {
				x.cover(p, g.lo, next) // kept even when the read failed
			}
			if err != nil {
				return fmt.Errorf("read dead-letter topic: %w", err)
			}
		}
	}
	return nil
}

// has reports whether o is known to have a dead letter.
func (x *dlqIndex) has(o origin) bool {
	_, ok := slices.BinarySearch(x.seen[inputPartition{o.topic, o.partition}], o.offset)
	return ok
}

// add records that o has a dead letter.
func (x *dlqIndex) add(o origin) {
	k := inputPartition{o.topic, o.partition}
	s := x.seen[k]
	switch i, found := slices.BinarySearch(s, o.offset); {
	case found:
		return
	case i == len(s):
		s = append(s, o.offset) // the usual case: letters arrive in offset order
	default:
		s = slices.Insert(s, i, o.offset)
	}
	x.seen[k] = s
	if x.n++; x.n > x.maxOrigins {
		x.forget()
	}
}

// forget drops the lower half of the offsets of the input partition that holds the most (ties:
// the first by topic and partition).
func (x *dlqIndex) forget() {
	var big inputPartition
	most := 0
	for k, s := range x.seen {
		if len(s) > most || (len(s) == most && cmp.Or(cmp.Compare(k.topic, big.topic), cmp.Compare(k.partition, big.partition)) < 0) {
			big, most = k, len(s)
		}
	}
	drop := max(1, most/2)
	if rest := x.seen[big][drop:]; len(rest) > 0 {
		x.seen[big] = slices.Clone(rest)
	} else {
		delete(x.seen, big)
	}
	x.n -= drop
}

// KafkaDeadLetterLog reads a dead-letter topic with kafka-go's Client.
type KafkaDeadLetterLog struct {
	Client *kafka.Client
	Topic  string
}

// fetchBytes is the most a fetch asks for. A record batch larger than that still comes whole, so
// a read holds at most about max(fetchBytes, the topic's max.message.bytes).
const fetchBytes = 1 << 20

// Offsets implements DeadLetterLog. A partition whose leader is moving is asked again for about
// 10 s (RetryTemporary) before the error is returned.
func (l *KafkaDeadLetterLog) Offsets(ctx context.Context, since time.Time) (map[int]LogOffsets, error) {
	return RetryTemporary(ctx, LeaderMoves, LeaderWait, func() (map[int]LogOffsets, error) { return l.offsets(ctx, since) })
}

func (l *KafkaDeadLetterLog) offsets(ctx context.Context, since time.Time) (map[int]LogOffsets, error) {
	md, err := l.Client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{l.Topic}})
	if err != nil {
		return nil, err
	}
	req := &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{}}
	for _, t := range md.Topics {
		if t.Error != nil {
			return nil, t.Error
		}
		for _, p := range t.Partitions {
			if p.Error != nil { // Leader Not Available while one is elected
				return nil, p.Error
			}
			req.Topics[l.Topic] = append(req.Topics[l.Topic], kafka.FirstOffsetOf(p.ID), kafka.LastOffsetOf(p.ID))
			if !since.IsZero() {
				req.Topics[l.Topic] = append(req.Topics[l.Topic], kafka.TimeOffsetOf(p.ID, since))
			}
		}
	}
	offs, err := l.Client.ListOffsets(ctx, req)
	if err != nil {
		return nil, err
	}
	out := map[int]LogOffsets{}
	for _, p := range offs.Topics[l.Topic] {
		if p.Error != nil {
			return nil, p.Error
		}
		o := LogOffsets{First: p.FirstOffset, End: p.LastOffset, Since: p.FirstOffset}
		if !since.IsZero() {
			o.Since = p.LastOffset // no record at or after since
			for off := range p.Offsets {
				if off >= 0 {
					o.Since = off
				}
			}
		}
		out[p.Partition] = o
	}
	return out, nil
}

// Read implements DeadLetterLog. A fetch from a partition whose leader is moving is asked again
// for about 10 s (RetryTemporary) before the error is returned.
func (l *KafkaDeadLetterLog) Read(ctx context.Context, partition int, from, to int64, fn func(int64, []kafka.Header)) error {
	for from < to {
		res, err := RetryTemporary(ctx, LeaderMoves, LeaderWait, func() (*kafka.FetchResponse, error) {
			res, err := l.Client.Fetch(ctx, &kafka.FetchRequest{Topic: l.Topic, Partition: partition, Offset: from,
				MinBytes: 1, MaxBytes: fetchBytes, MaxWait: 500 * time.Millisecond})
			if err == nil && res.Error != nil {
				err = res.Error
			}
			return res, err
		})
		if err != nil {
			return err
		}
		next := from
		for {
			r, err := res.Records.ReadRecord()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return err
			}
			if r.Offset < from || r.Offset >= to {
				continue // a batch may start before from
			}
			fn(r.Offset, r.Headers)
			next = r.Offset + 1
		}
		if next == from && res.HighWatermark <= from {
			return nil // nothing at or after from: the end
		}
		from = next
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return nil
}
