package suite

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// Skipping the compression of short replies changes no decision: on texts around both modes'
// length bounds, repetitive and not, the analysis equals the one with every reply compressed,
// except for the ratio of a reply nothing flags; every flagged reply carries its exact ratio.
func TestGzipSkipChangesNoDecision(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	words := []string{"a", "bb", "the", "answer", "is", "42", "loop", "again", "x"}
	flagged, byGzip := 0, 0
	for i := 0; i < 3000; i++ {
		var b strings.Builder
		n := r.IntN(2000)
		period := 1 + r.IntN(8)
		noise := []int{0, 20, 4, 2}[r.IntN(4)] // one word in noise is random; 0: none
		unit := words[r.IntN(len(words))] + " " + words[r.IntN(len(words))] + " "
		for i%3 == 0 && b.Len() < n {
			b.WriteString(unit) // pure repetition: the highest ratios at every length
		}
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
		if len(text) > 0 && full*20 > float64(len(text)) {
			t.Fatalf("%d bytes compress to %.1f bytes: the len/20 bound does not hold", len(text), float64(len(text))/full)
		}
		for _, mode := range []ReplyMode{ReplyDefault, ReplyOpenCompass} {
			got := AnalyzeReply(text, mode)
			bounds := gzipRuleBytes
			gzipRuleBytes = map[ReplyMode]int{} // compress every reply
			want := AnalyzeReply(text, mode)
			gzipRuleBytes = bounds
			if want.Trigger == "gzip_ratio" {
				byGzip++
			}
			if got.Trigger != "" {
				flagged++
			} else {
				want.GzipRatio = got.GzipRatio // a reply nothing flags keeps its ratio only when it was needed
			}
			if got != want {
				t.Fatalf("%v, %d bytes, ratio %.2f: analysis %+v, with every reply compressed %+v", mode, len(text), full, got, want)
			}
		}
	}
	if flagged == 0 || byGzip == 0 {
		t.Fatalf("%d replies flagged, %d by the gzip rule: the test must see both", flagged, byGzip)
	}
}
