package filereceiver

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestJSONFields(t *testing.T) {
	cases := []struct {
		line, a, b string
		va, vb     string
		ok         bool
	}{
		{`{"user":"ann","ts":"2026-11-25T10:00:00Z","n":{"x":[1,2,{"y":null}]}}`, "user", "ts", `"ann"`, `"2026-11-25T10:00:00Z"`, true},
		{` { "ts" : 1764064800.5 , "user" : 42 } `, "user", "ts", `42`, `1764064800.5`, true},
		{`{"a":"x\"y\\u0041"}`, "a", "", `"x\"y\\u0041"`, "", true},
		{`{}`, "a", "b", "", "", true},
		{`{"a":1}x`, "a", "", "", "", false},
		{`[1,2]`, "a", "", "", "", false},
		{`plain text`, "a", "", "", "", false},
		{`{"a":01}`, "a", "", "", "", false},
		{`{"a":0x10}`, "a", "", "", "", false},
		{`{"a":"\x"}`, "a", "", "", "", false},
		{`{"a":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}`, "a", "", "", "", false},
	}
	for _, c := range cases {
		va, vb, ok := jsonFields([]byte(c.line), c.a, c.b)
		if ok != c.ok || string(va) != c.va || string(vb) != c.vb {
			t.Errorf("%s: got %q %q %v, want %q %q %v", c.line, va, vb, ok, c.va, c.vb, c.ok)
		}
	}
	if k := keyBytes([]byte(`"x\"y\u0041"`)); string(k) != `x"yA` {
		t.Errorf("keyBytes: %q", k)
	}
	for _, c := range []struct {
		v, format string
		want      time.Time
	}{
		{`"2026-11-25T10:00:00.5Z"`, "rfc3339", time.Date(2026, 11, 25, 10, 0, 0, 5e8, time.UTC)},
		{`1764064800`, "unix", time.Unix(1764064800, 0)},
		{`"1764064800123"`, "unix_ms", time.UnixMilli(1764064800123)},
		{`1764064800123456`, "unix_us", time.UnixMicro(1764064800123456)},
	} {
		got, ok := parseTimestamp([]byte(c.v), c.format)
		if !ok || got.Sub(c.want).Abs() > time.Microsecond {
			t.Errorf("%s %s: %v %v", c.v, c.format, got, ok)
		}
	}
	if _, ok := parseTimestamp([]byte(`"yesterday"`), "rfc3339"); ok {
		t.Error("a bad timestamp was read")
	}
}

// TestJSONLines: key and timestamp from the fields; a line that is not
// JSON, or lacks a field, is sent as it is and counted.
func TestJSONLines(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "app.log")
	write(t, path, `{"ts":"2026-11-25T10:00:00Z","req":"r-1","msg":"a"}`+"\nnot json\n"+`{"req":"r-2","ts":"bad"}`+"\n")
	cfg := testConfig(t, dir)
	cfg.Key = ""
	cfg.JSON = JSONLines{Enabled: true, KeyField: "req", TimestampField: "ts", TimestampFormat: "rfc3339"}
	var got []struct {
		key string
		ts  time.Time
	}
	p := &pipe{}
	p.onRecord = func(key []byte, ts time.Time) {
		got = append(got, struct {
			key string
			ts  time.Time
		}{string(key), ts})
	}
	r := start(t, cfg, p)
	eventually(t, "three lines", func() bool { return len(p.records()) == 3 })
	p.mu.Lock()
	defer p.mu.Unlock()
	if got[0].key != "r-1" || !got[0].ts.Equal(time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)) {
		t.Errorf("line 1: %+v", got[0])
	}
	if got[1].key != "" || time.Since(got[1].ts) > time.Minute {
		t.Errorf("line 2 (not JSON): %+v", got[1])
	}
	if got[2].key != "r-2" || time.Since(got[2].ts) > time.Minute {
		t.Errorf("line 3 (bad timestamp): %+v", got[2])
	}
	if n := testutil.ToFloat64(r.m.Errors("invalid_json")); n != 1 {
		t.Errorf("invalid_json: %v", n)
	}
	if n := testutil.ToFloat64(r.m.Errors("invalid_timestamp")); n != 1 {
		t.Errorf("invalid_timestamp: %v (the non-JSON line's is not counted twice)", n)
	}
}

