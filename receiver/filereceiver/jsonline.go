package filereceiver

// JSON lines: a line that is a JSON object may give its record's key and
// timestamp from top-level fields. The line is sent as it is; only the
// two fields are looked at, in one pass without allocating, so parsing
// costs what a scan of the line costs. A line that is not a JSON object, or
// a field that is not there or cannot be read, is sent all the same,
// keyed and timestamped as without json, and counted (invalid_json,
// invalid_timestamp): never dropped.

import (
	"bytes"
	"encoding/json"
	"strconv"
	"time"
)

// maxJSONDepth bounds the nesting skipped over: a deeper line is not read
// (counted invalid, sent as it is), so a line of "[[[[..." costs no stack.
const maxJSONDepth = 64

// jsonFields finds the raw values of the top-level fields named a and b
// (either may be "") of the JSON object in line. ok is false when line is
// not one JSON object.
func jsonFields(line []byte, a, b string) (va, vb []byte, ok bool) {
	i := skipSpace(line, 0)
	if i >= len(line) || line[i] != '{' {
		return nil, nil, false
	}
	i = skipSpace(line, i+1)
	if i < len(line) && line[i] == '}' {
		return nil, nil, skipSpace(line, i+1) == len(line)
	}
	for {
		ks, ke, next, ok := scanString(line, i)
		if !ok {
			return nil, nil, false
		}
		i = skipSpace(line, next)
		if i >= len(line) || line[i] != ':' {
			return nil, nil, false
		}
		i = skipSpace(line, i+1)
		vs := i
		if i, ok = skipValue(line, i, 0); !ok {
			return nil, nil, false
		}
		key := line[ks:ke]
		// Not else: key_field and timestamp_field may be one field.
		if a != "" && va == nil && string(key) == a {
			va = line[vs:i]
		}
		if b != "" && vb == nil && string(key) == b {
			vb = line[vs:i]
		}
		i = skipSpace(line, i)
		if i >= len(line) {
			return nil, nil, false
		}
		switch line[i] {
		case ',':
			i = skipSpace(line, i+1)
		case '}':
			if skipSpace(line, i+1) != len(line) {
				return nil, nil, false
			}
			return va, vb, true
		default:
			return nil, nil, false
		}
	}
}

func skipSpace(p []byte, i int) int {
	for i < len(p) && (p[i] == ' ' || p[i] == '\t' || p[i] == '\r' || p[i] == '\n') {
		i++
	}
	return i
}

// scanString reads the string at p[i] ('"'): its content [s, e) (escapes
// left as they are) and the index after its closing quote.
func scanString(p []byte, i int) (s, e, next int, ok bool) {
	if i >= len(p) || p[i] != '"' {
		return 0, 0, 0, false
	}
	for j := i + 1; j < len(p); j++ {
		switch c := p[j]; {
		case c == '\\':
			if j+1 >= len(p) {
				return 0, 0, 0, false
			}
			switch p[j+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				j++
			case 'u':
				if j+5 >= len(p) || !hex4(p[j+2:j+6]) {
					return 0, 0, 0, false
				}
				j += 5
			default:
				return 0, 0, 0, false
			}
		case c == '"':
			return i + 1, j, j + 1, true
		case c < 0x20:
			return 0, 0, 0, false
		}
	}
	return 0, 0, 0, false
}

// skipValue returns the index after the value at p[i].
func skipValue(p []byte, i, depth int) (int, bool) {
	if i >= len(p) || depth > maxJSONDepth {
		return 0, false
	}
	switch c := p[i]; c {
	case '"':
		_, _, next, ok := scanString(p, i)
		return next, ok
	case '{', '[':
		end := byte('}')
		if c == '[' {
			end = ']'
		}
		i = skipSpace(p, i+1)
		if i < len(p) && p[i] == end {
			return i + 1, true
		}
		for {
			if c == '{' {
				_, _, next, ok := scanString(p, i)
				if !ok {
					return 0, false
				}
				i = skipSpace(p, next)
				if i >= len(p) || p[i] != ':' {
					return 0, false
				}
				i = skipSpace(p, i+1)
			}
			var ok bool
			if i, ok = skipValue(p, i, depth+1); !ok {
				return 0, false
			}
			i = skipSpace(p, i)
			if i >= len(p) {
				return 0, false
			}
			if p[i] == end {
				return i + 1, true
			}
			if p[i] != ',' {
				return 0, false
			}
			i = skipSpace(p, i+1)
		}
	default:
		// A number, true, false or null: up to the next delimiter.
		j := i
		for j < len(p) && !delim(p[j]) {
			j++
		}
		if j == i || !validScalar(p[i:j]) {
			return 0, false
		}
		return j, true
	}
}

func delim(c byte) bool {
	switch c {
	case ',', '}', ']', ' ', '\t', '\r', '\n':
		return true
	}
	return false
}

func hex4(p []byte) bool {
	for _, c := range p {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
			return false
		}
	}
	return true
}

// validScalar: true, false, null or a number in JSON's grammar
// (-?int(.digits)?([eE][+-]?digits)?).
func validScalar(v []byte) bool {
	switch string(v) {
	case "true", "false", "null":
		return true
	}
	i := 0
	if i < len(v) && v[i] == '-' {
		i++
	}
	digits := func() int {
		n := 0
		for i < len(v) && v[i] >= '0' && v[i] <= '9' {
			i++
			n++
		}
		return n
	}
	switch {
	case i < len(v) && v[i] == '0':
		i++
	case digits() == 0:
		return false
	}
	if i < len(v) && v[i] == '.' {
		i++
		if digits() == 0 {
			return false
		}
	}
	if i < len(v) && (v[i] == 'e' || v[i] == 'E') {
		i++
		if i < len(v) && (v[i] == '+' || v[i] == '-') {
			i++
		}
		if digits() == 0 {
			return false
		}
	}
	return i == len(v)
}

// keyBytes is a field's value as a record key: a string's content
// (unescaped when it has escapes), any other value as written.
func keyBytes(v []byte) []byte {
	if len(v) < 2 || v[0] != '"' {
		return v
	}
	inner := v[1 : len(v)-1]
	if bytes.IndexByte(inner, '\\') < 0 {
		return inner
	}
	var s string
	if json.Unmarshal(v, &s) != nil {
		return inner
	}
	return []byte(s)
}

// parseTimestamp reads a field's value in format: rfc3339 (a string), or
// unix, unix_ms, unix_us, unix_ns (a number, or a string of one).
func parseTimestamp(v []byte, format string) (time.Time, bool) {
	if len(v) >= 2 && v[0] == '"' {
		v = v[1 : len(v)-1]
	}
	if format == "rfc3339" {
		t, err := time.Parse(time.RFC3339Nano, string(v))
		return t, err == nil
	}
	f, err := strconv.ParseFloat(string(v), 64)
	if err != nil || !(f >= 0) {
		// Negative, or NaN (ParseFloat reads "NaN"; it fails every
		// comparison, and int64(NaN) is the year 1677).
		return time.Time{}, false
	}
	ns := f
	switch format {
	case "unix":
		ns *= 1e9
	case "unix_ms":
		ns *= 1e6
	case "unix_us":
		ns *= 1e3
	}
	if ns > 1<<62 {
		return time.Time{}, false
	}
	return time.Unix(0, int64(ns)), true
}
