// Package receipts proves delivery receipts end to end: the real ferry
// binary in front of a real Kafka broker, clients asking where their
// records went (HTTP ?receipt=true and the local protocol's version 2
// through the Go client), and every receipt checked by reading Kafka at
// that topic, partition and offset: the value there must be exactly the
// record sent, with its request id header. In delivery mode kafka the
// receipt comes with the answer; in spool mode the answer carries a
// receipt id, polled with GET /receipts/{id} until Kafka has the records.
package receipts

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/client"
	"github.com/ferryhq/ferry/proofs/harness/agenttest"
	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
)

var ferryBin string

func TestMain(m *testing.M) {
	flag.Parse()
	bin, cleanup := agenttest.BuildForTests()
	defer cleanup()
	ferryBin = bin
	kafkatest.Main(m)
}

// placeRange is one range of a receipt.
type placeRange struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
	Count     int    `json:"count"`
}

// sent is a record a client sent and where its receipt says it is.
type sent struct {
	value, requestID string
	topic            string
	partition        int32
	offset           int64
}

// expand turns ranges into one place per record, in record order.
func expand(values []string, reqID string, rs []placeRange) ([]sent, error) {
	var out []sent
	for _, r := range rs {
		for k := 0; k < r.Count; k++ {
			if len(out) == len(values) {
				return nil, fmt.Errorf("ranges cover more than the %d records sent", len(values))
			}
			out = append(out, sent{value: values[len(out)], requestID: reqID, topic: r.Topic, partition: r.Partition, offset: r.Offset + int64(k)})
		}
	}
	if len(out) != len(values) {
		return nil, fmt.Errorf("ranges cover %d of %d records", len(out), len(values))
	}
	return out, nil
}

// checkInKafka reads Kafka at every receipt's place: exactly the record
// sent must be there, with its request id.
func checkInKafka(t *testing.T, broker string, want []sent) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(broker))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	// Consume each partition named from the lowest offset named: one pass.
	parts := map[string]map[int32]kgo.Offset{}
	for _, s := range want {
		if parts[s.topic] == nil {
			parts[s.topic] = map[int32]kgo.Offset{}
		}
		if o, ok := parts[s.topic][s.partition]; !ok || s.offset < o.EpochOffset().Offset {
			parts[s.topic][s.partition] = kgo.NewOffset().At(s.offset)
		}
	}
	cl.AddConsumePartitions(parts)
	type key struct {
		t string
		p int32
		o int64
	}
	need := map[key]sent{}
	for _, s := range want {
		need[key{s.topic, s.partition, s.offset}] = s
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for len(need) > 0 && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			k := key{r.Topic, r.Partition, r.Offset}
			s, ok := need[k]
			if !ok {
				return
			}
			var id string
			for _, h := range r.Headers {
				if h.Key == "ferry.request_id" {
					id = string(h.Value)
				}
			}
			if string(r.Value) != s.value || id != s.requestID {
				t.Errorf("%s/%d/%d holds %q (request id %q), the receipt says %q (%q)", r.Topic, r.Partition, r.Offset, r.Value, id, s.value, s.requestID)
			}
			delete(need, k)
		})
	}
	if len(need) > 0 {
		t.Fatalf("%d receipts point at nothing in Kafka", len(need))
	}
}

// answer is the HTTP answer to a POST with ?receipt=true.
type answer struct {
	Accepted  int          `json:"accepted"`
	RequestID string       `json:"request_id"`
	Receipts  []placeRange `json:"receipts"`
	ReceiptID string       `json:"receipt_id"`
}

func postNDJSON(t *testing.T, a *agenttest.Agent, topic, reqID string, values []string) answer {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, "http://"+a.HTTP+"/v1/messages/"+topic+"?receipt=true", strings.NewReader(strings.Join(values, "\n")))
	req.Header.Set("Content-Type", "application/x-ndjson")
	req.Header.Set("X-Ferry-Request-Id", reqID)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var ans answer
	var raw bytes.Buffer
	_, _ = raw.ReadFrom(res.Body)
	if err := json.Unmarshal(raw.Bytes(), &ans); err != nil || res.StatusCode != 200 || ans.Accepted != len(values) || ans.RequestID != reqID {
		t.Fatalf("%s: %s (%v)", res.Status, raw.String(), err)
	}
	return ans
}

