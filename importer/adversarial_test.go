package importer

import (
	"strings"
	"testing"
	"unicode/utf8"

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
