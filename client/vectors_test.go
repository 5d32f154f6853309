package client_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ferryhq/ferry/client"
	"github.com/ferryhq/ferry/protocol"
)

// TestProduceFrameMatchesTheVector: the Go client, producing the records
// testdata/protocol/produce.json describes, writes the frame of
// produce.bin byte for byte (but its request id, which a client picks):
// the shared vectors check the protocol package's encoder, and the client
// encodes its frames itself, in place (conn.go).
func TestProduceFrameMatchesTheVector(t *testing.T) {
	want, err := os.ReadFile("../testdata/protocol/produce.bin")
	if err != nil {
		t.Fatal(err)
	}
	var vec struct {
		Frames []struct {
			Records []struct {
				Topic     string     `json:"topic"`
				Key       *string    `json:"key"`
				Value     string     `json:"value"`
				Timestamp int64      `json:"timestamp"`
				Headers   [][]string `json:"headers"`
			} `json:"records"`
		} `json:"frames"`
	}
	js, err := os.ReadFile("../testdata/protocol/produce.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(js, &vec); err != nil {
		t.Fatal(err)
	}

	// A fake agent: the handshake, then the first produce frame as read.
	dir, err := os.MkdirTemp("", "fv")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "a.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan []byte, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		// Idempotence not granted: a plain produce frame, as the vector.
		if err := sayHello(c, protocol.HelloOK{MaxFrameBytes: 1 << 20, MaxRecords: 10_000, MaxInflightBytes: 4 << 20, Server: "vectors"}); err != nil {
			return
		}
		f, err := readRaw(c)
		if err != nil {
			return
		}
		got <- f
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		_, _ = io.Copy(io.Discard, c)
	}()

	c, err := client.New(client.Options{Addrs: []string{"unix:" + sock}, MaxBlock: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_ = c.Close(ctx)
	}()
	for _, vr := range vec.Frames[0].Records {
		r := &client.Record{Topic: vr.Topic, Value: []byte(vr.Value)}
		if vr.Key != nil {
			r.Key = []byte(*vr.Key)
		}
		if vr.Timestamp != 0 {
			r.Timestamp = time.UnixMilli(vr.Timestamp)
		}
		for _, h := range vr.Headers {
			r.Headers = append(r.Headers, client.Header{Key: h[0], Value: []byte(h[1])})
		}
		c.Produce(context.Background(), r, nil)
	}
	var f []byte
	select {
	case f = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("no produce frame")
	}
	// The header's request id (bytes 6-9) is the client's choice.
	if len(f) != len(want) || !bytes.Equal(f[:6], want[:6]) || !bytes.Equal(f[10:], want[10:]) {
		t.Fatalf("the client's frame differs from produce.bin:\n got  %x\n want %x", f, want)
	}
}

// sayHello is a fake agent's side of the handshake: the client's preface
// and hello read, ok answered at the version the client asked for.
func sayHello(c net.Conn, ok protocol.HelloOK) error {
	var pre [4]byte
	if _, err := io.ReadFull(c, pre[:]); err != nil {
		return err
	}
	if _, err := readRaw(c); err != nil { // hello
		return err
	}
	ok.Version = uint16(pre[3])
	_, err := c.Write(protocol.AppendHelloOK(nil, ok))
	return err
}

// readRaw reads one frame, header included.
func readRaw(r io.Reader) ([]byte, error) {
	var hdr [10]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	h, err := protocol.ParseHeader(hdr, 1<<20)
	if err != nil {
		return nil, err
	}
	f := append([]byte(nil), hdr[:]...)
	f = append(f, make([]byte, h.BodyLen())...)
	_, err = io.ReadFull(r, f[len(hdr):])
	return f, err
}
