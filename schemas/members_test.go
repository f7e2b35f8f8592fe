package schemas

import "testing"

// DuplicateMember finds a name twice in one object, in the top-level object only or in every
// object, case-insensitively, and nothing across objects or in invalid JSON.
func TestDuplicateMember(t *testing.T) {
	for _, c := range []struct {
		json   string
		nested bool
		want   string
	}{
		{`{"a":1,"b":2}`, true, ""},
		{`{"a":1,"a":2}`, false, "a"},
		{`{"a":{"b":1,"b":2}}`, false, ""},
		{`{"a":{"b":1,"b":2}}`, true, "b"},
		{`{"a":[{"b":1},{"b":2}],"c":3}`, true, ""},
		{`{"a":[{"b":1,"B":2}]}`, true, "B"},
		{`{"a":{"x":1},"a":2}`, false, "a"},
		{`{"a":1,`, true, ""},
		{`[1,2]`, true, ""},
		{`"s"`, true, ""},
	} {
		got, dup := DuplicateMember([]byte(c.json), c.nested)
		if got != c.want || dup != (c.want != "") {
			t.Errorf("%s (nested %v): %q %v, want %q", c.json, c.nested, got, dup, c.want)
		}
	}
}
