package filereceiver

import (
	"errors"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/ferryhq/ferry/routing"
)

// template is a topic, key or header template over a file's name, path
// and the host, in routing's syntax: routing's fields are a request's
// signal and token, which a file has none of.
type template struct {
	raw   string
	parts []routing.Part
}

const templateHint = "file.name, file.dir, file.path, path.<n>, host"

// knownField: file.name (base name), file.dir (the parent directory's
// name), file.path (the path without its leading /), path.<n> (the n-th
// part of the path, from 1), host.
func knownField(f string) bool {
	switch f {
	case "file.name", "file.dir", "file.path", "host":
		return true
	}
	n, ok := strings.CutPrefix(f, "path.")
	i, err := strconv.Atoi(n)
	return ok && err == nil && i >= 1 && i <= 64
}

func parseTemplate(s string) (*template, error) {
	if s == "" {
		return nil, errors.New("empty")
	}
	parts, err := routing.SplitTemplate(s, knownField, templateHint)
	if err != nil {
		return nil, err
	}
	return &template{raw: s, parts: parts}, nil
}

func (t *template) static() bool { return len(t.parts) == 1 && t.parts[0].Field == "" }

// expand fills the template for a file found at path.
func (t *template) expand(path, host string) string {
	if t.static() {
		return t.raw
	}
	var b strings.Builder
	for _, p := range t.parts {
		switch f := p.Field; f {
		case "":
			b.WriteString(p.Lit)
		case "file.name":
			b.WriteString(filepath.Base(path))
		case "file.dir":
			b.WriteString(filepath.Base(filepath.Dir(path)))
		case "file.path":
			b.WriteString(strings.TrimLeft(path, "/"))
		case "host":
			b.WriteString(host)
		default: // path.<n>; a path with fewer parts gives ""
			n, _ := strconv.Atoi(f[len("path."):])
			parts := strings.Split(strings.Trim(path, "/"), "/")
			if n <= len(parts) {
				b.WriteString(parts[n-1])
			}
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
