package kafkafront

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferryhq/ferry/auth"
	"github.com/ferryhq/ferry/auth/authtest"
	"github.com/ferryhq/ferry/auth/ratelimit"
	"github.com/ferryhq/ferry/auth/token"
	"github.com/ferryhq/ferry/buffer/budget"
	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
	"github.com/ferryhq/ferry/receiver"
	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/telemetry"
)

// The produce path's tests drive an in-process front over a real loopback
// TCP connection with Kafka wire frames, and stand in for the pipeline with
// a consumer that holds every batch until the test acknowledges it.

// wait bounds every wait for an event that must come.
const wait = 10 * time.Second

// quietFor is how long a test watches for an answer that must not come.
const quietFor = 150 * time.Millisecond

// tsMillis is every test batch's timestamp: a retried batch must repeat
// its bytes (they are under the CRC).
const tsMillis = 1_700_000_000_000

// frontTopics is the cluster the fronts mirror: every topic has three
// partitions, except "missing", which does not exist; asked about "down",
// the cluster does not answer.
func frontTopics(_ context.Context, names []string) ([]TopicInfo, error) {
	var out []TopicInfo
	for _, n := range names {
		if n == "down" {
			return nil, errors.New("the cluster does not answer")
		}
		if n != "missing" {
			out = append(out, TopicInfo{Topic: n, Partitions: 3})
		}
	}
	return out, nil
}

// front is one in-process Kafka front and the pipeline behind it.
type front struct {
	r    *Receiver
	set  telemetry.Settings
	sink *heldSink
}

// startFront starts a front on a free loopback port; env's Set, Next and
// Topics are filled in. Every batch still held when the test ends is
// failed before the front shuts down.
func startFront(t *testing.T, cfg Config, env receiver.Env) *front {
	t.Helper()
	f := &front{set: telemetry.TestSettings(), sink: &heldSink{got: make(chan *heldBatch, 256)}}
	env.Set, env.Next, env.Topics = f.set, f.sink, frontTopics
	r, err := New(cfg, env)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.r = r
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		if err := r.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	t.Cleanup(func() { f.sink.failAll(consumer.ErrShuttingDown) })
	return f
}

// refused is the refusals counted under reason.
func (f *front) refused(reason string) float64 { return testutil.ToFloat64(f.r.m.Errors(reason)) }

// requests is the requests read of the API named api (ApiVersions, ...).
func (f *front) requests(t *testing.T, api string) float64 {
	t.Helper()
	mfs, err := f.set.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "ferry_receiver_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "code" && l.GetValue() == api {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// waitRequests waits until n requests of api have been read.
func (f *front) waitRequests(t *testing.T, api string, n float64) {
	t.Helper()
	for deadline := time.Now().Add(wait); f.requests(t, api) < n; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the front did not read %v %s requests", n, api)
		}
	}
}

// heldSink is the pipeline: it copies each batch's records, holds the
// batch unacknowledged, and hands it to the test; or refuses it.
type heldSink struct {
	mu     sync.Mutex
	refuse error
	held   []*heldBatch
	got    chan *heldBatch
}

// heldBatch is one batch the pipeline took and has not acknowledged.
type heldBatch struct {
	s    *heldSink
	b    *record.Batch
	recs []record.Record // copies: the batch's own point into pooled buffers
}

func (s *heldSink) Consume(_ context.Context, b *record.Batch) error {
	s.mu.Lock()
	if err := s.refuse; err != nil {
		s.mu.Unlock()
		return err
	}
	h := &heldBatch{s: s, b: b}
	for _, r := range b.Records {
		c := r
		c.Key = bytes.Clone(r.Key)
		c.Value = bytes.Clone(r.Value)
		c.Headers = nil
		for _, hd := range r.Headers {
			c.Headers = append(c.Headers, record.Header{Key: hd.Key, Value: bytes.Clone(hd.Value)})
		}
		h.recs = append(h.recs, c)
	}
	b.Arm()
	s.held = append(s.held, h)
	s.mu.Unlock()
	s.got <- h
	return nil
}

func (s *heldSink) setRefuse(err error) {
	s.mu.Lock()
	s.refuse = err
	s.mu.Unlock()
}

// next is the next batch the pipeline took.
func (s *heldSink) next(t *testing.T) *heldBatch {
	t.Helper()
	select {
	case h := <-s.got:
		return h
	case <-time.After(wait):
		t.Fatal("no batch reached the pipeline")
		return nil
	}
}

// none checks that no batch reached the pipeline (call it once the answer
// that follows any hand-off has been read).
func (s *heldSink) none(t *testing.T) {
	t.Helper()
	select {
	case h := <-s.got:
		t.Fatalf("a batch reached the pipeline: %d records, first %q", len(h.recs), h.recs[0].Value)
	default:
	}
}

func (s *heldSink) take(h *heldBatch) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, x := range s.held {
		if x == h {
			s.held = append(s.held[:i], s.held[i+1:]...)
			return true
		}
	}
	return false
}

// ack acknowledges every record of the batch as Kafka's client does:
// record i delivered at offset base+i, unless fail gives it an error.
func (h *heldBatch) ack(base int64, fail map[int]error) {
	if !h.s.take(h) {
		return
	}
	b := h.b
	for i := range len(h.recs) {
		err := fail[i]
		if err == nil && b.OnAcked != nil {
			b.OnAcked(i, base+int64(i))
		}
		// The last acknowledgement completes the batch, which goes back
		// to the front's pool: b is not touched after it.
		b.AckAt(i, err)
	}
}

// fail fails every record of the batch with err.
func (h *heldBatch) fail(err error) {
	fails := map[int]error{}
	for i := range h.recs {
		fails[i] = err
	}
	h.ack(0, fails)
}

func (s *heldSink) failAll(err error) {
	s.mu.Lock()
	held := append([]*heldBatch(nil), s.held...)
	s.mu.Unlock()
	for _, h := range held {
		h.fail(err)
	}
}

// kclient is a raw Kafka client connection.
type kclient struct {
	t    *testing.T
	c    net.Conn
	corr int32
}

