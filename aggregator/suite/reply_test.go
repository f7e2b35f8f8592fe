package suite

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/repeatrate/repeatrate/schemas"
)

func TestAnalyzeReply(t *testing.T) {
	loop := strings.Repeat("I will check the refund policy now. ", 30)
	prose := "Refunds are accepted within thirty days of delivery when the item is unused and in its original packaging; " +
		"store credit is offered after that, and damaged goods follow the warranty process described in section four."
	tests := []struct {
		name    string
		text    string
		mode    ReplyMode
		trigger string
		minRep  int
	}{
		// Ordinary prose is normal in both modes.
		{"prose", prose, ReplyDefault, "", 0},
		{"prose oc", prose, ReplyOpenCompass, "", 0},
		// A loop of one sentence compresses far beyond 8× and repeats 30 times.
		{"loop", loop, ReplyDefault, "gzip_ratio", 29},
		// A short loop under 256 bytes is judged by its repetition instead.
		{"short loop", strings.Repeat("no ", 40), ReplyDefault, "repeat_pattern", 39},
		// OpenCompass parity: 32-token windows at a regular gap, 20 times or more, in the second half.
		{"oc loop", prose + " " + strings.Repeat("a b c d e f g h ", 200), ReplyOpenCompass, "repeat_pattern", 20},
		{"empty", "", ReplyDefault, "", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := AnalyzeReply(tc.text, tc.mode)
			if s.Trigger != tc.trigger || s.Repeats < tc.minRep || s.Tokens != len(strings.Fields(tc.text)) {
				t.Fatalf("stats = %+v", s)
			}
			if len(s.Fragment) > schemas.MaxFragmentBytes {
				t.Fatalf("fragment of %d bytes kept", len(s.Fragment))
			}
		})
	}
	// The repeated fragment is found and named.
	if s := AnalyzeReply("intro words here "+strings.Repeat("spin the wheel ", 12), ReplyDefault); s.Fragment == "" || !strings.Contains("spin the wheel spin the wheel", s.Fragment) || s.Repeats < 11 {
		t.Fatalf("fragment = %+v", s)
	}
}

func FuzzAnalyzeReply(f *testing.F) {
	f.Add("a b a b a b", false)
	f.Add(strings.Repeat("x ", 100), true)
	f.Fuzz(func(t *testing.T, text string, oc bool) {
		mode := ReplyDefault
		if oc {
			mode = ReplyOpenCompass
		}
		s := AnalyzeReply(text, mode)
		if s.Share < 0 || s.Share > 1 || s.Tokens < 0 || len(s.Fragment) > schemas.MaxFragmentBytes {
			t.Fatalf("stats out of range: %+v", s)
		}
	})
}

// TestAppendFieldsMatchesStringsFields: AnalyzeReply's tokenizer cuts every text as strings.Fields
// does, over ASCII and Unicode spaces (U+0085, U+00A0, U+2000…, U+3000), invalid UTF-8 and texts
// that start or end in space, and reuses what it appends to.
func TestAppendFieldsMatchesStringsFields(t *testing.T) {
	parts := []string{"a", "bc", " ", "\t", "\n", "\v", "\f", "\r", "\u0085", "\u00a0", "\u2000", "\u2028", "\u3000",
		"\u1680", "é", "日本", "\xff", "\xe2\x80", "\x80", "x\u200by", "\u180e", "\x00"}
	r := rand.New(rand.NewPCG(5, 6))
	buf := []string{"stale"}
	for i := 0; i < 20000; i++ {
		var b strings.Builder
		for n := r.IntN(12); n > 0; n-- {
			b.WriteString(parts[r.IntN(len(parts))])
		}
		s := b.String()
		buf = appendFields(buf[:0], s)
		if want := strings.Fields(s); !slices.Equal(buf, want) && !(len(buf) == 0 && len(want) == 0) {
			t.Fatalf("%q: %q, want %q", s, buf, want)
		}
	}
}
