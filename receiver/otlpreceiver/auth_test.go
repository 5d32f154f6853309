package otlpreceiver

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/plog/plogotlp"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/ferryhq/ferry/auth"
	"github.com/ferryhq/ferry/auth/authtest"
	"github.com/ferryhq/ferry/auth/ratelimit"
	"github.com/ferryhq/ferry/auth/token"
	"github.com/ferryhq/ferry/consumer/consumertest"
	"github.com/ferryhq/ferry/otlp/encoding"
	"github.com/ferryhq/ferry/proofs/harness/payloads"
	"github.com/ferryhq/ferry/receiver"
	"github.com/ferryhq/ferry/telemetry"
	"github.com/ferryhq/ferry/tools/otlpgen"
)

func TestTokensOnBothTransports(t *testing.T) {
	checker, issue := authtest.New(t)
	good := issue("billing")
	cfg := testConfig()
	cfg.Auth = auth.ReceiverConfig{Mode: "required", Sources: []string{"authorization", "header", "metadata"}}
	sink := &consumertest.Sink{}
	r := startWith(t, cfg, telemetry.TestSettings(), sink, &receiver.Prechecks{Checker: checker})
	raw, _ := plogotlp.NewExportRequestFromLogs(otlpgen.New(1).Logs(2, 10)).MarshalProto()

	code, hdr, body := postOTLP(t, "http://"+r.HTTPAddr()+"/v1/logs", "application/x-protobuf", "", raw)
	if c, msg := statusOf(t, body); code != 401 || c != 16 || msg != "invalid token: missing" || hdr.Get("WWW-Authenticate") == "" {
		t.Fatalf("no token over HTTP: %d status %d %q", code, c, msg)
	}

	cc, _ := grpc.NewClient(r.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer cc.Close()
	client := plogotlp.NewGRPCClient(cc)
	req := plogotlp.NewExportRequestFromLogs(otlpgen.New(1).Logs(2, 10))
	if _, err := client.Export(context.Background(), req); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("no token over gRPC: %v", err)
	}
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+good)
	if _, err := client.Export(ctx, req); err != nil {
		t.Fatalf("valid token over gRPC: %v", err)
	}
	ctx = metadata.AppendToOutgoingContext(context.Background(), "x-ferry-token", authtest.Forge(good))
	if _, err := client.Export(ctx, req); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("forged token over gRPC: %v", err)
	}
	recs := sink.Records()
	if len(recs) == 0 {
		t.Fatal("nothing delivered for the valid token")
	}
	for _, rec := range recs {
		found := false
		for _, h := range rec.Headers {
			found = found || (h.Key == "ferry.tenant" && string(h.Value) == "billing")
		}
		if !found {
			t.Fatalf("record without ferry.tenant header: %+v", rec.Headers)
		}
	}
}