func dial(t *testing.T, f *front) *kclient {
	t.Helper()
	c, err := net.Dial("tcp", f.r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &kclient{t: t, c: c}
}

// send writes req as one frame: size, request header (v1, or v2 with its
// empty tag section for flexible requests), body. It returns the
// correlation id.
func (k *kclient) send(req kmsg.Request) int32 {
	k.t.Helper()
	k.corr++
	k.write(encodeRequest(req, k.corr))
	return k.corr
}

// encodeRequest frames req with correlation id corr: size, request
// header (v1, or v2 with its empty tag section for flexible requests,
// client id "test"), body.
func encodeRequest(req kmsg.Request, corr int32) []byte {
	b := make([]byte, 4, 512)
	b = binary.BigEndian.AppendUint16(b, uint16(req.Key()))
	b = binary.BigEndian.AppendUint16(b, uint16(req.GetVersion()))
	b = binary.BigEndian.AppendUint32(b, uint32(corr))
	b = append(b, 0, 4, 't', 'e', 's', 't') // client id
	if req.IsFlexible() {
		b = append(b, 0)
	}
	b = req.AppendTo(b)
	binary.BigEndian.PutUint32(b, uint32(len(b)-4))
	return b
}

func (k *kclient) write(b []byte) {
	k.t.Helper()
	_ = k.c.SetWriteDeadline(time.Now().Add(wait))
	if _, err := k.c.Write(b); err != nil {
		k.t.Fatalf("write: %v", err)
	}
}

// frame reads one response frame: its correlation id and the rest.
func (k *kclient) frame() (int32, []byte) {
	k.t.Helper()
	_ = k.c.SetReadDeadline(time.Now().Add(wait))
	var size [4]byte
	if _, err := io.ReadFull(k.c, size[:]); err != nil {
		k.t.Fatalf("no answer: %v", err)
	}
	body := make([]byte, binary.BigEndian.Uint32(size[:]))
	if _, err := io.ReadFull(k.c, body); err != nil || len(body) < 4 {
		k.t.Fatalf("a short answer: %v", err)
	}
	return int32(binary.BigEndian.Uint32(body)), body[4:]
}

// recv reads the answer to the request of correlation id corr, which
// must be the next one, into resp (of version ver).
func (k *kclient) recv(corr int32, ver int16, resp kmsg.Response) {
	k.t.Helper()
	got, body := k.frame()
	if got != corr {
		k.t.Fatalf("the next answer is to request %d, want %d", got, corr)
	}
	resp.SetVersion(ver)
	if resp.IsFlexible() && resp.Key() != 18 {
		if len(body) == 0 || body[0] != 0 {
			k.t.Fatalf("a flexible response header with tags: % x", body[:min(len(body), 8)])
		}
		body = body[1:]
	}
	if err := resp.ReadFrom(body); err != nil {
		k.t.Fatalf("%s v%d answer: %v", kmsg.NameForKey(resp.Key()), ver, err)
	}
}

// produce sends req and reads its answer.
func (k *kclient) produce(req *kmsg.ProduceRequest) *kmsg.ProduceResponse {
	k.t.Helper()
	corr := k.send(req)
	resp := kmsg.NewPtrProduceResponse()
	k.recv(corr, req.Version, resp)
	return resp
}

// apiVersions sends an ApiVersions v3 request; its answer must come next
// in order, after every answer owed before it.
func (k *kclient) apiVersions() int32 {
	k.t.Helper()
	req := kmsg.NewPtrApiVersionsRequest()
	req.Version = 3
	req.ClientSoftwareName, req.ClientSoftwareVersion = "test", "1"
	return k.send(req)
}

// answersNext checks that the next answer is the ApiVersions one of corr.
func (k *kclient) answersNext(corr int32) {
	k.t.Helper()
	k.recv(corr, 3, kmsg.NewPtrApiVersionsResponse())
}

// initProducerID asks for an idempotent producer's id.
func (k *kclient) initProducerID() (int64, int16) {
	k.t.Helper()
	req := kmsg.NewPtrInitProducerIDRequest()
	req.Version, req.TransactionTimeoutMillis = 4, 60000
	resp := kmsg.NewPtrInitProducerIDResponse()
	k.recv(k.send(req), req.Version, resp)
	if resp.ErrorCode != 0 || resp.ProducerID < 0 || resp.ProducerEpoch != 0 {
		k.t.Fatalf("InitProducerId: error %d, producer id %d epoch %d", resp.ErrorCode, resp.ProducerID, resp.ProducerEpoch)
	}
	return resp.ProducerID, resp.ProducerEpoch
}

// quiet checks that nothing arrives for quietFor.
func (k *kclient) quiet() {
	k.t.Helper()
	_ = k.c.SetReadDeadline(time.Now().Add(quietFor))
	var one [1]byte
	n, err := k.c.Read(one[:])
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		k.t.Fatalf("an answer came that was not due (%d bytes, %v)", n, err)
	}
}

// closed checks that the front closes the connection without another
// answer.
func (k *kclient) closed() {
	k.t.Helper()
	_ = k.c.SetReadDeadline(time.Now().Add(wait))
	var one [1]byte
	n, err := k.c.Read(one[:])
	switch {
	case err == nil:
		k.t.Fatalf("an answer (%d bytes) where the connection should have been closed", n)
	case errors.Is(err, os.ErrDeadlineExceeded):
		k.t.Fatal("the connection was left open")
	}
}

// trec is one record of a test batch; a nil key is a null key.
type trec struct {
	key, value []byte
	headers    [][2]string
}

// tbatch is a record batch (magic v2) as a producer sends it.
type tbatch struct {
	pid   int64 // -1: not idempotent
	epoch int16
	seq   int32
	attrs int16 // transactional, control; the codec is set from codec
	codec kgo.CompressionCodec
	recs  []trec
}

// blob is a non-idempotent batch of one record, n bytes of zeros.
func blob(n int) tbatch {
	return tbatch{pid: -1, epoch: -1, seq: -1, recs: []trec{{value: make([]byte, n)}}}
}

// plain is a non-idempotent batch of the values, each with key "k"+value.
func plain(values ...string) tbatch {
	b := tbatch{pid: -1, epoch: -1, seq: -1}
	for _, v := range values {
		b.recs = append(b.recs, trec{key: []byte("k" + v), value: []byte(v)})
	}
	return b
}

func (b tbatch) bytes(t testing.TB) []byte {
	t.Helper()
	kb := kafkatest.Batch{ProducerID: b.pid, Epoch: b.epoch, Seq: b.seq, Timestamp: time.UnixMilli(tsMillis),
		Attrs: b.attrs, Codec: b.codec, Records: make([]kafkatest.Record, len(b.recs))}
	for i, r := range b.recs {
		kb.Records[i] = kafkatest.Record{Key: r.key, Value: r.value, Headers: r.headers}
	}
	return kb.Bytes()
}

// newProduce is an empty produce request.
func newProduce(ver, acks int16) *kmsg.ProduceRequest {
	req := kmsg.NewPtrProduceRequest()
	req.Version, req.Acks, req.TimeoutMillis = ver, acks, 30000
	return req
}

