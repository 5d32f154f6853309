package syslogreceiver

// Parsing: RFC 5424 and RFC 3164 (BSD) messages into a Message whose fields
// are slices of the message itself. Parsing allocates nothing; a message
// that does not parse keeps what was found before the error (PRI, mostly)
// and names the error, and is delivered whole (raw) by the caller.

import (
	"bytes"
	"time"
)

// Protocols a message was read as.
const (
	protoUnknown = iota // did not parse: delivered as received
	proto5424
	proto3164
)

var protoNames = [...]string{"unknown", "rfc5424", "rfc3164"}

// Message is one parsed syslog message. Its byte fields point into the
// bytes given to parse; nil means absent (RFC 5424's NILVALUE "-", or a
// part RFC 3164 senders often leave out).
type Message struct {
	Proto    int
	HasPri   bool
	Facility int
	Severity int
	// Timestamp is RFC 5424's as sent (RFC 3339); for RFC 3164 it is
	// Stamp3164 instead (month, day and time, no year or zone).
	Timestamp []byte
	Stamp3164 stamp
	Hostname  []byte
	AppName   []byte
	ProcID    []byte
	MsgID     []byte
	// SD is RFC 5424's structured data as sent ("[id k="v"]..."), nil for
	// none; sdExtra is what flattening it adds beyond its own bytes (each
	// param repeats its element's id), for the output's bound.
	SD      []byte
	sdExtra int
	// sdFlat: SD has at most maxSDParams params and is flattened into
	// sd.<id>.<param> keys; more are kept whole as structured_data, so a
	// message of many tiny params cannot inflate its JSON without bound.
	sdFlat bool
	Msg    []byte
	// Err names why the message did not parse (Proto is protoUnknown).
	Err string
}

// stamp is an RFC 3164 timestamp: "Mmm dd hh:mm:ss" (with milliseconds
// when a Cisco device sends them).
type stamp struct {
	ok             bool
	month, day     int
	hour, min, sec int
	nsec           int
	hasYear        bool
	year           int
}

// time makes the stamp a time: the year is this year (last year when that
// would put it more than a week in the future: December's messages read in
// January), the zone the agent's.
func (s stamp) time(now time.Time) time.Time {
	y := now.Year()
	if s.hasYear {
		y = s.year
	}
	t := time.Date(y, time.Month(s.month), s.day, s.hour, s.min, s.sec, s.nsec, now.Location())
	if !s.hasYear && t.After(now.Add(7*24*time.Hour)) {
		t = time.Date(y-1, time.Month(s.month), s.day, s.hour, s.min, s.sec, s.nsec, now.Location())
	}
	return t
}

var facilityNames = [24]string{"kern", "user", "mail", "daemon", "auth", "syslog", "lpr", "news", "uucp", "cron",
	"authpriv", "ftp", "ntp", "security", "console", "solaris-cron", "local0", "local1", "local2", "local3",
	"local4", "local5", "local6", "local7"}

var severityNames = [8]string{"emerg", "alert", "crit", "err", "warning", "notice", "info", "debug"}

// parse reads b as RFC 5424 when its PRI is followed by a version ("1 "),
// else as RFC 3164. It never fails: m.Err says what did not parse.
func parse(b []byte, m *Message) {
	*m = Message{}
	rest, ok := parsePri(b, m)
	if !ok {
		m.Err = "invalid_pri"
		return
	}
	if len(rest) >= 2 && rest[0] >= '1' && rest[0] <= '9' && (rest[1] == ' ' || (len(rest) >= 3 && isDigit(rest[1]) && rest[2] == ' ')) {
		parse5424(rest, m)
		return
	}
	parse3164(rest, m)
}

