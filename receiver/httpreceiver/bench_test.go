package httpreceiver

import (
	"bytes"
	"context"
	"github.com/ferryhq/ferry/receiver"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/telemetry"
)

// ackAll acknowledges every record at once: the receiver's own cost.
type ackAll struct{}

func (ackAll) Consume(_ context.Context, b *record.Batch) error {
	b.Arm()
	for range b.Records {
		b.Ack(nil)
	}
	return nil
}

func benchHandle(b *testing.B, records, size int, enc string) {
	cfg := testConfig()
	cfg.MaxRequestBytes = 64 << 20
	r, err := New(cfg, receiver.Env{Set: telemetry.TestSettings(), Next: ackAll{}})
	if err != nil {
		b.Fatal(err)
	}
	var body bytes.Buffer
	for i := 0; i < records; i++ {
		body.Write(bytes.Repeat([]byte{'a' + byte(i%26)}, size))
		body.WriteByte('\n')
	}
	raw := body.Bytes()
	switch enc {
	case "gzip":
		raw = gz(raw)
	case "zstd":
		raw = zst(raw)
	}
	b.SetBytes(int64(body.Len()))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		req := httptest.NewRequest(http.MethodPost, "/v1/messages/bench", bytes.NewReader(raw))
		req.SetPathValue("topic", "bench")
		req.Header.Set("Content-Type", "application/x-ndjson")
		if enc != "" {
			req.Header.Set("Content-Encoding", enc)
		}
		w := httptest.NewRecorder()
		r.handleMessages(w, req)
		if w.Code != 200 {
			b.Fatalf("%d %s", w.Code, w.Body.String())
		}
	}
	b.ReportMetric(float64(records)*float64(b.N)/b.Elapsed().Seconds(), "records/s")
}

func BenchmarkHandleNDJSON_1000x100B(b *testing.B)      { benchHandle(b, 1000, 100, "") }
func BenchmarkHandleNDJSON_1000x100B_Gzip(b *testing.B) { benchHandle(b, 1000, 100, "gzip") }
func BenchmarkHandleNDJSON_1000x100B_Zstd(b *testing.B) { benchHandle(b, 1000, 100, "zstd") }
func BenchmarkHandleSingle_1KB(b *testing.B)            { benchHandle(b, 1, 1024, "") }
