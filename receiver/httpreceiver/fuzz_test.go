package httpreceiver

import (
	"bytes"
	"github.com/ferryhq/ferry/receiver"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ferryhq/ferry/consumer/consumertest"
	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/telemetry"
)

// FuzzDecode drives the whole request decoder (encoding, size limits, NDJSON
// splitting) with arbitrary bodies: it must never panic, must answer with a
// status from the documented set, and every record it accepts must be a
// non-empty line of the decoded body without a newline.
func FuzzDecode(f *testing.F) {
	f.Add([]byte("hello"), uint8(0), true)
	f.Add([]byte("{\"a\":1}\n{\"a\":2}\r\n\n"), uint8(0), true)
	f.Add(gz([]byte("a\nb\n")), uint8(1), true)
	f.Add(zst([]byte("a\nb\n")), uint8(2), false)
	f.Add(gz(bytes.Repeat([]byte("z"), 200<<10)), uint8(1), true)
	f.Add([]byte{0x1f, 0x8b, 0x08, 0, 0, 0}, uint8(1), false)
	f.Add([]byte{0x28, 0xb5, 0x2f, 0xfd, 0xff}, uint8(2), true)
	cfg := testConfig()
	s := &consumertest.Sink{}
	r, err := New(cfg, receiver.Env{Set: telemetry.TestSettings(), Next: s})
	if err != nil {
		f.Fatal(err)
	}
	encs := []string{"", "gzip", "zstd", "identity"}
	allowed := map[int]bool{200: true, 400: true, 413: true, 415: true}
	f.Fuzz(func(t *testing.T, body []byte, enc uint8, ndjson bool) {
		s.Reset()
		req := httptest.NewRequest(http.MethodPost, "/v1/messages/fuzz", bytes.NewReader(body))
		req.SetPathValue("topic", "fuzz")
		ct := "application/octet-stream"
		if ndjson {
			ct = "application/x-ndjson"
		}
		req.Header.Set("Content-Type", ct)
		req.Header.Set("Content-Encoding", encs[int(enc)%len(encs)])
		w := httptest.NewRecorder()
		done := make(chan struct{})
		go func() { r.handleMessages(w, req); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("handler hung")
		}
		if !allowed[w.Code] {
			t.Fatalf("status %d: %s", w.Code, w.Body.String())
		}
		for _, rec := range s.Records() {
			if rec.Topic != "fuzz" || (ndjson && (len(rec.Value) == 0 || bytes.IndexByte(rec.Value, '\n') >= 0)) {
				t.Fatalf("bad record %+v", rec)
			}
			if int64(len(rec.Value)) > int64(cfg.MaxRequestBytes) {
				t.Fatalf("record of %d bytes passed the %d limit", len(rec.Value), cfg.MaxRequestBytes)
			}
		}
	})
}

func TestSplitLinesKeepsEveryLine(t *testing.T) {
	var b record.Batch
	if _, err := splitLines([]byte("a\r\n\nbb\nccc"), &b, "t", nil, nil, time.Time{}, false); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range b.Records {
		got = append(got, string(r.Value))
	}
	if len(got) != 3 || got[0] != "a" || got[1] != "bb" || got[2] != "ccc" {
		t.Fatalf("got %q", got)
	}
}