// parsePri reads "<PRI>": 1 to 3 digits, 0..191, no leading zero.
func parsePri(b []byte, m *Message) ([]byte, bool) {
	if len(b) < 3 || b[0] != '<' {
		return b, false
	}
	v, i := 0, 1
	for ; i < len(b) && i <= 4 && isDigit(b[i]); i++ {
		v = v*10 + int(b[i]-'0')
	}
	digits := i - 1
	if digits == 0 || digits > 3 || i >= len(b) || b[i] != '>' || v > 191 || (digits > 1 && b[1] == '0') {
		return b, false
	}
	m.HasPri, m.Facility, m.Severity = true, v>>3, v&7
	return b[i+1:], true
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// field reads one space-terminated RFC 5424 header field of at most max
// printable US-ASCII bytes; "-" is nil.
func field(b []byte, max int) (val, rest []byte, ok bool) {
	i := 0
	for i < len(b) && b[i] != ' ' {
		if b[i] < 33 || b[i] > 126 {
			return nil, b, false
		}
		i++
	}
	if i == 0 || i > max || i == len(b) {
		return nil, b, false
	}
	val, rest = b[:i], b[i+1:]
	if len(val) == 1 && val[0] == '-' {
		val = nil
	}
	return val, rest, true
}

// parse5424: VERSION SP TIMESTAMP SP HOSTNAME SP APP-NAME SP PROCID SP
// MSGID SP STRUCTURED-DATA [SP MSG].
func parse5424(b []byte, m *Message) {
	fail := func(why string) { m.Proto, m.Err = protoUnknown, why }
	if b[0] != '1' || b[1] != ' ' {
		fail("unsupported_version")
		return
	}
	b = b[2:]
	var ok bool
	if m.Timestamp, b, ok = field(b, 40); !ok {
		fail("invalid_header")
		return
	}
	if m.Timestamp != nil && !validRFC3339(m.Timestamp) {
		m.Timestamp = nil
		fail("invalid_timestamp")
		return
	}
	if m.Hostname, b, ok = field(b, 255); !ok {
		fail("invalid_header")
		return
	}
	if m.AppName, b, ok = field(b, 48); !ok {
		fail("invalid_header")
		return
	}
	if m.ProcID, b, ok = field(b, 128); !ok {
		fail("invalid_header")
		return
	}
	// MSGID may end the message when SD is "-" and there is no MSG... no:
	// SD is required, so MSGID is always followed by a space.
	if m.MsgID, b, ok = field(b, 32); !ok {
		fail("invalid_header")
		return
	}
	switch {
	case len(b) > 0 && b[0] == '-':
		b = b[1:]
	case len(b) > 0 && b[0] == '[':
		n, extra, ok := scanSD(b)
		if !ok {
			fail("invalid_structured_data")
			return
		}
		m.SD, b = b[:n], b[n:]
		if extra >= 0 {
			m.sdExtra, m.sdFlat = extra, true
		}
	default:
		fail("invalid_structured_data")
		return
	}
	if len(b) > 0 {
		if b[0] != ' ' {
			fail("invalid_structured_data")
			return
		}
		b = b[1:]
		b = bytes.TrimPrefix(b, utf8BOM)
		m.Msg = b
	}
	m.Proto = proto5424
}

var utf8BOM = []byte{0xEF, 0xBB, 0xBF}

// validRFC3339 checks RFC 5424's TIMESTAMP: YYYY-MM-DDThh:mm:ss[.frac]
// (Z|+hh:mm|-hh:mm), frac of 1 to 6 digits.
func validRFC3339(b []byte) bool {
	const shape = "dddd-dd-ddTdd:dd:dd"
	if len(b) < len(shape)+1 {
		return false
	}
	for i := 0; i < len(shape); i++ {
		if shape[i] == 'd' {
			if !isDigit(b[i]) {
				return false
			}
		} else if b[i] != shape[i] {
			return false
		}
	}
	i := len(shape)
	if b[i] == '.' {
		j := i + 1
		for j < len(b) && isDigit(b[j]) {
			j++
		}
		if j == i+1 || j-i-1 > 6 {
			return false
		}
		i = j
	}
	rest := b[i:]
	if len(rest) == 1 && rest[0] == 'Z' {
		return true
	}
	return len(rest) == 6 && (rest[0] == '+' || rest[0] == '-') && isDigit(rest[1]) && isDigit(rest[2]) && rest[3] == ':' && isDigit(rest[4]) && isDigit(rest[5])
}

// maxSDParams is the most structured-data params flattened into JSON keys.
const maxSDParams = 256

// maxSDExtra is the most flattening adds to a message's JSON.
const maxSDExtra = maxSDParams * (2*32 + 16)

// scanSD finds the end of RFC 5424 structured data at b ("[" ... "]"
// repeated): its length, and what flattening adds (per param, its
// element's id again, escaped, and the ".", "sd." and JSON punctuation);
// extra is -1 when there are more than maxSDParams params.
func scanSD(b []byte) (n, extra int, ok bool) {
	i, params := 0, 0
	for i < len(b) && b[i] == '[' {
		i++
		// SD-ID: 1..32 of SD-NAME (printable, not = SP ] ").
		s := i
		for i < len(b) && sdName(b[i]) {
			i++
		}
		id := i - s
		if id == 0 || id > 32 {
			return 0, 0, false
		}
		for {
			if i >= len(b) {
				return 0, 0, false
			}
			if b[i] == ']' {
				i++
				break
			}
			if b[i] != ' ' {
				return 0, 0, false
			}
			i++
			s := i
			for i < len(b) && sdName(b[i]) {
				i++
			}
			if i-s == 0 || i-s > 32 || i+1 >= len(b) || b[i] != '=' || b[i+1] != '"' {
				return 0, 0, false
			}
			i += 2
			for {
				if i >= len(b) {
					return 0, 0, false
				}
				if b[i] == '\\' && i+1 < len(b) {
					i += 2
					continue
				}
				if b[i] == '"' {
					i++
					break
				}
				i++
			}
			extra += 2*id + 16
			params++
		}
	}
	if params > maxSDParams {
		extra = -1
	}
	return i, extra, i > 0
}

func sdName(c byte) bool { return c >= 33 && c <= 126 && c != '=' && c != ']' && c != '"' && c != ' ' }

// walkSD calls fn for every param of structured data that scanSD accepted,
// with its value still escaped (\" \\ \]).
func walkSD(sd []byte, fn func(id, name, value []byte)) {
	i := 0
	for i < len(sd) && sd[i] == '[' {
		i++
		s := i
		for sdName(sd[i]) {
			i++
		}
		id := sd[s:i]
		for sd[i] != ']' {
			i++ // the space
			s := i
			for sdName(sd[i]) {
				i++
			}
			name := sd[s:i]
			i += 2
			vs := i
			for sd[i] != '"' {
				if sd[i] == '\\' {
					i++
				}
				i++
			}
			fn(id, name, sd[vs:i])
			i++
		}
		i++
	}
}

var months = [12]string{"Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"}

// parse3164 reads what follows the PRI of a BSD message, leniently, as
// rsyslog does: [seq": "] ["*"|"."] TIMESTAMP [".mmm"] [" TZ"] [":"] SP
// [HOSTNAME SP] [TAG["["PID"]"]":" SP] MSG. Cisco devices send the
// sequence number, the "*" (clock not synchronised), the milliseconds, the
// zone and no hostname; many local programs send no timestamp nor
// hostname. Whatever follows is the message; only a missing PRI fails.
func parse3164(b []byte, m *Message) {
	m.Proto = proto3164
	// A Cisco sequence number: digits ": ".
	if j := digits(b); j > 0 && j+1 < len(b) && b[j] == ':' && b[j+1] == ' ' {
		b = b[j+2:]
	}
	stamped := false
	if s, n := parseStamp3164(b); n > 0 {
		m.Stamp3164, stamped = s, true
		b = b[n:]
	} else if n := rfc3339Prefix(b); n > 0 {
		m.Timestamp, stamped = b[:n], true
		b = b[n:]
		if len(b) > 0 && b[0] == ' ' {
			b = b[1:]
		}
	}
	// HOSTNAME, as rsyslog reads it: only after a timestamp, a word and a
	// space, and not a tag (a tag ends with ":" or holds "[").
	if w := wordLen(b); stamped && w > 0 && w < len(b) && b[w] == ' ' && !looksLikeTag(b[:w]) {
		m.Hostname = b[:w]
		b = b[w+1:]
	}
	// TAG: up to 48 (we allow 128) alphanumerics and "-._/%", then
	// optional [pid], then ":".
	i := 0
	for i < len(b) && i < 128 && b[i] != '[' && b[i] != ':' && b[i] != ' ' && b[i] > 32 && b[i] < 127 {
		i++
	}
	if i > 0 && i < len(b) {
		tag, j := b[:i], i
		var pid []byte
		if b[j] == '[' {
			k := bytes.IndexByte(b[j:min(len(b), j+130)], ']')
			if k > 1 {
				pid = b[j+1 : j+k]
				j += k + 1
			} else {
				j = -1
			}
		}
		if j >= 0 && j < len(b) && b[j] == ':' {
			m.AppName, m.ProcID = tag, pid
			b = b[j+1:]
			if len(b) > 0 && b[0] == ' ' {
				b = b[1:]
			}
		} else if j >= 0 && j == len(b) && pid != nil {
			m.AppName, m.ProcID = tag, pid
			b = b[j:]
		}
	}
	m.Msg = b
}

func digits(b []byte) int {
	i := 0
	for i < len(b) && i < 20 && isDigit(b[i]) {
		i++
	}
	return i
}

func wordLen(b []byte) int {
	i := 0
	for i < len(b) && b[i] > 32 && b[i] < 127 {
		i++
	}
	return i
}

func looksLikeTag(w []byte) bool {
	return w[len(w)-1] == ':' || bytes.IndexByte(w, '[') >= 0
}

// parseStamp3164 reads ["*"|"."]"Mmm dd hh:mm:ss"[".mmm"][" yyyy"][" TZ"][":"]" "
// and returns how many bytes it took (0: not a timestamp).
func parseStamp3164(b []byte) (stamp, int) {
	var s stamp
	i := 0
	if len(b) > 0 && (b[0] == '*' || b[0] == '.') {
		i++
	}
	if len(b) < i+15 {
		return s, 0
	}
	mo := -1
	for k, name := range months {
		if string(b[i:i+3]) == name {
			mo = k + 1
		}
	}
	if mo < 0 || b[i+3] != ' ' {
		return s, 0
	}
	i += 4
	// The day: "dd" or " d" (RFC 3164 pads with a space), or "d " as some send.
	var day int
	switch {
	case b[i] == ' ' && isDigit(b[i+1]):
		day, i = int(b[i+1]-'0'), i+2
	case isDigit(b[i]) && isDigit(b[i+1]):
		day, i = int(b[i]-'0')*10+int(b[i+1]-'0'), i+2
	case isDigit(b[i]) && b[i+1] == ' ':
		day, i = int(b[i]-'0'), i+1
	default:
		return s, 0
	}
	if day < 1 || day > 31 || i+9 > len(b) || b[i] != ' ' {
		return s, 0
	}
	i++
	// Cisco ASA: "Mmm dd yyyy hh:mm:ss".
	if i+13 <= len(b) && isDigit(b[i]) && isDigit(b[i+1]) && isDigit(b[i+2]) && isDigit(b[i+3]) && b[i+4] == ' ' {
		s.hasYear, s.year = true, int(b[i]-'0')*1000+int(b[i+1]-'0')*100+int(b[i+2]-'0')*10+int(b[i+3]-'0')
		i += 5
	}
	if i+8 > len(b) {
		return s, 0
	}
	t := b[i : i+8]
	if !isDigit(t[0]) || !isDigit(t[1]) || t[2] != ':' || !isDigit(t[3]) || !isDigit(t[4]) || t[5] != ':' || !isDigit(t[6]) || !isDigit(t[7]) {
		return s, 0
	}
	s.hour, s.min, s.sec = int(t[0]-'0')*10+int(t[1]-'0'), int(t[3]-'0')*10+int(t[4]-'0'), int(t[6]-'0')*10+int(t[7]-'0')
	if s.hour > 23 || s.min > 59 || s.sec > 60 {
		return s, 0
	}
	i += 8
	if i < len(b) && b[i] == '.' {
		j, ns, scale := i+1, 0, 100_000_000
		for j < len(b) && isDigit(b[j]) && j-i <= 9 {
			ns += int(b[j]-'0') * scale
			scale /= 10
			j++
		}
		if j > i+1 {
			s.nsec, i = ns, j
		}
	}
	// " yyyy" (some devices), then " TZ" (letters: UTC, CET...).
	if i+5 <= len(b) && b[i] == ' ' && isDigit(b[i+1]) && isDigit(b[i+2]) && isDigit(b[i+3]) && isDigit(b[i+4]) && (i+5 == len(b) || b[i+5] == ' ' || b[i+5] == ':') {
		s.hasYear, s.year = true, int(b[i+1]-'0')*1000+int(b[i+2]-'0')*100+int(b[i+3]-'0')*10+int(b[i+4]-'0')
		i += 5
	}
	if i+1 < len(b) && b[i] == ' ' {
		j := i + 1
		for j < len(b) && j-i <= 6 && b[j] >= 'A' && b[j] <= 'Z' {
			j++
		}
		if j-i-1 >= 2 && j < len(b) && (b[j] == ':' || b[j] == ' ') {
			i = j
		}
	}
	if i < len(b) && b[i] == ':' {
		i++
	}
	if i < len(b) && b[i] == ' ' {
		i++
	} else if i != len(b) {
		return s, 0
	}
	s.month, s.day, s.ok = mo, day, true
	return s, i
}

// rfc3339Prefix is the length of an RFC 3339 timestamp at b's start that a
// space or the end follows (rsyslog's RSYSLOG_ForwardFormat sends 3164
// with one), 0 for none.
func rfc3339Prefix(b []byte) int {
	i := bytes.IndexByte(b[:min(len(b), 41)], ' ')
	if i < 0 {
		i = len(b)
		if i > 40 {
			return 0
		}
	}
	if validRFC3339(b[:i]) {
		return i
	}
	return 0
}
