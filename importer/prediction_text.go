package importer

import (
	"bytes"
	"encoding/json"
	"math"
	"math/big"
	"sort"
	"strconv"
	"strings"
)

// predictionText is the text OpenCompass makes of a prediction (_prediction_to_text in
// opencompass/utils/repeat_analysis.py, what its abnormal-sample checks read): a string as it is;
// a number or a boolean as Python's str() writes it; null as ""; a list (a multi-round
// prediction's turns) as its items' texts joined by newlines; an object with "prediction" as that
// member's text, any other object as Python's json.dumps(sort_keys=True, ensure_ascii=False).
func predictionText(raw json.RawMessage) string {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return string(raw)
	}
	return pyText(v)
}

func pyText(v any) string {
	switch x := v.(type) {
	case nil:
		return ""
	case string:
		return x
	case bool:
		if x {
			return "True"
		}
		return "False"
	case json.Number:
		return pyNumber(x)
	case []any:
		parts := make([]string, len(x))
		for i, item := range x {
			parts[i] = pyText(item)
		}
		return strings.Join(parts, "\n")
	case map[string]any:
		if p, ok := x["prediction"]; ok {
			return pyText(p)
		}
		var b strings.Builder
		pyDump(&b, x)
		return b.String()
	}
	return ""
}

// pyNumber writes n as Python's str() of the int or float json.loads makes of it.
func pyNumber(n json.Number) string {
	s := n.String()
	if !strings.ContainsAny(s, ".eE") {
		return pyInt(s)
	}
	return pyFloat(pyParseFloat(s))
}

// pyInt is Python's str() of an integer literal, exact at any size ("-0" is 0).
func pyInt(s string) string {
	var z big.Int
	if _, ok := z.SetString(s, 10); !ok {
		return s
	}
	return z.String()
}

// pyParseFloat is Python's float() of a JSON number: beyond the float range, ±inf.
func pyParseFloat(s string) float64 {
	f, _ := strconv.ParseFloat(s, 64) // out of range: ±Inf (or ±0) with ErrRange, as Python
	return f
}

// pyFloat is Python's repr of a float: the shortest digits that round-trip, in fixed notation
// with at least one decimal when the exponent is in -4..15, else d.ddde±XX.
func pyFloat(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	case math.IsNaN(f):
		return "nan"
	}
	e := strconv.FormatFloat(f, 'e', -1, 64) // e.g. -1.25e+03
	mant, expText, _ := strings.Cut(e, "e")
	exp, _ := strconv.Atoi(expText)
	if exp < -4 || exp >= 16 {
		sign := "+"
		if exp < 0 {
			sign, exp = "-", -exp
		}
		return mant + "e" + sign + fmt2(exp)
	}
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.Contains(s, ".") {
		s += ".0"
	}
	return s
}

func fmt2(n int) string {
	if n < 10 {
		return "0" + strconv.Itoa(n)
	}
	return strconv.Itoa(n)
}

// pyDump writes v as Python's json.dumps(v, sort_keys=True, ensure_ascii=False) does.
func pyDump(b *strings.Builder, v any) {
	switch x := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		b.WriteString(strconv.FormatBool(x))
	case json.Number:
		if s := x.String(); !strings.ContainsAny(s, ".eE") {
			b.WriteString(pyInt(s))
		} else {
			switch f := pyParseFloat(s); {
			case math.IsInf(f, 1):
				b.WriteString("Infinity")
			case math.IsInf(f, -1):
				b.WriteString("-Infinity")
			default:
				b.WriteString(pyFloat(f))
			}
		}
	case string:
		pyString(b, x)
	case []any:
		b.WriteByte('[')
		for i, item := range x {
			if i > 0 {
				b.WriteString(", ")
			}
			pyDump(b, item)
		}
		b.WriteByte(']')
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Slice(keys, func(i, j int) bool { return pyLess(keys[i], keys[j]) })
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteString(", ")
			}
			pyString(b, k)
			b.WriteString(": ")
			pyDump(b, x[k])
		}
		b.WriteByte('}')
	}
}

// pyLess orders strings as Python does: by code point.
func pyLess(a, b string) bool {
	ra, rb := []rune(a), []rune(b)
	for i := 0; i < len(ra) && i < len(rb); i++ {
		if ra[i] != rb[i] {
			return ra[i] < rb[i]
		}
	}
	return len(ra) < len(rb)
}

// pyString writes s as a JSON string the way Python's json module does with ensure_ascii=False:
// only the quote, the backslash and control characters are escaped.
func pyString(b *strings.Builder, s string) {
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			if r < 0x20 {
				b.WriteString(`\u00`)
				b.WriteString(strconv.FormatInt(int64(r)>>4, 16))
				b.WriteString(strconv.FormatInt(int64(r)&15, 16))
			} else {
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
}
