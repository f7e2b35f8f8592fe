package suite

import (
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
