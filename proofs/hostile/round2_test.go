package hostile

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferryhq/ferry/auth/authtest"
	"github.com/ferryhq/ferry/auth/token"
	"github.com/ferryhq/ferry/proofs/harness/agenttest"
	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
	"github.com/ferryhq/ferry/proofs/harness/payloads"
	"github.com/ferryhq/ferry/protocol"
)

// The second hostile-input round: the surfaces added after the first one
// (the local protocol's connections, the Kafka front's producer ids, tokens
// on connections that outlive them, the configuration's re-exec).

// ---- a raw Kafka-protocol client ----

// kafkaSession is one raw connection to the Kafka front: requests built
// by kmsg, sent and answered one at a time.
type kafkaSession struct {
	c    net.Conn
	corr int32
}

func dialKafka(addr string) (*kafkaSession, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	return &kafkaSession{c: c}, nil
}

func (s *kafkaSession) Close() { s.c.Close() }

// roundTrip sends req and reads its answer into resp.
func (s *kafkaSession) roundTrip(req kmsg.Request, resp kmsg.Response) error {
	s.corr++
	if _, err := s.c.Write(kafkaRequest(req.Key(), req.GetVersion(), s.corr, req.IsFlexible(), req.AppendTo(nil))); err != nil {
		return err
	}
	raw, err := kafkaAnswer(s.c)
	if err != nil {
		return err
	}
	if resp.IsFlexible() && req.Key() != 18 {
		raw = raw[min(1, len(raw)):]
	}
	resp.SetVersion(req.GetVersion())
	return resp.ReadFrom(raw)
}

// dialProducer opens a session and asks for a producer id.
func dialProducer(addr string) (*kafkaSession, int64, error) {
	s, err := dialKafka(addr)
	if err != nil {
		return nil, 0, err
	}
	pid, err := s.initPID()
	if err != nil {
		s.Close()
		return nil, 0, err
	}
	return s, pid, nil
}

// sasl authenticates with the token as the SASL PLAIN password.
func (s *kafkaSession) sasl(user, tok string) error {
	hs := kmsg.NewPtrSASLHandshakeRequest()
	hs.Version, hs.Mechanism = 1, "PLAIN"
	if err := s.roundTrip(hs, kmsg.NewPtrSASLHandshakeResponse()); err != nil {
		return err
	}
	au := kmsg.NewPtrSASLAuthenticateRequest()
	au.Version, au.SASLAuthBytes = 1, []byte("\x00"+user+"\x00"+tok)
	resp := kmsg.NewPtrSASLAuthenticateResponse()
	if err := s.roundTrip(au, resp); err != nil {
		return err
	}
	if resp.ErrorCode != 0 {
		return fmt.Errorf("SASL: error %d", resp.ErrorCode)
	}
	return nil
}

// initPID asks for an idempotent producer id.
func (s *kafkaSession) initPID() (int64, error) {
	req := kmsg.NewPtrInitProducerIDRequest()
	req.Version = 1
	resp := kmsg.NewPtrInitProducerIDResponse()
	if err := s.roundTrip(req, resp); err != nil {
		return 0, err
	}
	if resp.ErrorCode != 0 {
		return 0, fmt.Errorf("InitProducerId: error %d", resp.ErrorCode)
	}
	return resp.ProducerID, nil
}

// produce sends one batch to topic's partition 0 (acks all) and returns the
// partition's error code and base offset.
func (s *kafkaSession) produce(topic string, batch []byte) (int16, int64, error) {
	resp := kmsg.NewPtrProduceResponse()
	if err := s.roundTrip(kafkatest.ProduceRequest(topic, batch), resp); err != nil {
		return 0, 0, err
	}
	rp := resp.Topics[0].Partitions[0]
	return rp.ErrorCode, rp.BaseOffset, nil
}

// idemBatch is a batch of values from producer pid at epoch and sequence
// seq (pid -1: not idempotent).
func idemBatch(pid int64, epoch int16, seq int32, values ...string) []byte {
	return kafkatest.Batch{ProducerID: pid, Epoch: epoch, Seq: seq, Values: values}.Bytes()
}

// ledger keeps the values an agent answered as accepted, to count those
// missing from Kafka.
type ledger struct {
	t       *testing.T
	brokers string
	acked   map[string][]string // topic → values
}

func newLedger(t *testing.T, brokers string) *ledger {
	return &ledger{t: t, brokers: brokers, acked: map[string][]string{}}
}

func (l *ledger) ok(topic string, values ...string) {
	l.acked[topic] = append(l.acked[topic], values...)
}

// lost counts the accepted values of topic that are not in Kafka.
func (l *ledger) lost(topic string) int64 {
	seen := map[string]bool{}
	for _, r := range kafkatest.UpTo(l.t, l.brokers, topic, 60*time.Second) {
		seen[string(r.Value)] = true
	}
	var n int64
	for _, v := range l.acked[topic] {
		if !seen[v] {
			l.t.Logf("%s: %q was answered as accepted and is not in Kafka", topic, v)
			n++
		}
	}
	return n
}

// countValues counts the records of topic whose value is matched.
func countValues(t *testing.T, brokers, topic string, match func(string) bool) int64 {
	var n int64
	for _, r := range kafkatest.UpTo(t, brokers, topic, 60*time.Second) {
		if match(string(r.Value)) {
			n++
		}
	}
	return n
}