// add puts records for topic's partition in req (after its others).
func add(req *kmsg.ProduceRequest, topic string, partition int32, records []byte) *kmsg.ProduceRequest {
	p := kmsg.NewProduceRequestTopicPartition()
	p.Partition, p.Records = partition, records
	for i := range req.Topics {
		if req.Topics[i].Topic == topic {
			req.Topics[i].Partitions = append(req.Topics[i].Partitions, p)
			return req
		}
	}
	tp := kmsg.NewProduceRequestTopic()
	tp.Topic = topic
	tp.Partitions = append(tp.Partitions, p)
	req.Topics = append(req.Topics, tp)
	return req
}

// anyThrottle: the test does not pin the answer's throttle.
const anyThrottle = -1

// want is what a test expects of one partition's answer.
type want struct {
	code int16
	base int64
}

// checkAnswer compares every partition's error code and base offset, and
// the throttle (unless anyThrottle), with what the test expects; a
// partition in error must say why (Produce v8 and later carry the message).
func checkAnswer(t *testing.T, resp *kmsg.ProduceResponse, throttle int32, parts map[string]want) {
	t.Helper()
	if throttle != anyThrottle && resp.ThrottleMillis != throttle {
		t.Errorf("throttle %d ms, want %d", resp.ThrottleMillis, throttle)
	}
	seen := 0
	for _, rt := range resp.Topics {
		for _, rp := range rt.Partitions {
			name := fmt.Sprintf("%s/%d", rt.Topic, rp.Partition)
			w, ok := parts[name]
			if !ok {
				t.Errorf("%s: answered, not asked for", name)
				continue
			}
			seen++
			if rp.ErrorCode != w.code || rp.BaseOffset != w.base {
				t.Errorf("%s: error %v, base offset %d; want %v, %d", name, kerr.ErrorForCode(rp.ErrorCode), rp.BaseOffset, kerr.ErrorForCode(w.code), w.base)
			}
			if w.code != 0 && resp.Version >= 8 && (rp.ErrorMessage == nil || *rp.ErrorMessage == "") {
				t.Errorf("%s: error %d without a message", name, rp.ErrorCode)
			}
		}
	}
	if seen != len(parts) {
		t.Errorf("%d partitions answered, want %d", seen, len(parts))
	}
}

// recordsAre checks the records the pipeline got, in order, each as
// "topic/partition key=value h1=v1,...", null keys as "<nil>".
func recordsAre(t *testing.T, got []record.Record, want ...string) {
	t.Helper()
	var have []string
	for _, r := range got {
		key := "<nil>"
		if r.Key != nil {
			key = string(r.Key)
		}
		var hs []string
		for _, h := range r.Headers {
			hs = append(hs, h.Key+"="+string(h.Value))
		}
		p, chosen := r.Partition()
		if !chosen {
			t.Errorf("record %q has no partition", r.Value)
		}
		if !r.Timestamp.Equal(time.UnixMilli(tsMillis)) {
			t.Errorf("record %q timestamp %v, want the batch's", r.Value, r.Timestamp)
		}
		s := fmt.Sprintf("%s/%d %s=%s", r.Topic, p, key, r.Value)
		if len(hs) > 0 {
			s += " " + strings.Join(hs, ",")
		}
		have = append(have, s)
	}
	if strings.Join(have, "\n") != strings.Join(want, "\n") {
		t.Fatalf("the pipeline got\n\t%s\nwant\n\t%s", strings.Join(have, "\n\t"), strings.Join(want, "\n\t"))
	}
}

// TestProduceAnsweredOnAck: a produce request with acks all or 1 hands
// its records on with topic, partition, key, value, headers and timestamp,
// and is answered only once the pipeline acknowledged them, with each
// partition's base offset; an answer owed after it waits its turn.
func TestProduceAnsweredOnAck(t *testing.T) {
	for _, c := range []struct {
		ver, acks int16
	}{{7, -1}, {3, 1}, {9, -1}, {12, 1}} {
		t.Run(fmt.Sprintf("v%d_acks%d", c.ver, c.acks), func(t *testing.T) {
			f := startFront(t, testConfig(), receiver.Env{})
			k := dial(t, f)
			first := plain("a", "b")
			first.recs[0].headers = [][2]string{{"h", "1"}, {"trace", ""}}
			first.recs[1].key = nil
			req := newProduce(c.ver, c.acks)
			add(req, "logs", 0, first.bytes(t))
			add(req, "metrics", 1, plain("c").bytes(t))
			add(req, "logs", 2, plain("d", "e").bytes(t))
			corr := k.send(req)
			api := k.apiVersions()
			h := f.sink.next(t)
			recordsAre(t, h.recs,
				"logs/0 ka=a h=1,trace=",
				"logs/0 <nil>=b",
				"logs/2 kd=d",
				"logs/2 ke=e",
				"metrics/1 kc=c")
			// Held by the pipeline: no answer, and the ApiVersions one
			// read after it waits behind it.
			f.waitRequests(t, "ApiVersions", 1)
			k.quiet()
			h.ack(1000, nil)
			resp := kmsg.NewPtrProduceResponse()
			k.recv(corr, c.ver, resp)
			checkAnswer(t, resp, 0, map[string]want{"logs/0": {0, 1000}, "logs/2": {0, 1002}, "metrics/1": {0, 1004}})
			k.answersNext(api)
			if n := testutil.ToFloat64(f.r.m.Records(f.r.set.Topics.Get("logs"))); n != 4 {
				t.Errorf("%v records counted for logs, want 4", n)
			}
		})
	}
}

// TestProduceAcksZero: acks 0 is never answered, and its records are
// handed on all the same; the connection goes on at once.
func TestProduceAcksZero(t *testing.T) {
	f := startFront(t, testConfig(), receiver.Env{})
	k := dial(t, f)
	req := add(newProduce(7, 0), "logs", 1, plain("a", "b").bytes(t))
	add(req, "logs", 2, plain("c").bytes(t))
	k.send(req)
	api := k.apiVersions()
	h := f.sink.next(t)
	recordsAre(t, h.recs, "logs/1 ka=a", "logs/1 kb=b", "logs/2 kc=c")
	// Answered while the pipeline still holds the records: the produce
	// request owes nothing.
	k.answersNext(api)
	h.ack(0, nil)
	k.answersNext(k.apiVersions())
	if n := testutil.ToFloat64(f.r.m.NoWaitCounter()); n != 3 {
		t.Errorf("%v records counted fire-and-forget, want 3", n)
	}
	// Refused by the pipeline: dropped, still unanswered.
	f.sink.setRefuse(consumer.ErrFull)
	k.send(add(newProduce(7, 0), "logs", 1, plain("x").bytes(t)))
	k.answersNext(k.apiVersions())
	if n := f.refused("queue_full"); n != 1 {
		t.Errorf("%v queue_full refusals counted, want 1", n)
	}
}

