package aggregator

import (
	"math/rand/v2"
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
		rec, err := appendRecord(nil, o)
		if err != nil {
			t.Fatalf("%+v: %v", *o, err)
		}
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
		rec, err := appendRecord(nil, &o)
		if err != nil {
			t.Fatal(err)
		}
		rec[0] |= recordTagHorizon
		rec = appendNumber(rec, 5000)
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
// winner's occurred time, a number beyond what the schemas admit; and an observation the schemas
// would not admit is never written, not even in bytes a tag would frame wrongly.
func TestRecordsRefuseWhatNoWriterMakes(t *testing.T) {
	good, err := appendRecord(nil, &Observation{Class: Confirmed, Occurred: 10, Assessed: 20, Seq: 3})
	if err != nil {
		t.Fatal(err)
	}
	for _, tag := range []byte{0, 4, 0x0f, 0x40, 0x80, 0x41, 'C', 'P', 'U', '0'} {
		if recordLength(tag) != 0 {
			t.Errorf("tag %#x gives a length", tag)
		}
	}
	nums := func(tag byte, vs ...int64) []byte {
		b := []byte{tag}
		for _, v := range vs {
			b = appendNumber(b, v)
		}
		return b
	}
	top := recordMaxMicros
	bad := map[string][]byte{
		"empty":                  {},
		"one byte short":         good[:len(good)-1],
		"one byte more":          append(append([]byte(nil), good...), 0),
		"layout 10's text":       []byte("C19a2b3c4d5e6f7,19a2b3c4d5e6f8"),
		"seq bit, seq 0":         nums(byte(Confirmed)|recordTagSeq, 10, 20, 0),
		"horizon at occ":         nums(byte(Passed)|recordTagHorizon, 10, 20, 10),
		"horizon below occ":      nums(byte(Passed)|recordTagHorizon, 10, 20, 9),
		"class 0 of length":      nums(0, 10, 20),
		"unknown high bit":       nums(byte(Passed)|0x40, 10, 20),
		"seq record cut off":     good[:15],
		"occurred past 2200":     nums(byte(Passed), top+1, 20),
		"assessed past 2200":     nums(byte(Passed), 10, top+1),
		"seq of 2^53":            nums(byte(Passed)|recordTagSeq, 10, 20, schemas.MaxAssessmentSeq+1),
		"horizon past 2200":      nums(byte(Passed)|recordTagHorizon, 10, 20, top+1),
		"all 7 bytes set":        nums(byte(Passed)|recordTagSeq|recordTagHorizon, 1<<56-2, 1<<56-1, 1<<56-1, 1<<56-1),
		"horizon with seq, past": nums(byte(Passed)|recordTagSeq|recordTagHorizon, 10, 20, 1, top+1),
	}
	for name, rec := range bad {
		if got, err := parseRecord(rec); err == nil {
			t.Errorf("%s (%x): read as %+v", name, rec, got)
		}
	}
	for _, o := range []Observation{
		{Class: 0, Occurred: 10, Assessed: 20},
		{Class: 4, Occurred: 10, Assessed: 20},
		{Class: 0x11, Occurred: 10, Assessed: 20},
		{Class: 0x21, Occurred: 10, Assessed: 20, Seq: 1},
		{Class: Passed, Occurred: -1, Assessed: 20},
		{Class: Passed, Occurred: 10, Assessed: top + 1},
		{Class: Passed, Occurred: 10, Assessed: 20, Seq: -1},
		{Class: Passed, Occurred: 10, Assessed: 20, Seq: schemas.MaxAssessmentSeq + 1},
	} {
		if rec, err := appendRecord([]byte("kept"), &o); err == nil || string(rec) != "kept" {
			t.Errorf("%+v written as %x (%v)", o, rec, err)
		}
	}
}
