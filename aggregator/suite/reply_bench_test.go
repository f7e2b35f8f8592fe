package suite

import (
	"strings"
	"testing"
)

// BenchmarkAnalyzeReply measures the analysis of one short prediction, as eval results carry them.
func BenchmarkAnalyzeReply(b *testing.B) {
	text := strings.Repeat("the answer is forty two because ", 3)
	b.ReportAllocs()
	for b.Loop() {
		AnalyzeReply(text, ReplyDefault)
	}
}
