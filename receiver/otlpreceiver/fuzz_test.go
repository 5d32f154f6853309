package otlpreceiver

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/plog/plogotlp"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"

	"github.com/ferryhq/ferry/consumer/consumertest"
	"github.com/ferryhq/ferry/otlp/encoding"
	"github.com/ferryhq/ferry/receiver"
	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/telemetry"
	"github.com/ferryhq/ferry/tools/otlpgen"
)

// fuzzMaxRecord is the record bound of the fuzz targets' receivers (the
// exporter's limit less the 4096 bytes maxRecordBytes keeps for framing):
// small, so that a request of a few kB is split over several records.
const fuzzMaxRecord = 8 << 10

// fuzzReceiver is one receiver of a fuzz target and the sink behind it.
type fuzzReceiver struct {
	r    *Receiver
	sink *consumertest.Sink
	enc  string
}

// newFuzzReceiver builds a receiver whose three signals use encoding enc,
// with a record bound of fuzzMaxRecord; started, it listens on loopback.
func newFuzzReceiver(f *testing.F, enc string, started bool) *fuzzReceiver {
	cfg := testConfig()
	cfg.Traces.Encoding, cfg.Metrics.Encoding, cfg.Logs.Encoding = enc, enc, enc
	fr := &fuzzReceiver{sink: &consumertest.Sink{}, enc: enc}
	r, err := New(cfg, receiver.Env{Set: telemetry.TestSettings(), Next: fr.sink,
		Bounds: receiver.Bounds{MaxRecordBytes: fuzzMaxRecord + 4096}})
	if err != nil {
		f.Fatal(err)
	}
	if started {
		if err := r.Start(context.Background()); err != nil {
			f.Fatal(err)
		}
		f.Cleanup(func() { _ = r.Shutdown(context.Background()) })
	}
	fr.r = r
	return fr
}

// post runs one OTLP/HTTP request through the receiver's handler and
// returns the status and the records that reached the sink.
func (fr *fuzzReceiver) post(sig encoding.Signal, body []byte, ctype, cenc string) (int, []record.Record) {
	fr.sink.Reset()
	req := httptest.NewRequest(http.MethodPost, "/v1/"+sig.String(), bytes.NewReader(body))
	req.Header.Set("Content-Type", ctype)
	if cenc != "" {
		req.Header.Set("Content-Encoding", cenc)
	}
	w := httptest.NewRecorder()
	fr.r.http.srv.Handler().ServeHTTP(w, req)
	// The handler answers after Kafka's (the sink's) ack, which comes after
	// the sink copied the records.
	return w.Code, fr.sink.Records()
}

var fuzzSignals = []encoding.Signal{encoding.Traces, encoding.Metrics, encoding.Logs}

// otlpSeeds are valid requests of every signal, protobuf and JSON: each
// with its signal's index and whether it is JSON.
func otlpSeeds() []struct {
	b      []byte
	sig    uint8
	isJSON bool
} {
	tp, _ := ptraceotlp.NewExportRequestFromTraces(otlpgen.New(1).Traces(3)).MarshalProto()
	tj, _ := ptraceotlp.NewExportRequestFromTraces(otlpgen.New(1).Traces(2)).MarshalJSON()
	// Larger than a record: split over several.
	tbig, _ := ptraceotlp.NewExportRequestFromTraces(otlpgen.New(2).Traces(120)).MarshalProto()
	mp, _ := pmetricotlp.NewExportRequestFromMetrics(otlpgen.New(1).Metrics(1, 1, 1)).MarshalProto()
	mj, _ := pmetricotlp.NewExportRequestFromMetrics(otlpgen.New(1).Metrics(1, 1, 1)).MarshalJSON()
	lp, _ := plogotlp.NewExportRequestFromLogs(otlpgen.New(1).Logs(2, 16)).MarshalProto()
	lj, _ := plogotlp.NewExportRequestFromLogs(otlpgen.New(1).Logs(2, 16)).MarshalJSON()
	lbig, _ := plogotlp.NewExportRequestFromLogs(otlpgen.New(3).Logs(40, 400)).MarshalProto()
	// A resource with a schema URL of 6000 bytes and small records: the
	// split must count the URL, copied into every record (it once did not,
	// and made records of 11 kB with an 8 kB bound).
	ld := otlpgen.New(3).Logs(100, 100)
	ld.ResourceLogs().At(0).SetSchemaUrl(strings.Repeat("s", 6000))
	lschema, _ := plogotlp.NewExportRequestFromLogs(ld).MarshalProto()
	return []struct {
		b      []byte
		sig    uint8
		isJSON bool
	}{{tp, 0, false}, {tj, 0, true}, {tbig, 0, false}, {mp, 1, false}, {mj, 1, true}, {lp, 2, false}, {lj, 2, true}, {lbig, 2, false},
		{lschema, 2, false}}
}

