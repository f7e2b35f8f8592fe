package aggregator

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/repeatrate/repeatrate/schemas"
)

// TestRecordsReadBackAsWritten: every observation the schemas admit (times 1970..2200, seqs below
// 2⁵³, each class) reads back from its layout-11 record exactly, the record's length is what its
// tag alone says, and records laid end to end split back into the same records by their tags,
// as the packed record store splits a bucket.
func TestRecordsReadBackAsWritten(t *testing.T) {
	edges := []int64{0, 1, 255, 256, 1 << 32, codecMaxUS}
	seqs := []int64{0, 1, 255, 1 << 40, schemas.MaxAssessmentSeq}
	var all []Observation
	for _, c := range []Class{Confirmed, Passed, Unscored} {
		for _, occ := range edges {
			for _, asd := range edges {
				for _, seq := range seqs {
					all = append(all, Observation{Class: c, Occurred: occ, Assessed: asd, Seq: seq})
				}
			}
		}
	}
	r := rand.New(rand.NewPCG(11, 34))
	for range 10000 {
		o := Observation{Class: Class(1 + r.IntN(3)), Occurred: r.Int64N(codecMaxUS + 1), Assessed: r.Int64N(codecMaxUS + 1)}
		if r.IntN(2) == 0 {
			o.Seq = r.Int64N(schemas.MaxAssessmentSeq + 1)
		}
		all = append(all, o)
	}
	var packed []byte
	for i := range all {
		o := &all[i]
		rec := appendRecord(nil, o)
		if recordLength(rec[0]) != len(rec) {
			t.Fatalf("%+v: a record of %d bytes whose tag says %d", *o, len(rec), recordLength(rec[0]))
		}
		got, err := parseRecord(rec)
		want := storedRecord{class: o.Class, occurred: o.Occurred, assessed: o.Assessed, seq: o.Seq, horizon: o.Occurred}
		if err != nil || got != want {
			t.Fatalf("%+v read back as %+v, %v", *o, got, err)
		}
		packed = append(packed, rec...)
	}
	for i, at := 0, 0; i < len(all); i++ {
		n := recordLength(packed[at])
		got, err := parseRecord(packed[at : at+n])
		if err != nil || got.occurred != all[i].Occurred || got.seq != all[i].Seq {
			t.Fatalf("record %d split from the run: %+v, %v", i, got, err)
		}
		if at += n; i == len(all)-1 && at != len(packed) {
			t.Fatalf("the run has %d bytes left after its last record", len(packed)-at)
		}
	}
}

// TestRecordsWithAHorizonReadBack: a record the apply script gave a horizon (the tag's horizon
// bit, 7 more bytes after the seq, if any) reads back with it.
func TestRecordsWithAHorizonReadBack(t *testing.T) {
	for _, seq := range []int64{0, 9} {
		o := Observation{Class: Passed, Occurred: 1000, Assessed: 2000, Seq: seq}
		rec := appendRecord(nil, &o)
		rec[0] |= recordTagHorizon
		rec = appendTime(rec, 5000)
		if recordLength(rec[0]) != len(rec) {
			t.Fatalf("seq %d: %d bytes, the tag says %d", seq, len(rec), recordLength(rec[0]))
		}
		got, err := parseRecord(rec)
		want := storedRecord{class: Passed, occurred: 1000, assessed: 2000, seq: seq, horizon: 5000}
		if err != nil || got != want {
			t.Fatalf("seq %d: %+v, %v; want %+v", seq, got, err, want)
		}
	}
}

// TestRecordsRefuseWhatNoWriterMakes: bytes no writer makes are refused, not read as numbers: a
// byte that is no tag, a length other than the tag's, a seq bit over a seq of 0 (a duplicate is
// recognised byte for byte, so each assessment has one encoding), a horizon not above the
// winner's occurred time; and a number that does not fit 7 bytes is never written.
func TestRecordsRefuseWhatNoWriterMakes(t *testing.T) {
	good := appendRecord(nil, &Observation{Class: Confirmed, Occurred: 10, Assessed: 20, Seq: 3})
	for _, tag := range []byte{0, 4, 0x0f, 0x40, 0x80, 0x41, 'C', 'P', 'U', '0'} {
		if recordLength(tag) != 0 {
			t.Errorf("tag %#x gives a length", tag)
		}
	}
	bad := map[string][]byte{
		"empty":              {},
		"one byte short":     good[:len(good)-1],
		"one byte more":      append(append([]byte(nil), good...), 0),
		"layout 10's text":   []byte("C19a2b3c4d5e6f7,19a2b3c4d5e6f8"),
		"seq bit, seq 0":     append(append([]byte{byte(Confirmed) | recordTagSeq}, make([]byte, 14)...), make([]byte, 7)...),
		"horizon at occ":     append([]byte{byte(Passed) | recordTagHorizon}, appendTime(appendTime(appendTime(nil, 10), 20), 10)...),
		"horizon below occ":  append([]byte{byte(Passed) | recordTagHorizon}, appendTime(appendTime(appendTime(nil, 10), 20), 9)...),
		"class 0 of length":  append([]byte{0}, make([]byte, 14)...),
		"unknown high bit":   append([]byte{byte(Passed) | 0x40}, make([]byte, 14)...),
		"seq record cut off": good[:15],
	}
	for name, rec := range bad {
		if got, err := parseRecord(rec); err == nil {
			t.Errorf("%s (%x): read as %+v", name, rec, got)
		}
	}
	for _, v := range []int64{-1, 1 << 56} {
		func() {
			defer func() {
				if r := recover(); r == nil || !strings.Contains(r.(string), "7 bytes") {
					t.Errorf("%d: written without complaint (%v)", v, r)
				}
			}()
			appendTime(nil, v)
		}()
	}
}
