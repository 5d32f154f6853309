package otlpreceiver

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.opentelemetry.io/collector/pdata/plog/plogotlp"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/ferryhq/ferry/auth"
	"github.com/ferryhq/ferry/auth/authtest"
	"github.com/ferryhq/ferry/auth/token"
	"github.com/ferryhq/ferry/buffer/budget"
	"github.com/ferryhq/ferry/consumer/consumertest"
	"github.com/ferryhq/ferry/otlp/encoding"
	"github.com/ferryhq/ferry/processor/attributes"
	"github.com/ferryhq/ferry/proofs/harness/payloads"
	"github.com/ferryhq/ferry/receiver"
	"github.com/ferryhq/ferry/telemetry"
	"github.com/ferryhq/ferry/tools/otlpgen"
)

// refusedWith posts body and requires status code and reason in the
// answer, and that nothing reached the next stage.
func refusedWith(t *testing.T, url, ctype, enc string, body []byte, code int, reason string, sink *consumertest.Sink) {
	t.Helper()
	got, _, out := postOTLP(t, url, ctype, enc, body)
	if got != code {
		t.Fatalf("status %d, want %d: %.300s", got, code, out)
	}
	if reason != "" && !bytes.Contains(out, []byte(reason)) {
		t.Fatalf("answer %q does not name %q", out, reason)
	}
	if n := len(sink.Records()); n != 0 {
		t.Fatalf("%d records passed on from a refused request", n)
	}
}

// TestAmplificationRefusedBeforeBuilt: a request whose records would be far
// larger than itself (one big resource copied into each of many traces'
// records) is refused with 413 naming max_expanded_bytes, and the output is
// not built past the bound: protobuf records are sized before a byte of
// them is written (otlp/encoding), so the whole request, from the client's
// write to its answer, allocates less than max_expanded_bytes (about 1 MiB
// here, the first time; ~100 MB if the records were built).
func TestAmplificationRefusedBeforeBuilt(t *testing.T) {
	cfg := testConfig()
	sink := &consumertest.Sink{}
	r := start(t, cfg, sink)
	body := payloads.Gzip(payloads.Amplifier(100<<10, 1000)) // ~150 KB; ~100 MB of records
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	refusedWith(t, "http://"+r.HTTPAddr()+"/v1/traces", "application/x-protobuf", "gzip", body,
		413, "receivers.otlp.max_expanded_bytes", sink)
	runtime.ReadMemStats(&after)
	if n := after.TotalAlloc - before.TotalAlloc; n >= uint64(cfg.MaxExpandedBytes) {
		t.Fatalf("the refused request allocated %d bytes, max_expanded_bytes is %d: its records were built", n, cfg.MaxExpandedBytes)
	}
}

// TestItemBombRefused: many empty spans in a few KB of gzip are refused
// with 413 naming max_items_per_request, over HTTP and gRPC.
func TestItemBombRefused(t *testing.T) {
	cfg := testConfig()
	cfg.MaxItems = 10000
	cfg.MaxRequestBytes = 2 << 20
	sink := &consumertest.Sink{}
	r := start(t, cfg, sink)
	body := payloads.EmptySpans(100000)
	refusedWith(t, "http://"+r.HTTPAddr()+"/v1/traces", "application/x-protobuf", "gzip", payloads.Gzip(body),
		413, "receivers.otlp.max_items_per_request", sink)

	conn, err := grpc.NewClient(r.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	req := ptraceotlp.NewExportRequest()
	if err := req.UnmarshalProto(body); err != nil {
		t.Fatal(err)
	}
	_, err = ptraceotlp.NewGRPCClient(conn).Export(context.Background(), req)
	if st, _ := status.FromError(err); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "max_items_per_request") {
		t.Fatalf("gRPC: %v, want RESOURCE_EXHAUSTED naming max_items_per_request", err)
	}
}

