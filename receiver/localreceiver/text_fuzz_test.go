package localreceiver

import (
	"bufio"
	"bytes"
	"context"
	"github.com/ferryhq/ferry/receiver"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/buffer/budget"
	"github.com/ferryhq/ferry/consumer/consumertest"
	"github.com/ferryhq/ferry/telemetry"
)

// FuzzTextMode: whatever bytes a text-mode client sends, the connection's
// handler neither panics nor hangs, every record it hands on is a line the
// client sent ("topic<TAB>value" with the value as sent), it hands on no
// more records than it answered OK, and the memory its line buffer
// reserved is all given back when the connection ends.
func FuzzTextMode(f *testing.F) {
	cfg := Config{Enabled: true, Listen: "127.0.0.1:0", MaxFrameBytes: 16 << 10, MaxRecords: 16, MaxInflightBytes: 1 << 20,
		IdleTimeout: 5 * time.Second, AckTimeout: 5 * time.Second, BodyTimeout: 5 * time.Second, Topics: []string{"*"}}
	sink := &consumertest.Sink{}
	// A small budget: long lines grow into it, and some find no room.
	b := budget.New(10 << 10)
	r, err := New(cfg, receiver.Env{Set: telemetry.TestSettings(), Next: sink, Bodies: b})
	if err != nil {
		f.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { ln.Close() })

	f.Add([]byte("t\thello\nt\tworld\n"))
	f.Add([]byte("#noreply\nt\tv\n"))
	f.Add([]byte("#token abc\nt\tv\r\n"))
	f.Add([]byte("no tab here\n\n#comment\nt\t\n"))
	f.Add(append([]byte("t\t"), bytes.Repeat([]byte("x"), 6000)...))                         // grows, unfinished
	f.Add(append(append([]byte("t\t"), bytes.Repeat([]byte("y"), 5000)...), "\nt\tz\n"...))  // grows, then shrinks
	f.Add(append(append([]byte("t\t"), bytes.Repeat([]byte("w"), 12000)...), "\nt\tz\n"...)) // no room to grow
	f.Add(append([]byte("t\t"), bytes.Repeat([]byte("v"), 20000)...))                        // too long
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) > 24<<10 {
			return
		}
		sink.Reset()
		cli, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer cli.Close()
		srv, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			defer srv.Close()
			r.text(context.Background(), srv, nil)
		}()
		go func() {
			_, _ = cli.Write(in)
			_ = cli.(*net.TCPConn).CloseWrite()
		}()
		_ = cli.SetReadDeadline(time.Now().Add(10 * time.Second))
		var answers []string
		br := bufio.NewReader(cli)
		for {
			l, err := br.ReadString('\n')
			if err != nil {
				break
			}
			answers = append(answers, strings.TrimSpace(l))
		}
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("the text handler did not end after the client closed")
		}
		oks := 0
		for _, a := range answers {
			if a == "OK" {
				oks++
			}
		}
		sent := map[string]bool{}
		for _, l := range bytes.Split(in, []byte("\n")) {
			sent[string(bytes.TrimRight(l, "\r"))] = true
		}
		recs := sink.Records()
		if len(recs) > oks && !bytes.Contains(in, []byte("#noreply")) {
			t.Fatalf("%d records handed on, %d lines answered OK", len(recs), oks)
		}
		for _, rec := range recs {
			if !sent[rec.Topic+"\t"+string(rec.Value)] {
				t.Fatalf("a record (%q, %q) that is no line the client sent", rec.Topic, rec.Value)
			}
		}
		if used := b.Used(); used != 0 {
			t.Fatalf("%d bytes of the budget still reserved after the connection ended", used)
		}
	})
}
