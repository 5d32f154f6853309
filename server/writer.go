package server

import (
	"errors"
	"net"
	"os"
	"sync"
	"time"
)

// writeTimeout: a client that reads none of its answers for this long is
// gone or stuck, and is disconnected. (A variable for the tests.)
var writeTimeout = 30 * time.Second

// Writer sends a stream connection's answers (the local protocol's, the
// Kafka front's). Any goroutine queues them, the Kafka client's promise
// callbacks among them, so queueing never blocks; one goroutine of the
// Writer's own writes them, as many as are queued in one write. A write
// that fails or times out ends the connection for reading too (the reader
// is woken by a read deadline in the past), and answers queued later are
// dropped: they have nowhere to go, and the records they answer for stay
// delivered or counted.
type Writer struct {
	c        net.Conn
	drained  func()
	timedOut func()

	mu     sync.Mutex
	q      []byte
	closed bool
	kick   chan struct{}
	done   chan struct{}
}

// NewWriter starts c's writer. drained (may be nil) runs, outside the
// Writer's lock, each time the queue was handed to the socket or dropped,
// for a reader that waits for the queue to shrink; timedOut (may be nil)
// when a write timed out.
func NewWriter(c net.Conn, drained, timedOut func()) *Writer {
	w := &Writer{c: c, drained: drained, timedOut: timedOut, kick: make(chan struct{}, 1), done: make(chan struct{})}
	go w.run()
	return w
}

// Queue appends an answer with enc, unless the connection is closed.
func (w *Writer) Queue(enc func([]byte) []byte) {
	w.mu.Lock()
	if !w.closed {
		w.q = enc(w.q)
	}
	w.mu.Unlock()
	w.wake()
}

// Append queues an answer already encoded.
func (w *Writer) Append(b []byte) {
	w.mu.Lock()
	if !w.closed {
		w.q = append(w.q, b...)
	}
	w.mu.Unlock()
	w.wake()
}

func (w *Writer) wake() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// Queued is the bytes of answers waiting to be written.
func (w *Writer) Queued() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.q)
}

// Closed reports whether no more answers will be written.
func (w *Writer) Closed() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.closed
}

// Close writes what is queued, then stops; later answers are dropped.
func (w *Writer) Close() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	w.wake()
	<-w.done
}

func (w *Writer) run() {
	defer close(w.done)
	var buf []byte
	for {
		<-w.kick
		for {
			w.mu.Lock()
			buf, w.q = w.q, buf[:0]
			closed := w.closed
			w.mu.Unlock()
			if w.drained != nil {
				w.drained()
			}
			if len(buf) == 0 {
				if closed {
					return
				}
				break
			}
			_ = w.c.SetWriteDeadline(time.Now().Add(writeTimeout))
			if _, err := w.c.Write(buf); err != nil {
				_ = w.c.SetReadDeadline(time.Now())
				w.mu.Lock()
				w.closed = true
				w.q = w.q[:0]
				w.mu.Unlock()
				if w.drained != nil {
					w.drained()
				}
				if errors.Is(err, os.ErrDeadlineExceeded) && w.timedOut != nil {
					w.timedOut()
				}
				return
			}
		}
	}
}
