package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
)

// PartitionReader reads a partition up to a fixed offset, outside any group: what a rebuild
// replays and what a check of a topic's contents reads.
type PartitionReader struct {
	Dialer  *kafka.Dialer
	Brokers []string
}

// Reading one partition to a fixed offset.
const (
	fetchMaxBytes = 16 << 20
	fetchMaxWait  = 500 * time.Millisecond
	fetchTimeout  = 30 * time.Second // one fetch round trip, reading included
	fetchAttempts = 5                // failed fetches in a row before Read gives up
)

// Read feeds fn every message of topic/part below offset end, in offset order, in slices of at
// most maxBatch, and returns how many it fed. It stops at end and never waits for silence: a
// fetch that returns no message while the partition's high-water mark is at or past end proves
// that nothing is left below end (records removed by compaction, transaction markers); while the
// high-water mark is below end (a new leader catching up) it keeps fetching until ctx ends.
// Records that retention deletes before they are read are skipped, as they are for every consumer;
// a log truncated below the position (unclean leader election) is an error. A failing fetch is
// retried on a new connection a few times.
func (r PartitionReader) Read(ctx context.Context, topic string, part int, end int64, maxBatch int,
	fn func([]kafka.Message) error) (int, error) {
	var conn *kafka.Conn
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	total, failures := 0, 0
	pos := int64(-1) // the next offset to read; -1: the partition's first
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		from := pos
		var msgs []kafka.Message
		var hwm int64
		err := func() error {
			if conn == nil {
				c, err := r.dialLeader(ctx, topic, part)
				if err != nil {
					return err
				}
				conn = c
			}
			if pos < 0 {
				conn.SetDeadline(time.Now().Add(fetchTimeout))
				first, err := conn.ReadFirstOffset()
				if err != nil {
					return err
				}
				pos, from = first, first
			}
			if pos >= end {
				return nil
			}
			var err error
			msgs, hwm, pos, err = fetchTo(conn, pos, end)
			return err
		}()
		if errors.Is(err, kafka.OffsetOutOfRange) && conn != nil {
			conn.SetDeadline(time.Now().Add(fetchTimeout))
			first, ferr := conn.ReadFirstOffset()
			if ferr == nil && first > pos {
				pos = first // retention deleted what was not read yet
				continue
			}
			return total, fmt.Errorf("read %s/%d at %d (first offset %d, end %d): %w", topic, part, pos, first, end, errors.Join(err, ferr))
		}
		if err != nil {
			failures++
			if failures >= fetchAttempts {
				return total, fmt.Errorf("read %s/%d at %d: %w", topic, part, pos, err)
			}
			if conn != nil {
				conn.Close()
				conn = nil
			}
			select {
			case <-ctx.Done():
				return total, ctx.Err()
			case <-time.After(time.Duration(failures) * 200 * time.Millisecond):
			}
			continue
		}
		failures = 0
		if pos >= end || (len(msgs) == 0 && pos == from && hwm >= end) {
			// Read up to end, or nothing is left below it (see above).
			pos = max(pos, end)
		}
		for len(msgs) > 0 {
			n := min(len(msgs), maxBatch)
			if err := fn(msgs[:n]); err != nil {
				return total, err
			}
			total += n
			msgs = msgs[n:]
		}
		if pos >= end {
			return total, nil
		}
	}
}

// fetchTo makes one fetch at offset pos and returns its messages below end, the partition's
// high-water mark, and the offset to read next (past records the fetch showed were compacted away).
func fetchTo(conn *kafka.Conn, pos, end int64) ([]kafka.Message, int64, int64, error) {
	if _, err := conn.Seek(pos, kafka.SeekAbsolute|kafka.SeekDontCheck); err != nil {
		return nil, 0, pos, err
	}
	conn.SetDeadline(time.Now().Add(fetchTimeout))
	b := conn.ReadBatchWith(kafka.ReadBatchConfig{MinBytes: 1, MaxBytes: fetchMaxBytes, MaxWait: fetchMaxWait})
	var msgs []kafka.Message
	next := pos
	for {
		m, err := b.ReadMessage()
		if err != nil || m.Offset >= end {
			break
		}
		msgs = append(msgs, m)
		next = m.Offset + 1
	}
	hwm := b.HighWaterMark()
	if err := b.Close(); err != nil {
		return nil, hwm, pos, err
	}
	return msgs, hwm, max(next, b.Offset()), nil
}

// dialLeader connects to the leader of topic/part through the first broker that answers.
func (r PartitionReader) dialLeader(ctx context.Context, topic string, part int) (*kafka.Conn, error) {
	var errs []error
	for _, b := range r.Brokers {
		c, err := r.Dialer.DialLeader(ctx, "tcp", b, topic, part)
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("connect to the leader of %s/%d: %w", topic, part, errors.Join(errs...))
}
