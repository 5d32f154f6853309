package hostile

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"

	"github.com/ferryhq/ferry/auth/token"
	"github.com/ferryhq/ferry/client"
	"github.com/ferryhq/ferry/proofs/harness/agenttest"
	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
)

// TestForgedTenantHeaders: consumers trust the ferry.* headers to say
// which application a record came from. A client of the local protocol or
// of the Kafka front that writes them itself, with a token or without, must
// not be believed: in Kafka each record carries only what ferry added (the
// token's tenant, or nothing), and every forged header is counted.
func TestForgedTenantHeaders(t *testing.T) {
	brokers := kafkatest.Shared(t)
	topic := kafkatest.NewTopic(t, brokers, "forged-tenant", 1)
	a := agenttest.Start(t, ferryBin, agentConfig(brokers), "receivers.kafka.enabled=true",
		"receivers.local.auth.mode=optional", "receivers.kafka.auth.mode=optional")
	tok := issue(t, token.Claims{App: "orders"})
	forged := []client.Header{{Key: "ferry.tenant", Value: []byte("payroll")}, {Key: "ferry.app", Value: []byte("payroll")}, {Key: "trace", Value: []byte("t1")}}
	dropped := func(receiver string) float64 {
		return a.Metric(`ferry_receiver_errors_total{reason="reserved_header_dropped",receiver="` + receiver + `"}`)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// The local protocol, without and with a token.
	for i, tk := range []string{"", tok} {
		before := dropped("local")
		cl, err := client.New(client.Options{Addrs: []string{"unix:" + a.Socket}, Token: tk})
		if err != nil {
			t.Fatal(err)
		}
		err = cl.ProduceSync(ctx, &client.Record{Topic: topic, Key: []byte{'l', byte('0' + i)}, Value: []byte("local"), Headers: forged})
		_ = cl.Close(ctx)
		if err != nil {
			t.Fatalf("local protocol, token %v: %v", tk != "", err)
		}
		if got := dropped("local"); got != before+2 {
			t.Errorf("local protocol, token %v: reserved_header_dropped %v → %v, want +2", tk != "", before, got)
		}
	}
	// The Kafka front, without SASL and with the token as SASL PLAIN.
	var kforged []kgo.RecordHeader
	for _, h := range forged {
		kforged = append(kforged, kgo.RecordHeader{Key: h.Key, Value: h.Value})
	}
	for i, tk := range []string{"", tok} {
		before := dropped("kafka")
		opts := []kgo.Opt{kgo.SeedBrokers(a.KafkaFront), kgo.RequestRetries(2)}
		if tk != "" {
			opts = append(opts, kgo.SASL(plain.Auth{User: "orders", Pass: tk}.AsMechanism()))
		}
		cl, err := kgo.NewClient(opts...)
		if err != nil {
			t.Fatal(err)
		}
		err = cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Key: []byte{'k', byte('0' + i)}, Value: []byte("front"), Headers: kforged}).FirstErr()
		cl.Close()
		if err != nil {
			t.Fatalf("Kafka front, token %v: %v", tk != "", err)
		}
		if got := dropped("kafka"); got != before+2 {
			t.Errorf("Kafka front, token %v: reserved_header_dropped %v → %v, want +2", tk != "", before, got)
		}
	}

	recs := kafkatest.Consume(t, brokers, topic, 4, 30*time.Second)
	if len(recs) != 4 {
		t.Fatalf("%d records in Kafka, want 4", len(recs))
	}
	for _, r := range recs {
		withToken := r.Key[1] == '1'
		hs := map[string][]string{}
		for _, h := range r.Headers {
			hs[h.Key] = append(hs[h.Key], string(h.Value))
		}
		if len(hs["trace"]) != 1 || hs["trace"][0] != "t1" {
			t.Errorf("record %s: the client's own header lost: %v", r.Key, hs)
		}
		if len(hs["ferry.app"]) != 0 {
			t.Errorf("record %s carries a forged ferry.app: %v", r.Key, hs)
		}
		switch {
		case withToken && (len(hs["ferry.tenant"]) != 1 || hs["ferry.tenant"][0] != "orders"):
			t.Errorf("record %s (token of app orders) has ferry.tenant %v, want only orders", r.Key, hs["ferry.tenant"])
		case !withToken && len(hs["ferry.tenant"]) != 0:
			t.Errorf("record %s (no token) has ferry.tenant %v, want none", r.Key, hs["ferry.tenant"])
		}
	}
}
