package localreceiver

import (
	"bufio"
	"net"
	"testing"

	"github.com/ferryhq/ferry/consumer/consumertest"
	"github.com/ferryhq/ferry/protocol"
	"github.com/ferryhq/ferry/receipt"
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
	_, _, h, body = dialVersion(t, r, 3, 3)
	if reason, _, _ := protocol.DecodeError(body, protocol.DefaultLimits); h.Type != protocol.TypeError || reason != "unsupported_version" {
		t.Fatalf("version 3: %d %q", h.Type, body)
	}
}
