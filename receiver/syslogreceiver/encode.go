package syslogreceiver

// The json format: one flat JSON object per message, appended to a batch's
// buffer without allocating. Its size is bounded from the message before a
// byte of it is written (jsonBound), so the buffer is reserved first.

import (
	"strconv"
	"time"

	"github.com/ferryhq/ferry/otlp/flatjson"
)

// jsonFixed covers every key, the names, the punctuation and a 3164
// timestamp made RFC 3339: what a message's JSON adds besides its own
// bytes.
const jsonFixed = 512

// jsonBound is the most appendJSON writes for m read from raw: every byte of
// raw at most once in a string (each escaped to at most 6 bytes: \u00XX,
// or \ufffd for a byte that is not UTF-8), plus structured data's repeated
// ids, plus the fixed part.
func jsonBound(m *Message, raw []byte) int { return 6*len(raw) + m.sdExtra + jsonFixed }

// appendJSON writes m as one flat JSON object: timestamp, hostname,
// app_name, proc_id, msg_id (each only when present), facility,
// facility_name, severity, severity_name (when the PRI parsed), protocol,
// sd.<id>.<param> for every structured-data param, message; and, for a
// message that did not parse, parse_error with the whole message as
// received in message.
func appendJSON(dst []byte, m *Message, raw []byte, now time.Time) []byte {
	dst = append(dst, '{')
	first := true
	key := func(k string) {
		if !first {
			dst = append(dst, ',')
		}
		first = false
		dst = append(dst, '"')
		dst = append(dst, k...)
		dst = append(dst, '"', ':')
	}
	str := func(k string, v []byte) {
		if v == nil {
			return
		}
		key(k)
		dst = appendString(dst, v)
	}
	if m.Proto != protoUnknown {
		switch {
		case m.Timestamp != nil:
			str("timestamp", m.Timestamp)
		case m.Stamp3164.ok:
			key("timestamp")
			dst = append(dst, '"')
			dst = m.Stamp3164.time(now).AppendFormat(dst, time.RFC3339Nano)
			dst = append(dst, '"')
		}
		str("hostname", m.Hostname)
		str("app_name", m.AppName)
		str("proc_id", m.ProcID)
		str("msg_id", m.MsgID)
	}
	if m.HasPri {
		key("facility")
		dst = strconv.AppendInt(dst, int64(m.Facility), 10)
		key("facility_name")
		dst = append(dst, '"')
		dst = append(dst, facilityNames[m.Facility]...)
		dst = append(dst, '"')
		key("severity")
		dst = strconv.AppendInt(dst, int64(m.Severity), 10)
		key("severity_name")
		dst = append(dst, '"')
		dst = append(dst, severityNames[m.Severity]...)
		dst = append(dst, '"')
	}
	key("protocol")
	dst = append(dst, '"')
	dst = append(dst, protoNames[m.Proto]...)
	dst = append(dst, '"')
	if m.SD != nil && !m.sdFlat {
		key("structured_data")
		dst = appendString(dst, m.SD)
	}
	if m.SD != nil && m.sdFlat {
		walkSD(m.SD, func(id, name, value []byte) {
			dst = append(dst, `,"sd.`...)
			dst = flatjson.AppendEscaped(dst, id)
			dst = append(dst, '.')
			dst = flatjson.AppendEscaped(dst, name)
			dst = append(dst, '"', ':', '"')
			// RFC 5424 escapes '"', '\' and ']' in values with a '\';
			// a '\' before anything else is kept as it is.
			for i := 0; i < len(value); i++ {
				if value[i] == '\\' && i+1 < len(value) && (value[i+1] == '"' || value[i+1] == '\\' || value[i+1] == ']') {
					i++
				}
				j := i + 1
				for j < len(value) && value[j] != '\\' {
					j++
				}
				dst = flatjson.AppendEscaped(dst, value[i:j])
				i = j - 1
			}
			dst = append(dst, '"')
		})
	}
	if m.Proto == protoUnknown {
		key("message")
		dst = appendString(dst, raw)
		key("parse_error")
		dst = append(dst, '"')
		dst = append(dst, m.Err...)
		dst = append(dst, '"')
	} else {
		key("message")
		if m.Msg == nil {
			dst = append(dst, '"', '"')
		} else {
			dst = appendString(dst, m.Msg)
		}
	}
	return append(dst, '}')
}

func appendString(dst, s []byte) []byte {
	dst = append(dst, '"')
	dst = flatjson.AppendEscaped(dst, s)
	return append(dst, '"')
}
