package suite

import (
	"compress/gzip"
	"io"
	"strings"
	"sync"

	"github.com/repeatrate/repeatrate/schemas"
)

// ReplyMode selects the rules that mark a reply abnormal.
type ReplyMode uint8

const (
	// ReplyDefault flags a reply of at least 256 bytes that gzip compresses 8× or more, or a
	// fragment of 1–64 tokens repeated back to back at least 10 times covering half the reply.
	ReplyDefault ReplyMode = iota
	// ReplyOpenCompass follows OpenCompass's repeat analysis: gzip (level 9) ratio above 40, or one
	// 32-token window occurring at least 20 times at regular gaps in the second half of the reply;
	// and only replies at or above the 75th-percentile token length count (applied per version
	// when a snapshot is computed, over the replies seen so far).
	ReplyOpenCompass
)

func (m ReplyMode) String() string {
	if m == ReplyOpenCompass {
		return "opencompass"
	}
	return "default"
}

// ReplyStats is what the analysis keeps of a reply: numbers and at most a short fragment, never
// the text itself.
type ReplyStats struct {
	Tokens    int
	GzipRatio float64
	Fragment  string // the repeated fragment, clipped
	Repeats   int
	Share     float64 // share of the reply's tokens the repetition covers
	Trigger   string  // "gzip_ratio", "repeat_pattern", or "" when normal
}

// gzipRuleBytes is, per mode, the shortest text the gzip rule can flag: default mode asks for 256
// bytes; OpenCompass mode for a ratio above 40, and a gzip stream of a non-empty text is at least
// 20 bytes (a 10-byte header, an 8-byte trailer and a deflate block), so its ratio is at most
// len/20 and needs more than 800 bytes. Compressing costs more than the rest of an eval result's
// processing, so shorter replies are compressed only when another rule found them abnormal.
var gzipRuleBytes = map[ReplyMode]int{ReplyDefault: 256, ReplyOpenCompass: 801}

// AnalyzeReply measures one reply's length, compressibility and periodic repetition. GzipRatio is
// 0 for a reply too short for the gzip rule that no other rule flagged (see gzipRuleBytes).
func AnalyzeReply(text string, mode ReplyMode) (s ReplyStats) {
	toks := strings.Fields(text)
	s = ReplyStats{Tokens: len(toks)}
	if len(text) >= gzipRuleBytes[mode] {
		s.GzipRatio = gzipRatio(text)
	}
	defer func() {
		// Every abnormal-sample alert carries the ratio, whichever rule raised it.
		if s.Trigger != "" && s.GzipRatio == 0 {
			s.GzipRatio = gzipRatio(text)
		}
	}()
	ids := tokenIDs(toks)
	switch mode {
	case ReplyOpenCompass:
		if s.GzipRatio > 40 {
			s.Trigger = "gzip_ratio"
		}
		if start, n, gap := windowRepeats(ids, 32); n >= 20 {
			s.Repeats, s.Share = n, float64(min(len(ids), n*gap))/float64(len(ids))
			s.Fragment = clipFragment(toks[start : start+32])
			if s.Trigger == "" {
				s.Trigger = "repeat_pattern"
			}
		}
	default:
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
	}
	return s
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

func tokenIDs(toks []string) []int32 {
	ids := make([]int32, len(toks))
	seen := make(map[string]int32, len(toks))
	for i, t := range toks {
		id, ok := seen[t]
		if !ok {
			id = int32(len(seen))
			seen[t] = id
		}
		ids[i] = id
	}
	return ids
}

// periodicRun finds the back-to-back repetition covering most tokens: a fragment of period p
// (1..maxPeriod) starting at start, repeated `repeats` whole times over `covered` tokens.
func periodicRun(ids []int32, maxPeriod int) (start, period, repeats, covered int) {
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

// windowRepeats looks in the second half of ids for the w-token window that occurs most often at
// regular gaps; it returns its first position, occurrences and gap.
func windowRepeats(ids []int32, w int) (start, count, gap int) {
	half := len(ids) / 2
	if len(ids)-half < w {
		return 0, 0, 0
	}
	type seen struct{ first, last, gap, n int }
	windows := make(map[uint64]*seen)
	const mul = 1099511628211
	for i := half; i+w <= len(ids); i++ {
		var h uint64 = 14695981039346656037
		for _, id := range ids[i : i+w] {
			h = (h ^ uint64(id)) * mul
		}
		s := windows[h]
		switch {
		case s == nil:
			windows[h] = &seen{first: i, last: i, n: 1}
			continue
		case s.n == 1:
			s.gap = i - s.last
		case i-s.last != s.gap:
			s.n = -1 << 30 // irregular: never counts
		}
		s.last = i
		s.n++
		if s.n > count {
			start, count, gap = s.first, s.n, s.gap
		}
	}
	return start, count, gap
}

func clipFragment(toks []string) string {
	f := strings.Join(toks, " ")
	if len(f) > schemas.MaxFragmentBytes {
		f = strings.ToValidUTF8(f[:schemas.MaxFragmentBytes], "")
	}
	return f
}
