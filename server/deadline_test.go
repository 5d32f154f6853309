package server

import (
	"context"
	"errors"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"
)

// TestReadHeaderIdle: a connection that sends nothing is idle only while
// nothing of it is in flight: the wait is extended as long as busy says
// answers are owed, and ends one idle period after they all went out; a
// header that stops half way is not a client waiting; a stopping agent
// (its context ended) stops the wait.
func TestReadHeaderIdle(t *testing.T) {
	const idle = 30 * time.Millisecond
	t.Run("idle", func(t *testing.T) {
		a, b := net.Pipe()
		defer a.Close()
		defer b.Close()
		var hdr [4]byte
		if err := ReadHeader(context.Background(), a, hdr[:], idle, func() bool { return false }); !errors.Is(err, ErrIdle) {
			t.Fatalf("%v, want idle", err)
		}
	})
	t.Run("busy, then answered", func(t *testing.T) {
		a, b := net.Pipe()
		defer a.Close()
		defer b.Close()
		var busy atomic.Bool
		busy.Store(true)
		checks := atomic.Int32{}
		done := make(chan error, 1)
		go func() {
			var hdr [4]byte
			done <- ReadHeader(context.Background(), a, hdr[:], idle, func() bool { checks.Add(1); return busy.Load() })
		}()
		// Extended at least three times while busy, however slow the
		// machine: the reader is still waiting.
		for checks.Load() < 3 {
			select {
			case err := <-done:
				t.Fatalf("ended while busy: %v", err)
			default:
				time.Sleep(idle)
			}
		}
		busy.Store(false)
		if err := <-done; !errors.Is(err, ErrIdle) {
			t.Fatalf("%v, want idle once nothing is owed", err)
		}
	})
	t.Run("a header while busy", func(t *testing.T) {
		a, b := net.Pipe()
		defer a.Close()
		defer b.Close()
		checks := atomic.Int32{}
		done := make(chan error, 1)
		var hdr [4]byte
		go func() {
			done <- ReadHeader(context.Background(), a, hdr[:], idle, func() bool { checks.Add(1); return true })
		}()
		for checks.Load() < 2 {
			time.Sleep(idle)
		}
		if _, err := b.Write([]byte{1, 2, 3, 4}); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil || hdr != [4]byte{1, 2, 3, 4} {
			t.Fatalf("%v %v", err, hdr)
		}
	})
	t.Run("half a header", func(t *testing.T) {
		a, b := net.Pipe()
		defer a.Close()
		defer b.Close()
		done := make(chan error, 1)
		go func() {
			var hdr [4]byte
			done <- ReadHeader(context.Background(), a, hdr[:], idle, func() bool { return true })
		}()
		if _, err := b.Write([]byte{1, 2}); err != nil {
			t.Fatal(err)
		}
		if err := <-done; !errors.Is(err, ErrIdle) {
			t.Fatalf("%v, want idle: a trickled header is not a client waiting for answers", err)
		}
	})
	t.Run("stopping", func(t *testing.T) {
		a, b := net.Pipe()
		defer a.Close()
		defer b.Close()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			var hdr [4]byte
			done <- ReadHeader(ctx, a, hdr[:], time.Hour, func() bool { return true })
		}()
		cancel()
		_ = a.SetReadDeadline(time.Now()) // what Stream.Shutdown does
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("%v, want the context's end", err)
		}
	})
}

// TestReadBodyDeadline: a body that stops arriving ends the read at its
// deadline, whatever the connection had in flight.
func TestReadBodyDeadline(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	go func() { _, _ = b.Write([]byte{1}) }()
	err := ReadBody(a, make([]byte, 8), 30*time.Millisecond)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("%v, want the deadline", err)
	}
}
