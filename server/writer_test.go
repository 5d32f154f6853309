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
	w := NewWriter(a, func() { drained.Add(1) }, nil)
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
	w = NewWriter(c, nil, func() { timedOut.Store(true) })
	w.Append([]byte("never read"))
	for end := time.Now().Add(5 * time.Second); !w.Closed() && time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
	}
	if !w.Closed() || !timedOut.Load() {
		t.Fatalf("a client that reads nothing: closed %v, timed out %v", w.Closed(), timedOut.Load())
	}
	w.Close()
}
