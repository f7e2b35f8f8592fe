package schemas

import "testing"

// DuplicateMember finds an attribute name twice, exactly alike, in the top-level object, and
// nothing nested, in other spellings or in invalid JSON.
func TestDuplicateMember(t *testing.T) {
	for _, c := range []struct{ json, want string }{
		{`{"a":1,"b":2}`, ""},
		{`{"a":1,"a":2}`, "a"},
		{`{"a":{"x":1},"a":2}`, "a"},
		{`{"a":{"b":1,"b":2}}`, ""},
		{`{"a":1,"A":2}`, ""},
		{`{"a":1,`, ""},
		{`[1,2]`, ""},
		{`"s"`, ""},
	} {
		got, dup := DuplicateMember([]byte(c.json))
		if got != c.want || dup != (c.want != "") {
			t.Errorf("%s: %q %v, want %q", c.json, got, dup, c.want)
		}
	}
}

// duplicateField finds a field of the schema that the decoder would read twice — names folded as
// Go's JSON decoders match them, in the data object and its scope — and leaves names the schema
// does not read alone, as the fast path does.
func TestDuplicateField(t *testing.T) {
	for _, c := range []struct {
		json string
		eval bool
		want string
	}{
		{`{"outcome":"passed","outcome":"x"}`, false, "outcome"},
		{`{"outcome":"passed","OUTCOME":"x"}`, false, "OUTCOME"},
		{`{"scope":{"workspace":"a","Workspace":"b"}}`, false, "Workspace"},
		{`{"scope":{"workspace":"a","workſpace":"b"}}`, false, "workſpace"}, // U+017F folds to s
		{`{"scope":{"workspace":"a"},"ſcope":{"workspace":"b"}}`, false, "ſcope"},
		{`{"scope":{"workspace":"a","work\u0073pace":"b"}}`, false, "workspace"},
		{`{"suite":"a","Suite":"b"}`, true, "Suite"},
		{`{"suite":"a","Suite":"b"}`, false, ""}, // not a live attempt's field
		{`{"x":1,"X":2,"é":0}`, false, ""},
		{`{"x":{"scope":1,"scope":2}}`, false, ""},
		{`{"scope":[1,2],"outcome":"p"}`, false, ""},
		{`{"outcome":`, false, ""},
	} {
		got, dup := duplicateField([]byte(c.json), c.eval)
		if got != c.want || dup != (c.want != "") {
			t.Errorf("%s (eval %v): %q %v, want %q", c.json, c.eval, got, dup, c.want)
		}
	}
}