// FuzzOTLPHTTP drives both decoders (protobuf, and JSON through pdata) and
// all three encodings through the HTTP handler: never a panic, always an
// OTLP answer from the documented set, and what reached the sink agrees
// with the answer (checkDelivery).
func FuzzOTLPHTTP(f *testing.F) {
	for _, s := range otlpSeeds() {
		for enc := range uint8(3) {
			f.Add(s.b, s.sig, s.isJSON, enc)
		}
	}
	receivers := []*fuzzReceiver{newFuzzReceiver(f, "otlp_proto", false), newFuzzReceiver(f, "otlp_json", false),
		newFuzzReceiver(f, "flat_json", false)}
	f.Fuzz(func(t *testing.T, body []byte, sig uint8, isJSON bool, enc uint8) {
		fr := receivers[int(enc)%len(receivers)]
		s := fuzzSignals[int(sig)%3]
		ctype := "application/x-protobuf"
		if isJSON {
			ctype = "application/json"
		}
		code, recs := fr.post(s, body, ctype, "")
		checkDelivery(t, fr, s, body, isJSON, code, recs)
	})
}

// checkDelivery: the answer is 200, 400 or 413 (the sink delivers every
// record, so nothing else may come); nothing reached the sink unless the
// answer is 200; and on 200 every record goes to the signal's topic with
// its signal and encoding headers, the records together stay within
// max_expanded_bytes (each costing record.Overhead besides its key and
// value), an otlp_proto record is over the record bound only when it holds
// one span, log record or metric (which cannot be split), and where pdata
// decodes the request the records hold its items: each otlp_proto and
// otlp_json value decodes with pdata and together they hold every item
// once; a flat_json record is one JSON object per item.
func checkDelivery(t *testing.T, fr *fuzzReceiver, sig encoding.Signal, body []byte, isJSON bool, code int, recs []record.Record) {
	t.Helper()
	switch code {
	case http.StatusOK:
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
		if len(recs) > 0 {
			t.Fatalf("answered %d, and %d records reached the sink", code, len(recs))
		}
		return
	default:
		t.Fatalf("status %d", code)
	}
	cfg := fr.r.cfg
	topic := [...]string{cfg.Traces.Topic, cfg.Metrics.Topic, cfg.Logs.Topic}[sig]
	total := 0
	for i, rec := range recs {
		if rec.Topic != topic {
			t.Fatalf("record %d to topic %q, want %q", i, rec.Topic, topic)
		}
		hs := map[string]string{}
		for _, h := range rec.Headers {
			hs[h.Key] = string(h.Value)
		}
		if hs["ferry.signal"] != sig.String() || hs["ferry.encoding"] != fr.enc {
			t.Fatalf("record %d headers %v", i, hs)
		}
		total += len(rec.Key) + len(rec.Value) + record.Overhead
	}
	if total > int(cfg.MaxExpandedBytes) {
		t.Fatalf("%d records take %d bytes, past max_expanded_bytes (%d)", len(recs), total, cfg.MaxExpandedBytes)
	}
	want, ok := pdataItems(sig, body, isJSON)
	got := 0
	for i, rec := range recs {
		switch fr.enc {
		case "flat_json":
			var obj map[string]any
			if err := json.Unmarshal(rec.Value, &obj); err != nil {
				t.Fatalf("flat_json record %d is not a JSON object: %v: %q", i, err, rec.Value)
			}
			got++
		default:
			n, units, err := pdataCount(sig, rec.Value, fr.enc == "otlp_json")
			if err != nil {
				if ok {
					t.Fatalf("%s record %d does not decode with pdata, though the request does: %v", fr.enc, i, err)
				}
				continue
			}
			if fr.enc == "otlp_proto" && len(rec.Value) > fuzzMaxRecord && units != 1 {
				t.Fatalf("otlp_proto record %d of %d bytes (bound %d) holds %d spans, log records or metrics", i, len(rec.Value), fuzzMaxRecord, units)
			}
			got += n
		}
	}
	if ok && got != want {
		t.Fatalf("%d records hold %d items; pdata finds %d in the request", len(recs), got, want)
	}
}

