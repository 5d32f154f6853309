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
func checkJSONShape(b []byte, maxContainers int) error {
	depth, containers := 0, 0
	inStr, esc := false, false
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
		switch c {
		case '"':
			inStr = true
		case '{', '[':
			depth++
			containers++
			if depth > maxJSONDepth {
				return fmt.Errorf("JSON nested deeper than %d levels", maxJSONDepth)
			}
			if containers > maxContainers {
				return &containersError{maxContainers}
			}
		case '}', ']':
			depth--
		}
	}
	return nil
}

type containersError struct{ limit int }

func (e *containersError) Error() string {
	return fmt.Sprintf("more than %d JSON objects and arrays", e.limit)
}
