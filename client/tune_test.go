//go:build linux

package client

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestUnixSendBufferHoldsFrames: the client's dial raises a Unix
// connection's send buffer to unixWriteBuffer (as far as
// net.core.wmem_max lets it), so a whole default frame fits in the socket
// while the agent is busy.
func TestUnixSendBufferHoldsFrames(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	plain, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	conn, err := dialTuned("unix", sock, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	before, after := sndbuf(t, plain), sndbuf(t, conn)
	// Linux doubles what it is asked for, capped at wmem_max first.
	want := unixWriteBuffer
	if b, err := os.ReadFile("/proc/sys/net/core/wmem_max"); err == nil {
		if max, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			want = min(want, max)
		}
	}
	if after < 2*want || after < before {
		t.Fatalf("send buffer %d bytes as dialled (a plain dial: %d), want at least %d", after, before, 2*want)
	}
}

func sndbuf(t *testing.T, c net.Conn) int {
	t.Helper()
	rc, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	var serr error
	if err := rc.Control(func(fd uintptr) { n, serr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF) }); err != nil {
		t.Fatal(err)
	}
	if serr != nil {
		t.Fatal(serr)
	}
	return n
}
