package server

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"time"
)

// ErrIdle: the connection sent nothing for its idle timeout while none of
// its requests was in flight.
var ErrIdle = errors.New("idle")

// ReadHeader reads the next request header of a pipelining protocol into
// b. A connection is idle only while nothing of it is in flight: the read
// waits idle at a time, and a wait that ends with no byte read is extended
// as long as busy() says requests are still unanswered, so a client
// waiting for its answers is never cut off, and one that got them all is
// idled out on time (a read without a deadline would hold the connection
// for good once its last answer went out). Once a byte has arrived the
// rest of the header must follow within the same wait: a header trickled
// a byte at a time is not a client waiting.
//
// ctx ending stops it: Stream.Shutdown ends the context, then sets every
// connection's deadline to now to wake it.
func ReadHeader(ctx context.Context, c net.Conn, b []byte, idle time.Duration, busy func() bool) error {
	got, partial := 0, false
	for {
		_ = c.SetReadDeadline(time.Now().Add(idle))
		// After setting it: a Shutdown that set its own deadline before
		// this one had already ended ctx.
		if err := ctx.Err(); err != nil {
			return err
		}
		n, err := io.ReadFull(c, b[got:])
		got += n
		if err == nil {
			return nil
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			return err
		}
		switch {
		case got > 0 && partial:
			return ErrIdle
		case got > 0:
			partial = true // arrived at the end of a wait: one more
		case !busy():
			return ErrIdle
		}
	}
}

// ReadBody reads a request's body into b within timeout of now. The body
// usually holds a reservation of the shared memory budget: a client that
// sends a header and then trickles (or stops) must not pin it for longer
// than timeout, whatever it has in flight.
func ReadBody(c net.Conn, b []byte, timeout time.Duration) error {
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	_, err := io.ReadFull(c, b)
	return err
}

// DiscardBody skips n bytes of a body within timeout (a request refused
// before it was read: its bytes must still be consumed to find the next).
func DiscardBody(c net.Conn, n int64, timeout time.Duration) error {
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	_, err := io.CopyN(io.Discard, c, n)
	return err
}
