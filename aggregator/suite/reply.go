package suite

import (
	"compress/gzip"
	"io"
	"slices"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"github.com/repeatrate/repeatrate/schemas"
)

// ReplyMode selects the rules that mark a reply abnormal (ReplyDefault or ReplyOpenCompass, in
// its low four bits: Rules) and the tokenizer that cuts it into tokens (its high four bits:
// Tokenizer, whitespace when 0; set by WithTokenizer). Compare modes by Rules().
type ReplyMode uint8

const (
	// ReplyDefault flags a reply of at least 256 bytes that gzip compresses 8× or more, or a
	// fragment of 1–64 tokens repeated back to back at least 10 times covering half the reply.
	ReplyDefault ReplyMode = iota
	// ReplyOpenCompass is OpenCompass's repeat analysis (opencompass/utils/repeat_analysis.py),
	// verdict for verdict on whitespace tokens as Python's str.split() cuts them: over the second
	// half of the reply, a gzip ratio (zlib level 9) above 40, or a 32-token window sampled near
	// its end that occurs more than 20 times with its two commonest gaps covering 90 % of the
	// gaps; and only replies at or above the 75th-percentile token length count (applied per
	// version when a snapshot is computed, over the replies seen so far). See analyzeOpenCompass.
	ReplyOpenCompass
)

// String names the mode's rules.
func (m ReplyMode) String() string {
	if m.Rules() == ReplyOpenCompass {
		return "opencompass"
	}
	return "default"
}

// Rules returns the mode without its tokenizer: ReplyDefault or ReplyOpenCompass.
func (m ReplyMode) Rules() ReplyMode { return m & 0x0f }

// Tokenizer returns what the mode counts as a token.
func (m ReplyMode) Tokenizer() Tokenizer { return Tokenizer(m >> 4) }

// WithTokenizer returns the mode's rules with tokenizer t.
func (m ReplyMode) WithTokenizer(t Tokenizer) ReplyMode { return m.Rules() | ReplyMode(t)<<4 }

// ReplyStats is what the analysis keeps of a reply: numbers and at most a short fragment, never
// the text itself.
type ReplyStats struct {
	Tokens    int
	GzipRatio float64
	// Fragment, Repeats and Share describe the reply's repetition when a rule found it abnormal
	// (what an abnormal sample reports); they are zero for a normal reply.
	Fragment string // the repeated fragment, clipped
	Repeats  int
	Share    float64 // share of the reply's tokens the repetition covers (OpenCompass: its repeat_pattern_ratio)
	Trigger  string  // "gzip_ratio", "repeat_pattern", or "" when normal
}

// gzipRuleBytes is, per mode, the shortest text the gzip rule can flag: default mode asks for 256
// bytes; OpenCompass mode for a ratio above 40 of the reply's second half, and a gzip stream of a
// non-empty text is at least 20 bytes (a 10-byte header, an 8-byte trailer and a deflate block),
// so its ratio is at most len/20 and the half needs more than 800 bytes. Compressing costs more
// than the rest of an eval result's processing, so shorter replies are compressed only when
// another rule found them abnormal.
var gzipRuleBytes = map[ReplyMode]int{ReplyDefault: 256, ReplyOpenCompass: 801}

