package suite

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/repeatrate/repeatrate/internal/testenv"
)

// oracleReply is what OpenCompass's own analysis says of one reply (test/opencompass/oracle.py).
type oracleReply struct {
	Text                string  `json:"text"`
	Length              int     `json:"length"`
	Skipped             bool    `json:"skipped"`
	Count               int     `json:"count"`
	Ratio               float64 `json:"ratio"`
	Pattern             string  `json:"pattern"`
	Gzip                float64 `json:"gzip"`
	RepeatPattern       bool    `json:"repeat_pattern"`
	GzipHighCompression bool    `json:"gzip_high_compression"`
}

// TestOpenCompassOracle runs OpenCompass's repeat analysis (the PyPI package's own code) on a
// generated corpus — loops near the count threshold, uneven gaps, short replies around 64 and 128
// tokens, single-token runs, texts near the gzip threshold, multi-block random text, every Unicode
// white space — and requires the opencompass mode to agree on every reply: token count, pattern
// count, ratio and fragment, gzip ratio (bit for bit) and both verdicts; and Python's white space
// to be pySpace on every code point.
func TestOpenCompassOracle(t *testing.T) {
	py := testenv.PythonVenv(t)
	out := filepath.Join(t.TempDir(), "oracle.json")
	cmd := exec.Command(py, filepath.Join("..", "..", "test", "opencompass", "oracle.py"), out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("oracle.py: %v\n%s", err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		OpenCompass string        `json:"opencompass"`
		Space       []rune        `json:"space"`
		Replies     []oracleReply `json:"replies"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	space := make(map[rune]bool, len(doc.Space))
	for _, r := range doc.Space {
		space[r] = true
	}
	for r := rune(0); r <= utf8.MaxRune; r++ {
		if utf8.ValidRune(r) && pySpace(r) != space[r] {
			t.Errorf("U+%04X: pySpace %v, Python's isspace %v", r, pySpace(r), space[r])
		}
	}
	disagree, flagged := 0, 0
	for i, w := range doc.Replies {
		s := AnalyzeReply(w.Text, ReplyOpenCompass)
		gz := ocGzipRatio(ocHalfText(w.Text))
		frag := ""
		if w.Count > 0 {
			frag = clipFragment(strings.Split(w.Pattern, " "))
		}
		ok := !w.Skipped && s.Tokens == w.Length && s.Repeats == w.Count && s.Share == w.Ratio &&
			s.Fragment == frag && gz == w.Gzip && (s.GzipRatio == 0 || s.GzipRatio == w.Gzip) &&
			(s.Trigger == "gzip_ratio") == w.GzipHighCompression &&
			(s.Trigger == "repeat_pattern") == (w.RepeatPattern && !w.GzipHighCompression)
		if w.RepeatPattern || w.GzipHighCompression {
			flagged++
		}
		if !ok {
			disagree++
			if disagree <= 10 {
				t.Errorf("reply %d (%d bytes): ours %+v (gzip of the half %v), OpenCompass %+v", i, len(w.Text), s, gz,
					oracleReply{Length: w.Length, Skipped: w.Skipped, Count: w.Count, Ratio: w.Ratio, Gzip: w.Gzip,
						RepeatPattern: w.RepeatPattern, GzipHighCompression: w.GzipHighCompression})
			}
		}
	}
	t.Logf("OpenCompass %s: %d of %d replies agree (%d abnormal for OpenCompass)", doc.OpenCompass,
		len(doc.Replies)-disagree, len(doc.Replies), flagged)
	if len(doc.Replies) < 1000 || flagged == 0 || flagged == len(doc.Replies) {
		t.Fatalf("corpus of %d replies, %d abnormal: too small or one-sided", len(doc.Replies), flagged)
	}
}