// TestProduceRetriable: a pipeline that refuses the batch, a full memory
// budget, and records Kafka failed are answered with the retriable code
// the error kind maps to (NOT_ENOUGH_REPLICAS for busy and unavailable),
// with its retry-after as throttle; a partition whose records were
// delivered keeps its offset.
func TestProduceRetriable(t *testing.T) {
	notEnough := kerr.NotEnoughReplicas.Code
	t.Run("pipeline_full", func(t *testing.T) {
		f := startFront(t, testConfig(), receiver.Env{})
		k := dial(t, f)
		f.sink.setRefuse(consumer.ErrFull)
		req := add(newProduce(9, -1), "logs", 0, plain("a").bytes(t))
		add(req, "logs", 1, plain("b").bytes(t))
		checkAnswer(t, k.produce(req), 1000, map[string]want{"logs/0": {notEnough, -1}, "logs/1": {notEnough, -1}})
		f.sink.setRefuse(consumer.ErrUnavailable)
		checkAnswer(t, k.produce(req), 5000, map[string]want{"logs/0": {notEnough, -1}, "logs/1": {notEnough, -1}})
		f.sink.none(t)
		if f.refused("queue_full") != 1 || f.refused("kafka_unavailable") != 1 {
			t.Errorf("refusals counted: queue_full %v, kafka_unavailable %v", f.refused("queue_full"), f.refused("kafka_unavailable"))
		}
	})
	t.Run("records_failed", func(t *testing.T) {
		f := startFront(t, testConfig(), receiver.Env{})
		k := dial(t, f)
		req := add(newProduce(9, -1), "logs", 0, plain("a", "b").bytes(t))
		add(req, "logs", 1, plain("c").bytes(t))
		corr := k.send(req)
		f.sink.next(t).ack(40, map[int]error{1: consumer.ErrUnavailable})
		resp := kmsg.NewPtrProduceResponse()
		k.recv(corr, 9, resp)
		checkAnswer(t, resp, 5000, map[string]want{"logs/0": {notEnough, -1}, "logs/1": {0, 42}})
	})
	t.Run("budget_full", func(t *testing.T) {
		bud := budget.New(256 << 10)
		f := startFront(t, testConfig(), receiver.Env{Bodies: bud})
		k := dial(t, f)
		if !bud.TryReserve(bud.Limit()) {
			t.Fatal("could not fill the budget")
		}
		req := add(newProduce(9, -1), "logs", 0, plain("a").bytes(t))
		add(req, "metrics", 2, plain("b").bytes(t))
		checkAnswer(t, k.produce(req), 1000, map[string]want{"logs/0": {notEnough, -1}, "metrics/2": {notEnough, -1}})
		// acks 0: dropped, unanswered.
		k.send(add(newProduce(9, 0), "logs", 0, plain("c").bytes(t)))
		k.answersNext(k.apiVersions())
		f.sink.none(t)
		if n := f.refused("queue_full"); n != 2 {
			t.Errorf("%v queue_full refusals counted, want 2", n)
		}
		// Room again: the same request is delivered, and its memory goes
		// back once Kafka answered.
		bud.Release(bud.Limit())
		corr := k.send(req)
		h := f.sink.next(t)
		recordsAre(t, h.recs, "logs/0 ka=a", "metrics/2 kb=b")
		h.ack(7, nil)
		resp := kmsg.NewPtrProduceResponse()
		k.recv(corr, 9, resp)
		checkAnswer(t, resp, 0, map[string]want{"logs/0": {0, 7}, "metrics/2": {0, 8}})
		if used := bud.Used(); used != 0 {
			t.Errorf("%d bytes of the budget still reserved after the answer", used)
		}
	})
	t.Run("rate_limited", func(t *testing.T) {
		lim, err := ratelimit.New(ratelimit.Config{Classes: map[string]ratelimit.Class{"slow": {RecordsPerSec: 0.1, BurstRecords: 2}},
			DefaultClass: "slow"}, telemetry.TestSettings())
		if err != nil {
			t.Fatal(err)
		}
		f := startFront(t, testConfig(), receiver.Env{Pre: &receiver.Prechecks{Limiter: lim}})
		k := dial(t, f)
		pid, epoch := k.initProducerID()
		batch := func(seq int32, values ...string) *kmsg.ProduceRequest {
			tb := plain(values...)
			tb.pid, tb.epoch, tb.seq = pid, epoch, seq
			return add(newProduce(9, -1), "logs", 0, tb.bytes(t))
		}
		corr := k.send(batch(0, "a", "b"))
		f.sink.next(t).ack(0, nil)
		resp := kmsg.NewPtrProduceResponse()
		k.recv(corr, 9, resp)
		checkAnswer(t, resp, 0, map[string]want{"logs/0": {0, 0}})
		// The bucket is empty for 10 s. The refused batch is forgotten:
		// its retry is refused for the rate again, not as a duplicate.
		over := batch(2, "c")
		for range 2 {
			resp := k.produce(over)
			checkAnswer(t, resp, anyThrottle, map[string]want{"logs/0": {notEnough, -1}})
			if resp.ThrottleMillis < 9000 || resp.ThrottleMillis > 10000 {
				t.Errorf("throttle %d ms, want the bucket's 10 s", resp.ThrottleMillis)
			}
		}
		f.sink.none(t)
		if n := f.refused("duplicate_in_flight"); n != 0 {
			t.Errorf("a rate-limited batch's retry was taken for a duplicate %v times", n)
		}
		if n := f.refused("rate_limited"); n != 2 {
			t.Errorf("ferry_receiver_errors_total{reason=rate_limited} %v, want the 2 refused requests", n)
		}
	})
}

