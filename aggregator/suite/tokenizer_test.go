package suite

import (
	"encoding/json"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/pkoukk/tiktoken-go-loader/assets"

	"github.com/repeatrate/repeatrate/internal/testenv"
)

// tokenizerTexts is a corpus for the tokenizers: prose in several scripts, code, numbers,
// contractions in any case, white-space runs of every kind (\r\n, U+0085, U+2028, U+001C…),
// special-token text, emoji and combining marks, loops like the abnormal replies, and random code
// points from every plane.
func tokenizerTexts() []string {
	r := rand.New(rand.NewPCG(13, 0))
	pieces := []string{"The answer is 42.", "I'm", "DON'T", "they'LL", "it'S", "  ", "\n\n", "\r\n", "\t", " \u00a0",
		"\u0085", "\u2028", "\u001c", "\u001f", "数学是科学的语言。", "Ελληνικά", "русский текст", "عربى", "हिन्दी",
		"🙂🙃👍🏽", "e\u0301", "x = f(y) + 3.14159;", "func main() {\n\treturn\n}", "1234567890", "<|endoftext|>",
		"<|endofprompt|>", "http://example.com/a/b?c=d", "\u200b", "ﬁ", "Ǆ", "𝔘𝔫𝔦", "..."}
	var out []string
	for i := 0; i < 600; i++ {
		var b strings.Builder
		switch i % 4 {
		case 0: // pieces joined by white space
			for j := r.IntN(60); j >= 0; j-- {
				b.WriteString(pieces[r.IntN(len(pieces))])
				b.WriteString([]string{" ", "", "\n", "  ", "\t "}[r.IntN(5)])
			}
		case 1: // random code points of every plane (valid scalar values)
			for j := r.IntN(200); j >= 0; j-- {
				var c rune
				switch r.IntN(4) {
				case 0:
					c = rune(r.IntN(0x80))
				case 1:
					c = rune(r.IntN(0x3000))
				case 2:
					c = rune(r.IntN(0x30000))
				default:
					c = rune(r.IntN(utf8.MaxRune + 1))
				}
				if utf8.ValidRune(c) {
					b.WriteRune(c)
				}
			}
		case 2: // a loop, as abnormal replies have
			unit := pieces[r.IntN(len(pieces))] + " " + pieces[r.IntN(len(pieces))] + " "
			b.WriteString(strings.Repeat(unit, 1+r.IntN(80)))
		default: // long white-space and digit runs
			b.WriteString(strings.Repeat(" ", r.IntN(40)) + strings.Repeat("7", r.IntN(20)) + strings.Repeat("\n ", r.IntN(10)) + "end")
		}
		out = append(out, b.String())
	}
	return append(out, "", " ", "a", strings.Repeat("ab", 3000))
}

