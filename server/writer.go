package server

import (
	"context"
	"errors"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// keepCap is the most buffer capacity a Writer keeps between bursts.
const keepCap = 64 << 10

// writeTimeout: a client that reads none of its answers for this long is
// gone or stuck, and is disconnected. (A variable for the tests.)
var writeTimeout = 30 * time.Second

// What a connection may hold of answers its client has not read: a client
// that pipelines requests and never reads must not make ferry hold their
// answers without bound (an ApiVersions request of 20 bytes has an answer
// three times that size; a Produce naming 10,000 partitions one 16 times
// its size). Past MaxHeld, or past FreeHeld while the receiver's
// connections together hold more than their Answers room, the reader stops
// reading the connection until its client reads (flow control, as for
// requests). Answers still owed count by an estimate from the moment their
// request is read (Park), so a reader, which checks before it reads a
// request, holds at most its bound plus one answer.
const (
	MaxHeld  = 1 << 20  // bytes of answers held for one connection
	FreeHeld = 16 << 10 // held without asking the room: any well-behaved client
	// CrowdedPoll is how often a reader stopped as crowded looks again.
	CrowdedPoll = 5 * time.Millisecond
)

// Answers is the room one receiver's connections share for answers their
// clients have not read: with max_connections at 1,024 a bound of MaxHeld
// each would allow 1 GiB. Together they hold at most room, plus FreeHeld
// and one answer a connection.
type Answers struct {
	held  atomic.Int64
	room  int64
	gauge interface{ Add(float64) }
}

// AnswersRoom is a receiver's room for answers held beyond FreeHeld: an
// eighth of queue.memory_limit (32 MiB by default), at least 1 MiB; 32 MiB
// when there is no limit (tests).
func AnswersRoom(memoryLimit int64) int64 {
	if memoryLimit <= 0 {
		return 32 << 20
	}
	return max(memoryLimit/8, 1<<20)
}

// NewAnswers makes a room of room bytes; gauge (may be nil) follows what
// is held.
func NewAnswers(room int64, gauge interface{ Add(float64) }) *Answers {
	return &Answers{room: room, gauge: gauge}
}

// Held is the bytes of answers the receiver's connections hold.
func (a *Answers) Held() int64 { return a.held.Load() }

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

	ans *Answers

	mu      sync.Mutex
	q       []byte
	writing int   // bytes handed to the socket's Write, not yet returned
	parked  int   // bytes of answers not queued yet: made and waiting for an earlier one, or owed (their estimate): Park
	counted int64 // what ans counts for this connection
	closed  bool
	kick    chan struct{}
	done    chan struct{}
}

// NewWriter starts c's writer, its answers counted in ans (may be nil).
// drained (may be nil) runs, outside the Writer's lock, each time the
// queue was handed to the socket or dropped, for a reader that waits for
// the queue to shrink; timedOut (may be nil) when a write timed out.
func NewWriter(c net.Conn, ans *Answers, drained, timedOut func()) *Writer {
	w := &Writer{c: c, ans: ans, drained: drained, timedOut: timedOut, kick: make(chan struct{}, 1), done: make(chan struct{})}
	go w.run()
	return w
}

// held is what the connection holds of answers; under w.mu.
func (w *Writer) held() int { return len(w.q) + w.writing + w.parked }

// settle brings the receiver's count to held; under w.mu.
func (w *Writer) settle() {
	if w.ans == nil {
		return
	}
	h := int64(w.held())
	if h != w.counted {
		w.ans.held.Add(h - w.counted)
		if w.ans.gauge != nil {
			w.ans.gauge.Add(float64(h - w.counted))
		}
		w.counted = h
	}
}

// Park counts n bytes of an answer the connection holds, or will hold,
// before it is queued (a negative n: no longer): one that must wait for an
// answer to an earlier request, or the estimate of one still owed, so that
// a reader stops before the answers to what it already read exceed its
// bound.
func (w *Writer) Park(n int) {
	w.mu.Lock()
	w.parked += n
	w.settle()
	w.mu.Unlock()
}

// AppendParked queues an answer counted by Park.
func (w *Writer) AppendParked(b []byte) {
	w.mu.Lock()
	w.parked -= len(b)
	if !w.closed {
		w.q = append(w.q, b...)
	}
	w.settle()
	w.mu.Unlock()
	w.wake()
}

// QueueParked is Queue for an answer whose estimate, parked bytes, was
// counted by Park.
func (w *Writer) QueueParked(parked int, enc func([]byte) []byte) {
	w.mu.Lock()
	w.parked -= parked
	if !w.closed {
		w.q = enc(w.q)
	}
	w.settle()
	w.mu.Unlock()
	w.wake()
}

// Holding says whether the connection's reader must wait before it reads
// another request: over, the connection holds more than MaxHeld of
// answers (wait for drained); crowded, more than FreeHeld while the
// receiver's connections together hold more than their room (wait a
// CrowdedPoll: another connection's client reading makes the room).
func (w *Writer) Holding() (over, crowded bool) {
	w.mu.Lock()
	h := w.held()
	w.mu.Unlock()
	return h > MaxHeld, h > FreeHeld && w.ans != nil && w.ans.held.Load() > w.ans.room
}

// WaitForRoom is the reader's wait before it reads another request: while
// the connection holds too much (Holding), or full (may be nil: the
// caller's own bound, such as answers owed) says so. mu is cond's lock,
// held by the caller; cond is broadcast by the caller when its bound
// eases and by drained (the writer's progress); a crowded receiver is
// polled every CrowdedPoll, since other connections' clients make that
// room. False: the writer closed or ctx ended (cond must be broadcast
// then too).
func (w *Writer) WaitForRoom(ctx context.Context, mu sync.Locker, cond *sync.Cond, full func() bool) bool {
	for !w.Closed() && ctx.Err() == nil {
		over, crowded := w.Holding()
		if over || full != nil && full() {
			cond.Wait()
			continue
		}
		if crowded {
			mu.Unlock()
			time.Sleep(CrowdedPoll)
			mu.Lock()
			continue
		}
		return true
	}
	return false
}

// Queue appends an answer with enc, unless the connection is closed.
func (w *Writer) Queue(enc func([]byte) []byte) {
	w.mu.Lock()
	if !w.closed {
		w.q = enc(w.q)
		w.settle()
	}
	w.mu.Unlock()
	w.wake()
}

// Append queues an answer already encoded.
func (w *Writer) Append(b []byte) {
	w.mu.Lock()
	if !w.closed {
		w.q = append(w.q, b...)
		w.settle()
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

// Queued is the bytes of answers the connection holds: waiting to be
// written, being written (a client that reads nothing holds both), parked.
func (w *Writer) Queued() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.held()
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
			if cap(buf) > keepCap {
				// A burst of answers (or a client that read slowly)
				// must not leave an idle connection holding its peak.
				buf = nil
			}
			buf, w.q = w.q, buf[:0]
			w.writing = len(buf)
			w.settle()
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
				w.q, w.writing = nil, 0
				w.settle()
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