// pdataItems counts the request's items as pdata decodes it (ok false if
// it does not).
func pdataItems(sig encoding.Signal, body []byte, isJSON bool) (int, bool) {
	n, _, err := pdataCount(sig, body, isJSON)
	return n, err == nil
}

// pdataCount decodes an export request (or TracesData, LogsData,
// MetricsData: the same message) with pdata and counts its items (spans,
// log records, data points) and its units (spans, log records, metrics:
// what a record cannot be split below).
func pdataCount(sig encoding.Signal, b []byte, isJSON bool) (items, units int, err error) {
	switch sig {
	case encoding.Traces:
		req := ptraceotlp.NewExportRequest()
		if isJSON {
			err = req.UnmarshalJSON(b)
		} else {
			err = req.UnmarshalProto(b)
		}
		n := req.Traces().SpanCount()
		return n, n, err
	case encoding.Metrics:
		req := pmetricotlp.NewExportRequest()
		if isJSON {
			err = req.UnmarshalJSON(b)
		} else {
			err = req.UnmarshalProto(b)
		}
		return req.Metrics().DataPointCount(), req.Metrics().MetricCount(), err
	default:
		req := plogotlp.NewExportRequest()
		if isJSON {
			err = req.UnmarshalJSON(b)
		} else {
			err = req.UnmarshalProto(b)
		}
		n := req.Logs().LogRecordCount()
		return n, n, err
	}
}

