package suite

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// analyzeFull is AnalyzeReply's default mode without its shortcut: the repetition searched over
// every period up to 64 for every reply, reported whenever a fragment repeats.
func analyzeFull(text string) ReplyStats {
	toks := tokenize(text, ReplyDefault)
	s := ReplyStats{Tokens: len(toks)}
	if len(text) >= gzipRuleBytes[ReplyDefault] {
		s.GzipRatio = gzipRatio(text)
	}
	ids := tokenIDs(toks)
	start, period, repeats, covered := periodicRun(ids, 64)
	if repeats > 1 {
		s.Repeats, s.Share = repeats, float64(covered)/float64(len(ids))
		s.Fragment = clipFragment(toks[start : start+period])
	}
	switch {
	case len(text) >= 256 && s.GzipRatio >= 8:
		s.Trigger = "gzip_ratio"
	case s.Repeats >= 10 && s.Share >= 0.5:
		s.Trigger = "repeat_pattern"
	}
	if s.Trigger != "" && s.GzipRatio == 0 {
		s.GzipRatio = gzipRatio(text)
	}
	return s
}

// AnalyzeReply searches the short periods first and stops there for a reply no rule can flag.
// Over replies built to sit on the rules' edges (small vocabularies, fragments repeated 8 to 12
// times, half or just under half of the reply, periods just over a tenth of it, prose around
// them, lengths across the gzip rule's 256 bytes) it must flag exactly the replies the full
// search flags, with the same fragment, repeats and share, and report no repetition otherwise.
func TestReplyShortcutAgreesWithTheFullSearch(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	words := strings.Fields("a b c d e f g h refund policy window days store credit")
	word := func(v int) string { return words[r.IntN(min(v, len(words)))] }
	var flagged, near int
	for n := 0; n < 20000; n++ {
		var toks []string
		for range r.IntN(12) {
			toks = append(toks, word(len(words)))
		}
		frag := make([]string, 1+r.IntN(8))
		for i := range frag {
			frag[i] = word(2 + r.IntN(6))
		}
		for range 7 + r.IntN(7) {
			toks = append(toks, frag...)
		}
		for range r.IntN(3 * len(frag) * 6) {
			toks = append(toks, word(r.IntN(len(words))+1))
		}
		text := strings.Join(toks, " ")
		got, want := AnalyzeReply(text, ReplyDefault), analyzeFull(text)
		if want.Trigger == "" {
			want.Fragment, want.Repeats, want.Share = "", 0, 0
			if analyzeFull(text).Repeats >= 8 {
				near++
			}
		} else {
			flagged++
		}
		if got != want {
			t.Fatalf("%q:\n got  %+v\n want %+v", text, got, want)
		}
	}
	if flagged < 2000 || near < 2000 {
		t.Fatalf("%d replies flagged, %d normal ones repeating 8 times or more: the texts do not test the edge", flagged, near)
	}
}