func prefix(p string) func(string) bool {
	return func(v string) bool { return strings.HasPrefix(v, p) }
}
func suffix(p string) func(string) bool {
	return func(v string) bool { return strings.HasSuffix(v, p) }
}

// TestKafkaFrontProducerIDs: the Kafka front's duplicate-batch check never
// answers success for a batch it did not deliver. Producer ids cannot be
// guessed, are deduplicated only for the application they were issued to,
// a new epoch starts its sequences afresh, and a batch is a duplicate only
// if its bytes (CRC) are the same.
func TestKafkaFrontProducerIDs(t *testing.T) {
	brokers := kafkatest.Shared(t)
	a := agenttest.Start(t, ferryBin, agentConfig(brokers), "receivers.kafka.enabled=true",
		"receivers.kafka.auth.mode=optional", "receivers.kafka.auth.sources=[sasl]")
	acked := newLedger(t, brokers)

	next := kafkatest.NewTopic(t, brokers, "front-nextpid", 1)
	attackCounted(t, a, "Kafka front: batches forged under the next producer id to be issued", func() (string, bool, string) {
		s, pid, err := dialProducer(a.KafkaFront)
		if err != nil {
			return err.Error(), false, ""
		}
		defer s.Close()
		// Poison the id the next producer would have been given.
		for seq := int32(0); seq < 5; seq++ {
			if _, _, err := s.produce(next, idemBatch(pid+1, 0, seq, fmt.Sprintf("forged-%d", seq))); err != nil {
				return err.Error(), false, ""
			}
		}
		good, err := kgo.NewClient(kgo.SeedBrokers(a.KafkaFront), kgo.DefaultProduceTopic(next))
		if err != nil {
			return err.Error(), false, ""
		}
		defer good.Close()
		n := 0
		for i := range 10 {
			v := fmt.Sprintf("good-%d", i)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if good.ProduceSync(ctx, &kgo.Record{Value: []byte(v)}).FirstErr() == nil {
				acked.ok(next, v)
				n++
			}
			cancel()
		}
		return fmt.Sprintf("franz-go's idempotent producer: %d of 10 acknowledged", n), n == 10,
			"producer ids are random and owned; the attacker's five records go to Kafka as its own (was: the next producer's first five batches answered OK and dropped)"
	}, nil, func() int64 { return acked.lost(next) })

	epochs := kafkatest.NewTopic(t, brokers, "front-epoch", 1)
	attackCounted(t, a, "Kafka front: a new epoch of the same producer id, sequences from 0 again", func() (string, bool, string) {
		s, pid, err := dialProducer(a.KafkaFront)
		if err != nil {
			return err.Error(), false, ""
		}
		defer s.Close()
		var codes []int16
		for _, b := range []struct {
			epoch int16
			seq   int32
		}{{0, 0}, {0, 1}, {1, 0}, {1, 1}} {
			v := fmt.Sprintf("epoch%d-seq%d", b.epoch, b.seq)
			code, _, err := s.produce(epochs, idemBatch(pid, b.epoch, b.seq, v))
			if err != nil {
				return err.Error(), false, ""
			}
			if code == 0 {
				acked.ok(epochs, v)
			}
			codes = append(codes, code)
		}
		return fmt.Sprintf("partition errors %v", codes), fmt.Sprint(codes) == "[0 0 0 0]",
			"what the Java producer does after an expired batch: the same id, epoch + 1 (was: epoch 1's batches answered OK and dropped)"
	}, nil, func() int64 { return acked.lost(epochs) })

	theft := kafkatest.NewTopic(t, brokers, "front-theft", 1)
	attackCounted(t, a, "Kafka front: a batch under another application's producer id", func() (string, bool, string) {
		alpha, err := dialKafka(a.KafkaFront)
		if err != nil {
			return err.Error(), false, ""
		}
		defer alpha.Close()
		if err := alpha.sasl("alpha", issue(t, token.Claims{App: "alpha"})); err != nil {
			return err.Error(), false, ""
		}
		pid, err := alpha.initPID()
		if err != nil {
			return err.Error(), false, ""
		}
		if code, _, err := alpha.produce(theft, idemBatch(pid, 0, 0, "alpha-0")); err != nil || code != 0 {
			return fmt.Sprintf("alpha's own batch: %d %v", code, err), false, ""
		}
		acked.ok(theft, "alpha-0")
		beta, err := dialKafka(a.KafkaFront)
		if err != nil {
			return err.Error(), false, ""
		}
		defer beta.Close()
		if err := beta.sasl("beta", issue(t, token.Claims{App: "beta"})); err != nil {
			return err.Error(), false, ""
		}
		code, _, err := beta.produce(theft, idemBatch(pid, 0, 0, "beta-0"))
		if err != nil {
			return err.Error(), false, ""
		}
		if code == 0 {
			acked.ok(theft, "beta-0")
		}
		return fmt.Sprintf("partition error %d (delivered as beta's own)", code), code == 0,
			"an id is matched against its batches only for the application it was issued to; another's batches under it are delivered untracked (was: answered OK with alpha's offset, dropped)"
	}, nil, func() int64 { return acked.lost(theft) })

	crc := kafkatest.NewTopic(t, brokers, "front-crc", 1)
	attackCounted(t, a, "Kafka front: the same producer id and sequence with other bytes", func() (string, bool, string) {
		s, pid, err := dialProducer(a.KafkaFront)
		if err != nil {
			return err.Error(), false, ""
		}
		defer s.Close()
		var codes []int16
		for _, v := range []string{"first", "other bytes, same sequence"} {
			code, _, err := s.produce(crc, idemBatch(pid, 0, 0, v))
			if err != nil {
				return err.Error(), false, ""
			}
			if code == 0 {
				acked.ok(crc, v)
			}
			codes = append(codes, code)
		}
		return fmt.Sprintf("partition errors %v", codes), fmt.Sprint(codes) == "[0 0]", "a duplicate is the same sequence range and the same CRC; anything else is delivered (was: answered OK, dropped)"
	}, nil, func() int64 { return acked.lost(crc) })
}

