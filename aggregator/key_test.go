package aggregator

import (
	"testing"

	"github.com/repeatrate/repeatrate/schemas"
)

func TestKeyStringIsInjective(t *testing.T) {
	sc := func(w, m string) schemas.Scope {
		return schemas.Scope{Workspace: w, Model: m, Run: "r", Checkpoint: "c", Artifact: "a"}
	}
	keys := []Key{
		{Scope: sc("a:b", "c"), CorrectionID: "x", Source: Live},
		{Scope: sc("a", "b:c"), CorrectionID: "x", Source: Live},
		{Scope: sc("a|b", "c"), CorrectionID: "x", Source: Live},
		{Scope: sc("a", "b|c"), CorrectionID: "x", Source: Live},
		{Scope: sc("a%7Cb", "c"), CorrectionID: "x", Source: Live},
		{Scope: sc("a}b", "c"), CorrectionID: "x", Source: Live},
		{Scope: sc("a{b", "c"), CorrectionID: "x", Source: Live},
		{Scope: sc("a", "c"), CorrectionID: "x|live", Source: Evaluation},
		{Scope: sc("a", "c"), CorrectionID: "x", Source: Evaluation},
		{Scope: sc("a b", "c"), CorrectionID: "x", Source: Live},
		{Scope: sc("a\nb", "c"), CorrectionID: "x", Source: Live},
		{Scope: sc("ä", "c"), CorrectionID: "x", Source: Live},
	}
	seen := map[string]Key{}
	for _, k := range keys {
		s := k.String()
		if prev, ok := seen[s]; ok {
			t.Fatalf("%+v and %+v share key %q", prev, k, s)
		}
		seen[s] = k
		for _, c := range s {
			if c == '{' || c == '}' || c <= ' ' || c >= 0x7f {
				t.Fatalf("key %q holds %q, which could break a hash tag or a log line", s, c)
			}
		}
	}
}

func FuzzKeyString(f *testing.F) {
	f.Add("a:b", "c", "a", "b:c")
	f.Add("a|b", "c", "a", "b|c")
	f.Fuzz(func(t *testing.T, w1, m1, w2, m2 string) {
		k1 := Key{Scope: schemas.Scope{Workspace: w1, Model: m1}, Source: Live}
		k2 := Key{Scope: schemas.Scope{Workspace: w2, Model: m2}, Source: Live}
		if k1 != k2 && k1.String() == k2.String() {
			t.Fatalf("%q/%q and %q/%q share %q", w1, m1, w2, m2, k1.String())
		}
	})
}