// TestHeaderTemplates: headers: and path parts, per file.
func TestHeaderTemplates(t *testing.T) {
	dir := t.TempDir()
	sub := filepath.Join(dir, "nginx")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(sub, "access.log")
	write(t, path, "x\n")
	cfg := testConfig(t, dir)
	cfg.Include = []string{filepath.Join(dir, "*", "*.log")}
	cfg.Topic = "logs-{file.dir}"
	parts := strings.Split(strings.Trim(path, "/"), "/")
	cfg.Headers = map[string]string{"service": "{file.dir}", "where": "{host}:{path.1}"}
	var hdrs map[string]string
	p := &pipe{}
	p.onHeaders = func(h map[string]string) { hdrs = h }
	start(t, cfg, p)
	eventually(t, "the line", func() bool { return len(p.records()) == 1 })
	p.mu.Lock()
	defer p.mu.Unlock()
	host, _ := os.Hostname()
	if p.got[0].topic != "logs-nginx" || hdrs["service"] != "nginx" || hdrs["where"] != host+":"+parts[0] {
		t.Fatalf("topic %q headers %v", p.got[0].topic, hdrs)
	}
}

// FuzzJSONFields: jsonFields accepts exactly the lines encoding/json finds
// valid JSON objects (nesting within maxJSONDepth), and a value it finds is
// valid JSON.
func FuzzJSONFields(f *testing.F) {
	f.Add([]byte(`{"a":"x","b":[1,{"c":-0.5e3}],"d":true}`), "a", "b")
	f.Add([]byte(`{"a":"\u00e9\n"}`), "a", "")
	f.Add([]byte(` {} `), "", "")
	f.Fuzz(func(t *testing.T, line []byte, a, b string) {
		va, vb, ok := jsonFields(line, a, b)
		if d := depth(line); d > maxJSONDepth-4 && d < maxJSONDepth+4 {
			return // where the bound falls exactly is not encoding/json's business
		}
		var m map[string]json.RawMessage
		valid := json.Valid(line) && bytes.HasPrefix(bytes.TrimLeft(line, " \t\r\n"), []byte("{")) && depth(line) <= maxJSONDepth
		if valid {
			valid = json.Unmarshal(line, &m) == nil
		}
		if ok != valid {
			t.Fatalf("%q: jsonFields ok=%v, encoding/json valid=%v", line, ok, valid)
		}
		for _, v := range [][]byte{va, vb} {
			if v != nil && !json.Valid(v) {
				t.Fatalf("%q: value %q is not JSON", line, v)
			}
		}
		if ok && a != "" && utf8.Valid(line) && !bytes.ContainsRune(line, '\\') {
			// (Field names are matched as written: escapes are not undone.)
			if _, in := m[a]; in != (va != nil) {
				t.Fatalf("%q: field %q found=%v, encoding/json %v", line, a, va != nil, in)
			}
		}
	})
}

// depth is the deepest nesting of line (outside strings).
func depth(line []byte) int {
	d, most, inStr := 0, 0, false
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case inStr && c == '\\':
			i++
		case c == '"':
			inStr = !inStr
		case !inStr && (c == '{' || c == '['):
			d++
			most = max(most, d)
		case !inStr && (c == '}' || c == ']'):
			d--
		}
	}
	return most
}

// TestJSONTimestampNotANumber: strconv.ParseFloat reads "NaN" (and a
// string may hold it); NaN fails every comparison, so it passed the range
// checks and became the year 1677 (int64 of NaN), a time the line never
// said, not counted as invalid_timestamp.
func TestJSONTimestampNotANumber(t *testing.T) {
	for _, v := range []string{`"NaN"`, `"nan"`, `"+Inf"`, `"-Inf"`, `"Infinity"`, `-1`, `1e300`} {
		for _, format := range []string{"unix", "unix_ms", "unix_us", "unix_ns"} {
			if got, ok := parseTimestamp([]byte(v), format); ok {
				t.Errorf("%s %s read as %v", v, format, got)
			}
		}
	}
}

// TestJSONKeyAndTimestampOneField: key_field and timestamp_field may name
// the same field (an id that is a time); the second was never found, so
// every line counted invalid_timestamp and kept the time it was read.
func TestJSONKeyAndTimestampOneField(t *testing.T) {
	va, vb, ok := jsonFields([]byte(`{"ts":1764064800}`), "ts", "ts")
	if !ok || string(va) != "1764064800" || string(vb) != "1764064800" {
		t.Fatalf("got %q %q %v", va, vb, ok)
	}
}
