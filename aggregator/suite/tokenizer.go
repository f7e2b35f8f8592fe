package suite

import (
	"fmt"
	"strings"
	"sync"
	"unicode/utf8"

	tiktoken "github.com/pkoukk/tiktoken-go"
	tiktokenloader "github.com/pkoukk/tiktoken-go-loader"
)

// Tokenizer names what the reply analysis counts as a token (docs/semantics.md#replies).
type Tokenizer uint8

const (
	// TokenizerWhitespace cuts a reply into white-space separated words (the default).
	TokenizerWhitespace Tokenizer = iota
	// TokenizerO200kBase is tiktoken's o200k_base encoding (GPT-4o and later), offline.
	TokenizerO200kBase
	// TokenizerCl100kBase is tiktoken's cl100k_base encoding (GPT-4, GPT-3.5), offline.
	TokenizerCl100kBase
)

var tokenizerNames = [...]string{"whitespace", "o200k_base", "cl100k_base"}

func (t Tokenizer) String() string {
	if int(t) < len(tokenizerNames) {
		return tokenizerNames[t]
	}
	return fmt.Sprintf("tokenizer(%d)", uint8(t))
}

// ParseTokenizer returns the tokenizer of a name: whitespace, o200k_base or cl100k_base.
func ParseTokenizer(name string) (Tokenizer, error) {
	for i, n := range tokenizerNames {
		if n == name {
			return Tokenizer(i), nil
		}
	}
	return 0, fmt.Errorf("tokenizer %q is not one of %s", name, strings.Join(tokenizerNames[:], ", "))
}

// bpe is one tiktoken encoding, loaded once from the encoding file embedded in the binary
// (github.com/pkoukk/tiktoken-go-loader; no network), with each token's text as Python's
// tiktoken decode([id]) gives it.
type bpe struct {
	once sync.Once
	enc  *tiktoken.Tiktoken
	text []string // by token id
	err  error
}

var (
	bpes       = map[Tokenizer]*bpe{TokenizerO200kBase: {}, TokenizerCl100kBase: {}}
	loaderOnce sync.Once
)

// Load prepares the tokenizer (o200k_base: about 0.25 s and 30 MB of heap, once per process),
// so that the first reply does not pay for it; the analysis loads it on first use otherwise.
func (t Tokenizer) Load() error {
	if t == TokenizerWhitespace {
		return nil
	}
	_, err := t.bpe()
	return err
}

func (t Tokenizer) bpe() (*bpe, error) {
	b := bpes[t]
	if b == nil {
		return nil, fmt.Errorf("unknown %v", t)
	}
	b.once.Do(func() {
		loaderOnce.Do(func() { tiktoken.SetBpeLoader(tiktokenloader.NewOfflineLoader()) })
		b.enc, b.err = tiktoken.GetEncoding(t.String())
		if b.err != nil {
			return
		}
		// Token ids run from 0 with at most a few gaps (before the special tokens, which
		// EncodeOrdinary never produces); stop after a long run of unknown ids.
		for id, misses := 0, 0; misses < 1024; id++ {
			tok := b.enc.Decode([]int{id})
			if tok == "" {
				misses++
			} else {
				misses = 0
			}
			b.text = append(b.text, pyDecodeReplace(tok))
		}
	})
	return b, b.err
}

// tokenize cuts text into the tokens mode's rules and tokenizer take: for the whitespace
// tokenizer Go's strings.Fields in the default rules and Python's str.split() in the opencompass
// rules (pyFields); for a tiktoken encoding the texts of encode(text, disallowed_special=()) —
// special-token text is ordinary text — each as decode([id]) gives it, so byte pieces of one
// character read as U+FFFD as they do in OpenCompass's analysis.
func tokenize(text string, mode ReplyMode) []string {
	switch t := mode.Tokenizer(); t {
	case TokenizerWhitespace:
		if mode.Rules() == ReplyOpenCompass {
			return pyFields(text)
		}
		return strings.Fields(text)
	default:
		b, err := t.bpe()
		if err != nil {
			panic(err) // embedded encoding files: cannot fail but by a broken build
		}
		ids := b.enc.EncodeOrdinary(text)
		toks := make([]string, len(ids))
		for i, id := range ids {
			toks[i] = b.text[id]
		}
		return toks
	}
}

// pyDecodeReplace is Python's bytes.decode("utf-8", errors="replace") of s: each maximal
// prefix of a well-formed sequence that is cut short (or a byte that starts none) becomes one
// U+FFFD, as the Unicode standard recommends and Python does (Go's range loop gives one per byte).
func pyDecodeReplace(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for len(s) > 0 {
		r, size := utf8.DecodeRuneInString(s)
		if r != utf8.RuneError || size > 1 {
			b.WriteString(s[:size])
			s = s[size:]
			continue
		}
		b.WriteRune(utf8.RuneError)
		s = s[maximalSubpart(s):]
	}
	return b.String()
}

// maximalSubpart is the length of the longest prefix of s (at least 1) that begins a well-formed
// UTF-8 sequence, for an s that does not begin with one.
func maximalSubpart(s string) int {
	lo, hi, need := byte(0x80), byte(0xbf), 0
	switch c := s[0]; {
	case c >= 0xc2 && c <= 0xdf:
		need = 1
	case c == 0xe0:
		need, lo = 2, 0xa0
	case c == 0xed:
		need, hi = 2, 0x9f
	case c >= 0xe1 && c <= 0xef:
		need = 2
	case c == 0xf0:
		need, lo = 3, 0x90
	case c >= 0xf1 && c <= 0xf3:
		need = 3
	case c == 0xf4:
		need, hi = 3, 0x8f
	default:
		return 1
	}
	i := 1
	for ; i <= need && i < len(s) && s[i] >= lo && s[i] <= hi; i++ {
		lo, hi = 0x80, 0xbf
	}
	return i
}
