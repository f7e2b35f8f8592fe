package schemas

import (
	"bytes"
	"encoding/json"
	"strings"
)

// DuplicateMember returns the first member name that appears twice in one JSON object of b, in
// the top-level object only or, with nested, in every object. Names are compared as Go's JSON
// decoders match them to fields, case-insensitively: "workspace" and "Workspace" are the same
// member to this decoder. JSON parsers disagree on which of two equal names counts (Go's keep the
// last, many others the first), so an event with both could be authorised as one workspace and
// read by another consumer as another: it is refused. Invalid JSON reports none (the decoder then
// says what is wrong).
func DuplicateMember(b []byte, nested bool) (string, bool) {
	type frame struct {
		obj     bool
		wantKey bool
		seen    map[string]bool
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err != nil {
			return "", false
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if d, ok := tok.(json.Delim); ok {
			switch d {
			case '{', '[':
				if top != nil && top.obj {
					top.wantKey = true // after this value, a name
				}
				stack = append(stack, &frame{obj: d == '{', wantKey: d == '{', seen: map[string]bool{}})
			default:
				stack = stack[:len(stack)-1]
				if len(stack) == 0 {
					return "", false
				}
			}
			continue
		}
		switch {
		case top == nil:
			return "", false // a scalar document
		case top.obj && top.wantKey:
			name, _ := tok.(string)
			if nested || len(stack) == 1 {
				k := strings.ToLower(name)
				if top.seen[k] {
					return name, true
				}
				top.seen[k] = true
			}
			top.wantKey = false
		case top.obj:
			top.wantKey = true
		}
	}
}