// TestDeepNestingNeverReachesPdata: attribute nesting far beyond ferry's
// bound, on the paths that hand the request to pdata (attribute filters,
// the resource token, OTLP/JSON), is refused with 400 by ferry's own
// decoder first. The stack is capped for the test: pdata's recursive
// decoder used to need hundreds of MiB for this (a fatal stack overflow
// at larger sizes, killing the agent and everything it held).
func TestDeepNestingNeverReachesPdata(t *testing.T) {
	defer debug.SetMaxStack(debug.SetMaxStack(32 << 20))
	set := telemetry.TestSettings()
	ap, err := attributes.New(attributes.Config{Actions: []attributes.Action{{Action: "delete", Key: "secret"}}}, set)
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig()
	cfg.MaxRequestBytes = 8 << 20
	cfg.MaxExpandedBytes = 16 << 20
	cfg.Auth = auth.ReceiverConfig{Mode: "optional", Sources: []string{"authorization", "resource"}}
	sink := &consumertest.Sink{}
	r := startWith(t, cfg, set, sink, &receiver.Prechecks{Attributes: ap})
	url := "http://" + r.HTTPAddr() + "/v1/traces"
	refusedWith(t, url, "application/x-protobuf", "", payloads.DeepAttribute(300000, ""), 400, "", sink)
	refusedWith(t, url, "application/json", "", payloads.DeepJSON(100000), 400, "nested deeper", sink)
	// A shallow one still goes through every path.
	if code, _, out := postOTLP(t, url, "application/x-protobuf", "", payloads.DeepAttribute(5, "")); code != 200 {
		t.Fatalf("shallow nesting: %d %s", code, out)
	}
	if code, _, out := postOTLP(t, url, "application/json", "", payloads.DeepJSON(5)); code != 200 {
		t.Fatalf("shallow JSON nesting: %d %s", code, out)
	}
}

// TestDeepNestingResourceToken: the resource-token path strips the token
// through pdata; a deep request carrying a token is refused before that.
func TestDeepNestingResourceToken(t *testing.T) {
	defer debug.SetMaxStack(debug.SetMaxStack(32 << 20))
	cfg := testConfig()
	cfg.MaxRequestBytes = 8 << 20
	cfg.MaxExpandedBytes = 16 << 20
	cfg.Auth = auth.ReceiverConfig{Mode: "optional", Sources: []string{"resource"}}
	checker, issue := authtest.New(t)
	sink := &consumertest.Sink{}
	r := startWith(t, cfg, telemetry.TestSettings(), sink, &receiver.Prechecks{Checker: checker})
	tok := issue("app")
	url := "http://" + r.HTTPAddr() + "/v1/traces"
	refusedWith(t, url, "application/x-protobuf", "", payloads.DeepAttribute(300000, tok), 400, "", sink)
	if code, _, out := postOTLP(t, url, "application/x-protobuf", "", payloads.DeepAttribute(5, tok)); code != 200 {
		t.Fatalf("shallow nesting with a resource token: %d %s", code, out)
	}
}

// budgetedGRPC starts a receiver of cfg whose requests reserve from a
// budget of limit bytes, and returns a gRPC client of it and the budget.
func budgetedGRPC(t *testing.T, cfg Config, limit int64, readWait ...time.Duration) (ptraceotlp.GRPCClient, *budget.Budget) {
	t.Helper()
	b := budget.New(limit)
	r, err := New(cfg, receiver.Env{Set: telemetry.TestSettings(), Next: &consumertest.Sink{}, Bodies: b})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range readWait {
		r.grpc.readWait = d
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Shutdown(context.Background()) })
	conn, err := grpc.NewClient(r.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return ptraceotlp.NewGRPCClient(conn), b
}

