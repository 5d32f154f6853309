// Package routing owns where a record goes: a topic template over the
// request's signal and its token's fields, e.g. "otel-{signal}-{tenant}".
// A topic named by the token itself wins over any template.
//
// Placeholders: {signal} (traces, metrics, logs, messages), {tenant} (the
// token's app; {app} is the same), {business_id}, {data_id} (the token's
// data id for the signal), {resource.<key>} (a resource attribute of the
// record, OTLP), {header.<name>} (a request header or gRPC metadata). A
// missing resource attribute or header expands to "unknown". A template
// without placeholders is a plain topic.
// Values are never rewritten to fit: a value with characters Kafka does
// not allow in topic names, a value containing the template's separator
// next to another client- or token-chosen value, or a name over 249 bytes
// is refused (ErrRoute), because sanitizing, truncating or blending would
// let one client's values name another's topic. Which topics a request may
// write at all is Allow's business (allow.go).
package routing

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/ferryhq/ferry/auth/token"
	"github.com/ferryhq/ferry/record"
)

// Vars are the values a template can use.
type Vars struct {
	Signal     string
	Tenant     string // "" when the request has no token
	BusinessID uint64
	DataID     uint64
	// Resource looks up a resource attribute of the record; Header a request
	// header. Either may be nil.
	Resource func(key string) (string, bool)
	Header   func(name string) string
}

type part = Part

// Part is one piece of a template: a literal, or a {Field}.
type Part struct {
	Lit   string
	Field string
}

// SplitTemplate cuts s into literals and {fields}, each field checked by
// known (hint lists the fields for the error). Every receiver's templates
// (topics, keys, headers) share this syntax; each has its own fields.
func SplitTemplate(s string, known func(field string) bool, hint string) ([]Part, error) {
	raw := s
	var parts []Part
	for len(s) > 0 {
		i := strings.IndexByte(s, '{')
		if i < 0 {
			parts = append(parts, Part{Lit: s})
			break
		}
		if i > 0 {
			parts = append(parts, Part{Lit: s[:i]})
		}
		j := strings.IndexByte(s[i:], '}')
		if j < 0 {
			return nil, fmt.Errorf("%q: unclosed {", raw)
		}
		f := s[i+1 : i+j]
		if !known(f) {
			return nil, fmt.Errorf("%q: unknown placeholder {%s} (use %s)", raw, f, hint)
		}
		parts = append(parts, Part{Field: f})
		s = s[i+j+1:]
	}
	return parts, nil
}

// Template is a parsed topic template.
type Template struct {
	raw   string
	parts []part
	seps  *string // separators(), computed once
}

var fields = map[string]bool{"signal": true, "tenant": true, "app": true, "business_id": true, "data_id": true}

func knownField(f string) bool {
	return fields[f] || strings.HasPrefix(f, "resource.") && len(f) > 9 || strings.HasPrefix(f, "header.") && len(f) > 7
}

// Parse reads a template; unknown placeholders are errors.
func Parse(s string) (*Template, error) {
	if s == "" {
		return nil, errors.New("empty topic")
	}
	parts, err := SplitTemplate(s, knownField, "signal, tenant, business_id, data_id, resource.<key>, header.<name>")
	if err != nil {
		return nil, err
	}
	return &Template{raw: s, parts: parts}, nil
}

// Static reports whether the template is a plain topic.
func (t *Template) Static() bool { return len(t.parts) == 1 && t.parts[0].Field == "" }

// Fixed is the name the template stands for in full when its only field,
// if any, is {signal} (known from the configuration section it is in):
// ok is false when the name depends on a request (a token, a resource
// attribute, a header), so no one but the client knows it in advance.
func (t *Template) Fixed(signal string) (name string, ok bool) {
	var b strings.Builder
	for _, p := range t.parts {
		switch p.Field {
		case "":
			b.WriteString(p.Lit)
		case "signal":
			b.WriteString(signal)
		default:
			return "", false
		}
	}
	return b.String(), true
}

// PerResource reports whether the result depends on the record's resource.
func (t *Template) PerResource() bool {
	for _, p := range t.parts {
		if strings.HasPrefix(p.Field, "resource.") {
			return true
		}
	}
	return false
}

// String is the template as written.
func (t *Template) String() string { return t.raw }

// ErrNeedsToken: the template uses token fields and the request has none.
var ErrNeedsToken = errors.New("the topic template uses token fields ({tenant}, {business_id}, {data_id}) and the request has no token")

// Expand returns the topic for v. A value that would make a name Kafka
// does not allow, or one that could stand for another tenant's (see
// checkValue), or a name over 249 bytes, is an error: topics are never
// sanitized, truncated or blended, so one client can never write into a
// topic that belongs to another's values.
func (t *Template) Expand(v Vars) (string, error) { return t.expand(v, true) }

// ErrRoute is a template expansion refused for the request's values.
type ErrRoute struct{ Msg string }

func (e *ErrRoute) Error() string { return e.Msg }

// free reports whether a placeholder takes values from the client or the
// token (rather than a closed set such as {signal} or a number).
func free(field string) bool {
	return field == "tenant" || field == "app" || strings.HasPrefix(field, "resource.") || strings.HasPrefix(field, "header.")
}

