package suite

import (
	"fmt"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
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
// tiktoken decode([id]) gives it. It splits text with the encoding's pattern (the regexp2 engine
// github.com/pkoukk/tiktoken-go uses) and merges each piece as tiktoken does, lowest rank first
// and leftmost among equals, but with a heap: tiktoken-go rescans the piece after every merge,
// which took 3–7 s for one 64 KiB reply without white space (a degenerate reply such as "aaa…").
type bpe struct {
	once  sync.Once
	re    *regexp2.Regexp
	ranks map[string]int
	text  []string // by token id
	err   error
}

// tiktokenEncodings are the encodings' download addresses (the loader's keys) and split
// patterns, as tiktoken's openai_public.py defines them (in tiktoken-go's regexp2 syntax).
var tiktokenEncodings = map[Tokenizer]struct{ url, pattern string }{
	TokenizerO200kBase: {"https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken", strings.Join([]string{
		`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
		`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
		`\p{N}{1,3}`,
		` ?[^\s\p{L}\p{N}]+[\r\n/]*`,
		`\s*[\r\n]+`,
		`\s+(?!\S)`,
		`\s+`,
	}, "|")},
	TokenizerCl100kBase: {"https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken",
		`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`},
}

var bpes = map[Tokenizer]*bpe{TokenizerO200kBase: {}, TokenizerCl100kBase: {}}

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
		enc := tiktokenEncodings[t]
		if b.ranks, b.err = tiktokenloader.NewOfflineLoader().LoadTiktokenBpe(enc.url); b.err != nil {
			return
		}
		if b.re, b.err = regexp2.Compile(enc.pattern, regexp2.None); b.err != nil {
			return
		}
		top := 0
		for _, id := range b.ranks {
			top = max(top, id)
		}
		b.text = make([]string, top+1)
		for tok, id := range b.ranks {
			b.text[id] = pyDecodeReplace(tok)
		}
	})
	return b, b.err
}

// encode is tiktoken's encode_ordinary: the ids of text's pieces, special-token text included as
// ordinary text.
func (b *bpe) encode(text string) []int {
	var ids []int
	m, err := b.re.FindStringMatch(text)
	for m != nil && err == nil {
		piece := m.String()
		if id, ok := b.ranks[piece]; ok {
			ids = append(ids, id)
		} else {
			ids = b.merge(ids, piece)
		}
		m, err = b.re.FindNextMatch(m)
	}
	return ids
}

// merge appends the ids of piece's byte-pair encoding: starting from single bytes, the adjacent
// pair whose concatenation has the lowest rank is merged, the leftmost of equal ranks, until no
// pair has a rank — tiktoken's byte_pair_merge, in O(n log n). A part is named by its start
// offset, which a merge never changes; next links the parts.
func (b *bpe) merge(ids []int, piece string) []int {
	n := len(piece)
	if n == 1 {
		return append(ids, b.ranks[piece])
	}
	next, prev, ver := make([]int, n), make([]int, n), make([]int, n)
	for i := range n {
		next[i], prev[i] = i+1, i-1
	}
	h := make(mergeHeap, 0, n)
	// push queues the merge of part i with the one after it, when their bytes are a token.
	push := func(i int) {
		ver[i]++
		if j := next[i]; j < n {
			if r, ok := b.ranks[piece[i:next[j]]]; ok {
				h.push(mergeItem{rank: r, pos: i, ver: ver[i]})
			}
		}
	}
	for i := 0; i+1 < n; i++ {
		push(i)
	}
	for len(h) > 0 {
		it := h.pop()
		i := it.pos
		if it.ver != ver[i] {
			continue // the part or its neighbour changed since
		}
		j := next[i]
		next[i] = next[j]
		if next[j] < n {
			prev[next[j]] = i
		}
		ver[j]++ // j is gone
		push(i)
		if p := prev[i]; p >= 0 {
			push(p)
		}
	}
	for i := 0; i < n; i = next[i] {
		ids = append(ids, b.ranks[piece[i:next[i]]])
	}
	return ids
}

type mergeItem struct{ rank, pos, ver int }

// mergeHeap is a binary min-heap of merges by rank, then position.
type mergeHeap []mergeItem

func (h mergeHeap) less(a, b int) bool {
	return h[a].rank < h[b].rank || (h[a].rank == h[b].rank && h[a].pos < h[b].pos)
}

func (h *mergeHeap) push(it mergeItem) {
	*h = append(*h, it)
	s := *h
	for k := len(s) - 1; k > 0; {
		p := (k - 1) / 2
		if !s.less(k, p) {
			break
		}
		s[k], s[p] = s[p], s[k]
		k = p
	}
}

func (h *mergeHeap) pop() mergeItem {
	s := *h
	top := s[0]
	last := len(s) - 1
	s[0] = s[last]
	s = s[:last]
	for k := 0; ; {
		c := 2*k + 1
		if c >= len(s) {
			break
		}
		if c+1 < len(s) && s.less(c+1, c) {
			c++
		}
		if !s.less(c, k) {
			break
		}
		s[k], s[c] = s[c], s[k]
		k = c
	}
	*h = s
	return top
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
		ids := b.encode(text)
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
