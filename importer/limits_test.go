package importer

import (
	"archive/zip"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/klauspost/compress/zstd"

	"github.com/repeatrate/repeatrate/schemas"
)

// TestClipPrediction: a reply over the decoder's limit is cut to the longest prefix that fits and
// ends at a character boundary. A reply of three-byte characters (CJK text, "€") made the cut
// strip byte after byte — the last four bytes never start at a boundary — down to three bytes,
// then panic slicing s[-1:].
func TestClipPrediction(t *testing.T) {
	limit := schemas.DefaultLimits.MaxPredictionBytes
	for _, c := range []struct{ name, unit string }{
		{"ascii", "a"}, {"two-byte", "é"}, {"three-byte", "中"}, {"euro", "€"}, {"four-byte", "😀"},
		{"mixed", "a中😀é"}, {"three-byte after one", "x中中中"},
	} {
		for _, extra := range []int{0, 1, 2, 3, 4, 7} {
			s := strings.Repeat(c.unit, (limit+extra)/len(c.unit)+1)
			var got string
			func() {
				defer func() {
					if r := recover(); r != nil {
						t.Fatalf("%s (+%d): panic %v", c.name, extra, r)
					}
				}()
				got = clipPrediction(s)
			}()
			if !utf8.ValidString(got) || len(got) > limit || !strings.HasPrefix(s, got) || len(got) < limit-3 {
				t.Errorf("%s (+%d): %d bytes, valid %v, prefix %v", c.name, extra, len(got), utf8.ValidString(got), strings.HasPrefix(s, got))
			}
		}
	}
	if s := strings.Repeat("ab", 10); clipPrediction(s) != s {
		t.Error("a short reply is changed")
	}
}

// evalArchive writes an Inspect .eval archive: a valid header.json and one sample whose JSON is
// padded with white space to pad bytes, zstd-compressed (a few kilobytes), declaring declared
// bytes decompressed (the real size when 0).
func evalArchive(t *testing.T, path string, pad int, declared uint64) {
	t.Helper()
	header := `{"status":"success","eval":{"run_id":"r1","created":"2026-11-29T10:00:00Z","task":"t","model":"m","config":{"epochs":1},"scorers":[{"name":"s"}]}}`
	sample := []byte(`{"id":"c1","epoch":1,"output":{"completion":"ok"},"scores":{"s":{"value":"C"}}` + strings.Repeat(" ", pad) + `}`)
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zw := zip.NewWriter(f)
	w, err := zw.Create("header.json")
	if err != nil {
		t.Fatal(err)
	}
	w.Write([]byte(header))
	enc, _ := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedBestCompression))
	comp := enc.EncodeAll(sample, nil)
	if declared == 0 {
		declared = uint64(len(sample))
	}
	w, err = zw.CreateRaw(&zip.FileHeader{Name: "samples/c1_epoch_1.json", Method: zstd.ZipMethodWinZip,
		CRC32: crc32.ChecksumIEEE(sample), CompressedSize64: uint64(len(comp)), UncompressedSize64: declared})
	if err != nil {
		t.Fatal(err)
	}
	w.Write(comp)
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestInspectDecompressionBomb: a .eval member that decompresses past the limit fails the import
// with a message — whether it declares its size or lies about it — instead of being read whole into
// memory (zstd turns kilobytes into gigabytes); one at the limit imports.
func TestInspectDecompressionBomb(t *testing.T) {
	const limit = 1 << 20
	dir := t.TempDir()
	for _, c := range []struct {
		name     string
		pad      int
		declared uint64
		ok       bool
	}{
		{"small", 100, 0, true},
		{"bomb", 8 * limit, 0, false},
		{"bomb declaring a small size", 8 * limit, 1000, false},
		{"bomb declaring the limit", 8 * limit, limit, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "-")+".eval")
			evalArchive(t, path, c.pad, c.declared)
			evs, err := Inspect(path, Options{Scope: testScope, MaxMemberBytes: limit})
			if c.ok != (err == nil) || (c.ok && len(evs) != 1) {
				t.Fatalf("%d events, %v", len(evs), err)
			}
			if !c.ok {
				t.Log(err)
			}
		})
	}
}
