package otlpreceiver

import (
	"bytes"
	"context"
	"github.com/ferryhq/ferry/receiver"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/plog/plogotlp"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/ferryhq/ferry/consumer/consumertest"
	"github.com/ferryhq/ferry/telemetry"
	"github.com/ferryhq/ferry/tools/otlpgen"
)

// FuzzOTLPHTTP drives both decoders (protobuf, and JSON through pdata) and
// all three encodings through the HTTP handler: never a panic, always an
// OTLP answer from the documented set.
func FuzzOTLPHTTP(f *testing.F) {
	tp, _ := ptraceotlp.NewExportRequestFromTraces(otlpgen.New(1).Traces(3)).MarshalProto()
	tj, _ := ptraceotlp.NewExportRequestFromTraces(otlpgen.New(1).Traces(2)).MarshalJSON()
	lp, _ := plogotlp.NewExportRequestFromLogs(otlpgen.New(1).Logs(2, 16)).MarshalProto()
	lj, _ := plogotlp.NewExportRequestFromLogs(otlpgen.New(1).Logs(2, 16)).MarshalJSON()
	mp, _ := pmetricotlp.NewExportRequestFromMetrics(otlpgen.New(1).Metrics(1, 1, 1)).MarshalProto()
	mj, _ := pmetricotlp.NewExportRequestFromMetrics(otlpgen.New(1).Metrics(1, 1, 1)).MarshalJSON()
	for i, b := range [][]byte{tp, tj, lp, lj, mp, mj} {
		f.Add(b, uint8(i/2), i%2 == 1, uint8(i))
	}
	receivers := make([]*Receiver, 3)
	encs := []string{"otlp_proto", "otlp_json", "flat_json"}
	for i, enc := range encs {
		cfg := testConfig()
		cfg.Traces.Encoding, cfg.Metrics.Encoding, cfg.Logs.Encoding = enc, enc, enc
		r, err := New(cfg, receiver.Env{Set: telemetry.TestSettings(), Next: &consumertest.Sink{}})
		if err != nil {
			f.Fatal(err)
		}
		receivers[i] = r
	}
	paths := []string{"/v1/traces", "/v1/metrics", "/v1/logs"}
	allowed := map[int]bool{200: true, 400: true, 413: true}
	f.Fuzz(func(t *testing.T, body []byte, sig uint8, isJSON bool, enc uint8) {
		r := receivers[int(enc)%len(receivers)]
		h := newHTTPServer(r)
		req := httptest.NewRequest(http.MethodPost, paths[int(sig)%3], bytes.NewReader(body))
		if isJSON {
			req.Header.Set("Content-Type", "application/json")
		} else {
			req.Header.Set("Content-Type", "application/x-protobuf")
		}
		w := httptest.NewRecorder()
		h.srv.Handler().ServeHTTP(w, req)
		if !allowed[w.Code] {
			t.Fatalf("status %d: %s", w.Code, w.Body.String())
		}
	})
}

func TestGRPCGzipBombIsRefused(t *testing.T) {
	r := start(t, testConfig(), &consumertest.Sink{})
	ld := plog.NewLogs()
	ld.ResourceLogs().AppendEmpty().ScopeLogs().AppendEmpty().LogRecords().AppendEmpty().Body().SetStr(strings.Repeat("a", 8<<20))
	cc, _ := grpc.NewClient(r.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer cc.Close()
	_, err := plogotlp.NewGRPCClient(cc).Export(context.Background(), plogotlp.NewExportRequestFromLogs(ld), grpc.UseCompressor("gzip"))
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("8 MiB (gzip: a few kB) over a 256 KiB limit: %v", err)
	}
}