// TestProducePartitionRefused: a partition the front refuses (past the
// topic's partition count, negative, a topic the cluster lacks or the
// listener does not allow, an invalid name, a corrupt or old-format batch,
// too many records) is answered with its own code, and the request's other
// partitions are delivered and answered as usual.
func TestProducePartitionRefused(t *testing.T) {
	cfg := testConfig()
	cfg.Topics = []string{"logs", "missing", "down", "bad*"}
	cfg.MaxRecords = 5
	f := startFront(t, cfg, receiver.Env{})
	k := dial(t, f)
	corrupt := plain("x").bytes(t)
	corrupt[len(corrupt)-1] ^= 1
	old := plain("x").bytes(t)
	old[16] = 1
	req := newProduce(9, -1)
	add(req, "logs", 3, plain("past").bytes(t))
	add(req, "logs", 1, plain("a", "b").bytes(t))
	add(req, "logs", -1, plain("negative").bytes(t))
	add(req, "logs", 0, corrupt)
	add(req, "logs", 2, old)
	add(req, "missing", 0, plain("x").bytes(t))
	add(req, "secret", 0, plain("x").bytes(t))
	add(req, "bad topic", 0, plain("x").bytes(t))
	add(req, "bad2", 7, plain("past").bytes(t))
	add(req, "bad2", 2, plain("1", "2", "3", "4").bytes(t)) // 2 + 4 records: over 5
	add(req, "bad2", 1, plain("c").bytes(t))
	corr := k.send(req)
	h := f.sink.next(t)
	recordsAre(t, h.recs, "logs/1 ka=a", "logs/1 kb=b", "bad2/1 kc=c")
	h.ack(10, nil)
	resp := kmsg.NewPtrProduceResponse()
	k.recv(corr, 9, resp)
	unknown := kerr.UnknownTopicOrPartition.Code
	checkAnswer(t, resp, 0, map[string]want{
		"logs/3":      {unknown, -1},
		"logs/1":      {0, 10},
		"logs/-1":     {unknown, -1},
		"logs/0":      {kerr.CorruptMessage.Code, -1},
		"logs/2":      {kerr.UnsupportedForMessageFormat.Code, -1},
		"missing/0":   {unknown, -1},
		"secret/0":    {kerr.TopicAuthorizationFailed.Code, -1},
		"bad topic/0": {kerr.InvalidTopicException.Code, -1},
		"bad2/7":      {unknown, -1},
		"bad2/2":      {kerr.MessageTooLarge.Code, -1},
		"bad2/1":      {0, 12},
	})
	for reason, n := range map[string]float64{"unknown_topic": 4, "corrupt_message": 1, "unsupported_message_format": 1, "topic_not_allowed": 1, "invalid_topic": 1, "too_many_records": 1} {
		if got := f.refused(reason); got != n {
			t.Errorf("%v %s refusals counted, want %v", got, reason, n)
		}
	}
	// Topics the connection may not write to were never looked up: a
	// client cannot make ferry ask the cluster about them, or crowd the
	// cache with them.
	f.r.topics.mu.Lock()
	_, secret := f.r.topics.topics["secret"]
	_, bad := f.r.topics.topics["bad topic"]
	_, logs := f.r.topics.topics["logs"]
	f.r.topics.mu.Unlock()
	if secret || bad || !logs {
		t.Errorf("cached after the request: secret %v, bad topic %v (want neither), logs %v (want it)", secret, bad, logs)
	}
	// Every partition refused: answered at once, nothing handed on.
	only := add(newProduce(9, -1), "logs", 3, plain("past").bytes(t))
	checkAnswer(t, k.produce(only), 0, map[string]want{"logs/3": {unknown, -1}})
	// A cluster that cannot be asked: retriable LEADER_NOT_AVAILABLE.
	down := add(newProduce(9, -1), "down", 0, plain("x").bytes(t))
	checkAnswer(t, k.produce(down), 0, map[string]want{"down/0": {kerr.LeaderNotAvailable.Code, -1}})
	f.sink.none(t)
	if n := f.refused("kafka_unavailable"); n != 1 {
		t.Errorf("%v kafka_unavailable refusals counted, want 1", n)
	}
}

// TestProduceTransactional: ferry serves no transactions: a transactional
// InitProducerId and a produce request with a transactional id are refused
// TRANSACTIONAL_ID_AUTHORIZATION_FAILED (nothing delivered), and a
// transactional or control batch is refused INVALID_RECORD while the
// request's other partitions are delivered.
func TestProduceTransactional(t *testing.T) {
	f := startFront(t, testConfig(), receiver.Env{})
	k := dial(t, f)
	denied := kerr.TransactionalIDAuthorizationFailed.Code

	ip := kmsg.NewPtrInitProducerIDRequest()
	ip.Version, ip.TransactionalID, ip.TransactionTimeoutMillis = 4, kmsg.StringPtr("tx"), 60000
	ipResp := kmsg.NewPtrInitProducerIDResponse()
	k.recv(k.send(ip), 4, ipResp)
	if ipResp.ErrorCode != denied || ipResp.ProducerID != -1 || ipResp.ProducerEpoch != -1 {
		t.Errorf("transactional InitProducerId: error %d, producer id %d epoch %d", ipResp.ErrorCode, ipResp.ProducerID, ipResp.ProducerEpoch)
	}

	req := add(newProduce(9, -1), "logs", 0, plain("a").bytes(t))
	add(req, "metrics", 1, plain("b").bytes(t))
	req.TransactionID = kmsg.StringPtr("tx")
	checkAnswer(t, k.produce(req), 0, map[string]want{"logs/0": {denied, -1}, "metrics/1": {denied, -1}})
	req.Acks = 0
	k.send(req)
	k.answersNext(k.apiVersions())
	f.sink.none(t)

	txn, control := plain("t"), plain("c")
	txn.attrs, control.attrs = attrTxn, attrControl
	req = add(newProduce(9, -1), "logs", 0, txn.bytes(t))
	add(req, "logs", 1, plain("ok").bytes(t))
	add(req, "logs", 2, control.bytes(t))
	corr := k.send(req)
	h := f.sink.next(t)
	recordsAre(t, h.recs, "logs/1 kok=ok")
	h.ack(3, nil)
	resp := kmsg.NewPtrProduceResponse()
	k.recv(corr, 9, resp)
	invalid := kerr.InvalidRecord.Code
	checkAnswer(t, resp, 0, map[string]want{"logs/0": {invalid, -1}, "logs/1": {0, 3}, "logs/2": {invalid, -1}})
	if n := f.refused("transactions_unsupported"); n != 5 {
		t.Errorf("%v transactions_unsupported refusals counted, want 5", n)
	}
}

