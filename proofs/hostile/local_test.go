package hostile

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryhq/ferry/client"
	"github.com/ferryhq/ferry/proofs/harness/agenttest"
	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
	"github.com/ferryhq/ferry/protocol"
)

// localConn opens a binary local-protocol connection and says hello.
func localConn(t *testing.T, a *agenttest.Agent, feats uint64) (net.Conn, error) {
	t.Helper()
	c, err := net.Dial("unix", a.Socket)
	if err != nil {
		return nil, err
	}
	out := append([]byte(nil), protocol.Preamble[:]...)
	out = protocol.AppendHello(out, protocol.Hello{Version: 1, ClientName: "hostile", Features: feats})
	if _, err := c.Write(out); err != nil {
		c.Close()
		return nil, err
	}
	if _, _, err := readFrame(c); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// readFrame reads one frame the agent sends and describes it.
func readFrame(c net.Conn) (protocol.FrameHeader, string, error) {
	return readFrameBy(c, time.Now().Add(30*time.Second))
}

// readFrameBy is readFrame that gives up at by.
func readFrameBy(c net.Conn, by time.Time) (protocol.FrameHeader, string, error) {
	_ = c.SetReadDeadline(by)
	var hdr [10]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return protocol.FrameHeader{}, "", err
	}
	h, err := protocol.ParseHeader(hdr, 1<<20)
	if err != nil {
		return h, "", err
	}
	body := make([]byte, h.BodyLen())
	if _, err := io.ReadFull(c, body); err != nil {
		return h, "", err
	}
	switch h.Type {
	case protocol.TypeError:
		reason, _, _ := protocol.DecodeError(body, protocol.DefaultLimits)
		return h, "error " + reason, nil
	case protocol.TypeResult:
		rs, _ := protocol.DecodeResult(nil, body, protocol.DefaultLimits)
		var parts []string
		for _, r := range rs {
			st := map[byte]string{0: "ok", 1: "retryable", 2: "permanent"}[r.Status]
			parts = append(parts, fmt.Sprintf("%s %s", st, r.Reason))
		}
		return h, "result " + strings.Join(parts, ", "), nil
	}
	return h, fmt.Sprintf("frame type %d", h.Type), nil
}

// closed reports whether the agent closed c (after any frame it sent).
func closed(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := c.Read(make([]byte, 1))
	return err != nil
}

func produceFrame(flags byte, id uint32, body []byte) []byte {
	return protocol.AppendFrame(nil, protocol.TypeProduce, flags, id, body)
}

