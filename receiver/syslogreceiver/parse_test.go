package syslogreceiver

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// What a message parses to, as its JSON object (the json format's output).
type parseCase struct {
	name string
	in   string
	want map[string]any
}

// RFC 5424 §6.5's examples, and the cases senders get wrong.
var cases5424 = []parseCase{
	{"rfc5424 example 1: no structured data, BOM", "<34>1 2003-10-11T22:14:15.003Z mymachine.example.com su - ID47 - \xEF\xBB\xBF'su root' failed for lonvick on /dev/pts/8",
		map[string]any{"timestamp": "2003-10-11T22:14:15.003Z", "hostname": "mymachine.example.com", "app_name": "su", "msg_id": "ID47",
			"facility": 4.0, "facility_name": "auth", "severity": 2.0, "severity_name": "crit", "protocol": "rfc5424",
			"message": "'su root' failed for lonvick on /dev/pts/8"}},
	{"rfc5424 example 2: no BOM, offset", "<165>1 2003-08-24T05:14:15.000003-07:00 192.0.2.1 myproc 8710 - - %% It's time to make the do-nuts.",
		map[string]any{"timestamp": "2003-08-24T05:14:15.000003-07:00", "hostname": "192.0.2.1", "app_name": "myproc", "proc_id": "8710",
			"facility": 20.0, "facility_name": "local4", "severity": 5.0, "severity_name": "notice", "protocol": "rfc5424",
			"message": "%% It's time to make the do-nuts."}},
	{"rfc5424 example 3: structured data and a message", `<165>1 2003-10-11T22:14:15.003Z mymachine.example.com evntslog - ID47 [exampleSDID@32473 iut="3" eventSource="Application" eventID="1011"] ` + "\xEF\xBB\xBF" + `An application event log entry...`,
		map[string]any{"timestamp": "2003-10-11T22:14:15.003Z", "hostname": "mymachine.example.com", "app_name": "evntslog", "msg_id": "ID47",
			"facility": 20.0, "facility_name": "local4", "severity": 5.0, "severity_name": "notice", "protocol": "rfc5424",
			"sd.exampleSDID@32473.iut": "3", "sd.exampleSDID@32473.eventSource": "Application", "sd.exampleSDID@32473.eventID": "1011",
			"message": "An application event log entry..."}},
	{"rfc5424 example 4: two elements, no message", `<165>1 2003-10-11T22:14:15.003Z mymachine.example.com evntslog - ID47 [exampleSDID@32473 iut="3" eventSource="Application" eventID="1011"][examplePriority@32473 class="high"]`,
		map[string]any{"timestamp": "2003-10-11T22:14:15.003Z", "hostname": "mymachine.example.com", "app_name": "evntslog", "msg_id": "ID47",
			"facility": 20.0, "facility_name": "local4", "severity": 5.0, "severity_name": "notice", "protocol": "rfc5424",
			"sd.exampleSDID@32473.iut": "3", "sd.exampleSDID@32473.eventSource": "Application", "sd.exampleSDID@32473.eventID": "1011",
			"sd.examplePriority@32473.class": "high", "message": ""}},
	{"rfc5424 all nil", "<0>1 - - - - - -",
		map[string]any{"facility": 0.0, "facility_name": "kern", "severity": 0.0, "severity_name": "emerg", "protocol": "rfc5424", "message": ""}},
	{"rfc5424 escapes in a param value", `<14>1 2024-01-02T03:04:05Z h a p m [x@1 k="a\"b\\c\]d\e"] m`,
		map[string]any{"timestamp": "2024-01-02T03:04:05Z", "hostname": "h", "app_name": "a", "proc_id": "p", "msg_id": "m",
			"facility": 1.0, "facility_name": "user", "severity": 6.0, "severity_name": "info", "protocol": "rfc5424",
			"sd.x@1.k": `a"b\c]d\e`, "message": "m"}},
	{"rfc5424 invalid UTF-8 and control bytes in the message", "<14>1 - h a - - - bad\xff\x01tab\tend",
		map[string]any{"hostname": "h", "app_name": "a", "facility": 1.0, "facility_name": "user", "severity": 6.0, "severity_name": "info",
			"protocol": "rfc5424", "message": "bad\ufffd\x01tab\tend"}},
	{"rfc5424 broken structured data: delivered whole", `<14>1 - h a - - [x@1 k="v] m`,
		map[string]any{"facility": 1.0, "facility_name": "user", "severity": 6.0, "severity_name": "info", "protocol": "unknown",
			"parse_error": "invalid_structured_data", "message": `<14>1 - h a - - [x@1 k="v] m`}},
	{"rfc5424 bad timestamp", `<14>1 2024-13 h a - - - m`,
		map[string]any{"facility": 1.0, "facility_name": "user", "severity": 6.0, "severity_name": "info", "protocol": "unknown",
			"parse_error": "invalid_timestamp", "message": `<14>1 2024-13 h a - - - m`}},
	{"rfc5424 version 2", `<14>2 - h a - - - m`,
		map[string]any{"facility": 1.0, "facility_name": "user", "severity": 6.0, "severity_name": "info", "protocol": "unknown",
			"parse_error": "unsupported_version", "message": `<14>2 - h a - - - m`}},
}

