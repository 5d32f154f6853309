package httpreceiver

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/consumer/consumertest"
	"github.com/ferryhq/ferry/exporter/kafkaexporter"
	"github.com/ferryhq/ferry/receipt"
	"github.com/ferryhq/ferry/receiver"
	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/telemetry"
)

// TestReceiptsOverHTTP: ?receipt=true answers the ranges where the
// request's records are in Kafka (a fake broker, the real exporter), and
// reading Kafka there gives back exactly the lines sent; the request id
// is on every record as ferry.request_id and echoed.
func TestReceiptsOverHTTP(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "t"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ecfg := kafkaexporter.Config{Brokers: c.ListenAddrs(), ClientID: "test", Acks: "all", Idempotent: true, Compression: "none",
		Linger: time.Millisecond, MaxBatchBytes: 1_000_000, Partitioner: "round_robin", RequestTimeout: 5 * time.Second,
		DialTimeout: time.Second, RetryBackoffMax: 200 * time.Millisecond, HealthCheckInterval: 100 * time.Millisecond, MaxPendingTopics: 1000,
		CreateTopics: kafkaexporter.CreateTopics{Partitions: -1, ReplicationFactor: -1}}
	e, err := kafkaexporter.New(ecfg, telemetry.TestSettings(), 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	_ = e.Start(context.Background())
	defer e.Shutdown(context.Background())
	_, url := start(t, testConfig(), e)

	var lines []string
	for i := 0; i < 50; i++ {
		lines = append(lines, fmt.Sprintf(`{"n":%d}`, i))
	}
	res := post(t, url+"/v1/messages/t?receipt=true", "application/x-ndjson", "", []byte(strings.Join(lines, "\n")), "X-Ferry-Request-Id", "req-42.a:b_c")
	if res.code != 200 || res.body["accepted"] != float64(50) || res.body["request_id"] != "req-42.a:b_c" || res.hdr.Get("X-Ferry-Request-Id") != "req-42.a:b_c" {
		t.Fatalf("%d %v %v", res.code, res.body, res.hdr)
	}
	rs, _ := res.body["receipts"].([]any)
	type place struct {
		p int32
		o int64
	}
	var want []place
	for _, x := range rs {
		m := x.(map[string]any)
		if m["topic"] != "t" {
			t.Fatalf("range %v", m)
		}
		for k := 0; k < int(m["count"].(float64)); k++ {
			want = append(want, place{int32(m["partition"].(float64)), int64(m["offset"].(float64)) + int64(k)})
		}
	}
	if len(want) != 50 {
		t.Fatalf("receipts cover %d records: %v", len(want), rs)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics("t"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	got := map[place]*kgo.Record{}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for len(got) < 50 && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { got[place{r.Partition, r.Offset}] = r })
	}
	for i, p := range want {
		r := got[p]
		if r == nil || string(r.Value) != lines[i] {
			t.Fatalf("line %d: receipt %v holds %v, sent %q", i, p, r, lines[i])
		}
		var id string
		for _, h := range r.Headers {
			if h.Key == receipt.HeaderKey {
				id = string(h.Value)
			}
		}
		if id != "req-42.a:b_c" {
			t.Fatalf("line %d: request id header %q", i, id)
		}
	}
}

func TestReceiptAndRequestIDRefusals(t *testing.T) {
	sink := &consumertest.Sink{}
	_, url := start(t, testConfig(), sink)
	for _, c := range []struct {
		query, id, reason string
	}{
		{"?receipt=maybe", "", "invalid_parameter"},
		{"?receipt=true&wait=false", "", "invalid_parameter"},
		{"", "has space", "invalid_request_id"},
		{"", strings.Repeat("a", receipt.MaxRequestIDBytes+1), "invalid_request_id"},
		{"", "quote\"", "invalid_request_id"},
	} {
		var hdr []string
		if c.id != "" {
			hdr = []string{"X-Ferry-Request-Id", c.id}
		}
		res := post(t, url+"/v1/messages/t"+c.query, "", "", []byte("x"), hdr...)
		if res.code != http.StatusBadRequest || res.body["reason"] != c.reason {
			t.Fatalf("%+v: %d %v", c, res.code, res.body)
		}
	}
	// An id sent empty is refused too (an id is 1 to 128), not ignored.
	if res := post(t, url+"/v1/messages/t", "", "", []byte("x"), "X-Ferry-Request-Id", ""); res.code != http.StatusBadRequest || res.body["reason"] != "invalid_request_id" {
		t.Fatalf("empty id: %d %v", res.code, res.body)
	}
	// A client cannot write the header itself.
	res := post(t, url+"/v1/messages/t", "", "", []byte("x"), "X-Ferry-Header-ferry.request_id", "spoofed")
	if res.code != 200 {
		t.Fatalf("%d %v", res.code, res.body)
	}
	for _, r := range sink.Records() {
		for _, h := range r.Headers {
			if h.Key == receipt.HeaderKey {
				t.Fatalf("spoofed header kept: %q", h.Value)
			}
		}
	}
	// Without receipt=true the answer is the same as ever.
	res = post(t, url+"/v1/messages/t", "", "", []byte("x"))
	if _, ok := res.body["receipts"]; ok || len(res.body) != 1 {
		t.Fatalf("%v", res.body)
	}
}

// TestReceiptLookup: GET /receipts/{id} answers pending, then the ranges;
// an unknown id (or none kept) answers 404.
func TestReceiptLookup(t *testing.T) {
	store, err := receipt.NewStore(receipt.Config{MaxBytes: 1 << 20, MaxAge: time.Minute}, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(testConfig(), receiver.Env{Set: telemetry.TestSettings(), Next: &consumertest.Sink{}, Receipts: store})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer r.Shutdown(context.Background())
	url := "http://" + r.Addr()
	id := store.Add(receipt.Pos{Seg: 1, Off: 32}, 100, []uint32{0, 30}, 0)
	get := func(id string) (int, map[string]any) {
		res, err := http.Get(url + "/receipts/" + id)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var m map[string]any
		_ = json.NewDecoder(res.Body).Decode(&m)
		return res.StatusCode, m
	}
	if code, m := get(id); code != 200 || m["state"] != "pending" || m["pending"] != float64(2) {
		t.Fatalf("%d %v", code, m)
	}
	rc := record.NewReceipt(2)
	rc.Acked(0, "t", 0, 7)
	rc.Acked(1, "t", 0, 8)
	store.Settle([]receipt.Pos{{Seg: 1, Off: 32}, {Seg: 1, Off: 62}}, rc)
	code, m := get(id)
	rs, _ := m["receipts"].([]any)
	if code != 200 || m["state"] != "done" || len(rs) != 1 || rs[0].(map[string]any)["count"] != float64(2) || rs[0].(map[string]any)["offset"] != float64(7) {
		t.Fatalf("%d %v", code, m)
	}
	if code, m := get("1-32-0000000000000000"); code != 404 || m["reason"] != "unknown_receipt" {
		t.Fatalf("%d %v", code, m)
	}
	// Delivery mode kafka keeps none.
	_, url2 := start(t, testConfig(), &consumertest.Sink{})
	res, _ := http.Get(url2 + "/receipts/" + id)
	if res.StatusCode != 404 {
		t.Fatal(res.Status)
	}
	res.Body.Close()
}

// TestReceiptsUnavailable: when the exporter cannot say where records
// land (Kafka with acks none), ?receipt=true is refused for good, naming
// the setting, and counted; the same request without it is served.
func TestReceiptsUnavailable(t *testing.T) {
	sink := &consumertest.Sink{}
	r, err := New(testConfig(), receiver.Env{Set: telemetry.TestSettings(), Next: sink, NoReceipts: kafkaexporter.NoReceiptsAcksNone})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer r.Shutdown(context.Background())
	url := "http://" + r.Addr()
	res := post(t, url+"/v1/messages/t?receipt=true", "", "", []byte("x"))
	if msg, _ := res.body["error"].(string); res.code != http.StatusBadRequest || res.body["reason"] != "receipts_unavailable" ||
		!strings.Contains(msg, "exporter.kafka.acks") {
		t.Fatalf("%d %v", res.code, res.body)
	}
	if n := testutil.ToFloat64(r.m.Errors("receipts_unavailable")); n != 1 {
		t.Fatalf("receipts_unavailable counted %v times", n)
	}
	if res := post(t, url+"/v1/messages/t", "", "", []byte("x")); res.code != 200 || len(sink.Records()) != 1 {
		t.Fatalf("%d %v", res.code, res.body)
	}
}

// TestReceiptLookupPages: a receipt with more ranges than one answer
// holds says so ("truncated", "next_from"), and ?from= continues it to the
// end; a bad from is refused.
func TestReceiptLookupPages(t *testing.T) {
	store, err := receipt.NewStore(receipt.Config{MaxBytes: 16 << 20, MaxAge: time.Minute}, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(testConfig(), receiver.Env{Set: telemetry.TestSettings(), Next: &consumertest.Sink{}, Receipts: store})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer r.Shutdown(context.Background())
	url := "http://" + r.Addr()
	n := receipt.MaxRangesPerAnswer + 5
	rel := make([]uint32, n)
	at := make([]receipt.Pos, n)
	rc := record.NewReceipt(n)
	for i := range rel {
		rel[i] = uint32(i * 10)
		at[i] = receipt.Pos{Seg: 1, Off: 32 + int64(i*10)}
		rc.Acked(i, "t", int32(i%2), int64(i))
	}
	id := store.Add(receipt.Pos{Seg: 1, Off: 32}, 32+int64(n*10), rel, 0)
	store.Settle(at, rc)
	got := 0
	for q, pages := "", 0; ; pages++ {
		res, err := http.Get(url + "/receipts/" + id + q)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		_ = json.NewDecoder(res.Body).Decode(&m)
		res.Body.Close()
		rs, _ := m["receipts"].([]any)
		if res.StatusCode != 200 || m["state"] != "done" || len(rs) > receipt.MaxRangesPerAnswer {
			t.Fatalf("%d %v", res.StatusCode, len(rs))
		}
		got += len(rs)
		next, more := m["next_from"].(float64)
		if more != (m["truncated"] == true) || pages > 2 {
			t.Fatalf("page %d: %v %v", pages, m["truncated"], m["next_from"])
		}
		if !more {
			break
		}
		q = fmt.Sprintf("?from=%d", int(next))
	}
	if got != n {
		t.Fatalf("%d ranges of %d", got, n)
	}
	res, _ := http.Get(url + "/receipts/" + id + "?from=-1")
	if res.StatusCode != 400 {
		t.Fatal(res.Status)
	}
	res.Body.Close()
}
