package suite

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// BenchmarkAnalyzeReply measures the analysis of one short prediction, as eval results carry them:
// "periodic" is one with a repeated fragment, "words" 3 to 40 words drawn from a small
// vocabulary (as the bench's eval shape sends them).
func BenchmarkAnalyzeReply(b *testing.B) {
	b.Run("periodic", func(b *testing.B) {
		text := strings.Repeat("the answer is forty two because ", 3)
		b.ReportAllocs()
		for b.Loop() {
			AnalyzeReply(text, ReplyDefault)
		}
	})
	b.Run("words", func(b *testing.B) {
		vocab := strings.Fields("the a answer is of to and in that it for was on are as with by at this be from or an not which yes no")
		r := rand.New(rand.NewPCG(1, 2))
		texts := make([]string, 1024)
		for i := range texts {
			w := make([]string, 3+r.IntN(38))
			for j := range w {
				w[j] = vocab[r.IntN(len(vocab))]
			}
			texts[i] = strings.Join(w, " ")
		}
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			AnalyzeReply(texts[i%len(texts)], ReplyDefault)
			i++
		}
	})
}
