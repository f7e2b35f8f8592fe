package aggregator

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/repeatrate/repeatrate/schemas"
)

// A record of state layout 11 is a tag byte, then the winner's occurred and assessed times in 7
// bytes each (little-endian µs), then its assessment seq in 7 bytes when not 0, then its horizon
// in 7 bytes when above its occurred time (only the apply script adds one). The tag's low 4 bits
// are the class (1 confirmed, 2 passed, 3 unscored), bit 4 says a seq follows, bit 5 a horizon,
// so the tag alone gives the record's length (recordLength), which is how the packed record store
// splits a bucket back into records.
const (
	recordTagSeq     = 0x10
	recordTagHorizon = 0x20
	recordTimeBytes  = 7
)

// recordLength returns the length of a layout-11 record (its tag included) that starts with tag,
// or 0 for a byte that is no tag.
func recordLength(tag byte) int {
	if c := tag & 0x0f; c < 1 || c > 3 || tag&^0x3f != 0 {
		return 0
	}
	n := 1 + 2*recordTimeBytes
	if tag&recordTagSeq != 0 {
		n += recordTimeBytes
	}
	if tag&recordTagHorizon != 0 {
		n += recordTimeBytes
	}
	return n
}

// recordMaxMicros is the last µs a record holds: the schemas admit times before 2200, and seqs
// up to schemas.MaxAssessmentSeq, so every number fits its 7 bytes with room to spare.
var recordMaxMicros = Micros(time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC)) - 1

// appendRecord appends o's layout-11 record to dst. An observation the schemas would not have
// admitted (a class outside the three, a time outside 1970..2200, a seq outside 0..2⁵³−1) is
// refused, never written in bytes that would read back as something else.
func appendRecord(dst []byte, o *Observation) ([]byte, error) {
	if o.Class < Confirmed || o.Class > Unscored {
		return dst, fmt.Errorf("opportunity %q: class %d is none of the three", o.OpportunityID, o.Class)
	}
	if !inRecordRange(o.Occurred, recordMaxMicros) || !inRecordRange(o.Assessed, recordMaxMicros) ||
		!inRecordRange(o.Seq, schemas.MaxAssessmentSeq) {
		return dst, fmt.Errorf("opportunity %q: occurred %d, assessed %d µs or seq %d outside what a record holds",
			o.OpportunityID, o.Occurred, o.Assessed, o.Seq)
	}
	tag := byte(o.Class)
	if o.Seq != 0 {
		tag |= recordTagSeq
	}
	dst = append(dst, tag)
	dst = appendNumber(dst, o.Occurred)
	dst = appendNumber(dst, o.Assessed)
	if o.Seq != 0 {
		dst = appendNumber(dst, o.Seq)
	}
	return dst, nil
}

func inRecordRange(v, most int64) bool { return v >= 0 && v <= most }

// appendNumber appends v (0 ≤ v < 2⁵⁶) in 7 bytes, little-endian.
func appendNumber(dst []byte, v int64) []byte {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(v))
	return append(dst, b[:recordTimeBytes]...)
}

// storedRecord is a layout-11 record read back: the winner and its horizon (the winner's occurred
// time when the record carries none).
type storedRecord struct {
	class                   Class
	occurred, assessed, seq int64
	horizon                 int64
}

// parseRecord reads one layout-11 record, which must be exactly rec.
func parseRecord(rec []byte) (storedRecord, error) {
	if len(rec) == 0 || recordLength(rec[0]) != len(rec) {
		return storedRecord{}, fmt.Errorf("no record of layout 11: %d bytes", len(rec))
	}
	tag := rec[0]
	number := func(i int) int64 {
		var b [8]byte
		copy(b[:], rec[i:i+recordTimeBytes])
		return int64(binary.LittleEndian.Uint64(b[:]))
	}
	r := storedRecord{class: Class(tag & 0x0f), occurred: number(1), assessed: number(1 + recordTimeBytes)}
	at := 1 + 2*recordTimeBytes
	if tag&recordTagSeq != 0 {
		r.seq = number(at)
		at += recordTimeBytes
	}
	if tag&recordTagSeq != 0 && r.seq == 0 {
		return storedRecord{}, errors.New("record says a seq follows, and its seq is 0")
	}
	r.horizon = r.occurred
	if tag&recordTagHorizon != 0 {
		r.horizon = number(at)
		if r.horizon <= r.occurred {
			return storedRecord{}, fmt.Errorf("record's horizon %d is not above its occurred time %d", r.horizon, r.occurred)
		}
	}
	if !inRecordRange(r.occurred, recordMaxMicros) || !inRecordRange(r.assessed, recordMaxMicros) ||
		!inRecordRange(r.horizon, recordMaxMicros) || !inRecordRange(r.seq, schemas.MaxAssessmentSeq) {
		return storedRecord{}, fmt.Errorf("record of %+v: a number outside what a writer stores", r)
	}
	return r, nil
}
