package suite

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// Skipping the compression of short replies changes no decision: on texts around both modes'
// length bounds, repetitive and not, the trigger is the one the gzip rule gives with the ratio
// always computed, and every flagged reply carries its exact ratio.
func TestGzipSkipChangesNoDecision(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	words := []string{"a", "bb", "the", "answer", "is", "42", "loop", "again", "x"}
	flagged, byGzip := 0, 0
	for i := 0; i < 3000; i++ {
		var b strings.Builder
		n := r.IntN(2000)
		period := 1 + r.IntN(8)
		noise := []int{0, 20, 4, 2}[r.IntN(4)] // one word in noise is random; 0: none
		for b.Len() < n {
			if noise > 0 && r.IntN(noise) == 0 {
				b.WriteString(words[r.IntN(len(words))])
			} else {
				b.WriteString(words[(b.Len()/3)%period])
			}
			b.WriteByte(" \n\t"[r.IntN(3)/2*r.IntN(3)])
		}
		text := b.String()
		full := gzipRatio(text)
		for _, mode := range []ReplyMode{ReplyDefault, ReplyOpenCompass} {
			s := AnalyzeReply(text, mode)
			gz := false
			switch mode {
			case ReplyDefault:
				gz = len(text) >= 256 && full >= 8
			case ReplyOpenCompass:
				gz = full > 40
			}
			if gz {
				byGzip++
			}
			if gz && s.Trigger != "gzip_ratio" {
				t.Fatalf("%v, %d bytes, ratio %.2f: trigger %q, want gzip_ratio", mode, len(text), full, s.Trigger)
			}
			if !gz && s.Trigger == "gzip_ratio" {
				t.Fatalf("%v, %d bytes, ratio %.2f: gzip_ratio flagged", mode, len(text), full)
			}
			if s.Trigger != "" {
				flagged++
				if s.GzipRatio != full {
					t.Fatalf("%v: flagged reply carries ratio %v, want %v", mode, s.GzipRatio, full)
				}
			}
			if len(text) < gzipRuleBytes[mode] && full*20 >= float64(len(text)) && len(text) > 0 {
				t.Fatalf("%d bytes compress to %.1f bytes: the len/20 bound does not hold", len(text), float64(len(text))/full)
			}
		}
	}
	if flagged == 0 || byGzip == 0 {
		t.Fatalf("%d replies flagged, %d by the gzip rule: the test must see both", flagged, byGzip)
	}
}