// TestGRPCReservesBeforeRead: a gRPC request reserves twice
// max_request_bytes of the memory budget (gRPC's buffers and ferry's copy)
// before its message is read; when that does not fit
// (within grpcReadWait) it is refused with RESOURCE_EXHAUSTED and
// RetryInfo, and every reservation is given back however the request ends
// (served, refused, too large).
func TestGRPCReservesBeforeRead(t *testing.T) {
	cfg := testConfig()
	client, budget := budgetedGRPC(t, cfg, 4<<20)
	small := ptraceotlp.NewExportRequestFromTraces(otlpgen.New(1).Traces(5))
	for i := 0; i < 20; i++ {
		if _, err := client.Export(context.Background(), small); err != nil {
			t.Fatal(err)
		}
	}
	big := ptraceotlp.NewExportRequestFromTraces(otlpgen.New(1).Traces(4000))
	if _, err := client.Export(context.Background(), big); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("message over max_request_bytes: %v", err)
	}
	waitUsed := func(want int64) {
		t.Helper()
		deadline := time.Now().Add(3 * time.Second)
		for budget.Used() != want {
			if time.Now().After(deadline) {
				t.Fatalf("budget holds %d bytes, want %d", budget.Used(), want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitUsed(0)
	// With the budget nearly taken, a request cannot reserve its read.
	budget.Reserve(budget.Limit()-int64(cfg.MaxRequestBytes)/2, budget.Limit())
	_, err := client.Export(context.Background(), small)
	st, _ := status.FromError(err)
	if st.Code() != codes.ResourceExhausted || len(st.Details()) == 0 {
		t.Fatalf("no room to read: %v (details %v), want RESOURCE_EXHAUSTED with RetryInfo", err, st.Details())
	}
	budget.Release(budget.Limit() - int64(cfg.MaxRequestBytes)/2)
	waitUsed(0)
	// Room for exactly the read reservation (twice max_request_bytes: gRPC's
	// buffers and ferry's copy): the message's buffer takes its bytes from
	// it, so the request is served (it once asked for both at once and was
	// answered INTERNAL, which OTLP exporters drop).
	budget.Reserve(budget.Limit()-2*int64(cfg.MaxRequestBytes), budget.Limit())
	for i := 0; i < 5; i++ {
		if _, err := client.Export(context.Background(), small); err != nil {
			t.Fatalf("a request that fits its read reservation: %v", err)
		}
	}
	budget.Release(budget.Limit() - 2*int64(cfg.MaxRequestBytes))
	waitUsed(0)
}

// TestGRPCBurstOfSmallRequests: a burst of small requests, many times more
// than memory_limit / max_request_bytes at once, is served whole: each
// holds the stream window until its handler runs and twice
// max_request_bytes only while its message is read, waiting its turn. Reserving
// max_request_bytes when the headers arrived refused most of such a burst
// with RESOURCE_EXHAUSTED although its bytes fitted many times over.
func TestGRPCBurstOfSmallRequests(t *testing.T) {
	cfg := testConfig()
	cfg.MaxRequestBytes = 8 << 20
	cfg.MaxExpandedBytes = 8 << 20
	cfg.GRPC.MaxConcurrentStreams = 64
	// Room for six reads (twice max_request_bytes each); 48 requests
	// arrive at once, and the stream windows they hold (48 MiB) leave room
	// for three reads at a time (arrivals stay below the limit less one
	// read, 81 MiB).
	client, budget := budgetedGRPC(t, cfg, 96<<20, 5*time.Second)
	small := ptraceotlp.NewExportRequestFromTraces(otlpgen.New(1).Traces(5))
	if _, err := client.Export(context.Background(), small); err != nil {
		t.Fatal(err)
	}
	// On a loaded machine (the race detector, the whole suite on 2 cores)
	// 16 waves of three reads can take longer than grpcReadWait, and the
	// last request of a burst was refused (1 of 48, once): this test's
	// claim is that all of them have room, so the wait is lengthened;
	// refusals at arrival (the bug it guards) do not wait.
	// drained waits until every reservation is given back: a request's
	// answer reaches the client just before its handler returns the
	// budget, so a round started at once could find the last one's held.
	drained := func(when string) {
		deadline := time.Now().Add(3 * time.Second)
		for budget.Used() != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("budget holds %d bytes %s, want 0", budget.Used(), when)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	for round := 0; round < 5; round++ {
		drained(fmt.Sprintf("before round %d", round))
		start := make(chan struct{})
		errs := make(chan error, 48)
		var wg sync.WaitGroup
		for i := 0; i < 48; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				_, err := client.Export(context.Background(), small)
				errs <- err
			}()
		}
		close(start)
		wg.Wait()
		close(errs)
		refused := 0
		for err := range errs {
			if err != nil {
				refused++
				t.Logf("round %d: %v", round, err)
			}
		}
		// Arrivals stay below the limit less one read (81 MiB), and reads
		// may take the rest: a burst staggered by a loaded machine, so that
		// three reads (16 MiB each) began before the rest arrived, leaves
		// those 33 MiB: 33 requests admitted, 15 refused, retryably, by
		// design (seen: 1 of 48 in about one run of ten with -race, and
		// once exactly 15, in make test on a fresh clone with the whole
		// suite running). Reserving max_request_bytes at arrival, the bug
		// this guards, admits at most 10 and refused 27-40.
		if refused > 15 {
			t.Fatalf("round %d: %d of 48 small requests refused, with room for nearly all of them", round, refused)
		}
	}
	drained("after the requests")
}

// TestTopicScopeOTLP: routed topics are checked against the token's topic
// pattern and the receiver's topics, per record when the topic comes from
// the resource: 403 / PERMISSION_DENIED, nothing passed on.
func TestTopicScopeOTLP(t *testing.T) {
	checker, _ := authtest.New(t)
	cfg := testConfig()
	cfg.Logs = encoding.Config{Topic: "otel-{signal}-{tenant}", Encoding: "otlp_proto", Partition: "resource"}
	cfg.Traces = encoding.Config{Topic: "spans-{resource.service.name}", Encoding: "otlp_proto", Partition: "trace_id"}
	cfg.Topics = []string{"otel-*", "spans-checkout"}
	cfg.Auth = auth.ReceiverConfig{Mode: "optional", Sources: []string{"authorization"}}
	sink := &consumertest.Sink{}
	r := startWith(t, cfg, telemetry.TestSettings(), sink, &receiver.Prechecks{Checker: checker})
	send := func(path string, raw []byte, tok string) int {
		req, _ := http.NewRequest(http.MethodPost, "http://"+r.HTTPAddr()+path, bytes.NewReader(raw))
		req.Header.Set("Content-Type", "application/x-protobuf")
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	logs, _ := plogotlp.NewExportRequestFromLogs(otlpgen.New(1).Logs(1, 3)).MarshalProto()
	scoped := authtest.IssueClaims(t, token.Claims{App: "acme", TopicPattern: "acme-*"})
	open := authtest.IssueClaims(t, token.Claims{App: "acme"})
	if c := send("/v1/logs", logs, scoped); c != 403 {
		t.Fatalf("token scoped to acme-* routed to otel-logs-acme: %d, want 403", c)
	}
	if c := send("/v1/logs", logs, open); c != 200 {
		t.Fatalf("unscoped token: %d", c)
	}
	// Per resource: one resource routes outside the receiver's topics.
	td := ptrace.NewTraces()
	for i, svc := range []string{"checkout", "billing"} {
		rs := td.ResourceSpans().AppendEmpty()
		rs.Resource().Attributes().PutStr("service.name", svc)
		sp := rs.ScopeSpans().AppendEmpty().Spans().AppendEmpty()
		sp.SetTraceID([16]byte{1, byte(i)})
		sp.SetName("op")
	}
	spans, _ := ptraceotlp.NewExportRequestFromTraces(td).MarshalProto()
	if c := send("/v1/traces", spans, ""); c != 403 {
		t.Fatalf("a resource routed to spans-billing: %d, want 403", c)
	}
	if n := len(sink.Records()); n != 1 {
		t.Fatalf("%d records passed on, want the one allowed logs record", n)
	}
}

// TestBrowserOriginsRefusedOTLP: OTLP/HTTP refuses requests from web pages
// not listed in allowed_origins, and answers the CORS preflight of those
// that are (browser OTLP exporters).
func TestBrowserOriginsRefusedOTLP(t *testing.T) {
	cfg := testConfig()
	cfg.HTTP.AllowedOrigins = []string{"https://app.example.com"}
	sink := &consumertest.Sink{}
	r := start(t, cfg, sink)
	raw, _ := plogotlp.NewExportRequestFromLogs(otlpgen.New(1).Logs(1, 1)).MarshalProto()
	do := func(method, origin string) *http.Response {
		req, _ := http.NewRequest(method, "http://"+r.HTTPAddr()+"/v1/logs", bytes.NewReader(raw))
		req.Header.Set("Content-Type", "application/x-protobuf")
		req.Header.Set("Origin", origin)
		if method == http.MethodOptions {
			req.Header.Set("Access-Control-Request-Method", "POST")
			req.Header.Set("Access-Control-Request-Headers", "content-type")
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res
	}
	if res := do(http.MethodPost, "https://evil.example"); res.StatusCode != 403 {
		t.Fatalf("foreign origin: %d", res.StatusCode)
	}
	if res := do(http.MethodOptions, "https://app.example.com"); res.StatusCode != 204 || res.Header.Get("Access-Control-Allow-Methods") != "POST" {
		t.Fatalf("preflight: %d %v", res.StatusCode, res.Header)
	}
	if res := do(http.MethodPost, "https://app.example.com"); res.StatusCode != 200 {
		t.Fatalf("allowed origin: %d", res.StatusCode)
	}
	if n := len(sink.Records()); n != 1 {
		t.Fatalf("%d records, want 1", n)
	}
}

// TestGRPCHandlerPanicIsItsRequests: a panic in a gRPC handler (a bug
// reached by a client's bytes) ends that request INTERNAL, counted, and the
// server goes on serving: gRPC recovers no handler, so unguarded it ended
// the agent (this test's process).
func TestGRPCHandlerPanicIsItsRequests(t *testing.T) {
	r := start(t, testConfig(), &consumertest.Sink{})
	conn, err := grpc.NewClient(r.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	req := ptraceotlp.NewExportRequestFromTraces(ptrace.NewTraces())
	bug := func() {
		var b []byte
		_ = b[len(r.HTTPAddr())]
	}
	onExport.Store(&bug)
	_, err = ptraceotlp.NewGRPCClient(conn).Export(context.Background(), req)
	onExport.Store(nil)
	if st := status.Convert(err); st.Code() != codes.Internal || !strings.Contains(st.Message(), "a ferry bug") {
		t.Fatalf("%v", err)
	}
	if v := testutil.ToFloat64(r.grpcM.Errors("internal_error")); v != 1 {
		t.Fatalf("internal_error counted %v", v)
	}
	if _, err := ptraceotlp.NewGRPCClient(conn).Export(context.Background(), req); err != nil {
		t.Fatalf("after the panic: %v", err)
	}
}

// TestRecordsBufferReservedFirst: the buffer a request's records are built
// in is reserved before it is taken. With room for the request's body but
// not for its records, the request is refused retryable (429 queue_full,
// Retry-After) and the budget holds nothing after; the buffer used to be
// taken outside the budget (1.5 times the body, per request in flight).
// With the attribute processor on, its rewritten copy takes its room from
// the body's.
func TestRecordsBufferReservedFirst(t *testing.T) {
	for _, rewrite := range []bool{false, true} {
		t.Run(fmt.Sprintf("rewrite=%v", rewrite), func(t *testing.T) { recordsBufferReservedFirst(t, rewrite) })
	}
}

func recordsBufferReservedFirst(t *testing.T, rewrite bool) {
	cfg := testConfig()
	b := budget.New(8 << 20)
	sink := &consumertest.Sink{}
	set := telemetry.TestSettings()
	pre := &receiver.Prechecks{}
	if rewrite {
		ap, err := attributes.New(attributes.Config{Actions: []attributes.Action{{Action: "delete", Key: "secret"}}}, set)
		if err != nil {
			t.Fatal(err)
		}
		pre.Attributes = ap
	}
	r, err := New(cfg, receiver.Env{Set: set, Next: sink, Bodies: b, Pre: pre})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Shutdown(context.Background()) })
	raw, _ := ptraceotlp.NewExportRequestFromTraces(otlpgen.New(1).Traces(40)).MarshalProto()
	url := "http://" + r.HTTPAddr() + "/v1/traces"
	class := 1 // the pooled buffer the body is read into: a power of two
	for class < len(raw) {
		class <<= 1
	}
	taken := b.Limit() - int64(class) - 1024
	b.Reserve(taken, b.Limit())
	code, hdr, out := postOTLP(t, url, "application/x-protobuf", "", raw)
	if code != http.StatusTooManyRequests || hdr.Get("Retry-After") == "" || !strings.Contains(string(out), "buffer is full") {
		t.Fatalf("room for the body only: %d %q %s", code, hdr.Get("Retry-After"), out)
	}
	if n := len(sink.Records()); n != 0 {
		t.Fatalf("%d records handed on", n)
	}
	if used := b.Used(); used != taken {
		t.Fatalf("the budget holds %d bytes after the refusal, want %d", used, taken)
	}
	b.Release(taken)
	if code, _, out := postOTLP(t, url, "application/x-protobuf", "", raw); code != 200 {
		t.Fatalf("with room: %d %s", code, out)
	}
	for deadline := time.Now().Add(3 * time.Second); b.Used() != 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the budget holds %d bytes after the request was served", b.Used())
		}
	}
}

// TestRecordsBufferThatCouldNeverFit: a request whose records' buffer at
// 1.5 times its size could never fit in the budget beside it is not told
// to retry forever: sent as one record (partition none) it needs no such
// buffer and is served.
func TestRecordsBufferThatCouldNeverFit(t *testing.T) {
	cfg := testConfig()
	cfg.MaxRequestBytes = 1 << 20
	cfg.Traces.Partition = "none"
	b := budget.New(768 << 10)
	sink := &consumertest.Sink{}
	r, err := New(cfg, receiver.Env{Set: telemetry.TestSettings(), Next: sink, Bodies: b})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Shutdown(context.Background()) })
	raw, _ := ptraceotlp.NewExportRequestFromTraces(otlpgen.New(1).Traces(1500)).MarshalProto()
	if len(raw) < 260<<10 || len(raw) > 512<<10 {
		t.Fatalf("the request is %d bytes: the test needs 256 to 512 KiB", len(raw))
	}
	url := "http://" + r.HTTPAddr() + "/v1/traces"
	if code, _, out := postOTLP(t, url, "application/x-protobuf", "", raw); code != 200 {
		t.Fatalf("a %d KiB request in a budget of 768 KiB: %d %s", len(raw)>>10, code, out)
	}
	if n := len(sink.Records()); n != 1 {
		t.Fatalf("%d records, want the request as one", n)
	}
}