// separators are the characters of the template's literal parts that can
// also occur in a value ('.', '_', '-'); with two or more free
// placeholders a value containing one could shift where the next part
// starts ("acme" + "x-prod" = "acme-x" + "prod").
func (t *Template) separators() string {
	if t.seps != nil {
		return *t.seps
	}
	nfree := 0
	seps := ""
	for _, p := range t.parts {
		if free(p.Field) {
			nfree++
		}
		for _, c := range p.Lit {
			if (c == '.' || c == '_' || c == '-') && !strings.ContainsRune(seps, c) {
				seps += string(c)
			}
		}
	}
	if nfree < 2 {
		seps = ""
	}
	t.seps = &seps
	return seps
}

// checkValue refuses a free placeholder's value that is not topic-safe.
func (t *Template) checkValue(field, val string) error {
	for i := 0; i < len(val); i++ {
		c := val[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return &ErrRoute{fmt.Sprintf("the value of {%s} has %q, which Kafka does not allow in a topic name", field, c)}
		}
	}
	if seps := t.separators(); seps != "" && strings.ContainsAny(val, seps) {
		return &ErrRoute{fmt.Sprintf("the value of {%s} contains one of %q, which separates the parts of topic template %q: refused so that one client's values cannot name another's topic", field, seps, t.raw)}
	}
	return nil
}

// ExpandRaw returns the expansion as is, for record keys, which may hold
// any bytes.
func (t *Template) ExpandRaw(v Vars) (string, error) { return t.expand(v, false) }

func (t *Template) expand(v Vars, sanitize bool) (string, error) {
	if t.Static() {
		return t.raw, nil
	}
	var b strings.Builder
	for _, p := range t.parts {
		switch p.Field {
		case "":
			b.WriteString(p.Lit)
		case "signal":
			b.WriteString(v.Signal)
		case "tenant", "app":
			if v.Tenant == "" {
				return "", ErrNeedsToken
			}
			if sanitize {
				if err := t.checkValue(p.Field, v.Tenant); err != nil {
					return "", err
				}
			}
			b.WriteString(v.Tenant)
		case "business_id":
			if v.Tenant == "" {
				return "", ErrNeedsToken
			}
			b.WriteString(strconv.FormatUint(v.BusinessID, 10))
		case "data_id":
			if v.Tenant == "" {
				return "", ErrNeedsToken
			}
			b.WriteString(strconv.FormatUint(v.DataID, 10))
		default:
			val := ""
			if k, ok := strings.CutPrefix(p.Field, "resource."); ok && v.Resource != nil {
				val, _ = v.Resource(k)
			} else if k, ok := strings.CutPrefix(p.Field, "header."); ok && v.Header != nil {
				val = v.Header(k)
			}
			if val == "" {
				val = "unknown"
			}
			if sanitize {
				if err := t.checkValue(p.Field, val); err != nil {
					return "", err
				}
			}
			b.WriteString(val)
		}
	}
	s := b.String()
	if sanitize {
		if len(s) > 249 {
			return "", &ErrRoute{fmt.Sprintf("topic %.40q… would be %d bytes; Kafka allows 249", s, len(s))}
		}
		if s == "." || s == ".." {
			return "", &ErrRoute{fmt.Sprintf("topic %q is not allowed by Kafka", s)}
		}
	}
	return s, nil
}

// Sanitize makes s a valid Kafka topic: [a-zA-Z0-9._-], at most 249 bytes.
func Sanitize(s string) string {
	out := []byte(s)
	for i, c := range out {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			out[i] = '_'
		}
	}
	if len(out) > 249 {
		out = out[:249]
	}
	if s := string(out); s != "." && s != ".." {
		return s
	}
	return "_"
}

// ReservedHeaderPrefix is the Kafka header namespace only ferry writes
// (ferry.tenant, ferry.app, ferry.signal, ...); a client's own headers in
// it are dropped, so consumers can trust them.
const ReservedHeaderPrefix = "ferry."

// TenantHeaders returns base plus the token's tenant, business id and data
// id for signal (a token.Traces… index) as Kafka headers (ferry.tenant,
// ferry.business_id, ferry.data_id), and the same as flat_json fields.
// base is never modified.
func TenantHeaders(base []record.Header, c *token.Claims, signal int) ([]record.Header, []byte) {
	h := append(base[:len(base):len(base)], record.Header{Key: "ferry.tenant", Value: []byte(c.App)})
	extra := append([]byte(`,"tenant":`), strconv.Quote(c.App)...)
	if c.BusinessID != 0 {
		h = append(h, record.Header{Key: "ferry.business_id", Value: strconv.AppendUint(nil, c.BusinessID, 10)})
		extra = strconv.AppendUint(append(extra, `,"business_id":`...), c.BusinessID, 10)
	}
	if id := c.DataIDs[signal]; id != 0 {
		h = append(h, record.Header{Key: "ferry.data_id", Value: strconv.AppendUint(nil, id, 10)})
		extra = strconv.AppendUint(append(extra, `,"data_id":`...), id, 10)
	}
	return h, extra
}
