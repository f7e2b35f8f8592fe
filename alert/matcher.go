package alert

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// MatchOp is a label matcher's operator, as in Prometheus: =, !=, =~, !~.
type MatchOp uint8

// Matcher operators.
const (
	MatchEqual MatchOp = iota + 1
	MatchNotEqual
	MatchRegexp
	MatchNotRegexp
)

// String returns the operator as written in a rules file.
func (o MatchOp) String() string {
	switch o {
	case MatchEqual:
		return "="
	case MatchNotEqual:
		return "!="
	case MatchRegexp:
		return "=~"
	case MatchNotRegexp:
		return "!~"
	}
	return "?"
}

// Matcher selects subjects by one field, like a Prometheus label matcher: the value compares byte
// for byte, and a regular expression must match the whole field (it is anchored). A field the
// subject does not have reads as the empty string.
type Matcher struct {
	Name  string
	Op    MatchOp
	Value string
	re    *regexp.Regexp
}

// ParseMatcher reads `name="value"`, `name!="value"`, `name=~"regexp"` or `name!~"regexp"`; the
// value may also be written unquoted.
func ParseMatcher(s string) (Matcher, error) {
	i := strings.IndexAny(s, "=!")
	if i <= 0 {
		return Matcher{}, fmt.Errorf("matcher %q: want name=\"value\", name!=\"value\", name=~\"re\" or name!~\"re\"", s)
	}
	m := Matcher{Name: strings.TrimSpace(s[:i])}
	rest := s[i:]
	switch {
	case strings.HasPrefix(rest, "=~"):
		m.Op, rest = MatchRegexp, rest[2:]
	case strings.HasPrefix(rest, "!~"):
		m.Op, rest = MatchNotRegexp, rest[2:]
	case strings.HasPrefix(rest, "!="):
		m.Op, rest = MatchNotEqual, rest[2:]
	case strings.HasPrefix(rest, "="):
		m.Op, rest = MatchEqual, rest[1:]
	default:
		return Matcher{}, fmt.Errorf("matcher %q: unknown operator", s)
	}
	rest = strings.TrimSpace(rest)
	if strings.HasPrefix(rest, `"`) {
		v, err := strconv.Unquote(rest)
		if err != nil {
			return Matcher{}, fmt.Errorf("matcher %q: bad quoted value: %w", s, err)
		}
		rest = v
	}
	m.Value = rest
	if m.Op == MatchRegexp || m.Op == MatchNotRegexp {
		re, err := regexp.Compile("^(?:" + m.Value + ")$")
		if err != nil {
			return Matcher{}, fmt.Errorf("matcher %q: %w", s, err)
		}
		m.re = re
	}
	return m, nil
}

// Matches reports whether v satisfies the matcher.
func (m Matcher) Matches(v string) bool {
	switch m.Op {
	case MatchEqual:
		return v == m.Value
	case MatchNotEqual:
		return v != m.Value
	case MatchRegexp:
		return m.re.MatchString(v)
	case MatchNotRegexp:
		return !m.re.MatchString(v)
	}
	return false
}

// String returns the matcher as written in a rules file.
func (m Matcher) String() string { return m.Name + m.Op.String() + strconv.Quote(m.Value) }

// matchAll reports whether fields satisfy every matcher.
func matchAll(ms []Matcher, fields map[string]string) bool {
	for _, m := range ms {
		if !m.Matches(fields[m.Name]) {
			return false
		}
	}
	return true
}