// TestRewriteDecodingReserved: with the attribute processor on, what pdata
// takes decoding a request (encoding.DecodeCost) is reserved while it
// runs: 100,000 empty attributes, 200 KB on the wire and 24 MB in pdata,
// are refused 413 where that could never fit, 429 with Retry-After where
// it does not fit now, and served where it does; the budget holds nothing
// after. They were decoded outside the budget.
func TestRewriteDecodingReserved(t *testing.T) {
	one := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), nil)
	resource := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), bytes.Repeat(one, 100_000))
	raw := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), resource)
	cost, err := encoding.DecodeCost(encoding.Traces, raw)
	if err != nil {
		t.Fatal(err)
	}
	ap, err := attributes.New(attributes.Config{Actions: []attributes.Action{{Action: "delete", Key: "secret"}}}, telemetry.TestSettings())
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig()
	cfg.MaxRequestBytes = 1 << 20
	answersWithin(t, cfg, &receiver.Prechecks{Attributes: ap}, "/v1/traces", "application/x-protobuf", raw, []budgetCase{
		{cost / 2, 0, http.StatusRequestEntityTooLarge},
		{2 * cost, 2*cost - cost/2, http.StatusTooManyRequests},
		{2 * cost, 0, http.StatusOK},
	})
}

