package suite

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	tiktoken "github.com/pkoukk/tiktoken-go"
	tiktokenloader "github.com/pkoukk/tiktoken-go-loader"
)

// degenerateReplies are 64 KiB replies of one long piece each: what a looping model writes and
// what made tiktoken-go's merge (a rescan of the piece after every merge) take seconds.
func degenerateReplies() []string {
	r := rand.New(rand.NewPCG(1, 2))
	var letters strings.Builder
	for letters.Len() < 64<<10 {
		letters.WriteByte(byte('a' + r.IntN(26)))
	}
	return []string{strings.Repeat("a", 64<<10), letters.String(), strings.Repeat(" ", 64<<10),
		strings.Repeat("ab", 32<<10), strings.Repeat("数", 20000), strings.Repeat("!?", 32<<10)}
}

// TestTiktokenMergeMatchesTiktokenGo: the heap merge gives tiktoken-go's ids (which
// TestTiktokenMatchesPython holds to Python's) on the tokenizer corpus and on degenerate replies.
func TestTiktokenMergeMatchesTiktokenGo(t *testing.T) {
	tiktoken.SetBpeLoader(tiktokenloader.NewOfflineLoader())
	texts := append(tokenizerTexts(), degenerateReplies()...)
	for i := range 300 { // short random pieces: every tie and order of merges
		r := rand.New(rand.NewPCG(uint64(i), 7))
		var b strings.Builder
		for range 1 + r.IntN(40) {
			b.WriteByte("aab!? \n1é"[r.IntN(9)])
		}
		texts = append(texts, b.String())
	}
	for _, tok := range []Tokenizer{TokenizerO200kBase, TokenizerCl100kBase} {
		enc, err := tiktoken.GetEncoding(tok.String())
		if err != nil {
			t.Fatal(err)
		}
		b, err := tok.bpe()
		if err != nil {
			t.Fatal(err)
		}
		bad := 0
		for i, text := range texts {
			if got, want := b.encode(text), enc.EncodeOrdinary(text); !slices.Equal(got, want) {
				if bad++; bad <= 5 {
					t.Errorf("%v text %d %q: %d ids, tiktoken-go %d", tok, i, clip(text), len(got), len(want))
				}
			}
		}
	}
}

// TestTiktokenDegenerateRepliesAreFast: a 64 KiB reply of one piece is analysed in well under a
// second (tiktoken-go's merge took 3.5–7 s for each, on this machine, loaded).
func TestTiktokenDegenerateRepliesAreFast(t *testing.T) {
	for _, tok := range []Tokenizer{TokenizerO200kBase, TokenizerCl100kBase} {
		if err := tok.Load(); err != nil {
			t.Fatal(err)
		}
		for _, text := range degenerateReplies() {
			start := time.Now()
			s := AnalyzeReply(text, ReplyOpenCompass.WithTokenizer(tok))
			if d := time.Since(start); d > 1500*time.Millisecond {
				t.Errorf("%v, %q…: %d tokens in %v", tok, text[:8], s.Tokens, d)
			}
		}
	}
}
