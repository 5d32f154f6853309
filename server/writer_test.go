package server

import (
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// TestWriter: answers arrive in the order queued; Close writes what is
// queued and drops what comes after; a client that stops reading ends the
// writer (write timeout) and wakes a waiting reader.
func TestWriter(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	var drained atomic.Int64
	w := NewWriter(a, nil, func() { drained.Add(1) }, nil)
	w.Append([]byte("one "))
	w.Queue(func(q []byte) []byte { return append(q, "two "...) })
	got := make([]byte, 8)
	if _, err := io.ReadFull(b, got); err != nil || string(got) != "one two " {
		t.Fatalf("read %q, %v", got, err)
	}
	w.Append([]byte("last"))
	go func() { _, _ = io.ReadFull(b, got[:4]) }()
	w.Close()
	w.Append([]byte("after"))
	if !w.Closed() || w.Queued() != 0 {
		t.Fatalf("closed %v, %d bytes queued after Close", w.Closed(), w.Queued())
	}
	if drained.Load() == 0 {
		t.Fatal("drained never ran")
	}

	// A client that never reads: the write times out.
	defer func(d time.Duration) { writeTimeout = d }(writeTimeout)
	writeTimeout = 100 * time.Millisecond
	c, d := net.Pipe()
	defer d.Close()
	var timedOut atomic.Bool
	w = NewWriter(c, nil, nil, func() { timedOut.Store(true) })
	w.Append([]byte("never read"))
	for end := time.Now().Add(5 * time.Second); !w.Closed() && time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
	}
	if !w.Closed() || !timedOut.Load() {
		t.Fatalf("a client that reads nothing: closed %v, timed out %v", w.Closed(), timedOut.Load())
	}
	w.Close()
}

// TestWriterHeld: what a connection holds of answers (queued, being
// written, parked) is counted in its receiver's room as it changes and
// given back when the answers are read or dropped; Holding stops
// a reader at MaxHeld, and at FreeHeld only while the room is spent.
func TestWriterHeld(t *testing.T) {
	ans := NewAnswers(64<<10, nil)
	a, b := net.Pipe() // nothing is written until b reads
	defer b.Close()
	w := NewWriter(a, ans, nil, nil)
	w.Append(make([]byte, 10<<10))
	w.Park(20 << 10)
	if h := ans.Held(); h != 30<<10 {
		t.Fatalf("held %d after 10 KiB queued and 20 KiB parked", h)
	}
	if over, crowded := w.Holding(); over || crowded {
		t.Fatal("30 KiB held in a room of 64 KiB: not over, not crowded")
	}
	other := NewWriter(net.Conn(nil), ans, nil, nil) // only counted, never written
	defer other.Close()
	other.Park(40 << 10)
	if over, crowded := w.Holding(); over || !crowded {
		t.Fatal("the room is spent and this connection holds more than FreeHeld: crowded")
	}
	other.Park(-40 << 10)
	w.Park(MaxHeld)
	if over, _ := w.Holding(); !over {
		t.Fatal("over MaxHeld")
	}
	w.Park(-MaxHeld)
	w.AppendParked(make([]byte, 20<<10))
	if h := ans.Held(); h != 30<<10 {
		t.Fatalf("held %d after the parked answer was queued", h)
	}
	// The client reads everything: nothing is held.
	got := make([]byte, 30<<10)
	if _, err := io.ReadFull(b, got); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(5 * time.Second); ans.Held() != 0 && time.Now().Before(end); time.Sleep(time.Millisecond) {
	}
	if h := ans.Held(); h != 0 {
		t.Fatalf("held %d after the client read every answer", h)
	}
	// A client that never reads: what the writer drops on its timeout is
	// no longer held.
	defer func(d time.Duration) { writeTimeout = d }(writeTimeout)
	writeTimeout = 50 * time.Millisecond
	w.Append(make([]byte, 8<<10))
	w.Append(make([]byte, 8<<10))
	for end := time.Now().Add(5 * time.Second); !w.Closed() && time.Now().Before(end); time.Sleep(time.Millisecond) {
	}
	w.Close()
	if h := ans.Held(); !w.Closed() || h != 0 {
		t.Fatalf("closed %v, held %d after the write timed out", w.Closed(), h)
	}
}