// TestOTLPJSONEncodingReserved: records written as otlp_json go through
// pdata too; what that takes is reserved while the encoder runs.
func TestOTLPJSONEncodingReserved(t *testing.T) {
	one := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), nil)
	resource := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), bytes.Repeat(one, 100_000))
	span := protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType),
		protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType), nil)) // a scope with one empty span
	raw := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), append(resource, span...))
	cost, err := encoding.DecodeCost(encoding.Traces, raw)
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig()
	cfg.MaxRequestBytes = 1 << 20
	cfg.MaxExpandedBytes = 64 << 20
	cfg.Traces = encoding.Config{Topic: "spans", Encoding: "otlp_json", Partition: "none"}
	answersWithin(t, cfg, nil, "/v1/traces", "application/x-protobuf", raw, []budgetCase{
		{cost / 2, 0, http.StatusRequestEntityTooLarge},
		{4 * cost, 0, http.StatusOK},
	})
}

// budgetCase is one request to a receiver whose budget is limit bytes,
// taken of them held by others, and the status it must be answered.
type budgetCase struct {
	limit, taken int64
	status       int
}

// answersWithin posts body to path on a receiver of cfg (with pre) for
// each case, checks the status (a 429 with Retry-After), and that the
// budget holds nothing after.
func answersWithin(t *testing.T, cfg Config, pre *receiver.Prechecks, path, ctype string, body []byte, cases []budgetCase) {
	t.Helper()
	for _, c := range cases {
		b := budget.New(c.limit)
		r, err := New(cfg, receiver.Env{Set: telemetry.TestSettings(), Next: &consumertest.Sink{}, Bodies: b, Pre: pre})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		b.Reserve(c.taken, b.Limit())
		code, hdr, out := postOTLP(t, "http://"+r.HTTPAddr()+path, ctype, "", body)
		if code != c.status || code == http.StatusTooManyRequests && hdr.Get("Retry-After") == "" {
			t.Fatalf("budget %d, %d taken: %d %s, want %d", c.limit, c.taken, code, out, c.status)
		}
		b.Release(c.taken)
		for deadline := time.Now().Add(3 * time.Second); b.Used() != 0; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the budget holds %d bytes after the request", b.Used())
			}
		}
		_ = r.Shutdown(context.Background())
	}
}