// TestProduceIdempotent: an idempotent producer's batch sent again while
// the first attempt is in flight is answered retriable and not delivered;
// sent again after it was delivered, it is answered with the first
// attempt's base offset and not delivered; one that failed is delivered
// again. A newer epoch starts afresh and fences the older one. Another
// connection of the same application is the same producer.
func TestProduceIdempotent(t *testing.T) {
	f := startFront(t, testConfig(), receiver.Env{})
	a, b := dial(t, f), dial(t, f)
	pid, epoch := a.initProducerID()
	batch := func(epoch int16, seq int32, values ...string) []byte {
		tb := plain(values...)
		tb.pid, tb.epoch, tb.seq = pid, epoch, seq
		return tb.bytes(t)
	}
	notEnough := kerr.NotEnoughReplicas.Code
	first := add(newProduce(9, -1), "logs", 0, batch(epoch, 0, "a", "b"))
	add(first, "logs", 1, plain("plain").bytes(t)) // not idempotent: always delivered
	corr := a.send(first)
	h := f.sink.next(t)
	recordsAre(t, h.recs, "logs/0 ka=a", "logs/0 kb=b", "logs/1 kplain=plain")

	// In flight: the idempotent batch is not delivered twice; the plain
	// one is.
	dupCorr := b.send(first)
	h2 := f.sink.next(t)
	recordsAre(t, h2.recs, "logs/1 kplain=plain")
	h2.ack(900, nil)
	resp := kmsg.NewPtrProduceResponse()
	b.recv(dupCorr, 9, resp)
	checkAnswer(t, resp, anyThrottle, map[string]want{"logs/0": {notEnough, -1}, "logs/1": {0, 900}})
	if n := f.refused("duplicate_in_flight"); n != 1 {
		t.Errorf("%v duplicate_in_flight counted, want 1", n)
	}

	h.ack(500, nil)
	resp = kmsg.NewPtrProduceResponse()
	a.recv(corr, 9, resp)
	checkAnswer(t, resp, 0, map[string]want{"logs/0": {0, 500}, "logs/1": {0, 502}})

	// Delivered: answered with the first attempt's offset, not delivered.
	only := add(newProduce(9, -1), "logs", 0, batch(epoch, 0, "a", "b"))
	checkAnswer(t, b.produce(only), 0, map[string]want{"logs/0": {0, 500}})
	checkAnswer(t, a.produce(only), 0, map[string]want{"logs/0": {0, 500}})
	f.sink.none(t)
	if n := f.refused("duplicate_batch"); n != 2 {
		t.Errorf("%v duplicate_batch counted, want 2", n)
	}

	// Failed: forgotten, so the retry is delivered.
	next := add(newProduce(9, -1), "logs", 0, batch(epoch, 2, "c"))
	corr = a.send(next)
	f.sink.next(t).fail(consumer.ErrUnavailable)
	resp = kmsg.NewPtrProduceResponse()
	a.recv(corr, 9, resp)
	checkAnswer(t, resp, 5000, map[string]want{"logs/0": {notEnough, -1}})
	corr = a.send(next)
	h = f.sink.next(t)
	recordsAre(t, h.recs, "logs/0 kc=c")
	h.ack(600, nil)
	resp = kmsg.NewPtrProduceResponse()
	a.recv(corr, 9, resp)
	checkAnswer(t, resp, 0, map[string]want{"logs/0": {0, 600}})

	// Claimed, then refused while decoding (a record count its records
	// do not fill, under a good CRC): forgotten as well, so its retry is
	// refused again, not taken for a duplicate in flight.
	bad := plain("c", "d")
	bad.pid, bad.epoch, bad.seq = pid, epoch, 3
	raw := bad.bytes(t)
	binary.BigEndian.PutUint32(raw[57:], 3)
	binary.BigEndian.PutUint32(raw[17:], crc32.Checksum(raw[batchCRCStart:], crc32c))
	for range 2 {
		checkAnswer(t, a.produce(add(newProduce(9, -1), "logs", 0, raw)), 0, map[string]want{"logs/0": {kerr.CorruptMessage.Code, -1}})
	}
	f.sink.none(t)

	// A batch that inflates past the first reservation is decoded twice;
	// its claim is given back between the passes: delivered once, then
	// recognised.
	big := blob(1 << 20)
	big.pid, big.epoch, big.seq, big.codec = pid, epoch, 6, kgo.ZstdCompression()
	bigReq := add(newProduce(9, -1), "logs", 0, big.bytes(t))
	corr = a.send(bigReq)
	f.sink.next(t).ack(650, nil)
	resp = kmsg.NewPtrProduceResponse()
	a.recv(corr, 9, resp)
	checkAnswer(t, resp, 0, map[string]want{"logs/0": {0, 650}})
	checkAnswer(t, a.produce(bigReq), 0, map[string]want{"logs/0": {0, 650}})
	f.sink.none(t)

	// Epoch 1 starts its sequences at 0 again: delivered. Epoch 0 is
	// fenced from then on.
	corr = a.send(add(newProduce(9, -1), "logs", 0, batch(epoch+1, 0, "a", "b")))
	f.sink.next(t).ack(700, nil)
	resp = kmsg.NewPtrProduceResponse()
	a.recv(corr, 9, resp)
	checkAnswer(t, resp, 0, map[string]want{"logs/0": {0, 700}})
	checkAnswer(t, a.produce(add(newProduce(9, -1), "logs", 0, batch(epoch, 3, "d"))), 0,
		map[string]want{"logs/0": {kerr.InvalidProducerEpoch.Code, -1}})
	f.sink.none(t)

	// An id this front never issued is not tracked: its retry is
	// delivered again.
	stranger := plain("s")
	stranger.pid, stranger.epoch, stranger.seq = pid^1<<40, 0, 0
	for i := range 2 {
		corr = a.send(add(newProduce(9, -1), "logs", 2, stranger.bytes(t)))
		f.sink.next(t).ack(int64(800+i), nil)
		resp = kmsg.NewPtrProduceResponse()
		a.recv(corr, 9, resp)
		checkAnswer(t, resp, 0, map[string]want{"logs/2": {0, int64(800 + i)}})
	}
}

// TestProduceAckTimeout: a request the pipeline does not acknowledge
// within ack_timeout is answered REQUEST_TIMED_OUT (throttle 1 s); its
// batch stays in flight, so a retry meanwhile is answered retriable; the
// late acknowledgement neither crashes nor answers again, and the retry
// after it gets the late delivery's offset.
func TestProduceAckTimeout(t *testing.T) {
	cfg := testConfig()
	cfg.AckTimeout = 100 * time.Millisecond
	f := startFront(t, cfg, receiver.Env{})
	k := dial(t, f)
	pid, epoch := k.initProducerID()
	tb := plain("a")
	tb.pid, tb.epoch, tb.seq = pid, epoch, 0
	req := add(newProduce(9, -1), "logs", 1, tb.bytes(t))
	start := time.Now()
	corr := k.send(req)
	h := f.sink.next(t)
	resp := kmsg.NewPtrProduceResponse()
	k.recv(corr, 9, resp)
	if waited := time.Since(start); waited < cfg.AckTimeout {
		t.Errorf("answered after %s, before ack_timeout (%s)", waited, cfg.AckTimeout)
	}
	checkAnswer(t, resp, 1000, map[string]want{"logs/1": {kerr.RequestTimedOut.Code, -1}})
	if n := f.refused("ack_timeout"); n != 1 {
		t.Errorf("%v ack_timeout counted, want 1", n)
	}
	checkAnswer(t, k.produce(req), anyThrottle, map[string]want{"logs/1": {kerr.NotEnoughReplicas.Code, -1}})

	h.ack(321, nil)
	k.answersNext(k.apiVersions())
	checkAnswer(t, k.produce(req), 0, map[string]want{"logs/1": {0, 321}})
	f.sink.none(t)
}