// FuzzOTLPHTTPCompressed: a gzip or zstd body is answered as what it
// decompresses to (read with the same libraries as a client would, outside
// the receiver): within max_request_bytes, with the answer and the records
// those bytes get uncompressed (for an intact body, the payload itself);
// inflating past the limit (a bomb: the payload repeated past 256 KiB, a
// few hundred bytes compressed), refused 413 with nothing delivered; not
// decompressing (cut short, junk after it), refused 400 or 413 with
// nothing delivered. Every answer also passes checkDelivery.
func FuzzOTLPHTTPCompressed(f *testing.F) {
	for i, s := range otlpSeeds() {
		f.Add(s.b, s.sig, s.isJSON, uint8(i), uint8(0))
	}
	f.Add([]byte("{}"), uint8(0), true, uint8(1), uint8(1<<2))            // a bomb of JSON
	f.Add([]byte{0x0a, 0}, uint8(2), false, uint8(0), uint8(1<<2|1))      // a bomb of empty resources, zstd
	f.Add([]byte{0x0a, 0}, uint8(2), false, uint8(0), uint8(2<<2))        // cut short
	f.Add([]byte("0"), uint8(0), false, uint8(0), uint8(2<<2|1))          // cut to nothing: zstd reads zero frames as an empty body
	f.Add([]byte{0x0a, 0}, uint8(1), false, uint8(0), uint8(3<<2|1|1<<4)) // junk after
	receivers := []*fuzzReceiver{newFuzzReceiver(f, "otlp_proto", false), newFuzzReceiver(f, "otlp_json", false),
		newFuzzReceiver(f, "flat_json", false)}
	zw, _ := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1))
	limit := int(receivers[0].r.cfg.MaxRequestBytes)
	f.Fuzz(func(t *testing.T, payload []byte, sig uint8, isJSON bool, enc uint8, mode uint8) {
		fr := receivers[int(enc)%len(receivers)]
		s := fuzzSignals[int(sig)%3]
		ctype := "application/x-protobuf"
		if isJSON {
			ctype = "application/json"
		}
		useZstd := mode&1 == 1
		shape := mode >> 2 & 3 // 0 intact, 1 bomb, 2 cut short, 3 junk after
		plain := payload
		if shape == 1 {
			unit := payload
			if len(unit) == 0 {
				unit = []byte{0}
			}
			plain = bytes.Repeat(unit, limit/len(unit)+1)
		}
		var body []byte
		cenc := "gzip"
		if useZstd {
			cenc = "zstd"
			body = zw.EncodeAll(plain, nil)
		} else {
			var buf bytes.Buffer
			gw, _ := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
			_, _ = gw.Write(plain)
			_ = gw.Close()
			body = buf.Bytes()
		}
		switch shape {
		case 2:
			body = body[:len(body)*int(mode>>4)/16]
		case 3:
			body = append(body, mode>>4, 0xff, 0)
		}
		code, recs := fr.post(s, body, ctype, cenc)
		// What the body decompresses to, read as a client's library reads
		// it (limit+1 bytes at most: enough to tell a body too large).
		got, derr := decompress(body, cenc, limit+1)
		switch {
		case derr != nil:
			got = nil
		case len(got) > limit && code != http.StatusRequestEntityTooLarge:
			t.Fatalf("a %s body inflating past %d bytes (shape %d): status %d, want 413", cenc, limit, shape, code)
		}
		checkDelivery(t, fr, s, got, isJSON, code, recs)
		if derr != nil {
			if code == http.StatusOK {
				t.Fatalf("a %s body that does not decompress (shape %d: %v) answered 200", cenc, shape, derr)
			}
			return
		}
		if len(got) > limit {
			return
		}
		if shape <= 1 && !bytes.Equal(got, plain) {
			t.Fatalf("an intact %s body decompresses to %d bytes, not its %d", cenc, len(got), len(plain))
		}
		pcode, precs := fr.post(s, got, ctype, "")
		if pcode != code || !sameRecords(recs, precs) {
			t.Fatalf("%s body (shape %d): status %d, %d records; its %d bytes uncompressed: status %d, %d records",
				cenc, shape, code, len(recs), len(got), pcode, len(precs))
		}
	})
}

// decompress reads at most max bytes of body decompressed with cenc.
func decompress(body []byte, cenc string, max int) ([]byte, error) {
	var r io.Reader
	if cenc == "gzip" {
		zr, err := gzip.NewReader(bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		r = zr
	} else {
		zr, err := zstd.NewReader(bytes.NewReader(body), zstd.WithDecoderConcurrency(1))
		if err != nil {
			return nil, err
		}
		defer zr.Close()
		r = zr
	}
	return io.ReadAll(io.LimitReader(r, int64(max)))
}

// sameRecords: a and b are the same records (topic, key, value) in order.
func sameRecords(a, b []record.Record) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Topic != b[i].Topic || !bytes.Equal(a[i].Key, b[i].Key) || !bytes.Equal(a[i].Value, b[i].Value) {
			return false
		}
	}
	return true
}

// rawClientCodec sends a []byte as the request message as it is, and reads the
// answer's bytes back.
type rawClientCodec struct{}