func TestRateLimitOverGRPC(t *testing.T) {
	set := telemetry.TestSettings()
	lim, _ := ratelimit.New(ratelimit.Config{Classes: map[string]ratelimit.Class{"tiny": {RecordsPerSec: 1, BurstRecords: 2}}, DefaultClass: "tiny"}, set)
	r, err := New(testConfig(), receiver.Env{Set: set, Next: &consumertest.Sink{}, Pre: &receiver.Prechecks{Limiter: lim}})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer r.Shutdown(context.Background())
	cc, _ := grpc.NewClient(r.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer cc.Close()
	client := plogotlp.NewGRPCClient(cc)
	req := plogotlp.NewExportRequestFromLogs(otlpgen.New(1).Logs(2, 10))
	if _, err := client.Export(context.Background(), req); err != nil {
		t.Fatalf("within the burst: %v", err)
	}
	_, err = client.Export(context.Background(), req)
	st := status.Convert(err)
	hasRetry := false
	for _, d := range st.Details() {
		_, ok := d.(*errdetails.RetryInfo)
		hasRetry = hasRetry || ok
	}
	if st.Code() != codes.ResourceExhausted || !hasRetry {
		t.Fatalf("over the limit: %v (RetryInfo %v)", err, hasRetry)
	}
}

func TestRouting(t *testing.T) {
	checker, _ := authtest.New(t)
	cfgAuth := auth.Config{Keys: []auth.KeyConfig{{ID: 1, Secret: authtest.Key, Issue: true}}, CacheSize: 16, CacheTTL: time.Minute}
	ring, _ := cfgAuth.Keyring()
	plain, _ := ring.Issue(token.Claims{App: "shop-eu", BusinessID: 9, DataIDs: [4]uint64{token.Logs: 1003}})
	// A name Kafka refuses is not sanitized into another tenant's topic.
	spaced, _ := ring.Issue(token.Claims{App: "shop eu"})
	own, _ := ring.Issue(token.Claims{App: "own", Topics: [4]string{token.Logs: "own-logs"}})

	cfg := testConfig()
	cfg.Logs.Topic = "otel-{signal}-{tenant}"
	cfg.Auth = auth.ReceiverConfig{Mode: "optional", Sources: []string{"authorization"}}
	sink := &consumertest.Sink{}
	r := startWith(t, cfg, telemetry.TestSettings(), sink, &receiver.Prechecks{Checker: checker})
	raw, _ := plogotlp.NewExportRequestFromLogs(otlpgen.New(1).Logs(1, 10)).MarshalProto()
	send := func(tok string) int {
		req, _ := http.NewRequest(http.MethodPost, "http://"+r.HTTPAddr()+"/v1/logs", bytes.NewReader(raw))
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
	if code := send(plain); code != 200 {
		t.Fatalf("templated: %d", code)
	}
	if code := send(own); code != 200 {
		t.Fatalf("token topic: %d", code)
	}
	if code := send(""); code != 400 {
		t.Fatalf("a {tenant} template without a token: %d, want 400", code)
	}
	if code := send(spaced); code != 400 {
		t.Fatalf("a tenant name Kafka refuses in a topic: %d, want 400", code)
	}
	recs := sink.Records()
	if len(recs) != 2 || recs[0].Topic != "otel-logs-shop-eu" || recs[1].Topic != "own-logs" {
		t.Fatalf("topics %q, %q", recs[0].Topic, recs[1].Topic)
	}
	var obj map[string]any
	if err := json.Unmarshal(recs[0].Value, &obj); err != nil {
		t.Fatal(err)
	}
	if obj["tenant"] != "shop-eu" || obj["business_id"] != 9.0 || obj["data_id"] != 1003.0 {
		t.Fatalf("flat_json tenant fields: %v %v %v", obj["tenant"], obj["business_id"], obj["data_id"])
	}
	hs := map[string]string{}
	for _, h := range recs[0].Headers {
		hs[h.Key] = string(h.Value)
	}
	if hs["ferry.tenant"] != "shop-eu" || hs["ferry.business_id"] != "9" || hs["ferry.data_id"] != "1003" {
		t.Fatalf("headers %v", hs)
	}
}

// TestTokenInResourceAttribute: ferry.token on the resource authenticates
// the request and never reaches Kafka; disagreeing resources are refused.
func TestTokenInResourceAttribute(t *testing.T) {
	checker, issue := authtest.New(t)
	tok := issue("edge")
	cfg := testConfig()
	cfg.Logs = encoding.Config{Topic: "logs", Encoding: "otlp_proto", Partition: "none"}
	cfg.Auth = auth.ReceiverConfig{Mode: "required", Sources: []string{"authorization", "metadata", "resource"}}
	sink := &consumertest.Sink{}
	r := startWith(t, cfg, telemetry.TestSettings(), sink, &receiver.Prechecks{Checker: checker})
	withTokens := func(toks ...string) []byte {
		ld := plog.NewLogs()
		for _, tk := range toks {
			rl := ld.ResourceLogs().AppendEmpty()
			rl.Resource().Attributes().PutStr("service.name", "svc")
			if tk != "" {
				rl.Resource().Attributes().PutStr("ferry.token", tk)
			}
			rl.ScopeLogs().AppendEmpty().LogRecords().AppendEmpty().Body().SetStr("hello")
		}
		raw, _ := plogotlp.NewExportRequestFromLogs(ld).MarshalProto()
		return raw
	}
	post := func(raw []byte) int {
		res, err := http.Post("http://"+r.HTTPAddr()+"/v1/logs", "application/x-protobuf", bytes.NewReader(raw))
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	if c := post(withTokens(tok, tok)); c != 200 {
		t.Fatalf("token in both resources: %d", c)
	}
	if c := post(withTokens(tok, issue("other"))); c != 401 {
		t.Fatalf("conflicting tokens: %d", c)
	}
	if v := testutil.ToFloat64(checker.RefusedCounter(ReasonConflicting)); v != 1 {
		t.Fatalf("ferry_auth_refused_total{reason=conflicting} = %v", v)
	}
	if c := post(withTokens("")); c != 401 {
		t.Fatalf("no token anywhere: %d", c)
	}
	// Over gRPC too.
	cc, _ := grpc.NewClient(r.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer cc.Close()
	req := plogotlp.NewExportRequest()
	_ = req.UnmarshalProto(withTokens(tok))
	if _, err := plogotlp.NewGRPCClient(cc).Export(context.Background(), req); err != nil {
		t.Fatalf("resource token over gRPC: %v", err)
	}
	// The attribute twice, an int then the token: both go.
	if c := post(payloads.TokenTwice(tok)); c != 200 {
		t.Fatalf("token after an int of the same name: %d", c)
	}
	recs := sink.Records()
	if len(recs) != 3 {
		t.Fatalf("%d records", len(recs))
	}
	for _, rec := range recs {
		if bytes.Contains(rec.Value, []byte("ferry.token")) || bytes.Contains(rec.Value, []byte(tok)) {
			t.Fatal("the token reached Kafka")
		}
		ld, err := (&plog.ProtoUnmarshaler{}).UnmarshalLogs(rec.Value)
		if err != nil || ld.LogRecordCount() == 0 {
			t.Fatalf("record: %v", err)
		}
	}
}

func TestRoutingByResourceAndHeaderWithKeyTemplate(t *testing.T) {
	cfg := testConfig()
	cfg.Logs = encoding.Config{Topic: "logs-{resource.service.name}-{header.x-env}", Encoding: "otlp_proto",
		Partition: "resource", Key: "{resource.host.name}"}
	sink := &consumertest.Sink{}
	r := startWith(t, cfg, telemetry.TestSettings(), sink, nil)
	ld := plog.NewLogs()
	for _, svc := range []string{"cart", "pay"} {
		rl := ld.ResourceLogs().AppendEmpty()
		rl.Resource().Attributes().PutStr("service.name", svc)
		rl.Resource().Attributes().PutStr("host.name", "h-"+svc)
		rl.ScopeLogs().AppendEmpty().LogRecords().AppendEmpty().Body().SetStr("x")
	}
	raw, _ := plogotlp.NewExportRequestFromLogs(ld).MarshalProto()
	req, _ := http.NewRequest(http.MethodPost, "http://"+r.HTTPAddr()+"/v1/logs", bytes.NewReader(raw))
	req.Header.Set("Content-Type", "application/x-protobuf")
	req.Header.Set("X-Env", "prod")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	recs := sink.Records()
	if res.StatusCode != 200 || len(recs) != 2 {
		t.Fatalf("%d, %d records", res.StatusCode, len(recs))
	}
	got := map[string]string{}
	for _, rec := range recs {
		got[rec.Topic] = string(rec.Key)
	}
	if got["logs-cart-prod"] != "h-cart" || got["logs-pay-prod"] != "h-pay" {
		t.Fatalf("topic → key %v", got)
	}
	// The same over gRPC, with metadata as the header.
	cc, _ := grpc.NewClient(r.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer cc.Close()
	sink.Reset()
	greq := plogotlp.NewExportRequestFromLogs(ld)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-env", "stage")
	if _, err := plogotlp.NewGRPCClient(cc).Export(ctx, greq); err != nil {
		t.Fatal(err)
	}
	for _, rec := range sink.Records() {
		if !strings.HasSuffix(rec.Topic, "-stage") {
			t.Fatalf("gRPC topic %q", rec.Topic)
		}
	}
}

// TestResourceTokenDecodingReserved: the resource-token path hands the
// request to pdata to strip the token: what that takes is reserved first,
// as for the attribute processor. A request carrying its token on the
// resource and 100,000 empty attributes besides (200 KB, 24 MB in pdata)
// is refused 413 where that could never fit, and served where it does.
func TestResourceTokenDecodingReserved(t *testing.T) {
	checker, issue := authtest.New(t)
	tok := issue("edge")
	ld := plog.NewLogs()
	rl := ld.ResourceLogs().AppendEmpty()
	rl.Resource().Attributes().PutStr("ferry.token", tok)
	rl.ScopeLogs().AppendEmpty().LogRecords().AppendEmpty().Body().SetStr("hello")
	raw, _ := plogotlp.NewExportRequestFromLogs(ld).MarshalProto()
	// A second ResourceLogs whose resource has 100,000 empty attributes.
	empty := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), nil)
	res := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), bytes.Repeat(empty, 100_000))
	raw = protowire.AppendBytes(protowire.AppendTag(raw, 1, protowire.BytesType), res)
	cost, err := encoding.DecodeCost(encoding.Logs, raw)
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig()
	cfg.MaxRequestBytes = 1 << 20
	cfg.Logs = encoding.Config{Topic: "logs", Encoding: "otlp_proto", Partition: "none"}
	cfg.Auth = auth.ReceiverConfig{Mode: "required", Sources: []string{"resource"}}
	answersWithin(t, cfg, &receiver.Prechecks{Checker: checker}, "/v1/logs", "application/x-protobuf", raw, []budgetCase{
		{cost / 2, 0, http.StatusRequestEntityTooLarge},
		{2 * cost, 0, http.StatusOK},
	})
}
