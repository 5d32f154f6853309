package filereceiver

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/ferryhq/ferry/routing"
)

// template is a topic or key template over a file's name, path and the
// host: routing's templates are over a request's signal and token, which
// a file has none of.
type template struct {
	raw   string
	parts []tpart
}

type tpart struct{ lit, field string }

var templateFields = map[string]bool{"file.name": true, "file.path": true, "host": true}

func parseTemplate(s string) (*template, error) {
	if s == "" {
		return nil, errors.New("empty")
	}
	t := &template{raw: s}
	for len(s) > 0 {
		i := strings.IndexByte(s, '{')
		if i < 0 {
			t.parts = append(t.parts, tpart{lit: s})
			break
		}
		if i > 0 {
			t.parts = append(t.parts, tpart{lit: s[:i]})
		}
		j := strings.IndexByte(s[i:], '}')
		if j < 0 {
			return nil, fmt.Errorf("%q: unclosed {", t.raw)
		}
		f := s[i+1 : i+j]
		if !templateFields[f] {
			return nil, fmt.Errorf("%q: unknown placeholder {%s} (use file.name, file.path, host)", t.raw, f)
		}
		t.parts = append(t.parts, tpart{field: f})
		s = s[i+j+1:]
	}
	return t, nil
}

func (t *template) static() bool { return len(t.parts) == 1 && t.parts[0].field == "" }

// expand fills the template for a file found at path.
func (t *template) expand(path, host string) string {
	if t.static() {
		return t.raw
	}
	var b strings.Builder
	for _, p := range t.parts {
		switch p.field {
		case "":
			b.WriteString(p.lit)
		case "file.name":
			b.WriteString(filepath.Base(path))
		case "file.path":
			b.WriteString(strings.TrimLeft(path, "/"))
		case "host":
			b.WriteString(host)
		}
	}
	return b.String()
}

// topic is the expansion made a valid Kafka topic name: the values come
// from the host's file system, which the operator chose with include, not
// from a client, so they are made to fit rather than refused.
func (t *template) topic(path, host string) string {
	if t.static() {
		return t.raw
	}
	return routing.Sanitize(t.expand(path, host))
}
