package hostile

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ferryhq/ferry/auth/authtest"
	"github.com/ferryhq/ferry/auth/token"
	"github.com/ferryhq/ferry/proofs/harness/agenttest"
	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
	"github.com/ferryhq/ferry/proofs/harness/payloads"
)

const memLimit = 64 << 20

// rssBound is the peak RSS an attack may cause: memory_limit + 64 MiB (the
// binary, the runtime and the Go soft limit's slack on top of the data bound).
const rssBound = memLimit + 64<<20

func issue(t *testing.T, c token.Claims) string { return authtest.IssueClaims(t, c) }

// reply is one answer to an attack: status and body.
type reply struct {
	code int
	body string
	err  error
}

func (r reply) String() string {
	if r.err != nil {
		return "connection error: " + r.err.Error()
	}
	reason := ""
	if i := strings.Index(r.body, `"reason":"`); i >= 0 {
		reason = r.body[i+10:]
		reason = " " + reason[:strings.IndexByte(reason, '"')]
	}
	return fmt.Sprintf("%d%s", r.code, reason)
}

func send(url, ctype, enc string, body []byte, hdr ...string) reply {
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	if enc != "" {
		req.Header.Set("Content-Encoding", enc)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if strings.EqualFold(hdr[i], "Host") {
			req.Host = hdr[i+1]
			continue
		}
		req.Header.Set(hdr[i], hdr[i+1])
	}
	cl := &http.Client{Timeout: 60 * time.Second}
	res, err := cl.Do(req)
	if err != nil {
		return reply{err: err}
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return reply{code: res.StatusCode, body: string(b)}
}

// attack runs fn against the agent in a fresh peak-RSS window and checks
// the common rules: the process stays up, its peak RSS stays within the
// bound, and the answer is what want says (4xx with the reason). forged,
// when given, counts the attacker's records that reached Kafka where they
// must not; the row says "not measured" without it.
func attack(t *testing.T, a *agenttest.Agent, name string, fn func() (answer string, ok bool, note string), forged func() int64) {
	t.Helper()
	attackCounted(t, a, name, fn, forged, nil)
}

// attackCounted is attack that also counts, with lost, the records a
// client was told were accepted that are not in Kafka.
func attackCounted(t *testing.T, a *agenttest.Agent, name string, fn func() (answer string, ok bool, note string), forged, lost func() int64) {
	t.Helper()
	a.ResetPeak()
	answer, ok, note := fn()
	time.Sleep(200 * time.Millisecond) // let the agent finish with it
	a.Alive()
	peak := a.Peak()
	r := row{Attack: name, Answer: answer, PeakMiB: float64(peak) / (1 << 20), Limit: rssBound / (1 << 20), Note: note}
	if forged != nil {
		r.Forged = counted(forged())
	}
	if lost != nil {
		r.Lost = counted(lost())
	}
	report(t, r)
	if !ok {
		t.Errorf("%s: answered %s", name, answer)
	}
	if peak > rssBound {
		t.Errorf("%s: peak RSS %d MiB over the %d MiB bound", name, peak>>20, rssBound>>20)
	}
	if r.Forged != nil && *r.Forged != 0 {
		t.Errorf("%s: %d forged records reached Kafka", name, *r.Forged)
	}
	if r.Lost != nil && *r.Lost != 0 {
		t.Errorf("%s: %d records answered as accepted are not in Kafka", name, *r.Lost)
	}
}

func agentConfig(brokers string) string {
	return fmt.Sprintf(`
queue:
  memory_limit: 64MiB
exporter:
  kafka:
    brokers: [%s]
    max_pending_topics: 50
receivers:
  http:
    max_connections: 200
    auth: {mode: optional, sources: [authorization, header]}
  otlp:
    # Two of it (a gRPC request's read reserves twice max_request_bytes)
    # leave 2 MiB of memory_limit for the well-behaved client's traffic:
    # at exactly half, one large request needed the whole budget and
    # waited out any other traffic (the burst attack failed 3 runs in 8).
    max_request_bytes: 31MiB
    http: {max_connections: 200}
    grpc: {max_connections: 200}
    auth: {mode: optional, sources: [authorization, metadata, resource]}
    logs:
      topic: "logs-{tenant}-{header.x-env}"
auth:
  keys: [{id: 1, secret: "%s", issue: true}]
processors:
  attributes:
    actions: [{action: delete, key: secret}]
telemetry:
  report_interval: 0s
`, brokers, authtest.Key)
}

// TestAttacks throws every attack at one agent (delivery mode kafka,
// memory_limit 64 MiB) while a well-behaved client sends records with
// sequence ids; at the end every acknowledged record of that client must be
// in Kafka.
func TestAttacks(t *testing.T) {
	brokers := kafkatest.Shared(t)
	goodTopic := kafkatest.NewTopic(t, brokers, "good", 3)
	billing := kafkatest.NewTopic(t, brokers, "billing", 1)
	acme := kafkatest.NewTopic(t, brokers, "acme-orders", 1)
	spoof := kafkatest.NewTopic(t, brokers, "spoof", 1)
	wide := kafkatest.NewTopic(t, brokers, "wide", 1)
	for _, tp := range []string{"otlp_spans", "otlp_logs", "otlp_metrics"} {
		kafkatest.CreateTopicIfMissing(t, brokers, tp, 1)
	}
	a := agenttest.Start(t, ferryBin, agentConfig(brokers))
	base := "http://" + a.HTTP
	otlp := "http://" + a.OTLP
	good := runGood(base, goodTopic)
	count := func(topic string) func() int64 {
		return func() int64 { return int64(len(kafkatest.UpTo(t, brokers, topic, 60*time.Second))) }
	}

	is := func(r reply, code int, reason string) (string, bool, string) {
		return r.String(), r.err == nil && r.code == code && strings.Contains(r.body, reason), ""
	}

	attack(t, a, "OTLP amplification: 256 KiB resource × 3,000 traces (gzip)", func() (string, bool, string) {
		body := payloads.Gzip(payloads.Amplifier(256<<10, 3000))
		a, ok, _ := is(send(otlp+"/v1/traces", "application/x-protobuf", "gzip", body), 413, "max_expanded_bytes")
		return a, ok, fmt.Sprintf("%d KB on the wire, ~750 MB of records if built", len(body)>>10)
	}, nil)

	attack(t, a, "OTLP item bomb: 4.2 M empty spans (gzip)", func() (string, bool, string) {
		body := payloads.Gzip(payloads.EmptySpans(4_200_000))
		a, ok, _ := is(send(otlp+"/v1/traces", "application/x-protobuf", "gzip", body), 413, "max_items_per_request")
		return a, ok, fmt.Sprintf("%d KB on the wire", len(body)>>10)
	}, nil)

	attack(t, a, "40,000 one-span traces in one request (CPU)", func() (string, bool, string) {
		before := a.CPU()
		r := send(otlp+"/v1/traces", "application/x-protobuf", "", payloads.Amplifier(64, 40000))
		cpu := a.CPU() - before
		return fmt.Sprintf("%s in %s of agent CPU", r, cpu.Round(10*time.Millisecond)), r.code == 200 && cpu < 2*time.Second,
			"splitting by trace walks each trace's own spans (was items × traces: seconds of CPU)"
	}, nil)

	attack(t, a, "NDJSON line bomb: 4 M one-byte lines (gzip)", func() (string, bool, string) {
		body := payloads.Gzip(payloads.Lines(4 << 20))
		a, ok, _ := is(send(base+"/v1/messages/"+goodTopic, "application/x-ndjson", "gzip", body), 413, "max_records_per_request")
		return a, ok, fmt.Sprintf("%d KB on the wire", len(body)>>10)
	}, nil)

	attack(t, a, "Attribute nested 2 M levels (17 MB), through the attribute filter", func() (string, bool, string) {
		body := payloads.DeepAttribute(2_000_000, "")
		a, ok, _ := is(send(otlp+"/v1/traces", "application/x-protobuf", "", body), 400, "nested too deeply")
		return a, ok, fmt.Sprintf("%d MB; used to overflow the stack and kill the agent", len(body)>>20)
	}, nil)

	attack(t, a, "Attribute nested 2 M levels with a resource token (gRPC)", func() (string, bool, string) {
		conn, err := largeSendConn(a.GRPC)
		if err != nil {
			return err.Error(), false, ""
		}
		defer conn.Close()
		body := rawBytes(payloads.DeepAttribute(2_000_000, issue(t, token.Claims{App: "edge"})))
		var st *status.Status
		tries := 0
		// The request reserves twice max_request_bytes while it is read;
		// while the budget is busy it is refused with RetryInfo (the
		// client, still sending, may see the stream reset): retry as an
		// exporter would.
		for ; tries < 5; tries++ {
			var resp rawBytes
			err = conn.Invoke(context.Background(), "/opentelemetry.proto.collector.trace.v1.TraceService/Export", body, &resp, grpc.ForceCodecV2(rawCodec{}))
			if st, _ = status.FromError(err); st.Code() == codes.InvalidArgument {
				break
			}
			time.Sleep(time.Second)
		}
		return st.Code().String() + ": " + firstLine(st.Message()), st.Code() == codes.InvalidArgument,
			fmt.Sprintf("the token is stripped through pdata only after ferry's decoder passed the request; %d retries while the memory budget was busy", tries)
	}, nil)

	attack(t, a, "48 gRPC requests of 30 MiB at once (max_request_bytes 31 MiB, memory_limit 64 MiB)", func() (string, bool, string) {
		conn, err := largeSendConn(a.GRPC)
		if err != nil {
			return err.Error(), false, ""
		}
		defer conn.Close()
		// Zero bytes are no OTLP: a request that is read is answered
		// INVALID_ARGUMENT, one that found no room RESOURCE_EXHAUSTED.
		body := rawBytes(make([]byte, 30<<20))
		answers := make(chan codes.Code, 48)
		var wg sync.WaitGroup
		for i := 0; i < 48; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var resp rawBytes
				err := conn.Invoke(context.Background(), "/opentelemetry.proto.collector.logs.v1.LogsService/Export", body, &resp, grpc.ForceCodecV2(rawCodec{}))
				answers <- status.Code(err)
			}()
		}
		wg.Wait()
		close(answers)
		var read, refused, other int
		for c := range answers {
			switch c {
			case codes.InvalidArgument:
				read++
			case codes.ResourceExhausted:
				refused++
			default:
				other++
			}
		}
		return fmt.Sprintf("%d read and answered INVALID_ARGUMENT, %d RESOURCE_EXHAUSTED, %d other", read, refused, other), read > 0 && other == 0,
			"each holds the 1 MiB stream window when it arrives, and 64 MiB (gRPC's buffers and ferry's copy) only while its message is read"
	}, nil)

	attack(t, a, "gRPC metadata: 48 connections each sending 4 MiB of it, never ending it (max_header_bytes 64 KiB)", func() (string, bool, string) {
		closed, open, err := grpcHeaderFlood(a.GRPC, 48, 4<<20, 3*time.Second)
		if err != nil {
			return err.Error(), false, ""
		}
		// A gRPC client reads the bound from the server's settings and
		// fails the call itself, with a reason.
		conn, err := grpc.NewClient(a.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err.Error(), false, ""
		}
		defer conn.Close()
		var callErr error
		for i := 0; i < 20; i++ { // retried in case the server's settings arrive after the first call
			var resp rawBytes
			ctx := metadata.AppendToOutgoingContext(context.Background(), "x-big", strings.Repeat("v", 100<<10))
			callErr = conn.Invoke(ctx, "/opentelemetry.proto.collector.trace.v1.TraceService/Export", rawBytes(nil), &resp, grpc.ForceCodecV2(rawCodec{}))
			if strings.Contains(status.Convert(callErr).Message(), "header list size") {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		return fmt.Sprintf("%d of 48 connections closed by the agent, %d left open; a client with 100 KiB of metadata: %s", closed, open, status.Convert(callErr).Message()),
			closed == 48 && strings.Contains(status.Convert(callErr).Message(), "violates the maximum size"),
			"gRPC's own bound is 16 MiB a stream, decoded and held outside the memory budget"
	}, nil)

	attack(t, a, "Unknown field: a protobuf group nested 5,000 levels in a span", func() (string, bool, string) {
		a, ok, _ := is(send(otlp+"/v1/traces", "application/x-protobuf", "", payloads.DeepGroup(5000)), 400, "malformed")
		return a, ok, "proto3 has no groups; ferry's decoder skipped them, so without an attribute filter (pdata refuses it) the span went to Kafka in a record protobuf-java (100 levels at most) cannot read"
	}, nil)

	attack(t, a, "OTLP/JSON nested 300,000 levels", func() (string, bool, string) {
		return is(send(otlp+"/v1/traces", "application/json", "", payloads.DeepJSON(300_000)), 400, "nested deeper")
	}, nil)

	attack(t, a, "64 clients each holding the last byte of an 8 MiB body", func() (string, bool, string) {
		var conns []net.Conn
		var refused int
		for i := 0; i < 64; i++ {
			c, err := net.Dial("tcp", a.HTTP)
			if err != nil {
				continue
			}
			conns = append(conns, c)
			fmt.Fprintf(c, "POST /v1/messages/%s HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n", goodTopic, 8<<20)
			go func(c net.Conn) { _, _ = c.Write(make([]byte, 8<<20-1)) }(c)
		}
		time.Sleep(2 * time.Second)
		for _, c := range conns {
			_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
			b := make([]byte, 64)
			if n, _ := c.Read(b); n > 0 && bytes.Contains(b[:n], []byte(" 429 ")) {
				refused++
			}
		}
		for _, c := range conns {
			c.Close()
		}
		return fmt.Sprintf("%d × 429 queue_full at once, the rest held within the budget", refused), refused >= 50, "bodies reserve their declared size before they are read"
	}, nil)

	attack(t, a, "Connection flood: 400 idle connections (max_connections 200)", func() (string, bool, string) {
		var conns []net.Conn
		for i := 0; i < 400; i++ {
			c, err := net.Dial("tcp", a.HTTP)
			if err == nil {
				conns = append(conns, c)
			}
		}
		time.Sleep(500 * time.Millisecond)
		refused := 0
		for _, c := range conns {
			_ = c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
			b := make([]byte, 64)
			if n, _ := c.Read(b); n > 0 && bytes.Contains(b[:n], []byte(" 503 ")) {
				refused++
			}
			c.Close()
		}
		return fmt.Sprintf("%d × 503 too_many_connections", refused), refused >= 190, ""
	}, nil)

	attack(t, a, "600 made-up topics, one record each, 100 at a time (max_pending_topics 50)", func() (string, bool, string) {
		var mu sync.Mutex
		codes := map[int]int{}
		var wg sync.WaitGroup
		sem := make(chan struct{}, 100)
		for i := 0; i < 600; i++ {
			wg.Add(1)
			sem <- struct{}{}
			go func(i int) {
				defer wg.Done()
				defer func() { <-sem }()
				r := send(fmt.Sprintf("%s/v1/messages/made-up-%d-%d", base, time.Now().UnixNano(), i), "text/plain", "", []byte("x"))
				mu.Lock()
				codes[r.code]++
				mu.Unlock()
			}(i)
		}
		wg.Wait()
		ok := codes[200] == 0 && codes[404]+codes[429] == 600 && codes[429] > 0
		purged := a.Metric("ferry_exporter_kafka_purged_topics_total")
		return fmt.Sprintf("%d × 404 unknown_topic, %d × 429 too_many_pending_topics", codes[404], codes[429]), ok && purged > 0,
			fmt.Sprintf("at most 50 pending at once; %.0f unknown topics purged from the Kafka client", purged)
	}, nil)

	attack(t, a, "Spoofed tenant header (X-Ferry-Header-Ferry.tenant: acme)", func() (string, bool, string) {
		r := send(base+"/v1/messages/"+spoof, "text/plain", "", []byte("x"), "X-Ferry-Header-Ferry.tenant", "acme")
		return r.String() + " (the header is dropped)", r.code == 200, ""
	}, func() int64 {
		var n int64
		for _, r := range kafkatest.UpTo(t, brokers, spoof, 60*time.Second) {
			for _, h := range r.Headers {
				if strings.HasPrefix(h.Key, "ferry.") {
					n++
				}
			}
		}
		return n
	})

	scoped := issue(t, token.Claims{App: "acme", TopicPattern: "acme-*"})
	attack(t, a, "Token scoped to acme-* writing to another tenant's topic", func() (string, bool, string) {
		a, ok, _ := is(send(base+"/v1/messages/"+billing, "text/plain", "", []byte("x"), "Authorization", "Bearer "+scoped), 403, "topic_not_allowed")
		if r := send(base+"/v1/messages/"+acme, "text/plain", "", []byte("x"), "Authorization", "Bearer "+scoped); r.code != 200 {
			return "its own topic: " + r.String(), false, ""
		}
		return a, ok, "its own topic still accepted"
	}, count(billing))

	attack(t, a, "Template blending: tenant acme + x-env x-prod (= acme-x + prod)", func() (string, bool, string) {
		tok := issue(t, token.Claims{App: "acme"})
		logs := payloads.Logs()
		return is(send(otlp+"/v1/logs", "application/x-protobuf", "", logs, "Authorization", "Bearer "+tok, "X-Env", "x-prod"), 400, "separates")
	}, nil)

	attack(t, a, "Browser POST from a web page (Origin: https://evil.example)", func() (string, bool, string) {
		return is(send(base+"/v1/messages/"+billing, "text/plain", "", []byte("x"), "Origin", "https://evil.example"), 403, "origin_not_allowed")
	}, count(billing))

	attack(t, a, "Browser reload: simple POST to /-/reload; DNS-rebound Host", func() (string, bool, string) {
		r1 := send("http://"+a.Admin+"/-/reload", "text/plain", "", nil)
		r2 := send("http://"+a.Admin+"/-/reload", "", "", nil, "X-Ferry-Reload", "1", "Host", "evil.example:8089")
		return fmt.Sprintf("%d, %d", r1.code, r2.code), r1.code == 403 && r2.code == 421, ""
	}, nil)

	attack(t, a, "1,000 records × 60 KB of headers (60 MB in the Kafka client)", func() (string, bool, string) {
		r := send(base+"/v1/messages/"+wide, "application/x-ndjson", "", payloads.Lines(1000), "X-Ferry-Header-Pad", strings.Repeat("p", 60<<10))
		n := len(kafkatest.ConsumeAll(t, brokers, wide, 3*time.Second))
		if r.code == 200 && n < 1000 { // a loaded broker: read until they are all there
			n = len(kafkatest.Consume(t, brokers, wide, 1000, 60*time.Second))
		}
		whole := r.code == 200 && n == 1000 || r.code != 200 && n == 0
		return fmt.Sprintf("%s, %d of 1,000 in Kafka", r, n), whole && r.err == nil, "a request is produced whole or not at all"
	}, nil)

	good.stop()
	missing := good.verify(t, brokers, goodTopic)
	report(t, row{Attack: "Well-behaved client during all of the above", Answer: fmt.Sprintf("%d records acknowledged, %d requests refused", good.n.Load(), good.refused.Load()),
		Lost: counted(missing), Note: "sequence ids checked in Kafka"})
	if missing != 0 {
		t.Errorf("the well-behaved client lost %d acknowledged records", missing)
	}
	if good.n.Load() == 0 {
		t.Error("the well-behaved client got nothing through")
	}
	a.Alive()
}

// verify reads topic (one consumer, up to 90 s on a loaded broker) and
// returns how many acknowledged records are missing.
func (g *goodClient) verify(t *testing.T, brokers, topic string) int64 {
	seen := map[string]bool{}
	for _, r := range kafkatest.Consume(t, brokers, topic, int(g.n.Load()), 90*time.Second) {
		seen[string(r.Value)] = true
	}
	var missing int64
	g.acked.Range(func(k, _ any) bool {
		if !seen[fmt.Sprintf("good:%d", k.(int))] {
			missing++
		}
		return true
	})
	return missing
}

// TestValidateRefuses: `ferry validate` refuses configurations that cannot
// work, naming the keys.
func TestValidateRefuses(t *testing.T) {
	kafkatest.SkipShort(t)
	for name, c := range map[string]struct{ yaml, keys string }{
		"reader below a record": {"delivery: {mode: spool}\nqueue: {memory_limit: 2MiB}\nreceivers: {http: {max_request_bytes: 64KiB}, otlp: {enabled: false}}\n", "queue.memory_limit"},
		"spool below a request": {"delivery: {mode: spill, spool: {max_bytes: 4MiB, segment_bytes: 1MiB}}\n", "delivery.spool.max_bytes"},
		"client buffer":         {"exporter: {kafka: {max_buffered_bytes: 64MiB}}\n", "exporter.kafka.max_buffered_bytes"},
		"pprof exposed":         {"telemetry: {admin: {listen: 0.0.0.0:8089, pprof: true}}\n", "telemetry.admin.pprof"},
	} {
		f := filepath.Join(t.TempDir(), "ferry.yaml")
		if err := os.WriteFile(f, []byte(c.yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(ferryBin, "validate", "-c", f).CombinedOutput()
		ok := err != nil && strings.Contains(string(out), c.keys)
		report(t, row{Attack: "ferry validate: " + name, Answer: strings.TrimSpace(firstLine(string(out))), Note: "exit status non-zero"})
		if !ok {
			t.Errorf("%s: %v %s", name, err, out)
		}
	}
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if len(s) > 120 {
		s = s[:120] + "…"
	}
	return strings.ReplaceAll(s, "|", "\\|")
}

// rawBytes and rawCodec send a request's bytes as they are: decoding the
// attack into pdata to send it would overflow the test's own stack.
type rawBytes []byte

type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }
func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(v.(rawBytes))}, nil
}
func (rawCodec) Unmarshal(d mem.BufferSlice, v any) error {
	*v.(*rawBytes) = d.Materialize()
	return nil
}