// ---- tokens on open connections ----

// key2 is a second signing key, removed by a reload in the test below.
var key2 = strings.Repeat("5c", 32)

func tokensConfig(brokers string, withKey2 bool) string {
	keys := fmt.Sprintf(`{id: 1, secret: "%s", issue: true}`, authtest.Key)
	if withKey2 {
		keys += fmt.Sprintf(`, {id: 2, secret: "%s"}`, key2)
	}
	return fmt.Sprintf(`
exporter:
  kafka:
    brokers: [%s]
receivers:
  otlp: {enabled: false}
  http:
    auth: {mode: required, sources: [authorization]}
  local:
    auth: {mode: required, sources: [hello]}
  kafka:
    enabled: true
    auth: {mode: required, sources: [sasl]}
auth:
  keys: [%s]
telemetry:
  report_interval: 0s
`, brokers, keys)
}

// tokenConns are one connection per door that takes a token once: the
// local protocol (binary and text) and the Kafka front.
type tokenConns struct {
	bin   net.Conn
	text  net.Conn
	textR *bufio.Reader
	kafka *kafkaSession
	id    uint32
}

func openTokenConns(a *agenttest.Agent, tok string) (*tokenConns, error) {
	tc := &tokenConns{}
	var err error
	if tc.bin, err = net.Dial("unix", a.Socket); err != nil {
		return nil, err
	}
	hello := append([]byte(nil), protocol.Preamble[:]...)
	hello = protocol.AppendHello(hello, protocol.Hello{Version: 1, ClientName: "hostile", Token: tok})
	if _, err := tc.bin.Write(hello); err != nil {
		return nil, err
	}
	if h, got, err := readFrame(tc.bin); err != nil || h.Type != protocol.TypeHelloOK {
		return nil, fmt.Errorf("hello: %s %v", got, err)
	}
	if tc.text, err = net.Dial("unix", a.Socket); err != nil {
		return nil, err
	}
	tc.textR = bufio.NewReader(tc.text)
	if _, err := fmt.Fprintf(tc.text, "#token %s\n", tok); err != nil {
		return nil, err
	}
	if line, err := tc.textLine(); err != nil || line != "OK" {
		return nil, fmt.Errorf("text #token: %q %v", line, err)
	}
	if tc.kafka, err = dialKafka(a.KafkaFront); err != nil {
		return nil, err
	}
	if err := tc.kafka.sasl("app", tok); err != nil {
		return nil, err
	}
	return tc, nil
}

func (tc *tokenConns) textLine() (string, error) {
	_ = tc.text.SetReadDeadline(time.Now().Add(20 * time.Second))
	line, err := tc.textR.ReadString('\n')
	return strings.TrimSpace(line), err
}

func (tc *tokenConns) Close() {
	tc.bin.Close()
	tc.text.Close()
	tc.kafka.Close()
}

// send writes value on each door and describes the three answers.
func (tc *tokenConns) send(topic, value string) (bin, text string, kafka int16, kafkaErr error) {
	tc.id++
	body := binary.AppendUvarint(nil, 1)
	body = protocol.AppendRecord(body, "", &protocol.Record{Topic: []byte(topic), Value: []byte("bin-" + value)})
	if _, err := tc.bin.Write(produceFrame(0, tc.id, body)); err != nil {
		bin = "write: " + err.Error()
	} else if _, got, err := readFrame(tc.bin); err != nil {
		bin = "read: " + err.Error()
	} else {
		bin = got
	}
	if _, err := fmt.Fprintf(tc.text, "%s\ttext-%s\n", topic, value); err != nil {
		text = "write: " + err.Error()
	} else if line, err := tc.textLine(); err != nil && line == "" {
		text = "read: " + err.Error()
	} else {
		text = line
	}
	kafka, _, kafkaErr = tc.kafka.produce(topic, idemBatch(-1, 0, 0, "kafka-"+value))
	return bin, text, kafka, kafkaErr
}

// kafkaWords describes the Kafka front's answer to a produce.
func kafkaWords(code int16, err error) string {
	if err != nil {
		return "connection closed"
	}
	return fmt.Sprint("partition error ", code)
}

