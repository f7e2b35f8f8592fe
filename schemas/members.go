package schemas

import (
	"bytes"
	"encoding/json"
	"strings"
	"unicode"
)

// DuplicateMember returns the first member name that appears twice, spelt exactly alike, in the
// top-level object of b: CloudEvents attributes are matched by their exact names. JSON parsers
// disagree on which of two equal names counts (Go's keep the last, many others the first), so an
// event with both could be authorised by one reading and read by another consumer in another: it
// is refused. Invalid JSON reports none (the decoder then says what is wrong).
func DuplicateMember(b []byte) (string, bool) {
	dec := json.NewDecoder(bytes.NewReader(b))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return "", false
	}
	seen := map[string]bool{}
	dup := ""
	walkObject(dec, func(name string, dec *json.Decoder) bool {
		if seen[name] {
			dup = name
			return false
		}
		seen[name] = true
		return skipValue(dec)
	})
	return dup, dup != ""
}

// duplicateField returns the first member of the data of an event (eval: an eval result) that
// the decoder would read twice: a name of the schema appearing twice, in the data object or its
// scope, as Go's JSON decoders match names to fields (case-insensitively, with Unicode simple
// folding: "workspace", "Workspace" and "workſpace" are one field). Names the schema does not
// read are left alone, as the fast path leaves them.
func duplicateField(data []byte, eval bool) (string, bool) {
	fields := liveNames
	if eval {
		fields = evalNames
	}
	dup := ""
	dec := json.NewDecoder(bytes.NewReader(data))
	var walk func(known []string) bool
	walk = func(known []string) bool {
		seen := map[string]bool{}
		return walkObject(dec, func(name string, dec *json.Decoder) bool {
			k := fold(name)
			field := ""
			for _, f := range known {
				if fold(f) == k {
					field = f
				}
			}
			if field == "" {
				return skipValue(dec)
			}
			if seen[k] {
				dup = name
				return false
			}
			seen[k] = true
			if field == "scope" {
				if t, err := dec.Token(); err != nil || t != json.Delim('{') {
					return err == nil && skipRest(dec, t)
				}
				return walk(scopeNames)
			}
			return skipValue(dec)
		})
	}
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return "", false
	}
	walk(fields)
	return dup, dup != ""
}

// walkObject calls member for each member name of the object whose '{' dec has just read, with
// dec positioned at its value (which member must consume); it stops when member returns false or
// the JSON is invalid, and reports whether it reached the object's end.
func walkObject(dec *json.Decoder, member func(name string, dec *json.Decoder) bool) bool {
	for {
		t, err := dec.Token()
		if err != nil {
			return false
		}
		if t == json.Delim('}') {
			return true
		}
		name, ok := t.(string)
		if !ok || !member(name, dec) {
			return false
		}
	}
}

// skipValue consumes the next value of dec.
func skipValue(dec *json.Decoder) bool {
	t, err := dec.Token()
	return err == nil && skipRest(dec, t)
}

// skipRest consumes the rest of the value whose first token t dec has read.
func skipRest(dec *json.Decoder, t json.Token) bool {
	if t != json.Delim('{') && t != json.Delim('[') {
		return true
	}
	for depth := 1; depth > 0; {
		t, err := dec.Token()
		if err != nil {
			return false
		}
		switch t {
		case json.Delim('{'), json.Delim('['):
			depth++
		case json.Delim('}'), json.Delim(']'):
			depth--
		}
	}
	return true
}

// fold maps a name to the same string as every name Go's JSON decoders match to it: each rune to
// the least of its simple case folding orbit (bytes.EqualFold's equality).
func fold(name string) string {
	var b strings.Builder
	for _, r := range name {
		least := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			least = min(least, f)
		}
		b.WriteRune(least)
	}
	return b.String()
}