func (rawClientCodec) Name() string { return "proto" }

func (rawClientCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}

func (rawClientCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

// FuzzOTLPGRPC sends arbitrary bytes as the Export request message of each
// service through the real gRPC server over loopback, optionally gzipped
// (and as a gzip bomb: the bytes repeated past max_request_bytes): never a
// panic; the status is OK, INVALID_ARGUMENT or RESOURCE_EXHAUSTED (the
// sink delivers every record, so nothing else may come); a bomb is
// RESOURCE_EXHAUSTED; and the answer and the records delivered are the
// ones OTLP/HTTP gives the same bytes (OK for 200, INVALID_ARGUMENT for
// 400, RESOURCE_EXHAUSTED for 413).
func FuzzOTLPGRPC(f *testing.F) {
	for i, s := range otlpSeeds() {
		for r := range 3 {
			if !s.isJSON {
				f.Add(s.b, s.sig, uint8(r<<4|i%2))
			}
		}
	}
	f.Add([]byte{0x0a, 0}, uint8(2), uint8(1<<2|1)) // a gzip bomb
	f.Add([]byte{0x0a, 0x80}, uint8(1), uint8(0))   // a truncated length
	receivers := []*fuzzReceiver{newFuzzReceiver(f, "otlp_proto", true), newFuzzReceiver(f, "otlp_json", true),
		newFuzzReceiver(f, "flat_json", true)}
	conns := make([]*grpc.ClientConn, len(receivers))
	for i, fr := range receivers {
		cc, err := grpc.NewClient(fr.r.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawClientCodec{}), grpc.MaxCallRecvMsgSize(1<<20)))
		if err != nil {
			f.Fatal(err)
		}
		f.Cleanup(func() { cc.Close() })
		conns[i] = cc
	}
	methods := map[encoding.Signal]string{
		encoding.Traces:  "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
		encoding.Metrics: "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
		encoding.Logs:    "/opentelemetry.proto.collector.logs.v1.LogsService/Export",
	}
	limit := int(receivers[0].r.cfg.MaxRequestBytes)
	httpCode := map[codes.Code]int{codes.OK: http.StatusOK, codes.InvalidArgument: http.StatusBadRequest,
		codes.ResourceExhausted: http.StatusRequestEntityTooLarge}
	f.Fuzz(func(t *testing.T, msg []byte, sig uint8, mode uint8) {
		i := int(mode>>4) % len(receivers)
		fr, cc := receivers[i], conns[i]
		s := fuzzSignals[int(sig)%3]
		var opts []grpc.CallOption
		if mode&1 == 1 {
			opts = append(opts, grpc.UseCompressor("gzip"))
		}
		bomb := mode>>2&1 == 1
		if bomb {
			unit := msg
			if len(unit) == 0 {
				unit = []byte{0}
			}
			msg = bytes.Repeat(unit, limit/len(unit)+1)
		}
		fr.sink.Reset()
		var out []byte
		err := cc.Invoke(context.Background(), methods[s], &msg, &out, opts...)
		recs := fr.sink.Records()
		code := status.Code(err)
		hc, known := httpCode[code]
		if !known {
			t.Fatalf("status %v: %v", code, err)
		}
		if bomb && code != codes.ResourceExhausted {
			t.Fatalf("a message of %d bytes (limit %d): %v", len(msg), limit, err)
		}
		checkDelivery(t, fr, s, msg, false, hc, recs)
		pcode, precs := fr.post(s, msg, "application/x-protobuf", "")
		if pcode != hc || !sameRecords(recs, precs) {
			t.Fatalf("gRPC: %v (%v), %d records; OTLP/HTTP: status %d, %d records", code, err, len(recs), pcode, len(precs))
		}
		if code == codes.OK && len(out) > 0 {
			// A partial success only comes from a refused record.
			t.Fatalf("OK with a partial success %x", out)
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
