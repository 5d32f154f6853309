package load

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"
)

// rawClient sends pre-serialized HTTP/1.1 requests over one keep-alive
// connection and reads only what it must of the answer (status and
// Content-Length). Like wrk, it keeps the load generator's own cost far
// below the server's, so on a shared 2-core machine the figure measures
// ferry, not net/http's client.
type rawClient struct {
	addr string
	conn net.Conn
	r    *bufio.Reader
}

// buildRawRequest serializes a POST with the given body once.
// extra holds more header lines ("Name: value").
func buildRawRequest(host, path, ctype string, extra []string, body []byte) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: %s\r\n", path, host, ctype)
	for _, h := range extra {
		b.WriteString(h + "\r\n")
	}
	fmt.Fprintf(&b, "Content-Length: %d\r\n\r\n", len(body))
	b.Write(body)
	return b.Bytes()
}

// do sends req and returns the response status.
func (c *rawClient) do(req []byte) (int, error) {
	if c.conn == nil {
		conn, err := net.DialTimeout("tcp", c.addr, 5*time.Second)
		if err != nil {
			return 0, err
		}
		c.conn, c.r = conn, bufio.NewReaderSize(conn, 16<<10)
	}
	_ = c.conn.SetDeadline(time.Now().Add(60 * time.Second))
	if _, err := c.conn.Write(req); err != nil {
		c.close()
		return 0, err
	}
	line, err := c.r.ReadSlice('\n')
	if err != nil || len(line) < 12 {
		c.close()
		return 0, fmt.Errorf("bad status line %q: %v", line, err)
	}
	status, err := strconv.Atoi(string(line[9:12]))
	if err != nil {
		c.close()
		return 0, err
	}
	length, keep := -1, true
	for {
		h, err := c.r.ReadSlice('\n')
		if err != nil {
			c.close()
			return 0, err
		}
		if len(h) <= 2 {
			break
		}
		if n, ok := headerValue(h, "content-length"); ok {
			length, _ = strconv.Atoi(n)
		}
		if v, ok := headerValue(h, "connection"); ok && v == "close" {
			keep = false
		}
	}
	if length < 0 {
		c.close() // no length: the body runs to the end of the connection
		return status, nil
	}
	if _, err := io.CopyN(io.Discard, c.r, int64(length)); err != nil {
		c.close()
		return 0, err
	}
	if !keep {
		c.close()
	}
	return status, nil
}

func (c *rawClient) close() {
	if c.conn != nil {
		c.conn.Close()
		c.conn = nil
	}
}

// headerValue returns the trimmed value of header line h if its name is
// name (case-insensitive).
func headerValue(h []byte, name string) (string, bool) {
	i := bytes.IndexByte(h, ':')
	if i != len(name) || !bytes.EqualFold(h[:i], []byte(name)) {
		return "", false
	}
	return string(bytes.TrimSpace(h[i+1:])), true
}
