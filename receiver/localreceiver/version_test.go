package localreceiver

import (
	"bufio"
	"net"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ferryhq/ferry/consumer/consumertest"
	"github.com/ferryhq/ferry/protocol"
	"github.com/ferryhq/ferry/receipt"
	"github.com/ferryhq/ferry/receiver"
	"github.com/ferryhq/ferry/telemetry"
)

// dialVersion opens a binary connection of version v with a hello of
// version hv.
func dialVersion(t *testing.T, r *Receiver, v byte, hv uint16) (net.Conn, *bufio.Reader, protocol.FrameHeader, []byte) {
	t.Helper()
	c, err := net.Dial("tcp", r.TCPAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	pre := protocol.PreambleFor(v)
	out := protocol.AppendHello(pre[:], protocol.Hello{Version: hv, ClientName: "t"})
	if _, err := c.Write(out); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	h, body := readFrame(t, c, br)
	return c, br, h, body
}

// TestVersion1Unchanged: a version 1 connection is served as version 1
// says, whatever version 2 gives the flags: bits 2-3 of a produce are
// ignored (its body has no request id), and no result carries a receipt.
func TestVersion1Unchanged(t *testing.T) {
	sink := &consumertest.Sink{}
	r := start(t, testConfig(t), sink, nil)
	c, br, h, body := dialVersion(t, r, 1, 1)
	ok, err := protocol.DecodeHelloOK(body, protocol.DefaultLimits)
	if h.Type != protocol.TypeHelloOK || err != nil || ok.Version != 1 {
		t.Fatalf("%d %+v %v", h.Type, ok, err)
	}
	rec := protocol.Record{Topic: []byte("t"), Value: []byte("v")}
	f := produce(3, rec)
	f[5] = protocol.FlagReceipt | protocol.FlagRequestID
	_, _ = c.Write(f)
	fh, fb := readFrame(t, c, br)
	rs, err := protocol.DecodeResult(nil, fb, protocol.DefaultLimits)
	if fh.Type != protocol.TypeResult || fh.Flags != 0 || err != nil || len(rs) != 1 || rs[0].Status != protocol.StatusOK {
		t.Fatalf("frame %d flags %d: %+v %v", fh.Type, fh.Flags, rs, err)
	}
	for _, r := range sink.Records() {
		for _, hd := range r.Headers {
			if hd.Key == receipt.HeaderKey {
				t.Fatal("a version 1 frame got a request id")
			}
		}
	}
}

// TestVersion2 handshakes at version 2, and a hello whose version is not
// the preamble's is refused.
func TestVersion2(t *testing.T) {
	r := start(t, testConfig(t), &consumertest.Sink{}, nil)
	_, _, h, body := dialVersion(t, r, 2, 2)
	if ok, err := protocol.DecodeHelloOK(body, protocol.DefaultLimits); h.Type != protocol.TypeHelloOK || err != nil || ok.Version != 2 {
		t.Fatalf("%d %+v %v", h.Type, ok, err)
	}
	_, _, h, body = dialVersion(t, r, 2, 1)
	if reason, _, _ := protocol.DecodeError(body, protocol.DefaultLimits); h.Type != protocol.TypeError || reason != "unsupported_version" {
		t.Fatalf("a v1 hello after a v2 preamble: %d %q", h.Type, body)
	}
	_, _, h, body = dialVersion(t, r, 5, 5)
	if reason, _, _ := protocol.DecodeError(body, protocol.DefaultLimits); h.Type != protocol.TypeError || reason != "unsupported_version" {
		t.Fatalf("version 5: %d %q", h.Type, body)
	}
}

// withRequestID is a version 2 produce frame whose body starts with the
// request id field body (raw: its length and bytes as given).
func withRequestID(id uint32, flags byte, idField []byte, recs ...protocol.Record) []byte {
	body := append([]byte(nil), idField...)
	body = protocol.AppendProduceCount(body, len(recs))
	prev := ""
	for i := range recs {
		body = protocol.AppendRecord(body, prev, &recs[i])
		prev = string(recs[i].Topic)
	}
	return protocol.AppendFrame(nil, protocol.TypeProduce, flags|protocol.FlagRequestID, id, body)
}

// TestRequestIDRefusedPerFrame: a request id that reads but is not valid
// (too long, empty, a space) is that frame's mistake: it is answered
// permanent invalid_request_id and the connection goes on, so a client
// never resends it after a framing error. A valid id lands on every
// record, beside the records' own headers; an id whose length runs past
// the frame is a framing error.
func TestRequestIDRefusedPerFrame(t *testing.T) {
	sink := &consumertest.Sink{}
	r := start(t, testConfig(t), sink, nil)
	c, br, _, _ := dialVersion(t, r, 2, 2)
	rec := protocol.Record{Topic: []byte("t"), Value: []byte("v")}
	for i, id := range []string{strings.Repeat("r", 129), "", "a b", "é"} {
		_, _ = c.Write(withRequestID(uint32(10+i), 0, protocol.AppendRequestID(nil, id), rec))
		fh, fb := readFrame(t, c, br)
		rs, err := protocol.DecodeResult(nil, fb, protocol.DefaultLimits)
		if fh.Type != protocol.TypeResult || fh.RequestID != uint32(10+i) || err != nil || len(rs) != 1 ||
			rs[0].Status != protocol.StatusPermanent || rs[0].Reason != "invalid_request_id" {
			t.Fatalf("id %q: frame %d: %+v %v", id, fh.Type, rs, err)
		}
	}
	hdr := protocol.Header{Key: []byte("own"), Value: []byte("1")}
	withHdr := protocol.Record{Topic: []byte("t"), Value: []byte("w"), Headers: []protocol.Header{hdr}}
	_, _ = c.Write(withRequestID(20, 0, protocol.AppendRequestID(nil, "req-1"), rec, withHdr, rec))
	fh, fb := readFrame(t, c, br)
	if rs, err := protocol.DecodeResult(nil, fb, protocol.DefaultLimits); fh.Type != protocol.TypeResult || err != nil ||
		len(rs) != 1 || rs[0].Status != protocol.StatusOK || rs[0].Count != 3 {
		t.Fatalf("frame %d: %+v %v", fh.Type, rs, err)
	}
	got := sink.Records()
	if len(got) != 3 {
		t.Fatalf("%d records", len(got))
	}
	for i, r := range got {
		var id string
		own := 0
		for _, hd := range r.Headers {
			switch hd.Key {
			case receipt.HeaderKey:
				id = string(hd.Value)
			case "own":
				own++
			}
		}
		if id != "req-1" || own != map[bool]int{true: 1, false: 0}[i == 1] {
			t.Fatalf("record %d: headers %+v", i, r.Headers)
		}
	}
	// A length past the frame: nothing after it can be trusted.
	_, _ = c.Write(withRequestID(30, 0, []byte{100, 'r'}))
	fh, fb = readFrame(t, c, br)
	if reason, _, _ := protocol.DecodeError(fb, protocol.DefaultLimits); fh.Type != protocol.TypeError || reason != "malformed_frame" {
		t.Fatalf("frame %d %q", fh.Type, fb)
	}
}

// TestReceiptsUnavailable: when the exporter cannot say where records
// land (Kafka with acks none), a frame asking for a receipt is refused
// for good, counted, and the connection goes on; one that does not ask is
// served.
func TestReceiptsUnavailable(t *testing.T) {
	sink := &consumertest.Sink{}
	set := telemetry.TestSettings()
	r := startEnv(t, testConfig(t), receiver.Env{Set: set, Next: sink, NoReceipts: "exporter.kafka.acks is none"})
	c, br, _, _ := dialVersion(t, r, 2, 2)
	rec := protocol.Record{Topic: []byte("t"), Value: []byte("v")}
	f := produce(1, rec)
	f[5] = protocol.FlagReceipt
	_, _ = c.Write(f)
	fh, fb := readFrame(t, c, br)
	rs, err := protocol.DecodeResult(nil, fb, protocol.DefaultLimits)
	if fh.Type != protocol.TypeResult || err != nil || len(rs) != 1 || rs[0].Status != protocol.StatusPermanent ||
		rs[0].Reason != "receipts_unavailable" || !strings.Contains(rs[0].Message, "acks") {
		t.Fatalf("frame %d: %+v %v", fh.Type, rs, err)
	}
	_, _ = c.Write(produce(2, rec))
	fh, fb = readFrame(t, c, br)
	if rs, err := protocol.DecodeResult(nil, fb, protocol.DefaultLimits); fh.Type != protocol.TypeResult || err != nil || rs[0].Status != protocol.StatusOK {
		t.Fatalf("frame %d: %+v %v", fh.Type, rs, err)
	}
	if n := testutil.ToFloat64(r.m.Errors("receipts_unavailable")); n != 1 {
		t.Fatalf("receipts_unavailable counted %v times", n)
	}
}