// TestTiktokenMatchesPython holds the o200k_base and cl100k_base tokenizers to Python's tiktoken
// (test/tiktoken/count.py, handed the encoding files this binary embeds, so no network): on every
// text of the corpus the same token ids, each token's text as decode([id]) gives it, and the
// reply analysis's token count in both reply modes.
func TestTiktokenMatchesPython(t *testing.T) {
	py := testenv.PythonVenv(t)
	dir := t.TempDir()
	for _, tok := range []Tokenizer{TokenizerO200kBase, TokenizerCl100kBase} {
		b, err := assets.Assets.ReadFile(tok.String() + ".tiktoken")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, tok.String()+".tiktoken"), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	texts := tokenizerTexts()
	in, _ := json.Marshal(texts)
	if err := os.WriteFile(filepath.Join(dir, "texts.json"), in, 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out.json")
	cmd := exec.Command(py, filepath.Join("..", "..", "test", "tiktoken", "count.py"), dir, filepath.Join(dir, "texts.json"), out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("count.py: %v\n%s", err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string][]struct {
		IDs    []int    `json:"ids"`
		Tokens []string `json:"tokens"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	for _, tok := range []Tokenizer{TokenizerO200kBase, TokenizerCl100kBase} {
		rows := doc[tok.String()]
		if len(rows) != len(texts) {
			t.Fatalf("%v: %d rows for %d texts", tok, len(rows), len(texts))
		}
		bpe, err := tok.bpe()
		if err != nil {
			t.Fatal(err)
		}
		bad, tokens := 0, 0
		for i, text := range texts {
			want := rows[i]
			tokens += len(want.IDs)
			ids := bpe.encode(text)
			got := tokenize(text, ReplyOpenCompass.WithTokenizer(tok))
			ok := slices.Equal(ids, want.IDs) && slices.Equal(got, want.Tokens) &&
				slices.Equal(tokenize(text, ReplyDefault.WithTokenizer(tok)), want.Tokens)
			for _, mode := range []ReplyMode{ReplyDefault, ReplyOpenCompass} {
				ok = ok && AnalyzeReply(text, mode.WithTokenizer(tok)).Tokens == len(want.IDs)
			}
			if !ok {
				if bad++; bad <= 5 {
					t.Errorf("%v, text %d %q:\n  ours   %v %q\n  Python %v %q", tok, i, clip(text), ids, got, want.IDs, want.Tokens)
				}
			}
		}
		t.Logf("%v: %d of %d texts (%d tokens) agree with Python's tiktoken", tok, len(texts)-bad, len(texts), tokens)
	}
}

func clip(s string) string {
	if len(s) > 120 {
		return strings.ToValidUTF8(s[:120], "") + "…"
	}
	return s
}

func TestPyDecodeReplace(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"abc", "abc"},
		{"\xe6\x95", "\ufffd"},                 // a cut 3-byte sequence: one replacement
		{"\x95\xb0", "\ufffd\ufffd"},           // lone continuation bytes: one each
		{"\xf0\x9f\x99", "\ufffd"},             // a cut 4-byte sequence
		{"\xe0\x80", "\ufffd\ufffd"},           // E0 80 is never well formed: E0 alone, then 80
		{"\xed\xa0\x80", "\ufffd\ufffd\ufffd"}, // a surrogate
		{"a\xffb", "a\ufffdb"},
		{"\xef\xbf\xbd", "\ufffd"}, // U+FFFD itself is valid
		{"\xc3", "\ufffd"},
	} {
		if got := pyDecodeReplace(tc.in); got != tc.want {
			t.Errorf("%q: got %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestParseTokenizer(t *testing.T) {
	for _, name := range []string{"whitespace", "o200k_base", "cl100k_base"} {
		tok, err := ParseTokenizer(name)
		if err != nil || tok.String() != name {
			t.Errorf("%s: %v %v", name, tok, err)
		}
		m := ReplyOpenCompass.WithTokenizer(tok)
		if m.Rules() != ReplyOpenCompass || m.Tokenizer() != tok || m.String() != "opencompass" {
			t.Errorf("%s: mode %d rules %v tokenizer %v", name, m, m.Rules(), m.Tokenizer())
		}
	}
	if _, err := ParseTokenizer("gpt-4o"); err == nil {
		t.Error("gpt-4o parsed as a tokenizer")
	}
}

// BenchmarkTokenize measures one reply's token count per tokenizer (a 120-word reply, about
// 700 bytes) and the whole reply analysis with it.
func BenchmarkTokenize(b *testing.B) {
	text := strings.Repeat("The model answers the question step by step, and 42 is the answer. ", 10)
	for _, tok := range []Tokenizer{TokenizerWhitespace, TokenizerO200kBase, TokenizerCl100kBase} {
		if err := tok.Load(); err != nil {
			b.Fatal(err)
		}
		for _, mode := range []ReplyMode{ReplyDefault, ReplyOpenCompass} {
			b.Run(tok.String()+"/"+mode.String(), func(b *testing.B) {
				for b.Loop() {
					AnalyzeReply(text, mode.WithTokenizer(tok))
				}
			})
		}
	}
}
