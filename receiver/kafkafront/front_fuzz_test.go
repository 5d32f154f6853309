package kafkafront

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferryhq/ferry/auth"
	"github.com/ferryhq/ferry/auth/authtest"
	"github.com/ferryhq/ferry/auth/token"
	"github.com/ferryhq/ferry/receiver"
	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/telemetry"
)

// The fuzz targets of the front's other requests reuse the harness of the
// produce ones (sequence_fuzz_test.go): one front per target on loopback,
// raw client connections, kmsg-built requests, and the produce tests'
// kclient to read answers.

// ackAll is a pipeline that delivers every batch at once.
type ackAll struct{}

func (ackAll) Consume(_ context.Context, b *record.Batch) error {
	b.Arm()
	for i := range b.Records {
		b.AckAt(i, nil)
	}
	return nil
}

// fuzzCluster is the real cluster of the fuzz targets: every topic has 1
// to 4 partitions (by its name's length) except those named missing*;
// asked for all, it lists fuzzAllTopics.
func fuzzCluster(_ context.Context, names []string) ([]TopicInfo, error) {
	if names == nil {
		names = fuzzAllTopics
	}
	var out []TopicInfo
	for _, n := range names {
		if !strings.HasPrefix(n, "missing") {
			out = append(out, TopicInfo{Topic: n, Partitions: fuzzPartitions(n)})
		}
	}
	return out, nil
}

var fuzzAllTopics = []string{"logs", "t", "t2", "secret"}

func fuzzPartitions(name string) int32 { return 1 + int32(len(name)%4) }

// startFuzzFront starts a front for a fuzz target; it writes to logs and
// t* only.
func startFuzzFront(f *testing.F, cfg Config, pre *receiver.Prechecks) *Receiver {
	cfg.Topics = []string{"logs", "t*"}
	r, err := New(cfg, receiver.Env{Set: telemetry.TestSettings(), Next: ackAll{}, Pre: pre, Topics: fuzzCluster})
	if err != nil {
		f.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = r.Shutdown(context.Background()) })
	return r
}

// appendRequest appends req as a frame with correlation id corr: size,
// request header (client id "f"; the empty tag section when flexible), body.
func appendRequest(dst []byte, req kmsg.Request, corr int32) []byte {
	return appendFrame(dst, req.Key(), req.GetVersion(), corr, req.IsFlexible(), req.AppendTo(nil))
}

// appendFrame appends a request frame whose body (after the header) is body.
func appendFrame(dst []byte, key, ver int16, corr int32, flexible bool, body []byte) []byte {
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	dst = binary.BigEndian.AppendUint16(dst, uint16(key))
	dst = binary.BigEndian.AppendUint16(dst, uint16(ver))
	dst = binary.BigEndian.AppendUint32(dst, uint32(corr))
	dst = append(dst, 0, 1, 'f')
	if flexible {
		dst = append(dst, 0)
	}
	dst = append(dst, body...)
	binary.BigEndian.PutUint32(dst[start:], uint32(len(dst)-start-4))
	return dst
}

// fuzzDial opens a client connection to r.
func fuzzDial(t *testing.T, r *Receiver) *kclient {
	t.Helper()
	c, err := net.Dial("tcp", r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &kclient{t: t, c: c}
}

// stillServes: a new connection gets ApiVersions answered, with the served
// table.
func stillServes(t *testing.T, r *Receiver) {
	t.Helper()
	k := fuzzDial(t, r)
	req := kmsg.NewPtrApiVersionsRequest()
	corr := k.send(req)
	resp := kmsg.NewPtrApiVersionsResponse()
	k.recv(corr, 0, resp)
	if resp.ErrorCode != 0 || len(resp.ApiKeys) != len(served) {
		t.Fatalf("after the input, ApiVersions: error %d, %d APIs", resp.ErrorCode, len(resp.ApiKeys))
	}
	k.c.Close()
}

// readAll reads what the front writes on c until it closes the connection.
func readAll(t *testing.T, c net.Conn) []byte {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(wait))
	out, err := io.ReadAll(c)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the connection was left open %s after the client's last byte", wait)
	}
	// A reset (the front closed with bytes of ours unread) may lose the
	// answers in flight: what arrived is checked.
	return out
}