// refusedAfter says whether each door refused a write on the connection
// whose token no longer holds: an Error frame, an ERR line, a
// SASL_AUTHENTICATION_FAILED answer or a closed connection.
func refusedAfter(bin, text string, kafka int16, kafkaErr error) bool {
	binOK := strings.HasPrefix(bin, "error unauthenticated") || strings.HasPrefix(bin, "read:")
	textOK := strings.HasPrefix(text, "ERR unauthenticated") || strings.HasPrefix(text, "read:")
	kafkaOK := kafka == 58 || kafkaErr != nil
	return binOK && textOK && kafkaOK
}

// TestTokensOnOpenConnections: a token checked once, at the local
// protocol's hello, its text mode's #token line or the Kafka front's SASL,
// stops writing when it expires, or when a reload removes its key, on the
// connection it opened.
func TestTokensOnOpenConnections(t *testing.T) {
	brokers := kafkatest.Shared(t)
	a := agenttest.Start(t, ferryBin, tokensConfig(brokers, true))
	topic := kafkatest.NewTopic(t, brokers, "tokens-open", 1)

	expiresAt := time.Unix(time.Now().Add(4*time.Second).Unix(), 0) // tokens carry whole seconds
	expiring := issue(t, token.Claims{App: "short", Expires: expiresAt})
	revoked := authtest.IssueWith(t, key2, 2, token.Claims{App: "rotated"})
	exp, err := openTokenConns(a, expiring)
	if err != nil {
		t.Fatal(err)
	}
	defer exp.Close()
	rev, err := openTokenConns(a, revoked)
	if err != nil {
		t.Fatal(err)
	}
	defer rev.Close()
	for _, tc := range []*tokenConns{exp, rev} {
		bin, text, kafka, kerr := tc.send(topic, "before")
		if bin != "result ok " || text != "OK" || kafka != 0 || kerr != nil {
			t.Fatalf("a valid token was refused: %q %q %d %v", bin, text, kafka, kerr)
		}
	}

	attack(t, a, "Local and Kafka front: a token that expires on an open connection", func() (string, bool, string) {
		time.Sleep(time.Until(expiresAt) + 500*time.Millisecond)
		bin, text, kafka, kerr := exp.send(topic, "expired")
		return fmt.Sprintf("binary: %s; text: %s; Kafka front: %s", bin, text, kafkaWords(kafka, kerr)), refusedAfter(bin, text, kafka, kerr),
			"every frame, batch of lines and request is checked against the connection's token, a cache hit (was: checked at hello and SASL only, the writes went on)"
	}, func() int64 { return countValues(t, brokers, topic, suffix("expired")) })

	attack(t, a, "Local and Kafka front: a reload removes the token's key, connections open", func() (string, bool, string) {
		if err := os.WriteFile(a.Config, []byte(tokensConfig(brokers, false)), 0o600); err != nil {
			return err.Error(), false, ""
		}
		if r := send("http://"+a.Admin+"/-/reload", "", "", nil, "X-Ferry-Reload", "1"); r.code != 200 {
			return "reload: " + r.String(), false, ""
		}
		bin, text, kafka, kerr := rev.send(topic, "revoked")
		return fmt.Sprintf("binary: %s; text: %s; Kafka front: %s", bin, text, kafkaWords(kafka, kerr)), refusedAfter(bin, text, kafka, kerr),
			"the verdict cache answers only for the keyring that gave it (was: the writes went on)"
	}, func() int64 { return countValues(t, brokers, topic, suffix("revoked")) })
}

// TestConfigOnAPipe: a configuration read from a pipe survives the start
// that runtime.monitor_deep_sleep re-executes (the second start cannot
// read the pipe again); a configuration file that holds nothing is an
// error, never the built-in defaults.
func TestConfigOnAPipe(t *testing.T) {
	brokers := kafkatest.Shared(t)
	topic := kafkatest.NewTopic(t, brokers, "piped", 1)
	secure := fmt.Sprintf(`
exporter: {kafka: {brokers: [%s]}}
receivers:
  http: {auth: {mode: required, sources: [authorization]}}
auth:
  keys: [{id: 1, secret: "%s", issue: true}]
`, brokers, authtest.Key)
	a := agenttest.StartPiped(t, ferryBin, secure)
	attack(t, a, "Configuration on a pipe (ferry run -c /dev/stdin, with auth required)", func() (string, bool, string) {
		r := send("http://"+a.HTTP+"/v1/messages/"+topic, "text/plain", "", []byte("no token"))
		ok := r.code == 401
		tok := issue(t, token.Claims{App: "piped"})
		if r2 := send("http://"+a.HTTP+"/v1/messages/"+topic, "text/plain", "", []byte("with token"), "Authorization", "Bearer "+tok); r2.code != 200 {
			return fmt.Sprintf("no token: %s; a valid token: %s", r, r2), false, ""
		}
		return r.String() + " without a token", ok, "the re-exec for runtime.monitor_deep_sleep hands the bytes it read to the new start in an in-memory file (was: the second start read an empty pipe and ran on the defaults, auth off)"
	}, func() int64 { return countValues(t, brokers, topic, prefix("no token")) })

	for name, args := range map[string][]string{
		"run -c /dev/null":        {"run", "-c", "/dev/null"},
		"validate, only comments": {"validate", "-c", writeTemp(t, "# nothing here\n\n")},
	} {
		// Bounded: a ferry that ran on the defaults would not return.
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		out, err := exec.CommandContext(ctx, ferryBin, append(args, "--set", "telemetry.admin.listen="+agenttest.FreeAddr(t),
			"receivers.http.listen="+agenttest.FreeAddr(t), "receivers.otlp.enabled=false", "receivers.local.enabled=false")...).CombinedOutput()
		cancel()
		ok := err != nil && strings.Contains(string(out), "holds no settings")
		report(t, row{Attack: "Empty configuration: ferry " + name, Answer: strings.TrimSpace(firstLine(string(out))), Note: "exit status non-zero, not the defaults"})
		if !ok {
			t.Errorf("ferry %s: %v %s", name, err, out)
		}
	}
}