// TestLocalProtocolAttacks: the local protocol's bounds, each attacked over
// the agent's real Unix socket, while a well-behaved Go client sends
// alongside and loses nothing.
func TestLocalProtocolAttacks(t *testing.T) {
	brokers := kafkatest.Shared(t)
	goodTopic := kafkatest.NewTopic(t, brokers, "local-good", 1)
	floodTopic := kafkatest.NewTopic(t, brokers, "local-flood", 1)
	a := agenttest.Start(t, ferryBin, agentConfig(brokers), "receivers.local.max_connections=200")

	// The well-behaved client.
	cl, err := client.New(client.Options{Addrs: []string{"unix:" + a.Socket}, RetryBackoff: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var okN, failN int64
	var mu sync.Mutex
	stop := make(chan struct{})
	goodDone := make(chan struct{})
	go func() {
		defer close(goodDone)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			cl.Produce(context.Background(), &client.Record{Topic: goodTopic, Value: []byte(fmt.Sprintf("good-%d", i))}, func(_ *client.Record, err error) {
				mu.Lock()
				if err == nil {
					okN++
				} else {
					failN++
				}
				mu.Unlock()
			})
			time.Sleep(200 * time.Microsecond)
		}
	}()

	attack(t, a, "Local: a frame header claiming 1 GiB", func() (string, bool, string) {
		c, err := localConn(t, a, 0)
		if err != nil {
			return err.Error(), false, ""
		}
		defer c.Close()
		var hdr [10]byte
		binary.BigEndian.PutUint32(hdr[:], 1<<30)
		hdr[4] = protocol.TypeProduce
		_, _ = c.Write(hdr[:])
		_, got, err := readFrame(c)
		return got, err == nil && got == "error frame_too_large" && closed(c), "refused from the header, before any byte of the body is read"
	}, nil)

	attack(t, a, "Local: a value length past the end of the frame", func() (string, bool, string) {
		c, err := localConn(t, a, 0)
		if err != nil {
			return err.Error(), false, ""
		}
		defer c.Close()
		_, _ = c.Write(produceFrame(0, 1, []byte{1, 1, 't', 0, 100, 'v', 0, 0}))
		_, got, err := readFrame(c)
		return got, err == nil && got == "error malformed_frame" && closed(c), "the connection is closed after the error frame"
	}, nil)

	attack(t, a, "Local: 50,000 records claimed in a 20-byte body", func() (string, bool, string) {
		c, err := localConn(t, a, 0)
		if err != nil {
			return err.Error(), false, ""
		}
		defer c.Close()
		body := binary.AppendUvarint(nil, 50_000)
		body = append(body, 1, 't', 0, 1, 'v', 0, 0)
		_, _ = c.Write(produceFrame(0, 1, body))
		_, got, err := readFrame(c)
		return got, err == nil && got == "error malformed_frame", "no memory is sized from a count the body cannot hold"
	}, nil)

	attack(t, a, "Local: LZ4 bomb, 1 MiB inflating to 256 MiB", func() (string, bool, string) {
		c, err := localConn(t, a, protocol.FeatureLZ4)
		if err != nil {
			return err.Error(), false, ""
		}
		defer c.Close()
		var plain bytes.Buffer
		plain.Write(binary.AppendUvarint(nil, 1))
		plain.Write([]byte{1, 't', 0})
		plain.Write(binary.AppendUvarint(nil, 256<<20))
		z, _ := protocol.Compress(nil, append(plain.Bytes(), make([]byte, 256<<20)...), protocol.CompressLZ4)
		_, _ = c.Write(produceFrame(protocol.CompressLZ4, 1, z))
		_, got, err := readFrame(c)
		return got, err == nil && got == "result permanent frame_too_large", fmt.Sprintf("%d KiB sent; decompression stops at max_frame_bytes", len(z)>>10)
	}, nil)

	attack(t, a, "Local: 32 connections × 24 MiB of pipelined frames, answers never read", func() (string, bool, string) {
		var conns []net.Conn
		frame := func(id uint32) []byte {
			body := binary.AppendUvarint(nil, 2)
			rec := (&protocol.Record{Topic: []byte(floodTopic), Value: bytes.Repeat([]byte("f"), 512<<10)})
			body = protocol.AppendRecord(body, "", rec)
			body = protocol.AppendRecord(body, floodTopic, rec)
			return produceFrame(0, id, body)
		}
		var wg sync.WaitGroup
		for i := 0; i < 32; i++ {
			c, err := localConn(t, a, 0)
			if err != nil {
				continue
			}
			conns = append(conns, c)
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = c.SetWriteDeadline(time.Now().Add(3 * time.Second))
				for id := uint32(1); id <= 24; id++ {
					if _, err := c.Write(frame(id)); err != nil {
						return // the agent stopped reading: flow control
					}
				}
			}()
		}
		wg.Wait()
		for _, c := range conns {
			c.Close()
		}
		return fmt.Sprintf("%d connections held within max_inflight_bytes and the budget", len(conns)), len(conns) == 32, "past max_inflight_bytes the agent stops reading a connection; frames reserve the budget before they are read"
	}, nil)

	attack(t, a, "Local text mode: a 16 MiB line without a newline", func() (string, bool, string) {
		c, err := net.Dial("unix", a.Socket)
		if err != nil {
			return err.Error(), false, ""
		}
		defer c.Close()
		go func() { _, _ = c.Write(append([]byte("t\t"), bytes.Repeat([]byte("x"), 16<<20)...)) }()
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		line, _ := bufio.NewReader(c).ReadString('\n')
		line = strings.TrimSpace(line)
		return line, strings.HasPrefix(line, "ERR line_too_long"), ""
	}, nil)

	attack(t, a, "Local: connection flood, 400 (max_connections 200)", func() (string, bool, string) {
		var conns []net.Conn
		for i := 0; i < 400; i++ {
			if c, err := net.Dial("unix", a.Socket); err == nil {
				conns = append(conns, c)
			}
		}
		time.Sleep(300 * time.Millisecond)
		refused := 0
		for _, c := range conns {
			_ = c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
			if _, err := c.Read(make([]byte, 1)); err == io.EOF {
				refused++
			}
			c.Close()
		}
		return fmt.Sprintf("%d closed at once", refused), refused >= 190, ""
	}, nil)

	close(stop)
	<-goodDone
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := cl.Close(ctx); err != nil {
		t.Fatalf("the good client could not deliver: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if failN > 0 {
		t.Fatalf("the good client had %d records failed during the attacks", failN)
	}
	got := kafkatest.UpTo(t, brokers, goodTopic, 60*time.Second)
	seen := map[string]bool{}
	for _, r := range got {
		seen[string(r.Value)] = true
	}
	if int64(len(seen)) < okN {
		t.Fatalf("%d records reported accepted, %d distinct in Kafka", okN, len(seen))
	}
	t.Logf("the good client: %d records accepted, all in Kafka", okN)
}