// FuzzRequestHeader writes arbitrary bytes as a client's whole side of a
// connection (size prefixes, request headers, client ids, tag sections,
// bodies: any API, any version) and closes its writing half: the front
// never panics, closes the connection once it has answered (never leaves
// it open), answers only requests that were framed, in order (the
// correlation ids of its answers are a subsequence of the requests', acks=0
// produce requests having none), each answer framed with its size, and
// afterwards still serves a new connection.
func FuzzRequestHeader(f *testing.F) {
	var seeds [][]byte
	av := kmsg.NewPtrApiVersionsRequest()
	av.Version, av.ClientSoftwareName, av.ClientSoftwareVersion = 3, "c", "1"
	seeds = append(seeds, appendRequest(nil, av, 1))
	av0 := kmsg.NewPtrApiVersionsRequest()
	seeds = append(seeds, appendRequest(nil, av0, 2))
	av9 := kmsg.NewPtrApiVersionsRequest()
	av9.Version = 9 // newer than served: answered in v0
	seeds = append(seeds, appendRequest(nil, av9, 3))
	for _, v := range []int16{1, 9, 12} {
		md := kmsg.NewPtrMetadataRequest()
		md.Version = v
		tp := kmsg.NewMetadataRequestTopic()
		tp.Topic = kmsg.StringPtr("logs")
		md.Topics = append(md.Topics, tp)
		seeds = append(seeds, appendRequest(nil, md, int32(v)))
	}
	ip := kmsg.NewPtrInitProducerIDRequest()
	ip.Version = 1
	hs := kmsg.NewPtrSASLHandshakeRequest()
	hs.Version, hs.Mechanism = 1, "PLAIN"
	prod := kmsg.NewPtrProduceRequest()
	prod.Version, prod.Acks, prod.TimeoutMillis = 7, -1, 30000
	tp := kmsg.NewProduceRequestTopic()
	tp.Topic = "t"
	pp := kmsg.NewProduceRequestTopicPartition()
	pp.Records = seqBatchBytes(-1, -1, -1, "v")
	tp.Partitions = append(tp.Partitions, pp)
	prod.Topics = append(prod.Topics, tp)
	prod0 := *prod
	prod0.Acks = 0
	fetch := kmsg.NewPtrFetchRequest()
	fetch.Version = 4
	fc := kmsg.NewPtrFindCoordinatorRequest()
	fc.Version, fc.CoordinatorKeys = 4, []string{"g"}
	// Pipelined: every kind of answer and no answer, in one stream.
	var pipe []byte
	for i, req := range []kmsg.Request{ip, hs, prod, &prod0, fc, av} {
		pipe = appendRequest(pipe, req, int32(10+i))
	}
	seeds = append(seeds, pipe, appendRequest(nil, ip, 4), appendRequest(nil, prod, 5), appendRequest(nil, fetch, 6),
		appendFrame(nil, 99, 0, 7, false, nil),                                        // an API no one serves
		[]byte{0, 0, 0, 4, 0, 18, 0, 0},                                               // a size below a header
		[]byte{0x7f, 0, 0, 0, 0, 18},                                                  // a size past max_request_bytes
		append(appendRequest(nil, av0, 8), 0, 0, 0, 40, 0, 3, 0, 1, 0, 0, 0, 9, 0xff)) // then a body cut short
	for _, s := range seeds {
		f.Add(s)
	}
	r := startFuzzFront(f, testConfig(), nil)
	f.Fuzz(func(t *testing.T, stream []byte) {
		if len(stream) > 64<<10 {
			return
		}
		// The requests the stream frames, as the front reads them: a size
		// prefix it takes (8 to max_request_bytes), then that many bytes.
		var corrs []int32
		for b := stream; len(b) >= 4; {
			size := int64(int32(binary.BigEndian.Uint32(b)))
			if size < 8 || size > int64(r.cfg.MaxRequestBytes) || int64(len(b)-4) < size {
				break
			}
			corrs = append(corrs, int32(binary.BigEndian.Uint32(b[8:])))
			b = b[4+size:]
		}
		c, err := net.Dial("tcp", r.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		// Written while the answers are read: a front that stops reading
		// until its answers are (flow control) must not stall the writer.
		wrote := make(chan struct{})
		go func() {
			defer close(wrote)
			_ = c.SetWriteDeadline(time.Now().Add(wait))
			_, _ = c.Write(stream) // the front may close before it has read it all
			_ = c.(*net.TCPConn).CloseWrite()
		}()
		out := readAll(t, c)
		<-wrote
		next := 0
		for len(out) >= 4 {
			size := int(binary.BigEndian.Uint32(out))
			if size > len(out)-4 {
				break // cut by a reset
			}
			if size < 4 {
				t.Fatalf("an answer of %d bytes, shorter than its correlation id", size)
			}
			corr := int32(binary.BigEndian.Uint32(out[4:]))
			for next < len(corrs) && corrs[next] != corr {
				next++
			}
			if next == len(corrs) {
				t.Fatalf("an answer to correlation id %d, which no request (in order) had: requests %v", corr, corrs)
			}
			next++
			out = out[4+size:]
		}
		stillServes(t, r)
	})
}

// FuzzMetadata sends a Metadata request (v1-v12) whose body after the
// header is arbitrary. Where kmsg cannot decode the body, or it names more
// than 1000 topics, the front closes the connection without an answer;
// otherwise it answers once: ferry as the only broker, at its address;
// asked for all topics, the cluster's topics this listener may write to,
// each with its partitions; asked for some, one answer per topic asked
// (an id-only topic: UNKNOWN_TOPIC_ID with the id), no error exactly for
// a name the listener may write to that the cluster has, and then the
// cluster's partition count, each partition led by ferry alone.
func FuzzMetadata(f *testing.F) {
	for _, v := range []int16{1, 4, 9, 10, 12} {
		md := kmsg.NewPtrMetadataRequest()
		md.Version = v
		for _, n := range []string{"logs", "t2", "secret", "missing", "bad name", "logs"} {
			tp := kmsg.NewMetadataRequestTopic()
			tp.Topic = kmsg.StringPtr(n)
			md.Topics = append(md.Topics, tp)
		}
		if v >= 10 {
			tp := kmsg.NewMetadataRequestTopic()
			tp.TopicID = [16]byte{1}
			md.Topics = append(md.Topics, tp)
		}
		f.Add(uint8(v), md.AppendTo(nil))
		all := kmsg.NewPtrMetadataRequest()
		all.Version = v
		f.Add(uint8(v), all.AppendTo(nil))
	}
	r := startFuzzFront(f, testConfig(), nil)
	host, port := r.advertised()
	f.Fuzz(func(t *testing.T, v uint8, body []byte) {
		ver := 1 + int16(v%12)
		req := kmsg.NewPtrMetadataRequest()
		req.SetVersion(ver)
		// The front walks the body's tagged fields before kmsg does (a
		// huge tag count costs kmsg seconds): so does the test.
		derr := checkBody(3, ver, body)
		if derr == nil {
			derr = req.ReadFrom(body)
		}
		k := fuzzDial(t, r)
		k.write(appendFrame(nil, 3, ver, 1, req.IsFlexible(), body))
		if derr != nil || len(req.Topics) > maxMetadataTopics {
			k.closed()
			return
		}
		resp := kmsg.NewPtrMetadataResponse()
		k.recv(1, ver, resp)
		if len(resp.Brokers) != 1 || resp.Brokers[0].NodeID != nodeID || resp.Brokers[0].Host != host || resp.Brokers[0].Port != port {
			t.Fatalf("brokers %+v, want node %d at %s:%d", resp.Brokers, nodeID, host, port)
		}
		// Topics by name, or by id (byID).
		type topicKey struct {
			byID bool
			name string
		}
		answered := map[topicKey]int{}
		for _, rt := range resp.Topics {
			// An id-only topic's answer has a null name, written as ""
			// before v12 (the name is nullable from v12 only).
			if rt.Topic == nil || ver < 12 && *rt.Topic == "" && rt.ErrorCode == kerr.UnknownTopicID.Code {
				if rt.ErrorCode != kerr.UnknownTopicID.Code {
					t.Fatalf("a topic answered by id with error %d", rt.ErrorCode)
				}
				answered[topicKey{true, string(rt.TopicID[:])}]++
				continue
			}
			name := *rt.Topic
			answered[topicKey{false, name}]++
			writable := receiver.CheckTopic(r.allow, nil, name) == nil
			exists := !strings.HasPrefix(name, "missing")
			if (rt.ErrorCode == 0) != (writable && exists) {
				t.Fatalf("topic %q (writable %v, in the cluster %v) answered with error %d", name, writable, exists, rt.ErrorCode)
			}
			if rt.ErrorCode != 0 {
				if len(rt.Partitions) != 0 {
					t.Fatalf("topic %q answered error %d and %d partitions", name, rt.ErrorCode, len(rt.Partitions))
				}
				continue
			}
			if int32(len(rt.Partitions)) != fuzzPartitions(name) {
				t.Fatalf("topic %q: %d partitions, the cluster has %d", name, len(rt.Partitions), fuzzPartitions(name))
			}
			for i, p := range rt.Partitions {
				if p.Partition != int32(i) || p.ErrorCode != 0 || p.Leader != nodeID || !slices.Equal(p.Replicas, onlyNode) || !slices.Equal(p.ISR, onlyNode) {
					t.Fatalf("topic %q partition %d: %+v", name, i, p)
				}
			}
		}
		want := map[topicKey]int{}
		if req.Topics == nil {
			for _, n := range fuzzAllTopics {
				if receiver.CheckTopic(r.allow, nil, n) == nil {
					want[topicKey{false, n}]++
				}
			}
		}
		for _, tp := range req.Topics {
			if tp.Topic == nil {
				want[topicKey{true, string(tp.TopicID[:])}]++
			} else {
				want[topicKey{false, *tp.Topic}]++
			}
		}
		if len(want) != len(answered) {
			t.Fatalf("answered %v, asked %v", answered, want)
		}
		for n, c := range want {
			if answered[n] != c {
				t.Fatalf("topic %+v answered %d times, asked %d: %v", n, answered[n], c, answered)
			}
		}
	})
}

// validToken: tok verifies under ring now.
func validToken(ring *token.Keyring, tok []byte) bool {
	_, err := ring.Verify(string(tok), time.Now())
	return err == nil
}

// FuzzSASLPlain: after a PLAIN handshake, a SaslAuthenticate (v0-v2) whose
// bytes are arbitrary is answered, and only a message of exactly three
// NUL-separated parts (RFC 4616: authzid, authcid, password) whose
// password is a valid application token (as package token verifies it)
// lets the client in (no error, and the
// connection then serves Metadata); any other is answered
// SASL_AUTHENTICATION_FAILED ("malformed SASL PLAIN message" when not
// three parts) and the connection is closed.
func FuzzSASLPlain(f *testing.F) {
	checker, _ := authtest.New(f)
	tok := authtest.IssueClaims(f, token.Claims{App: "shop"})
	// The oracle: the token package's own verdict on the password, under
	// the test key (each fuzzing process issues tokens of its own, so the
	// seeds' token is not this process's tok).
	ring, err := (&auth.Config{Keys: []auth.KeyConfig{{ID: 1, Secret: authtest.Key}}}).Keyring()
	if err != nil {
		f.Fatal(err)
	}
	for _, m := range []string{"\x00user\x00" + tok, "authz\x00user\x00" + tok, "", tok, "u\x00" + tok,
		"\x00u\x00" + tok + "\x00", "\x00u\x00" + tok[:len(tok)-1], "\x00\x00", "\x00u\x00not-a-token"} {
		for v := range uint8(3) {
			f.Add(v, []byte(m))
		}
	}
	cfg := testConfig()
	cfg.Auth = auth.ReceiverConfig{Mode: "required", Sources: []string{"sasl"}}
	r := startFuzzFront(f, cfg, &receiver.Prechecks{Checker: checker})
	f.Fuzz(func(t *testing.T, v uint8, msg []byte) {
		ver := int16(v % 3)
		k := fuzzDial(t, r)
		hs := kmsg.NewPtrSASLHandshakeRequest()
		hs.Version, hs.Mechanism = 1, "PLAIN"
		hresp := kmsg.NewPtrSASLHandshakeResponse()
		k.recv(k.send(hs), 1, hresp)
		if hresp.ErrorCode != 0 {
			t.Fatalf("PLAIN handshake: error %d", hresp.ErrorCode)
		}
		req := kmsg.NewPtrSASLAuthenticateRequest()
		req.Version, req.SASLAuthBytes = ver, msg
		resp := kmsg.NewPtrSASLAuthenticateResponse()
		k.recv(k.send(req), ver, resp)
		parts := bytes.Split(msg, []byte{0})
		switch {
		case len(parts) != 3:
			if resp.ErrorCode != kerr.SaslAuthenticationFailed.Code || resp.ErrorMessage == nil || *resp.ErrorMessage != "malformed SASL PLAIN message" {
				t.Fatalf("%d parts: error %d %v", len(parts), resp.ErrorCode, resp.ErrorMessage)
			}
		case !validToken(ring, parts[2]):
			if resp.ErrorCode != kerr.SaslAuthenticationFailed.Code {
				t.Fatalf("password %q (not a valid token): error %d", parts[2], resp.ErrorCode)
			}
		default:
			if resp.ErrorCode != 0 {
				t.Fatalf("the token as password: error %d %v", resp.ErrorCode, resp.ErrorMessage)
			}
			md := kmsg.NewPtrMetadataRequest()
			md.Version = 1
			tp := kmsg.NewMetadataRequestTopic()
			tp.Topic = kmsg.StringPtr("logs")
			md.Topics = append(md.Topics, tp)
			mresp := kmsg.NewPtrMetadataResponse()
			k.recv(k.send(md), 1, mresp)
			if len(mresp.Topics) != 1 || mresp.Topics[0].ErrorCode != 0 {
				t.Fatalf("authenticated, Metadata for logs: %+v", mresp.Topics)
			}
			return
		}
		k.closed()
	})
}