// TestProduceFlowControl: past max_inflight_bytes of unanswered produce
// requests the front stops reading the connection until an answer goes
// out.
func TestProduceFlowControl(t *testing.T) {
	cfg := testConfig()
	cfg.MaxRequestBytes, cfg.MaxInflightBytes = 64<<10, 64<<10
	f := startFront(t, cfg, receiver.Env{})
	k := dial(t, f)
	c1 := k.send(add(newProduce(9, -1), "logs", 0, blob(40<<10).bytes(t)))
	c2 := k.send(add(newProduce(9, -1), "logs", 1, blob(40<<10).bytes(t)))
	h1 := f.sink.next(t)
	select {
	case <-f.sink.got:
		t.Fatal("the second request was read past max_inflight_bytes")
	case <-time.After(quietFor):
	}
	h1.ack(1, nil)
	h2 := f.sink.next(t)
	h2.ack(2, nil)
	for _, c := range []struct {
		corr int32
		part string
		base int64
	}{{c1, "logs/0", 1}, {c2, "logs/1", 2}} {
		resp := kmsg.NewPtrProduceResponse()
		k.recv(c.corr, 9, resp)
		checkAnswer(t, resp, 0, map[string]want{c.part: {0, c.base}})
	}
}

// TestProduceCompressed: batches in every codec are delivered as sent; a
// request that inflates past the first reservation is decoded again with
// max_decompressed_bytes reserved; one past that is refused
// MESSAGE_TOO_LARGE.
func TestProduceCompressed(t *testing.T) {
	f := startFront(t, testConfig(), receiver.Env{})
	k := dial(t, f)
	req := newProduce(9, -1)
	codecs := []kgo.CompressionCodec{kgo.GzipCompression(), kgo.SnappyCompression(), kgo.Lz4Compression(), kgo.ZstdCompression()}
	var wantRecs []string
	wantParts := map[string]want{}
	for i, c := range codecs {
		tb := plain(fmt.Sprintf("%d-a", i), fmt.Sprintf("%d-b", i))
		tb.codec = c
		tb.recs[0].headers = [][2]string{{"codec", fmt.Sprint(i)}}
		add(req, fmt.Sprintf("t%d", i), 0, tb.bytes(t))
		wantRecs = append(wantRecs, fmt.Sprintf("t%d/0 k%d-a=%d-a codec=%d", i, i, i, i), fmt.Sprintf("t%d/0 k%d-b=%d-b", i, i, i))
		wantParts[fmt.Sprintf("t%d/0", i)] = want{0, int64(2 * i)}
	}
	corr := k.send(req)
	h := f.sink.next(t)
	recordsAre(t, h.recs, wantRecs...)
	h.ack(0, nil)
	resp := kmsg.NewPtrProduceResponse()
	k.recv(corr, 9, resp)
	checkAnswer(t, resp, 0, wantParts)

	// 1 MiB of zeros: a few KiB compressed, past 8 times the request.
	big := blob(1 << 20)
	big.codec = kgo.ZstdCompression()
	corr = k.send(add(newProduce(9, -1), "logs", 0, big.bytes(t)))
	h = f.sink.next(t)
	if len(h.recs) != 1 || len(h.recs[0].Value) != 1<<20 {
		t.Fatalf("the inflating batch arrived as %d records", len(h.recs))
	}
	h.ack(5, nil)
	resp = kmsg.NewPtrProduceResponse()
	k.recv(corr, 9, resp)
	checkAnswer(t, resp, 0, map[string]want{"logs/0": {0, 5}})

	bomb := blob(5 << 20)
	bomb.codec = kgo.GzipCompression()
	req = add(newProduce(9, -1), "logs", 0, bomb.bytes(t))
	add(req, "logs", 1, plain("ok").bytes(t))
	corr = k.send(req)
	h = f.sink.next(t)
	recordsAre(t, h.recs, "logs/1 kok=ok")
	h.ack(9, nil)
	resp = kmsg.NewPtrProduceResponse()
	k.recv(corr, 9, resp)
	checkAnswer(t, resp, 0, map[string]want{"logs/0": {kerr.MessageTooLarge.Code, -1}, "logs/1": {0, 9}})
}

// TestProduceProtocolErrors: a produce request the front cannot serve
// (a version it does not speak, a body that does not parse, more
// partitions than allowed, a size over max_request_bytes) closes the
// connection without an answer, and hands nothing on.
func TestProduceProtocolErrors(t *testing.T) {
	cfg := testConfig()
	cfg.MaxPartitions = 3
	f := startFront(t, cfg, receiver.Env{})
	many := newProduce(9, -1)
	for p := range int32(4) {
		add(many, "logs", p%3, plain("x").bytes(t))
	}
	for name, send := range map[string]func(k *kclient){
		"old_version":     func(k *kclient) { k.send(add(newProduce(2, -1), "logs", 0, plain("x").bytes(t))) },
		"too_new_version": func(k *kclient) { k.send(add(newProduce(13, -1), "logs", 0, plain("x").bytes(t))) },
		"garbage_body": func(k *kclient) {
			b := binary.BigEndian.AppendUint32(nil, 8+6+5)
			b = append(b, 0, 0, 0, 7, 0, 0, 0, 1, 0, 4, 't', 'e', 's', 't', 0xff, 0xff, 0xff, 0xff, 0xff)
			k.write(b)
		},
		"too_many_partitions": func(k *kclient) { k.send(many) },
		"too_large":           func(k *kclient) { k.write([]byte{0, 0x20, 0, 0, 0, 0, 0, 7}) },
	} {
		t.Run(name, func(t *testing.T) {
			k := dial(t, f)
			k.t = t
			send(k)
			k.closed()
			f.sink.none(t)
		})
	}
	for reason, n := range map[string]float64{"unsupported_api": 2, "malformed_request": 1, "too_many_partitions": 1, "request_too_large": 1} {
		if got := f.refused(reason); got != n {
			t.Errorf("%v %s counted, want %v", got, reason, n)
		}
	}
}