// TestSpoolForgery: a client puts a well-formed spool frame for topic
// "billing" inside a value (in the documented layout, with a guessed
// secret, and in the first format's layout); the value is damaged on disk
// while Kafka is down; the agent restarts with a smaller max_batch_bytes.
// Nothing reaches billing, every other acknowledged record is delivered
// (or, too large now, dead-lettered), none is skipped as damage.
func TestSpoolForgery(t *testing.T) {
	brokers := kafkatest.Shared(t)
	app := kafkatest.NewTopic(t, brokers, "app", 1)
	billing := kafkatest.NewTopic(t, brokers, "billing", 1)
	dir := t.TempDir()
	spoolSets := []string{"delivery.mode=spool", "delivery.spool.dir=" + dir + "/spool", "delivery.spool.fsync=always",
		"delivery.dead_letter.file=" + dir + "/dead.ndjson", "telemetry.report_interval=0s"}
	// Kafka unreachable: everything stays in the spool.
	a := agenttest.Start(t, ferryBin, "", append(spoolSets, "exporter.kafka.brokers=[127.0.0.1:1]")...)
	url := "http://" + a.HTTP + "/v1/messages/" + app
	var lines bytes.Buffer
	for i := 0; i < 20; i++ {
		fmt.Fprintf(&lines, "plain-%02d\n", i)
	}
	if r := send(url, "application/x-ndjson", "", lines.Bytes()); r.code != 200 {
		t.Fatalf("plain records: %s", r)
	}
	evil := append([]byte("prefix-"), payloads.SpoolFrame(billing, "forged")...)
	if r := send(url, "application/octet-stream", "", evil); r.code != 200 {
		t.Fatalf("value with a frame: %s", r)
	}
	for i := 0; i < 5; i++ {
		big := bytes.Repeat([]byte{byte('A' + i)}, 500<<10)
		if r := send(url, "application/octet-stream", "", big); r.code != 200 {
			t.Fatalf("500 KB record: %s", r)
		}
	}
	a.Stop()

	// Damage the value so its frame's checksum fails and the reader has to
	// resynchronise through the client's bytes.
	segs, _ := filepath.Glob(dir + "/spool/*.seg")
	damaged := false
	for _, s := range segs {
		b, _ := os.ReadFile(s)
		if i := bytes.Index(b, []byte("prefix-")); i >= 0 {
			b[i] ^= 0xFF
			if err := os.WriteFile(s, b, 0o600); err != nil {
				t.Fatal(err)
			}
			damaged = true
		}
	}
	if !damaged {
		t.Fatal("the value was not found in the spool")
	}

	b := agenttest.Start(t, ferryBin, "", append(spoolSets, "exporter.kafka.brokers=["+brokers+"]", "exporter.kafka.max_batch_bytes=262144")...)
	got := kafkatest.Consume(t, brokers, app, 20, 90*time.Second)
	deadline := time.Now().Add(30 * time.Second)
	var dead int
	for time.Now().Before(deadline) {
		d, _ := os.ReadFile(dir + "/dead.ndjson")
		if dead = bytes.Count(d, []byte("record_too_large")); dead >= 5 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	forged := int64(len(kafkatest.UpTo(t, brokers, billing, 60*time.Second)))
	plain := 0
	for _, r := range got {
		if bytes.HasPrefix(r.Value, []byte("plain-")) {
			plain++
		}
	}
	lost := int64(20-plain) + int64(5-dead)
	report(t, row{Attack: "Spool: a frame for another topic inside a value, damaged on disk, restart with a smaller max_batch_bytes",
		Answer: fmt.Sprintf("%d plain records delivered, %d large ones dead-lettered (record_too_large)", plain, dead),
		Forged: counted(forged), Lost: counted(lost), Note: "the damaged record itself is lost and counted; frames carry a per-segment secret"})
	if forged != 0 || lost != 0 {
		t.Fatalf("forged %d, lost %d (plain %d/20, dead-lettered %d/5)", forged, lost, plain, dead)
	}
	if v := b.Metric("ferry_spool_corrupt_bytes_total"); v <= 0 {
		t.Fatalf("the damage was not counted (%v)", v)
	}
	b.Stop()
}

// largeSendConn is a gRPC client whose own send limit is 64 MiB, so what
// refuses a large message is the agent's bound, not the client's.
func largeSendConn(addr string) (*grpc.ClientConn, error) {
	return grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(64<<20)))
}