// RFC 3164 as real senders write it.
var cases3164 = []parseCase{
	{"rfc3164 example", "<34>Oct 11 22:14:15 mymachine su: 'su root' failed for lonvick on /dev/pts/8",
		map[string]any{"timestamp": "2025-10-11T22:14:15Z", "hostname": "mymachine", "app_name": "su", "facility": 4.0, "facility_name": "auth",
			"severity": 2.0, "severity_name": "crit", "protocol": "rfc3164", "message": "'su root' failed for lonvick on /dev/pts/8"}},
	{"rfc3164 pid, space-padded day", "<13>Feb  5 17:32:18 web01 sshd[4123]: Accepted publickey for deploy",
		map[string]any{"timestamp": "2025-02-05T17:32:18Z", "hostname": "web01", "app_name": "sshd", "proc_id": "4123", "facility": 1.0, "facility_name": "user",
			"severity": 5.0, "severity_name": "notice", "protocol": "rfc3164", "message": "Accepted publickey for deploy"}},
	{"rfc3164 no hostname (a local program through /dev/log)", "<30>Feb  5 17:32:18 systemd[1]: Started Session 4.",
		map[string]any{"timestamp": "2025-02-05T17:32:18Z", "app_name": "systemd", "proc_id": "1", "facility": 3.0, "facility_name": "daemon",
			"severity": 6.0, "severity_name": "info", "protocol": "rfc3164", "message": "Started Session 4."}},
	{"rfc3164 no timestamp, no hostname", "<13>myapp: hello world",
		map[string]any{"app_name": "myapp", "facility": 1.0, "facility_name": "user", "severity": 5.0, "severity_name": "notice",
			"protocol": "rfc3164", "message": "hello world"}},
	{"cisco ios: sequence number, unsynchronised clock, milliseconds, zone, no hostname", "<189>34: *Mar  1 18:48:50.483 UTC: %SYS-5-CONFIG_I: Configured from console by vty2 (10.34.195.36)",
		map[string]any{"timestamp": "2025-03-01T18:48:50.483Z", "app_name": "%SYS-5-CONFIG_I", "facility": 23.0, "facility_name": "local7",
			"severity": 5.0, "severity_name": "notice", "protocol": "rfc3164", "message": "Configured from console by vty2 (10.34.195.36)"}},
	{"cisco asa with year", "<166>Jan 05 2025 10:00:00: %ASA-6-302013: Built inbound TCP connection 1",
		map[string]any{"timestamp": "2025-01-05T10:00:00Z", "app_name": "%ASA-6-302013", "facility": 20.0, "facility_name": "local4",
			"severity": 6.0, "severity_name": "info", "protocol": "rfc3164", "message": "Built inbound TCP connection 1"}},
	{"rsyslog forward format (RFC 3339 in 3164)", "<86>2024-05-01T10:11:12.123456+02:00 host1 CRON[99]: (root) CMD (true)",
		map[string]any{"timestamp": "2024-05-01T10:11:12.123456+02:00", "hostname": "host1", "app_name": "CRON", "proc_id": "99", "facility": 10.0,
			"facility_name": "authpriv", "severity": 6.0, "severity_name": "info", "protocol": "rfc3164", "message": "(root) CMD (true)"}},
	{"rfc3164 no tag", "<13>Oct  1 00:00:00 host just text here",
		map[string]any{"timestamp": "2025-10-01T00:00:00Z", "hostname": "host", "facility": 1.0, "facility_name": "user", "severity": 5.0,
			"severity_name": "notice", "protocol": "rfc3164", "message": "just text here"}},
	{"no PRI: delivered whole", "Oct 11 22:14:15 mymachine su: hi",
		map[string]any{"protocol": "unknown", "parse_error": "invalid_pri", "message": "Oct 11 22:14:15 mymachine su: hi"}},
	{"PRI out of range", "<192>Oct 11 22:14:15 m su: hi",
		map[string]any{"protocol": "unknown", "parse_error": "invalid_pri", "message": "<192>Oct 11 22:14:15 m su: hi"}},
	{"PRI with a leading zero", "<01>hi",
		map[string]any{"protocol": "unknown", "parse_error": "invalid_pri", "message": "<01>hi"}},
}

