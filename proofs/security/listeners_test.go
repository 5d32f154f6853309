package security

import (
	"bytes"
	"context"
	"crypto/tls"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/ferryhq/ferry/client"
	"github.com/ferryhq/ferry/proofs/harness/agenttest"
	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
	"github.com/ferryhq/ferry/proofs/harness/testcerts"
	"github.com/ferryhq/ferry/tools/otlpgen"
)

// Every listener over TLS, with real clients: curl for the messages API
// (mTLS) and the admin server, a gRPC client with TLS and a client
// certificate for OTLP/gRPC, an HTTPS client for OTLP/HTTP, and the Go
// client over the local protocol's TCP listener (mTLS). Clients without
// the certificate the listener requires, or speaking plain text, are
// refused at the handshake; what was accepted is in Kafka.
func TestListenersOverTLS(t *testing.T) {
	b := secured(t)
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatal("curl is needed for this test")
	}
	certs := testcerts.New(t)
	msgs := kafkatest.NewTopic(t, b.Addr, "tls-msgs", 1)
	spans := kafkatest.NewTopic(t, b.Addr, "tls-spans", 1)
	srv := func(prefix string, mtls bool) []string {
		s := []string{prefix + ".tls.cert_file=" + certs.ServerCert, prefix + ".tls.key_file=" + certs.ServerKey}
		if mtls {
			s = append(s, prefix+".tls.client_ca_file="+certs.CA)
		}
		return s
	}
	sets := []string{"exporter.kafka.brokers=[" + b.Addr + "]", "receivers.otlp.traces.topic=" + spans, "receivers.otlp.traces.encoding=flat_json"}
	sets = append(sets, srv("receivers.http", true)...)
	sets = append(sets, srv("telemetry.admin", false)...)
	sets = append(sets, srv("receivers.otlp.http", false)...)
	sets = append(sets, srv("receivers.otlp.grpc", true)...)
	sets = append(sets, srv("receivers.local", true)...)
	sets = append(sets, srv("receivers.kafka", true)...)
	sets = append(sets, "receivers.kafka.enabled=true")
	a := agenttest.Start(t, ferryBin, "", sets...)

	curl := func(args ...string) (string, error) {
		out, err := exec.Command("curl", append([]string{"-sS", "--max-time", "30"}, args...)...).CombinedOutput()
		return string(out), err
	}
	// Admin over HTTPS, checked against the CA.
	if out, err := curl("--cacert", certs.CA, "https://"+a.Admin+"/readyz"); err != nil || !strings.Contains(out, `"ready":true`) {
		t.Fatalf("admin over TLS: %v %s", err, out)
	}
	// The messages API requires a client certificate.
	url := "https://" + a.HTTP + "/v1/messages/" + msgs
	if out, err := curl("--cacert", certs.CA, "--cert", certs.ClientCert, "--key", certs.ClientKey,
		"-H", "Content-Type: application/x-ndjson", "--data-binary", "curl:1\ncurl:2\ncurl:3\n", url); err != nil || !strings.Contains(out, `"accepted":3`) {
		t.Fatalf("curl with a client certificate: %v %s", err, out)
	}
	if out, err := curl("--cacert", certs.CA, "--data-binary", "nocert:1", url); err == nil {
		t.Fatalf("curl without a client certificate was answered: %s", out)
	}
	if out, err := curl("--data-binary", "plain:1", "http://"+a.HTTP+"/v1/messages/"+msgs); err == nil && strings.Contains(out, "accepted") {
		t.Fatalf("plain HTTP to the TLS listener was accepted: %s", out)
	}
	if out, err := curl("--data-binary", "untrusted:1", url); err == nil {
		t.Fatalf("curl trusting no CA was answered: %s", out)
	}

	// OTLP/HTTP over HTTPS.
	body, _ := ptraceotlp.NewExportRequestFromTraces(otlpgen.New(1).Traces(10)).MarshalProto()
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: certs.Client(false)}}
	res, err := hc.Post("https://"+a.OTLP+"/v1/traces", "application/x-protobuf", bytes.NewReader(body))
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("OTLP/HTTP over TLS: %v %v", err, res)
	}
	res.Body.Close()

	// OTLP/gRPC over TLS with a client certificate; without one, refused.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	export := func(cert bool) error {
		conn, err := grpc.NewClient(a.GRPC, grpc.WithTransportCredentials(credentials.NewTLS(certs.Client(cert))))
		if err != nil {
			return err
		}
		defer conn.Close()
		_, err = ptraceotlp.NewGRPCClient(conn).Export(ctx, ptraceotlp.NewExportRequestFromTraces(otlpgen.New(2).Traces(10)))
		return err
	}
	if err := export(true); err != nil {
		t.Fatalf("OTLP/gRPC over TLS: %v", err)
	}
	if err := export(false); err == nil {
		t.Fatal("OTLP/gRPC without a client certificate was answered")
	}

	// The local protocol over TCP with TLS and a client certificate.
	produce := func(conf *tls.Config, value string) error {
		c, err := client.New(client.Options{Addrs: []string{"tcp:" + a.Local}, TLS: conf, MaxRetries: 1, DialTimeout: 5 * time.Second})
		if err != nil {
			return err
		}
		defer c.Close(ctx)
		return c.ProduceSync(ctx, &client.Record{Topic: msgs, Value: []byte(value)})
	}
	if err := produce(certs.Client(true), "local:1"); err != nil {
		t.Fatalf("local protocol over TLS: %v", err)
	}
	short, cancelShort := context.WithTimeout(ctx, 3*time.Second)
	defer cancelShort()
	if c, err := client.New(client.Options{Addrs: []string{"tcp:" + a.Local}, TLS: certs.Client(false), MaxRetries: 1}); err == nil {
		if err := c.ProduceSync(short, &client.Record{Topic: msgs, Value: []byte("nocert:local")}); err == nil {
			t.Fatal("the local protocol without a client certificate was answered")
		}
		c.Close(short)
	}

	// The Kafka front over TLS with a client certificate: franz-go with
	// security.protocol=SSL, unmodified.
	kafkaProduce := func(conf *tls.Config, value string) error {
		cl, err := kgo.NewClient(kgo.SeedBrokers(a.KafkaFront), kgo.DialTLSConfig(conf), kgo.DefaultProduceTopic(msgs),
			kgo.RequestRetries(1), kgo.RecordRetries(1))
		if err != nil {
			return err
		}
		defer cl.Close()
		short, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		return cl.ProduceSync(short, &kgo.Record{Value: []byte(value)}).FirstErr()
	}
	if err := kafkaProduce(certs.Client(true), "kafka:1"); err != nil {
		t.Fatalf("Kafka front over TLS: %v", err)
	}
	if err := kafkaProduce(certs.Client(false), "nocert:kafka"); err == nil {
		t.Fatal("the Kafka front without a client certificate was answered")
	}

	got := map[string]int{}
	for _, r := range kafkatest.ConsumeAll(t, b.Addr, msgs, 3*time.Second) {
		tag, _, _ := strings.Cut(string(r.Value), ":")
		got[tag]++
	}
	if got["curl"] != 3 || got["local"] != 1 || got["kafka"] != 1 || len(got) != 3 {
		t.Fatalf("messages in Kafka: %v (want curl 3, local 1, kafka 1, nothing else)", got)
	}
	if n := len(kafkatest.Consume(t, b.Addr, spans, 20, 30*time.Second)); n != 20 {
		t.Fatalf("%d of 20 spans in Kafka", n)
	}
	a.Stop()
}
