package syslogreceiver

// A topic or key template over a message's fields, in routing's syntax
// (routing.SplitTemplate), its fields resolved to an enum once so that
// expand does not allocate.

import (
	"errors"

	"github.com/ferryhq/ferry/routing"
)

type template struct {
	raw   string
	parts []tpart
}

type tpart struct {
	lit   string
	field int // 0: literal
}

const (
	fHostname = iota + 1
	fAppName
	fFacility
	fSeverity
	fHost
)

var templateFields = map[string]int{"hostname": fHostname, "app_name": fAppName, "facility": fFacility, "severity": fSeverity, "host": fHost}

func parseTemplate(s string) (*template, error) {
	if s == "" {
		return nil, errors.New("empty")
	}
	parts, err := routing.SplitTemplate(s, func(f string) bool { return templateFields[f] != 0 }, "hostname, app_name, facility, severity, host")
	if err != nil {
		return nil, err
	}
	t := &template{raw: s}
	for _, p := range parts {
		t.parts = append(t.parts, tpart{lit: p.Lit, field: templateFields[p.Field]})
	}
	return t, nil
}

func (t *template) static() bool { return len(t.parts) == 1 && t.parts[0].field == 0 }

// bound is the most expand appends for a message of n bytes.
func (t *template) bound(n int, host string) int {
	b := 0
	for _, p := range t.parts {
		b += len(p.lit) + max(n, len(host), 16)
	}
	return b
}

// expand appends the template filled from m (a missing field is "-").
func (t *template) expand(dst []byte, m *Message, host string) []byte {
	for _, p := range t.parts {
		var v []byte
		switch p.field {
		case 0:
			dst = append(dst, p.lit...)
			continue
		case fHostname:
			v = m.Hostname
		case fAppName:
			v = m.AppName
		case fFacility:
			if m.HasPri {
				dst = append(dst, facilityNames[m.Facility]...)
				continue
			}
		case fSeverity:
			if m.HasPri {
				dst = append(dst, severityNames[m.Severity]...)
				continue
			}
		case fHost:
			dst = append(dst, host...)
			continue
		}
		if len(v) == 0 {
			v = dash
		}
		dst = append(dst, v...)
	}
	return dst
}

var dash = []byte("-")

// topic is the template's topic for m: the values come from the sender, so
// they are made to fit a Kafka name rather than refused.
func (t *template) topic(m *Message, host string, scratch []byte) string {
	if t.static() {
		return t.raw
	}
	return routing.Sanitize(string(t.expand(scratch[:0], m, host)))
}
