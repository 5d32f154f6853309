package otlpreceiver

import (
	"context"
	"testing"

	"go.opentelemetry.io/collector/pdata/plog/plogotlp"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ferryhq/ferry/auth"
	"github.com/ferryhq/ferry/auth/authtest"
	"github.com/ferryhq/ferry/auth/ratelimit"
	"github.com/ferryhq/ferry/consumer/consumertest"
	"github.com/ferryhq/ferry/internal/otlpgen"
	"github.com/ferryhq/ferry/telemetry"
)

func TestTokensOnBothTransports(t *testing.T) {
	checker, issue := authtest.New(t)
	good := issue("billing")
	cfg := testConfig()
	cfg.Auth = auth.ReceiverConfig{Mode: "required", Sources: []string{"authorization", "header", "metadata"}}
	sink := &consumertest.Sink{}
	r, err := New(cfg, telemetry.TestSettings(), sink, &auth.Prechecks{Checker: checker})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer r.Shutdown(context.Background())
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
	ctx = metadata.AppendToOutgoingContext(context.Background(), "x-ferry-token", good[:len(good)-2]+"xx")
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
			found = found || (h.Key == "ferry.app" && string(h.Value) == "billing")
		}
		if !found {
			t.Fatalf("record without ferry.app header: %+v", rec.Headers)
		}
	}
}

func TestRateLimitOverGRPC(t *testing.T) {
	set := telemetry.TestSettings()
	lim, _ := ratelimit.New(ratelimit.Config{Classes: map[string]ratelimit.Class{"tiny": {RecordsPerSec: 1, BurstRecords: 2}}, DefaultClass: "tiny"}, set)
	r, err := New(testConfig(), set, &consumertest.Sink{}, &auth.Prechecks{Limiter: lim})
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