// testNow: the 3164 timestamps' year comes from it, the zone is UTC.
var testNow = time.Date(2025, 11, 25, 12, 0, 0, 0, time.UTC)

func TestParse(t *testing.T) {
	for _, c := range append(append([]parseCase(nil), cases5424...), cases3164...) {
		t.Run(c.name, func(t *testing.T) {
			var m Message
			parse([]byte(c.in), &m)
			out := appendJSON(nil, &m, []byte(c.in), testNow)
			if len(out) > jsonBound(&m, []byte(c.in)) {
				t.Fatalf("JSON of %d bytes over its bound %d", len(out), jsonBound(&m, []byte(c.in)))
			}
			got := map[string]any{}
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatalf("not JSON: %v\n%s", err, out)
			}
			for k, v := range c.want {
				if got[k] != v {
					t.Errorf("%s = %#v, want %#v", k, got[k], v)
				}
			}
			for k := range got {
				if _, ok := c.want[k]; !ok {
					t.Errorf("unexpected %s = %#v", k, got[k])
				}
			}
		})
	}
}

// December's messages read in January are last year's.
func TestStampYear(t *testing.T) {
	s, n := parseStamp3164([]byte("Dec 31 23:59:59 x"))
	if n == 0 {
		t.Fatal("not parsed")
	}
	jan := time.Date(2026, 1, 1, 0, 0, 5, 0, time.UTC)
	if got := s.time(jan).Year(); got != 2025 {
		t.Fatalf("year %d, want 2025", got)
	}
}

// More params than maxSDParams are kept whole, not flattened: a message of
// tiny params cannot inflate its JSON past the bound.
func TestManySDParamsStayWhole(t *testing.T) {
	in := "<14>1 - h a - - [" + strings.Repeat("x", 32) + strings.Repeat(` a=""`, maxSDParams+1) + "] m"
	var m Message
	parse([]byte(in), &m)
	if m.Proto != proto5424 || m.sdFlat {
		t.Fatalf("proto %d flat %v", m.Proto, m.sdFlat)
	}
	out := appendJSON(nil, &m, []byte(in), testNow)
	got := map[string]any{}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	if _, ok := got["structured_data"]; !ok || len(out) > jsonBound(&m, []byte(in)) {
		t.Fatalf("structured_data missing or over bound: %d > %d", len(out), jsonBound(&m, []byte(in)))
	}
}

func TestSplitFrame(t *testing.T) {
	for _, c := range []struct {
		in   string
		max  int
		kind int
		msg  string
		n    int
	}{
		{"5 hello6 world!", 100, frameMsg, "hello", 7},
		{"11 <13>a\nb c d", 100, frameMsg, "<13>a\nb c d", 14},
		{"5 hel", 100, frameNeedMore, "", 0},
		{"12", 100, frameNeedMore, "", 0},
		{"101 x", 100, frameTooLarge, "", 0},
		{"99999999999 ", 1 << 30, frameTooLarge, "", 0}, // 11 digits: refused from the digits
		{"999999999999", 1 << 30, frameTooLarge, "", 0},
		{"5x hello", 100, frameBadCount, "", 0},
		{"<13>hi\r\nnext", 100, frameMsg, "<13>hi", 8},
		{"<13>hi", 100, frameNeedMore, "", 0},
		{"<13>" + strings.Repeat("x", 20), 10, frameTruncated, "<13>xxxxxx", 10},
		{"<13>xxxxxx\n", 10, frameMsg, "<13>xxxxxx", 11},
	} {
		kind, msg, n := splitFrame([]byte(c.in), c.max)
		if kind != c.kind || string(msg) != c.msg || n != c.n {
			t.Errorf("splitFrame(%q, %d) = %d %q %d, want %d %q %d", c.in, c.max, kind, msg, n, c.kind, c.msg, c.n)
		}
	}
}

// Parsing and writing JSON allocate nothing per message.
func TestParseAllocatesNothing(t *testing.T) {
	in := []byte(cases5424[2].in)
	dst := make([]byte, 0, 4096)
	var m Message
	if n := testing.AllocsPerRun(100, func() {
		parse(in, &m)
		dst = appendJSON(dst[:0], &m, in, testNow)
	}); n != 0 {
		t.Fatalf("%v allocations per message", n)
	}
}

func BenchmarkParseJSON(b *testing.B) {
	for _, c := range []struct{ name, in string }{{"rfc5424", cases5424[2].in}, {"rfc3164", cases3164[1].in}} {
		b.Run(c.name, func(b *testing.B) {
			in := []byte(c.in)
			dst := make([]byte, 0, 4096)
			var m Message
			b.SetBytes(int64(len(in)))
			b.ReportAllocs()
			for b.Loop() {
				parse(in, &m)
				dst = appendJSON(dst[:0], &m, in, testNow)
			}
		})
	}
}