func writeTemp(t *testing.T, s string) string {
	f := filepath.Join(t.TempDir(), "ferry.yaml")
	if err := os.WriteFile(f, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// ---- connections that hold memory or a place ----

// TestSlowConnections: a client that sends a frame's or a request's
// header and then holds its last bytes gives its reservation back within
// body_timeout; a connection whose answers all went out is idled out on
// time (its reader no longer waits without a deadline once something was
// in flight).
func TestSlowConnections(t *testing.T) {
	brokers := kafkatest.Shared(t)
	topic := kafkatest.NewTopic(t, brokers, "slow", 1)
	a := agenttest.Start(t, ferryBin, agentConfig(brokers), "receivers.kafka.enabled=true",
		"receivers.local.idle_timeout=3s", "receivers.kafka.idle_timeout=3s")
	used := func() float64 { return a.Metric("ferry_queue_bytes") }
	one := func(v string) []byte {
		body := binary.AppendUvarint(nil, 1)
		return protocol.AppendRecord(body, "", &protocol.Record{Topic: []byte(topic), Value: []byte(v)})
	}

	attack(t, a, "Local and Kafka front: 10 + 4 connections each holding the last bytes of a large frame or request", func() (string, bool, string) {
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for i := range 10 {
			c, err := localConn(t, a, 0)
			if err != nil {
				return err.Error(), false, ""
			}
			conns = append(conns, c)
			// One valid frame first: with it in flight the old reader
			// read the next header, and then the body, with no deadline.
			if _, err := c.Write(produceFrame(0, 1, one(fmt.Sprintf("slow-%d", i)))); err != nil {
				return err.Error(), false, ""
			}
			var hdr [10]byte
			binary.BigEndian.PutUint32(hdr[:], 8<<20) // the largest frame (max_frame_bytes 8 MiB)
			hdr[4] = protocol.TypeProduce
			binary.BigEndian.PutUint32(hdr[6:], 2)
			_, _ = c.Write(append(hdr[:], 0))
		}
		// The local frames fill the budget first, so the Kafka clients'
		// requests are refused and trickle inside their refusals.
		// Past 56 MiB used the prompt request below (an 8 MiB buffer)
		// cannot fit.
		for by := time.Now().Add(5 * time.Second); used() < 58<<20 && time.Now().Before(by); {
			time.Sleep(50 * time.Millisecond)
		}
		for range 4 {
			c, err := net.Dial("tcp", a.KafkaFront)
			if err != nil {
				return err.Error(), false, ""
			}
			conns = append(conns, c)
			req := kafkaRequest(0, 7, 1, false, produceV7(topic, map[int32][]byte{0: idemBatch(-1, 0, 0, strings.Repeat("k", 1<<20))}))
			_, _ = c.Write(req[:len(req)-1])
		}
		start := time.Now()
		time.Sleep(time.Second)
		held := used()
		// Meanwhile another client is told at once to retry (its refusal
		// does not queue behind the trickling clients').
		prompt, promptTook, retry := "no answer", time.Duration(0), false
		if s, err := dialKafka(a.KafkaFront); err == nil {
			_ = s.c.SetDeadline(time.Now().Add(3 * time.Second))
			t0 := time.Now()
			code, _, err := s.produce(topic, idemBatch(-1, 0, 0, "prompt "+strings.Repeat("p", 6<<20))) // more than the budget has left
			promptTook = time.Since(t0)
			if err == nil {
				prompt, retry = fmt.Sprintf("code %d", code), code == kerr.NotEnoughReplicas.Code
			}
			s.Close()
		}
		for used() > 4<<20 && time.Since(start) < 25*time.Second {
			time.Sleep(250 * time.Millisecond)
		}
		freed := time.Since(start)
		// Every connection ends: the local ones after their frame's
		// answer and an Error frame, the Kafka ones closed.
		closedN := 0
		by := time.Now().Add(5 * time.Second)
		for _, c := range conns {
			if endsBy(c, by) {
				closedN++
			}
		}
		ok := held >= 58<<20 && used() <= 4<<20 && closedN == len(conns) && retry
		return fmt.Sprintf("%.0f MiB held, given back after %.0f s; %d of %d connections closed; another client answered %s in %.1f s",
				held/(1<<20), freed.Seconds(), closedN, len(conns), prompt, promptTook.Seconds()), ok,
			"a body must arrive within body_timeout (10s) of its header (was: the budget stayed held until the client chose to close); a refusal reads on its own clock (was: one lease, 5 s per trickling client)"
	}, func() int64 { return countValues(t, brokers, topic, prefix("kkkk")) })

	attack(t, a, "Local and Kafka front: a connection idle once its answers went out (idle_timeout 3s)", func() (string, bool, string) {
		lc, err := localConn(t, a, 0)
		if err != nil {
			return err.Error(), false, ""
		}
		defer lc.Close()
		if _, err := lc.Write(produceFrame(0, 1, one("idle"))); err != nil {
			return err.Error(), false, ""
		}
		if _, got, err := readFrame(lc); err != nil || got != "result ok " {
			return fmt.Sprintf("local frame: %q %v", got, err), false, ""
		}
		s, err := dialKafka(a.KafkaFront)
		if err != nil {
			return err.Error(), false, ""
		}
		defer s.Close()
		if code, _, err := s.produce(topic, idemBatch(-1, 0, 0, "idle")); err != nil || code != 0 {
			return fmt.Sprintf("produce: %d %v", code, err), false, ""
		}
		time.Sleep(4 * time.Second)
		lcClosed, kClosed := closed(lc), closed(s.c)
		return fmt.Sprintf("local closed %v, Kafka front closed %v", lcClosed, kClosed), lcClosed && kClosed,
			"the idle deadline is re-armed while answers are owed (was: once something had been in flight the next header was awaited without a deadline)"
	}, nil)
}

// TestRefusalRoom: with the memory budget full, 40 Kafka clients each send
// a produce request naming 10,000 topics of 249 bytes (2.5 MB of names a
// refusal must keep to answer them) and hold back its last byte. What the
// refusals keep is bounded by their room (one refusal of the largest
// request Kafka could accept, 10.7 MB): past
// it connections are closed queue_full rather than kept; RSS stays within
// the bound (unbounded, forty such requests would keep ~100 MB of names),
// and another client's request is still told to retry at once.
func TestRefusalRoom(t *testing.T) {
	brokers := kafkatest.Shared(t)
	topic := kafkatest.NewTopic(t, brokers, "room", 1)
	// Long body timeouts: the local frames keep the budget full, and the
	// Kafka clients their refusals, for the whole attack on a slow machine.
	a := agenttest.Start(t, ferryBin, agentConfig(brokers), "receivers.kafka.enabled=true",
		"receivers.local.body_timeout=60s", "receivers.kafka.body_timeout=30s")
	used := func() float64 { return a.Metric("ferry_queue_bytes") }
	attack(t, a, "Kafka front: 40 connections each holding back a refused request of 10,000 topics with 249-byte names (budget full)", func() (string, bool, string) {
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		// Local frames fill the budget: each holds an 8 MiB reservation
		// until its body_timeout.
		for range 8 {
			c, err := localConn(t, a, 0)
			if err != nil {
				return err.Error(), false, ""
			}
			conns = append(conns, c)
			var hdr [10]byte
			binary.BigEndian.PutUint32(hdr[:], 8<<20)
			hdr[4] = protocol.TypeProduce
			binary.BigEndian.PutUint32(hdr[6:], 1)
			_, _ = c.Write(append(hdr[:], 0))
		}
		for by := time.Now().Add(5 * time.Second); used() < 60<<20 && time.Now().Before(by); {
			time.Sleep(50 * time.Millisecond)
		}
		full := used()
		req := kmsg.NewPtrProduceRequest()
		req.Version, req.Acks, req.TimeoutMillis = 7, -1, 30000
		for i := range 10000 {
			tp := kmsg.NewProduceRequestTopic()
			tp.Topic = fmt.Sprintf("%05d%s", i, strings.Repeat("n", 244))
			tp.Partitions = []kmsg.ProduceRequestTopicPartition{kmsg.NewProduceRequestTopicPartition()}
			req.Topics = append(req.Topics, tp)
		}
		big := kafkaRequest(0, 7, 1, false, req.AppendTo(nil))
		before := a.Metric(`ferry_receiver_errors_total{receiver="kafka",reason="queue_full"}`)
		var wg sync.WaitGroup
		for range 40 {
			c, err := net.Dial("tcp", a.KafkaFront)
			if err != nil {
				return err.Error(), false, ""
			}
			conns = append(conns, c)
			wg.Add(1)
			go func() { // a closed connection stops reading: writes may block
				defer wg.Done()
				_ = c.SetWriteDeadline(time.Now().Add(15 * time.Second))
				_, _ = c.Write(big[:len(big)-1])
			}()
		}
		// Until the closes stop: the room is spent and the rest refused.
		queueFull := func() float64 {
			return a.Metric(`ferry_receiver_errors_total{receiver="kafka",reason="queue_full"}`) - before
		}
		for last, since, by := -1.0, time.Now(), time.Now().Add(20*time.Second); time.Now().Before(by); time.Sleep(100 * time.Millisecond) {
			if n := queueFull(); n != last {
				last, since = n, time.Now()
			} else if n >= 30 && time.Since(since) > time.Second {
				break
			}
		}
		closedFull := queueFull()
		retry := "no answer"
		if s, err := dialKafka(a.KafkaFront); err == nil {
			_ = s.c.SetDeadline(time.Now().Add(3 * time.Second))
			if code, _, err := s.produce(topic, idemBatch(-1, 0, 0, "refused "+strings.Repeat("s", 6<<20))); err == nil {
				retry = fmt.Sprintf("code %d", code)
			}
			s.Close()
		}
		stillFull := used()
		for _, c := range conns {
			c.Close()
		}
		wg.Wait()
		ok := full >= 60<<20 && stillFull >= 60<<20 && closedFull >= 30 && retry == fmt.Sprintf("code %d", kerr.NotEnoughReplicas.Code)
		return fmt.Sprintf("budget %.0f MiB used; %.0f of 40 closed queue_full (the refusals' room spent); another client answered %s", full/(1<<20), closedFull, retry), ok,
			"what a refusal keeps is reserved as it arrives from a room shared by refusals (new with the streaming refusal)"
	}, func() int64 { return countValues(t, brokers, topic, prefix("refused ")) })
}

// endsBy reads and drops what c still sends, and reports whether the agent
// closed it before by.
func endsBy(c net.Conn, by time.Time) bool {
	_ = c.SetReadDeadline(by)
	_, err := io.Copy(io.Discard, c)
	return err == nil // EOF: closed by the agent; a timeout is an error
}

// TestCompressedFrames: a compressed local frame is charged what it
// inflates to, not max_frame_bytes: well-behaved clients with lz4 or zstd
// and many small frames in flight are not refused for memory they do not
// use.
func TestCompressedFrames(t *testing.T) {
	brokers := kafkatest.Shared(t)
	topic := kafkatest.NewTopic(t, brokers, "compressed", 1)
	// A fixed linger keeps every frame in flight for a while: what each
	// holds adds up.
	a := agenttest.Start(t, ferryBin, agentConfig(brokers), "exporter.kafka.linger=500ms", "exporter.kafka.linger_mode=fixed")
	acked := newLedger(t, brokers)
	attackCounted(t, a, "Local: 40 small lz4 frames in flight (memory_limit 64 MiB, max_frame_bytes 8 MiB)", func() (string, bool, string) {
		c, err := localConn(t, a, protocol.FeatureLZ4)
		if err != nil {
			return err.Error(), false, ""
		}
		defer c.Close()
		var out []byte
		wire := 0
		for id := uint32(1); id <= 40; id++ {
			body := binary.AppendUvarint(nil, 1)
			body = protocol.AppendRecord(body, "", &protocol.Record{Topic: []byte(topic), Value: []byte(fmt.Sprintf("z-%02d %s", id, strings.Repeat("log line ", 100)))})
			z, _ := protocol.Compress(nil, body, protocol.CompressLZ4)
			wire += len(z)
			out = append(out, produceFrame(protocol.CompressLZ4, id, z)...)
		}
		if _, err := c.Write(out); err != nil {
			return err.Error(), false, ""
		}
		okN := 0
		answers := map[string]int{}
		for range 40 {
			h, got, err := readFrame(c)
			if err != nil {
				return err.Error(), false, ""
			}
			answers[got]++
			if got == "result ok " {
				okN++
				acked.ok(topic, fmt.Sprintf("z-%02d %s", h.RequestID, strings.Repeat("log line ", 100)))
			}
		}
		return fmt.Sprintf("%d of 40 accepted (%v)", okN, answers), okN == 40,
			fmt.Sprintf("%d KB on the wire; the output is reserved as it grows (was: max_frame_bytes a frame, 33 of 40 refused queue_full)", wire>>10)
	}, nil, func() int64 { return acked.lost(topic) })
}

// TestTextModeHoldsLittle: text-mode connections and hellos cost little
// before a client has shown a token or sent a whole line: the line buffer
// starts small and grows only by reserving from the budget, a hello is
// small and must come soon.
func TestTextModeHoldsLittle(t *testing.T) {
	brokers := kafkatest.Shared(t)
	a := agenttest.Start(t, ferryBin, agentConfig(brokers), "receivers.local.max_connections=600")
	attack(t, a, "Local text mode: 300 connections each holding an unterminated 900 KB line", func() (string, bool, string) {
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		line := append([]byte("t\t"), make([]byte, 900<<10)...)
		before := a.Metric(`ferry_receiver_errors_total{reason="queue_full",receiver="local"}`)
		var wg sync.WaitGroup
		for range 300 {
			c, err := net.Dial("unix", a.Socket)
			if err != nil {
				break
			}
			conns = append(conns, c)
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
				_, _ = c.Write(line)
			}()
		}
		wg.Wait()
		time.Sleep(time.Second)
		a.Alive()
		// Refused connections are answered "ERR queue_full" and closed;
		// with the rest of its line unread the client may see a reset
		// first, so the agent's count is what is checked.
		refused := a.Metric(`ferry_receiver_errors_total{reason="queue_full",receiver="local"}`) - before
		return fmt.Sprintf("%d connections; %.0f refused queue_full", len(conns), refused), len(conns) == 300 && refused >= 200,
			"a 4 KiB line buffer grown only by reserving from the budget (was: 1 MiB each before auth or budget, 376 MiB peak)"
	}, nil)

	attack(t, a, "Local: 200 hellos claiming 60 KiB each", func() (string, bool, string) {
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for range 200 {
			c, err := net.Dial("unix", a.Socket)
			if err != nil {
				return err.Error(), false, ""
			}
			conns = append(conns, c)
			var hdr [10]byte
			binary.BigEndian.PutUint32(hdr[:], 60<<10+6)
			hdr[4] = protocol.TypeHello
			_, _ = c.Write(append(protocol.Preamble[:], hdr[:]...))
		}
		refused := 0
		other := map[string]int{}
		by := time.Now().Add(5 * time.Second)
		for _, c := range conns {
			if _, got, err := readFrameBy(c, by); err == nil && got == "error frame_too_large" {
				refused++
			} else {
				other[fmt.Sprint(got, err)]++
			}
		}
		if len(other) > 0 {
			t.Logf("other answers: %v", other)
		}
		return fmt.Sprintf("%d of 200 answered frame_too_large", refused), refused == 200, "a hello (a name and a token) is at most 16 KiB, read within 10 s (was: 64 KiB, no deadline but idle_timeout)"
	}, nil)
}

// TestRateLimitsCountHeaders: a record's headers count against its
// application's bytes/s on every door, and a reload does not forgive the
// debt of a class that did not change.
func TestRateLimitsCountHeaders(t *testing.T) {
	brokers := kafkatest.Shared(t)
	topic := kafkatest.NewTopic(t, brokers, "ratelimited", 1)
	cfg := agentConfig(brokers) + `
rate_limits:
  classes: {tiny: {records_per_sec: 100000, bytes_per_sec: 1000}}
  default_class: tiny
`
	a := agenttest.Start(t, ferryBin, cfg, "receivers.kafka.enabled=true")
	pad := strings.Repeat("p", 50<<10)
	attack(t, a, "Rate limit 1,000 B/s: one-byte records with 50 KB of headers (HTTP, local, Kafka front)", func() (string, bool, string) {
		var got []string
		admitted := 0
		for i := range 3 {
			r := send("http://"+a.HTTP+"/v1/messages/"+topic, "text/plain", "", []byte(fmt.Sprint("h", i)), "X-Ferry-Header-Pad", pad)
			got = append(got, r.String())
			if r.code == 200 {
				admitted++
			}
		}
		c, err := localConn(t, a, 0)
		if err != nil {
			return err.Error(), false, ""
		}
		defer c.Close()
		for i := range 3 {
			body := binary.AppendUvarint(nil, 1)
			body = protocol.AppendRecord(body, "", &protocol.Record{Topic: []byte(topic), Value: []byte(fmt.Sprint("l", i)),
				Headers: []protocol.Header{{Key: []byte("pad"), Value: []byte(pad)}}})
			_, _ = c.Write(produceFrame(0, uint32(i+1), body))
			_, ans, _ := readFrame(c)
			got = append(got, ans)
			if ans == "result ok " {
				admitted++
			}
		}
		s, err := dialKafka(a.KafkaFront)
		if err != nil {
			return err.Error(), false, ""
		}
		defer s.Close()
		for i := range 3 {
			code, _, _ := s.produce(topic, kafkatest.Batch{ProducerID: -1, Headers: [][2]string{{"pad", pad}}, Values: []string{fmt.Sprint("k", i)}}.Bytes())
			got = append(got, fmt.Sprint("error ", code))
			if code == 0 {
				admitted++
			}
		}
		return strings.Join(got, "; "), admitted == 1, "the first passes on a full bucket into debt, as documented (was: all nine passed, only key and value counted)"
	}, func() int64 { return max(0, countValues(t, brokers, topic, prefix(""))-1) })

	attack(t, a, "Rate limit: a reload that changes nothing while in debt", func() (string, bool, string) {
		if r := send("http://"+a.Admin+"/-/reload", "", "", nil, "X-Ferry-Reload", "1"); r.code != 200 {
			return "reload: " + r.String(), false, ""
		}
		r := send("http://"+a.HTTP+"/v1/messages/"+topic, "text/plain", "", []byte("after-reload"))
		return r.String(), r.code == 429, "a class that did not change keeps its bucket (was: every bucket rebuilt full by any reload)"
	}, func() int64 { return countValues(t, brokers, topic, prefix("after-reload")) })
}

// TestResourceTokenTwice: a resource that carries ferry.token twice (an
// int, then the real token) has both removed before Kafka.
func TestResourceTokenTwice(t *testing.T) {
	brokers := kafkatest.Shared(t)
	topic := kafkatest.NewTopic(t, brokers, "token-twice", 1)
	a := agenttest.Start(t, ferryBin, agentConfig(brokers), "receivers.otlp.logs.topic="+topic)
	tok := issue(t, token.Claims{App: "twice"})
	attack(t, a, "OTLP: a resource carrying ferry.token twice (an int, then the token)", func() (string, bool, string) {
		r := send("http://"+a.OTLP+"/v1/logs", "application/x-protobuf", "", payloads.TokenTwice(tok))
		return r.String(), r.code == 200, "every attribute of that name is removed (was: pdata's Remove took only the first, and the token went to Kafka)"
	}, func() int64 {
		var n int64
		for _, rec := range kafkatest.UpTo(t, brokers, topic, 60*time.Second) {
			if strings.Contains(string(rec.Value), tok) || strings.Contains(string(rec.Value), "ferry.token") {
				n++
			}
		}
		return n
	})
}