// lookup polls GET /receipts/{id} until the receipt is done.
func lookup(t *testing.T, a *agenttest.Agent, id string) []placeRange {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	sawPending := false
	for {
		res, err := http.Get("http://" + a.HTTP + "/receipts/" + id)
		if err != nil {
			t.Fatal(err)
		}
		var st struct {
			State    string       `json:"state"`
			Pending  int          `json:"pending"`
			Receipts []placeRange `json:"receipts"`
		}
		err = json.NewDecoder(res.Body).Decode(&st)
		res.Body.Close()
		if err != nil || res.StatusCode != 200 {
			t.Fatalf("GET /receipts/%s: %s %v", id, res.Status, err)
		}
		if st.State == "done" {
			t.Logf("receipt %s: done (pending seen: %v)", id, sawPending)
			return st.Receipts
		}
		sawPending = true
		if time.Now().After(deadline) {
			t.Fatalf("receipt %s still pending after a minute (%d records)", id, st.Pending)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func values(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf(`{"src":%q,"n":%d}`, prefix, i)
	}
	return out
}

// viaClient sends records with the Go client (protocol version 2) and
// returns each record's Result.
func viaClient(t *testing.T, a *agenttest.Agent, topic, reqID string, vals []string) []client.Result {
	t.Helper()
	cl, err := client.New(client.Options{Addrs: []string{"unix:" + a.Socket}, Receipts: true, RequestIDs: true, Compression: "lz4"})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close(context.Background())
	res := make([]client.Result, len(vals))
	var wg sync.WaitGroup
	wg.Add(len(vals))
	for i, v := range vals {
		i := i
		cl.ProduceResult(context.Background(), &client.Record{Topic: topic, Key: []byte(fmt.Sprint(i % 5)), Value: []byte(v), RequestID: reqID},
			func(_ *client.Record, r client.Result, err error) {
				if err != nil {
					t.Errorf("record %d: %v", i, err)
				}
				res[i] = r
				wg.Done()
			})
	}
	wg.Wait()
	return res
}

// TestReceiptsKafkaMode: the answer carries the receipt; each one points
// at exactly the record sent.
func TestReceiptsKafkaMode(t *testing.T) {
	broker := kafkatest.Shared(t)
	topic := kafkatest.NewTopic(t, broker, "receipts", 4)
	a := agenttest.Start(t, ferryBin, "", "exporter.kafka.brokers=["+broker+"]", "exporter.kafka.linger=2ms", "exporter.kafka.partitioner=round_robin")

	var want []sent
	hv := values("http", 200)
	ans := postNDJSON(t, a, topic, "http-req-1", hv)
	if ans.ReceiptID != "" || len(ans.Receipts) == 0 {
		t.Fatalf("%+v", ans)
	}
	got, err := expand(hv, "http-req-1", ans.Receipts)
	if err != nil {
		t.Fatal(err)
	}
	want = append(want, got...)

	cv := values("client", 300)
	for i, r := range viaClient(t, a, topic, "client-req-1", cv) {
		if r.Offset < 0 || r.Topic != topic || r.ReceiptID != "" {
			t.Fatalf("record %d: %+v", i, r)
		}
		want = append(want, sent{value: cv[i], requestID: "client-req-1", topic: r.Topic, partition: r.Partition, offset: r.Offset})
	}
	checkInKafka(t, broker, want)
}

// TestReceiptsSpoolMode: the answer comes at the spool's fsync with a
// receipt id; GET /receipts/{id} answers pending until Kafka has the
// records, then where they are, and each place holds exactly the record.
func TestReceiptsSpoolMode(t *testing.T) {
	broker := kafkatest.Shared(t)
	topic := kafkatest.NewTopic(t, broker, "receipts-spool", 3)
	a := agenttest.Start(t, ferryBin, "", "exporter.kafka.brokers=["+broker+"]", "delivery.mode=spool",
		"delivery.spool.dir="+t.TempDir(), "delivery.spool.linger=20ms")

	var want []sent
	hv := values("http-spool", 150)
	ans := postNDJSON(t, a, topic, "spool-http", hv)
	if ans.ReceiptID == "" || len(ans.Receipts) != 0 {
		t.Fatalf("spool mode answer: %+v", ans)
	}
	got, err := expand(hv, "spool-http", lookup(t, a, ans.ReceiptID))
	if err != nil {
		t.Fatal(err)
	}
	want = append(want, got...)

	cv := values("client-spool", 200)
	ids := map[string][]int{}
	for i, r := range viaClient(t, a, topic, "spool-client", cv) {
		if r.ReceiptID == "" || r.Offset >= 0 {
			t.Fatalf("record %d: %+v", i, r)
		}
		ids[r.ReceiptID] = append(ids[r.ReceiptID], i)
	}
	for id, idx := range ids {
		vs := make([]string, len(idx))
		for k, i := range idx {
			vs[k] = cv[i]
		}
		got, err := expand(vs, "spool-client", lookup(t, a, id))
		if err != nil {
			t.Fatalf("receipt %s: %v", id, err)
		}
		want = append(want, got...)
	}
	checkInKafka(t, broker, want)

	// A receipt is the sender's alone: a made-up id answers 404.
	res, err := http.Get("http://" + a.HTTP + "/receipts/1-0123456789abcdef")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 404 {
		t.Fatalf("made-up receipt: %s", res.Status)
	}
}

// TestReceiptsAcksNone: with exporter.kafka.acks none Kafka answers
// nothing, so no offset is known: a request for a receipt is refused for
// good, naming the setting (HTTP 400 receipts_unavailable; the Go client's
// record fails with it, not retryable), never answered with made-up
// places; records sent without asking are delivered as ever.
func TestReceiptsAcksNone(t *testing.T) {
	broker := kafkatest.Shared(t)
	topic := kafkatest.NewTopic(t, broker, "receipts-acks-none", 1)
	a := agenttest.Start(t, ferryBin, "", "exporter.kafka.brokers=["+broker+"]", "exporter.kafka.acks=none", "exporter.kafka.idempotent=false")

	req, _ := http.NewRequest(http.MethodPost, "http://"+a.HTTP+"/v1/messages/"+topic+"?receipt=true", strings.NewReader("x"))
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var refusal struct{ Reason, Error string }
	_ = json.NewDecoder(res.Body).Decode(&refusal)
	res.Body.Close()
	if res.StatusCode != 400 || refusal.Reason != "receipts_unavailable" || !strings.Contains(refusal.Error, "exporter.kafka.acks") {
		t.Fatalf("%s %+v", res.Status, refusal)
	}

	cl, err := client.New(client.Options{Addrs: []string{"unix:" + a.Socket}, Receipts: true})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = cl.ProduceSync(ctx, &client.Record{Topic: topic, Value: []byte("y")})
	var fe *client.Error
	if !errors.As(err, &fe) || fe.Reason != "receipts_unavailable" || fe.Retryable {
		t.Fatalf("%T %v", err, err)
	}

	res, err = http.Post("http://"+a.HTTP+"/v1/messages/"+topic, "text/plain", strings.NewReader("z"))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("without a receipt: %s", res.Status)
	}
}