// AnalyzeReply measures one reply's length, compressibility and periodic repetition. GzipRatio is
// 0 for a reply too short for the gzip rule that no other rule flagged (see gzipRuleBytes).
func AnalyzeReply(text string, mode ReplyMode) (s ReplyStats) {
	if mode.Rules() == ReplyOpenCompass {
		return analyzeOpenCompass(text, mode)
	}
	var toks []string
	if mode.Tokenizer() == TokenizerWhitespace {
		// What tokenize gives, in a slice of the pool's.
		buf := fieldsPool.Get().(*[]string)
		toks = appendFields((*buf)[:0], text)
		defer func() {
			if cap(toks) <= maxPooledFields {
				clear(toks) // hold no reference to the text in the pool
				*buf = toks[:0]
				fieldsPool.Put(buf)
			}
		}()
	} else {
		toks = tokenize(text, mode)
	}
	s = ReplyStats{Tokens: len(toks)}
	if len(text) >= gzipRuleBytes[ReplyDefault] {
		s.GzipRatio = gzipRatio(text)
	}
	defer func() {
		// Every abnormal-sample alert carries the ratio, whichever rule raised it.
		if s.Trigger != "" && s.GzipRatio == 0 {
			s.GzipRatio = gzipRatio(text)
		}
	}()
	// The repetition rule looks at the back-to-back repetition covering most tokens over periods
	// up to 64. Repeated 10 times or more, its period is at most a tenth of the reply, so it is
	// also the one covering most over those short periods: when that one does not trigger the
	// rule, neither does the full search, and a reply the gzip rule passed too is normal and
	// reports no repetition. Most replies end here, without numbering their tokens.
	if !(len(text) >= 256 && s.GzipRatio >= 8) {
		_, _, r, c := periodicRun(toks, min(64, len(toks)/10))
		if r < 10 || 2*c < len(toks) {
			return s
		}
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
	return s
}

// fieldsPool holds the token slices of AnalyzeReply's whitespace tokenizer for reuse: a new slice
// per reply was the largest allocation of an eval result's processing. Slices grown beyond
// maxPooledFields tokens are left to the collector.
var fieldsPool = sync.Pool{New: func() any { return new([]string) }}

const maxPooledFields = 1 << 12

// asciiSpace marks the ASCII bytes unicode.IsSpace reports as space.
var asciiSpace = [utf8.RuneSelf]bool{'\t': true, '\n': true, '\v': true, '\f': true, '\r': true, ' ': true}

// appendFields appends to dst the fields of s as strings.Fields cuts them (around runs of
// unicode.IsSpace; a byte of invalid UTF-8 is not space), without allocating but to grow dst.
func appendFields(dst []string, s string) []string {
	start := -1
	for i := 0; i < len(s); {
		size, space := 1, false
		if c := s[i]; c < utf8.RuneSelf {
			space = asciiSpace[c]
		} else {
			var r rune
			r, size = utf8.DecodeRuneInString(s[i:])
			space = unicode.IsSpace(r)
		}
		switch {
		case space && start >= 0:
			dst = append(dst, s[start:i])
			start = -1
		case !space && start < 0:
			start = i
		}
		i += size
	}
	if start >= 0 {
		dst = append(dst, s[start:])
	}
	return dst
}

// gzipWriters holds level-9 gzip writers for reuse: a new one allocates about 800 KB of
// compressor state, which cost more than the rest of an eval result's processing together.
var gzipWriters = sync.Pool{New: func() any {
	w, _ := gzip.NewWriterLevel(io.Discard, gzip.BestCompression)
	return w
}}

// byteCounter counts what is written to it.
type byteCounter int

func (c *byteCounter) Write(p []byte) (int, error) {
	*c += byteCounter(len(p))
	return len(p), nil
}

func gzipRatio(text string) float64 {
	if len(text) == 0 {
		return 0
	}
	var n byteCounter
	w := gzipWriters.Get().(*gzip.Writer)
	w.Reset(&n)
	io.WriteString(w, text)
	w.Close()
	w.Reset(io.Discard) // hold no reference to n in the pool
	gzipWriters.Put(w)
	return float64(len(text)) / float64(n)
}

// idMaps holds token → id maps for reuse by tokenIDs: making one per reply cost a third of a short
// reply's analysis. A map that grew past maxPooledIDs is left to the collector, so that clearing
// a pooled one stays cheap.
var idMaps = sync.Pool{New: func() any { return make(map[string]int32, 64) }}

const maxPooledIDs = 1024

// tokenIDs numbers toks by first appearance, so that equal tokens get equal ids.
func tokenIDs(toks []string) []int32 {
	ids := make([]int32, len(toks))
	seen := idMaps.Get().(map[string]int32)
	for i, t := range toks {
		id, ok := seen[t]
		if !ok {
			id = int32(len(seen))
			seen[t] = id
		}
		ids[i] = id
	}
	if len(seen) <= maxPooledIDs {
		clear(seen)
		idMaps.Put(seen)
	}
	return ids
}

// periodicRun finds the back-to-back repetition covering most tokens: a fragment of period p
// (1..maxPeriod) starting at start, repeated `repeats` whole times over `covered` tokens. Of
// equal coverings the first found (the shortest period, then the earliest) wins.
func periodicRun[T comparable](ids []T, maxPeriod int) (start, period, repeats, covered int) {
	for p := 1; p <= maxPeriod && 2*p <= len(ids); p++ {
		run, runStart := 0, 0
		for i := 0; i+p < len(ids); i++ {
			if ids[i] == ids[i+p] {
				if run == 0 {
					runStart = i
				}
				run++
			} else {
				run = 0
			}
			if c := run + p; run >= p && c > covered {
				start, period, repeats, covered = runStart, p, c/p, c
			}
		}
	}
	return start, period, repeats, covered
}

func clipFragment(toks []string) string {
	f := strings.Join(toks, " ")
	if len(f) > schemas.MaxFragmentBytes {
		f = strings.ToValidUTF8(f[:schemas.MaxFragmentBytes], "")
	}
	return f
}

// OpenCompass's repeat-analysis constants (opencompass/utils/repeat_analysis.py).
const (
	ocPatternSize   = 32   // PATTERN_SIZE: tokens per window
	ocSamples       = 5    // NUM_SAMPLE_PATTERNS: windows sampled from the tail
	ocMinCount      = 20   // MIN_PATTERN_COUNT: a pattern is abnormal above it, tried from it
	ocConcentration = 0.9  // MIN_PATTERN_INTERVAL_CONCENTRATION: share of the two commonest gaps
	ocGzipThreshold = 40.0 // GZIP_THRESHOLD: a gzip ratio above it is abnormal
	ocGzipOverhead  = 18   // gzip.compress: 10-byte header and 8-byte trailer around the deflate
)

// analyzeOpenCompass is OpenCompass's analysis of one candidate reply (its _analyze_benchmark,
// step 5, and _build_abnormal_samples), on the tokens of mode's tokenizer:
//   - the tokens are Python's str.split() of the text (pyFields), or a tiktoken encoding's token
//     texts as OpenCompass's TokenizerWrapper makes them (tokenize); Tokens is their number;
//   - the pattern statistics are taken over the second half of the tokens (ocRepeatPattern);
//   - the gzip ratio is the second half of the text, cut at half its characters (code points,
//     not bytes), over its gzip.compress size, which is zlib's level-9 deflate plus 18 bytes;
//   - the reply is abnormal when the ratio is above 40 (gzip_ratio, which wins when both hold)
//     or the pattern's count is above 20 (repeat_pattern).
//
// Repeats, Share and Fragment are OpenCompass's repeat_pattern_count, repeat_pattern_ratio and
// repeat_pattern (clipped; empty when no window qualified). GzipRatio is 0 when the half is too
// short for the gzip rule and the reply is normal (gzipRuleBytes). The 75th-percentile gate is
// applied per version by the summary, not here.
func analyzeOpenCompass(text string, mode ReplyMode) ReplyStats {
	toks := tokenize(text, mode)
	s := ReplyStats{Tokens: len(toks)}
	half := toks[len(toks)/2:]
	count, ratio, off := ocRepeatPattern(half)
	if count > 0 {
		s.Repeats, s.Share = count, ratio
		s.Fragment = clipFragment(half[off : off+ocPatternSize])
	}
	halfText := ocHalfText(text)
	if len(halfText) >= gzipRuleBytes[ReplyOpenCompass] || count > ocMinCount {
		s.GzipRatio = ocGzipRatio(halfText)
	}
	switch {
	case s.GzipRatio > ocGzipThreshold:
		s.Trigger = "gzip_ratio"
	case count > ocMinCount:
		s.Trigger = "repeat_pattern"
	}
	return s
}

// pySpace reports whether Python's str.isspace() holds for r: Unicode White_Space (Go's
// unicode.IsSpace) and, beyond it, the separators U+001C–U+001F.
func pySpace(r rune) bool {
	return unicode.IsSpace(r) || (r >= 0x1c && r <= 0x1f)
}

// pyFields splits text as Python's str.split() without arguments does.
func pyFields(text string) []string { return strings.FieldsFunc(text, pySpace) }

// ocHalfText is Python's text[len(text) // 2:]: the second half by code points.
func ocHalfText(text string) string {
	skip := utf8.RuneCountInString(text) / 2
	for i := range text {
		if skip == 0 {
			return text[i:]
		}
		skip--
	}
	return ""
}

// ocGzipRatio is OpenCompass's _gzip_compression_ratio: UTF-8 bytes over gzip.compress bytes,
// 0 for an empty text.
func ocGzipRatio(text string) float64 {
	if text == "" {
		return 0
	}
	return float64(len(text)) / float64(zlibDeflateSize([]byte(text))+ocGzipOverhead)
}

// ocRepeatPattern is OpenCompass's _repeat_pattern_stats over toks: it samples windows of 32
// tokens from the tail (from max(n/2, n−192), about five evenly stepped), skips repeats of a
// sampled window, and for each finds every position the window occurs at in toks (overlaps
// included). A window with at least 20 occurrences whose two commonest gaps between consecutive
// occurrences make at least 90 % of the gaps scores (that share · occurrences · 32 / n); the best
// score wins, the first on ties. It returns the winner's occurrences, its score capped at 1 and
// its offset; 0, 0, 0 when none qualified or toks has fewer than 64 tokens.
func ocRepeatPattern(toks []string) (count int, ratio float64, offset int) {
	n := len(toks)
	if n < 2*ocPatternSize {
		return 0, 0, 0
	}
	ids := tokenIDs(toks)
	tailStart := max(n/2, n-ocPatternSize*(ocSamples+1))
	available := n - tailStart - ocPatternSize + 1 // ≥ 1, since n ≥ 64
	step := max(1, available/ocSamples)
	var (
		best    float64
		sampled [][]int32
		gaps    = make(map[int]int)
	)
	offset = tailStart
next:
	for i := tailStart; i < tailStart+available; i += step {
		target := ids[i : i+ocPatternSize]
		for _, t := range sampled {
			if slices.Equal(t, target) {
				continue next
			}
		}
		sampled = append(sampled, target)
		c, last := 0, -1
		clear(gaps)
		for j := 0; j+ocPatternSize <= n; j++ {
			if ids[j] != target[0] || !slices.Equal(ids[j:j+ocPatternSize], target) {
				continue
			}
			if last >= 0 {
				gaps[j-last]++
			}
			c, last = c+1, j
		}
		if c < ocMinCount {
			continue
		}
		top1, top2 := 0, 0
		for _, k := range gaps {
			switch {
			case k > top1:
				top1, top2 = k, top1
			case k > top2:
				top2 = k
			}
		}
		share := float64(top1+top2) / float64(c-1)
		if share < ocConcentration {
			continue
		}
		if r := share * float64(c) * ocPatternSize / float64(n); r > best {
			best, offset, count = r, i, c
		}
	}
	if count == 0 {
		return 0, 0, 0
	}
	return count, min(best, 1), offset
}