// TestProduceSASL: with tokens required, the SASL PLAIN password is the
// application token: a produce request before it, another mechanism, an
// exchange out of order, a malformed PLAIN message or a bad token closes
// the connection after the proper error; a good token lets the client in,
// and its records carry the token's tenant (a client's own ferry.*
// headers are dropped) and obey its topic.
func TestProduceSASL(t *testing.T) {
	cfg := testConfig()
	cfg.Auth = auth.ReceiverConfig{Mode: "required", Sources: []string{"sasl"}}
	checker, _ := authtest.New(t)
	f := startFront(t, cfg, receiver.Env{Pre: &receiver.Prechecks{Checker: checker}})
	tok := authtest.IssueClaims(t, token.Claims{App: "shop"})

	handshake := func(k *kclient, mech string) *kmsg.SASLHandshakeResponse {
		k.t.Helper()
		req := kmsg.NewPtrSASLHandshakeRequest()
		req.Version, req.Mechanism = 1, mech
		resp := kmsg.NewPtrSASLHandshakeResponse()
		k.recv(k.send(req), 1, resp)
		return resp
	}
	authenticate := func(k *kclient, ver int16, msg string) *kmsg.SASLAuthenticateResponse {
		k.t.Helper()
		req := kmsg.NewPtrSASLAuthenticateRequest()
		req.Version, req.SASLAuthBytes = ver, []byte(msg)
		resp := kmsg.NewPtrSASLAuthenticateResponse()
		k.recv(k.send(req), ver, resp)
		return resp
	}
	failed, illegal := kerr.SaslAuthenticationFailed.Code, kerr.IllegalSaslState.Code
	login := func(t *testing.T, tok string) *kclient {
		t.Helper()
		k := dial(t, f)
		k.t = t
		if resp := handshake(k, "PLAIN"); resp.ErrorCode != 0 {
			t.Fatalf("PLAIN handshake: error %d", resp.ErrorCode)
		}
		if resp := authenticate(k, 1, "\x00user\x00"+tok); resp.ErrorCode != 0 {
			t.Fatalf("a good token: error %d %v", resp.ErrorCode, resp.ErrorMessage)
		}
		return k
	}

	t.Run("no_sasl", func(t *testing.T) {
		k := dial(t, f)
		k.t = t
		k.send(add(newProduce(9, -1), "logs", 0, plain("x").bytes(t)))
		k.closed()
	})
	t.Run("other_mechanism", func(t *testing.T) {
		k := dial(t, f)
		k.t = t
		resp := handshake(k, "SCRAM-SHA-256")
		if resp.ErrorCode != kerr.UnsupportedSaslMechanism.Code || len(resp.SupportedMechanisms) != 1 || resp.SupportedMechanisms[0] != "PLAIN" {
			t.Errorf("handshake: error %d, mechanisms %q", resp.ErrorCode, resp.SupportedMechanisms)
		}
		k.closed()
	})
	t.Run("no_handshake", func(t *testing.T) {
		k := dial(t, f)
		k.t = t
		if resp := authenticate(k, 1, "\x00u\x00"+tok); resp.ErrorCode != illegal {
			t.Errorf("SaslAuthenticate before the handshake: error %d", resp.ErrorCode)
		}
		k.closed()
	})
	for name, msg := range map[string]string{
		"empty":        "",
		"no_nul":       tok,
		"one_nul":      "u\x00" + tok,
		"four_parts":   "\x00u\x00" + tok + "\x00more",
		"trailing_nul": "\x00u\x00" + tok + "\x00",
	} {
		t.Run("malformed_"+name, func(t *testing.T) {
			k := dial(t, f)
			k.t = t
			if resp := handshake(k, "PLAIN"); resp.ErrorCode != 0 {
				t.Fatalf("PLAIN handshake: error %d", resp.ErrorCode)
			}
			resp := authenticate(k, 2, msg)
			if resp.ErrorCode != failed || resp.ErrorMessage == nil || *resp.ErrorMessage != "malformed SASL PLAIN message" {
				t.Errorf("a malformed PLAIN message: error %d, %v", resp.ErrorCode, resp.ErrorMessage)
			}
			k.closed()
		})
	}
	t.Run("bad_token", func(t *testing.T) {
		k := dial(t, f)
		k.t = t
		handshake(k, "PLAIN")
		resp := authenticate(k, 0, "\x00u\x00not-a-token")
		if resp.ErrorCode != failed || resp.ErrorMessage == nil || !strings.Contains(*resp.ErrorMessage, "not a valid application token") {
			t.Errorf("a bad token: error %d, %v", resp.ErrorCode, resp.ErrorMessage)
		}
		k.closed()
	})
	t.Run("twice", func(t *testing.T) {
		k := dial(t, f)
		k.t = t
		handshake(k, "PLAIN")
		if resp := authenticate(k, 2, "\x00u\x00"+tok); resp.ErrorCode != 0 {
			t.Fatalf("a good token: error %d", resp.ErrorCode)
		}
		if resp := authenticate(k, 2, "\x00u\x00"+tok); resp.ErrorCode != illegal {
			t.Errorf("SaslAuthenticate twice: error %d", resp.ErrorCode)
		}
		k.closed()
	})
	t.Run("tenant", func(t *testing.T) {
		k := login(t, tok)
		tb := plain("a")
		tb.recs[0].headers = [][2]string{{"ferry.tenant", "evil"}, {"x", "1"}}
		corr := k.send(add(newProduce(9, -1), "logs", 0, tb.bytes(t)))
		h := f.sink.next(t)
		recordsAre(t, h.recs, "logs/0 ka=a x=1,ferry.tenant=shop")
		h.ack(4, nil)
		resp := kmsg.NewPtrProduceResponse()
		k.recv(corr, 9, resp)
		checkAnswer(t, resp, 0, map[string]want{"logs/0": {0, 4}})
	})
	t.Run("token_topic", func(t *testing.T) {
		var claims token.Claims
		claims.App, claims.Topics[token.Messages] = "shop", "logs"
		k := login(t, authtest.IssueClaims(t, claims))
		req := add(newProduce(9, -1), "metrics", 0, plain("m").bytes(t))
		add(req, "logs", 0, plain("l").bytes(t))
		corr := k.send(req)
		h := f.sink.next(t)
		recordsAre(t, h.recs, "logs/0 kl=l ferry.tenant=shop")
		h.ack(0, nil)
		resp := kmsg.NewPtrProduceResponse()
		k.recv(corr, 9, resp)
		checkAnswer(t, resp, 0, map[string]want{"metrics/0": {kerr.TopicAuthorizationFailed.Code, -1}, "logs/0": {0, 0}})
	})
	t.Run("foreign_producer_id", func(t *testing.T) {
		// Another application's batches under shop's producer id are
		// delivered every time and leave shop's retry check alone.
		shop, other := login(t, tok), login(t, authtest.IssueClaims(t, token.Claims{App: "other"}))
		pid, epoch := shop.initProducerID()
		tb := plain("p")
		tb.pid, tb.epoch, tb.seq = pid, epoch, 0
		req := add(newProduce(9, -1), "logs", 2, tb.bytes(t))
		for i, k := range []*kclient{other, other, shop} {
			corr := k.send(req)
			f.sink.next(t).ack(int64(10+i), nil)
			resp := kmsg.NewPtrProduceResponse()
			k.recv(corr, 9, resp)
			checkAnswer(t, resp, 0, map[string]want{"logs/2": {0, int64(10 + i)}})
		}
		checkAnswer(t, shop.produce(req), 0, map[string]want{"logs/2": {0, 12}})
		if n := f.refused("producer_id_not_yours"); n != 2 {
			t.Errorf("%v producer_id_not_yours counted, want 2", n)
		}
	})
	f.sink.none(t)
}
