package otlpreceiver

import "fmt"

// maxJSONDepth bounds the nesting of an OTLP/JSON request before pdata,
// whose JSON decoder recurses, sees it. The envelope takes about 12 levels
// and each attribute value level 3 ({"kvlistValue":{"values":[...), so
// this admits the 32 levels of attribute nesting ferry's own protobuf
// decoder allows.
const maxJSONDepth = 12 + 3*32 + 8

// jsonContainersPerItem: a JSON request may hold this many objects and
// arrays per allowed item; pdata builds a structure for each, so their
// count bounds the memory decoding takes.
const jsonContainersPerItem = 4

// checkJSONShape walks b once, outside strings, and refuses nesting deeper
// than maxJSONDepth or more than maxContainers objects and arrays. It does
// not validate the JSON (pdata does, once the shape is known to be safe).
// It returns what pdata's decoding will take in memory at most (jsonCost).
func checkJSONShape(b []byte, maxContainers int) (cost int64, err error) {
	depth, containers, values := 0, 0, 0
	inStr, esc, inValue := false, false, false
	// inArray[d]: the container at depth d is an array. A string in an
	// array is a value too: pdata takes quoted numbers ("1") in numeric
	// arrays, and appends them one at a time as bare ones.
	var inArray [maxJSONDepth + 1]bool
	for _, c := range b {
		if inStr {
			switch {
			case esc:
				esc = false
			case c == '\\':
				esc = true
			case c == '"':
				inStr = false
			}
			continue
		}
		// A run of number or literal characters is one value.
		isValue := c >= '0' && c <= '9' || c == '-' || c == '+' || c == '.' || c == 'E' || c >= 'a' && c <= 'z'
		if isValue && !inValue {
			values++
		}
		inValue = isValue
		switch c {
		case '"':
			inStr = true
			if inArray[depth] {
				values++
			}
		case '{', '[':
			depth++
			containers++
			if depth > maxJSONDepth {
				return 0, fmt.Errorf("JSON nested deeper than %d levels", maxJSONDepth)
			}
			inArray[depth] = c == '['
			if containers > maxContainers {
				return 0, &containersError{maxContainers}
			}
		case '}', ']':
			if depth == 0 {
				return 0, fmt.Errorf("JSON closes %q that was not opened", c)
			}
			depth--
		}
	}
	return jsonCost(len(b), containers, values), nil
}

// What pdata allocates decoding OTLP/JSON, garbage included (TestJSONCost
// checks it against runtime.MemStats): a message and its slot per object
// or array (a log record of "{}" took 184 bytes), per number or literal
// its 8 bytes and the slices' growth and copies around them (an array of
// two million "1"s, 2 bytes of body each, took 52 bytes each, 25 times the
// body), and about twice the body for strings, maps and the protobuf
// written after. Ordinary requests take 3 to 4 times their body; this
// estimate says 5 to 10.
const (
	jsonContainerCost = 192
	jsonValueCost     = 56
)

func jsonCost(n, containers, values int) int64 {
	return int64(containers)*jsonContainerCost + int64(values)*jsonValueCost + 2*int64(n)
}

type containersError struct{ limit int }

func (e *containersError) Error() string {
	return fmt.Sprintf("more than %d JSON objects and arrays", e.limit)
}
