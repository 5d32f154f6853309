package localreceiver

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"github.com/ferryhq/ferry/auth/token"
	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/protocol"
	"github.com/ferryhq/ferry/receiver/httpbody"
	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/routing"
)

// textWriteTimeout: a text-mode client that reads none of its answers
// for this long is disconnected (a variable for the tests).
var textWriteTimeout = 30 * time.Second

// textControlFree is how many bytes of control lines a batch keeps when
// the budget has no room for them.
const textControlFree = 64 << 10

// text serves a text-mode connection: "topic<TAB>value" lines. Lines that
// arrive together go as one batch; each is answered "OK" or
// "ERR <reason> <message>" in order once durable, unless "#noreply" was
// sent. "#token <token>" authenticates the lines after it.
func (r *Receiver) text(ctx context.Context, c net.Conn, prefix []byte) {
	maxLine := min(r.limits.MaxFrameBytes, 1<<20)
	lr := newLineReader(ctx, c, prefix, r.body)
	defer lr.close()
	w := bufio.NewWriter(c)
	cn := &conn{r: r, ctx: ctx, c: c} // for check()
	reply := true
	authed := !r.gate.Enabled()
	tok := "" // the #token line's token, checked again on every batch of lines
	// Every write of answers (bufio writes when its buffer fills, not only
	// at Flush) has a deadline: a client that reads none is disconnected
	// instead of holding the connection, and its lines, for good.
	writing := func() { _ = c.SetWriteDeadline(time.Now().Add(textWriteTimeout)) }
	refuse := func(reason, msg string) {
		r.m.Error(reason)
		writing()
		_, _ = w.WriteString("ERR " + reason + " " + msg + "\n")
		_ = w.Flush()
	}
	var lines [][]byte
	var noRoom []int        // lines refused for want of budget
	var copies httpbody.Buf // the lines' copies, reserved until handed on
	defer r.body.Release(&copies)
	for ctx.Err() == nil {
		if cap(lines) > 1024 {
			lines = nil // a large batch's slots (and copies) are not kept for the next
		}
		clear(lines)
		lines, noRoom = lines[:0], noRoom[:0]
		controlFree := textControlFree
		size := 0
		// Before a token is given a line is a #token line: short, and soon.
		idle, max := r.cfg.IdleTimeout, maxLine
		if !authed {
			idle, max = min(idle, helloTimeout), maxHello
		}
		// One line (waiting for it), then every full line already here.
		for len(lines) < r.limits.MaxRecords && size < r.limits.MaxFrameBytes {
			if len(lines) > 0 && !lr.hasLine() {
				break
			}
			line, err := lr.readLine(idle, r.cfg.BodyTimeout, max)
			switch {
			case errors.Is(err, errLineTooLong):
				refuse("line_too_long", "a line is longer than "+itoa(max)+" bytes")
				return
			case errors.Is(err, httpbody.ErrNoRoom):
				// This line is refused, in its place among the answers;
				// the connection goes on with the next one.
				r.m.Error("queue_full")
				r.logWarn("queue_full", "local text line refused: no room in the memory budget for a line this long", "remote", c.RemoteAddr().String())
				if err := lr.skipLine(r.cfg.BodyTimeout); err != nil {
					if errors.Is(err, errLineTimeout) {
						refuse("body_timeout", "a line did not end within receivers.local.body_timeout ("+r.cfg.BodyTimeout.String()+")")
					}
					return
				}
				lines = append(lines, nil)
				noRoom = append(noRoom, len(lines)-1)
				continue
			case errors.Is(err, errLineTimeout):
				refuse("body_timeout", "a line did not end within receivers.local.body_timeout ("+r.cfg.BodyTimeout.String()+")")
				return
			}
			if err != nil && len(line) == 0 {
				if len(lines) == 0 {
					return // the client left or idled out
				}
				break
			}
			line = bytes.TrimRight(line, "\r")
			// The reader's bytes are overwritten by the next read: keep a
			// copy, reserved until the queue charges the records. Control
			// lines (#token, #noreply) that find no room are kept within
			// a small allowance a batch: refusing them would read as a bad
			// token, or give answers nobody reads.
			if !r.body.Reserve(&copies, int64(len(line))) {
				if control := len(line) > 0 && line[0] == '#'; !control || len(line) > controlFree {
					r.m.Error("queue_full")
					lines = append(lines, nil)
					noRoom = append(noRoom, len(lines)-1)
					continue
				}
				controlFree -= len(line) // kept without room
			}
			lines = append(lines, append([]byte(nil), line...))
			size += len(line)
			if err != nil {
				break
			}
		}
		// A long line's room goes back to the budget once it is copied out.
		lr.shrink()
		var answers []string
		var lastAnswer string
		checked := false
		b := r.batchP.Get().(*record.Batch)
		var idx []int
		now := time.Now()
		payload := 0
		for i, line := range lines {
			switch {
			case len(noRoom) > 0 && noRoom[0] == i:
				noRoom = noRoom[1:]
				answers = append(answers, "ERR queue_full ferry's buffer is full: no room for a line this long; retry later")
				continue
			case bytes.HasPrefix(line, []byte("#noreply")):
				reply = false
				answers = append(answers, "")
				continue
			case bytes.HasPrefix(line, []byte("#token ")):
				claims, err := r.gate.Check(string(bytes.TrimSpace(line[len("#token "):])))
				if err != nil {
					r.m.Error("unauthenticated")
					writing()
					_, _ = w.WriteString("ERR unauthenticated " + oneLine(err.Error()) + "\n")
					_ = w.Flush()
					return
				}
				cn.claims, authed, tok = claims, true, string(bytes.TrimSpace(line[len("#token "):]))
				answers = append(answers, "OK")
				continue
			case len(line) == 0 || line[0] == '#':
				answers = append(answers, "")
				continue
			}
			if !authed {
				r.m.Error("unauthenticated")
				writing()
				_, _ = w.WriteString("ERR unauthenticated send \"#token <token>\" first\n")
				_ = w.Flush()
				return
			}
			if !checked {
				// Once per batch of lines: a token that expired, or whose
				// key a reload removed, stops writing on this connection.
				if _, err := r.gate.Check(tok); err != nil {
					r.m.Error("unauthenticated")
					r.logWarn("unauthenticated", "local text connection closed: the connection's token no longer holds", "err", err)
					writing()
					_, _ = w.WriteString("ERR unauthenticated the connection's token no longer holds: " + oneLine(err.Error()) + "\n")
					_ = w.Flush()
					return
				}
				checked = true
			}
			topic, value, ok := bytes.Cut(line, []byte{'\t'})
			if !ok {
				r.m.Error("invalid_line")
				answers = append(answers, "ERR invalid_line want topic<TAB>value")
				continue
			}
			if err := cn.check(string(topic)); err != nil {
				r.m.Error(consumer.Reason(err))
				// Lines refused alike in a row share one answer string.
				if a := errLine(err); a != lastAnswer {
					lastAnswer = a
				}
				answers = append(answers, lastAnswer)
				continue
			}
			rec := record.Record{Topic: string(topic), Value: value, Timestamp: now}
			if cn.claims != nil {
				rec.Headers, _ = routing.TenantHeaders(nil, cn.claims, token.Messages)
			}
			b.Records = append(b.Records, rec)
			idx = append(idx, i)
			answers = append(answers, "OK")
			payload += len(value)
		}
		// The copies are the records' values now, which the queue charges
		// from the hand-off on (as Submit gives up a request's own), or
		// refused lines: the batch's records hold the ones handed on, and
		// nothing the rest, while the batch waits for Kafka and its client.
		r.body.Release(&copies)
		clear(lines)
		if len(b.Records) == 0 {
			b.Reset()
			r.batchP.Put(b)
		}
		if n := len(b.Records); n > 0 {
			b.Charge(size, 0) // the values are copies of the lines, size in all
			fr := &frame{n: n}
			results := make(chan []protocol.Range, 1)
			fr.finish = func(rs []protocol.Range, _ *protocol.Receipt) { results <- rs }
			b.OnFailure = fr.onFailure
			first := b.Records[0].Topic // b may be recycled as soon as it is handed on
			var err error
			if err = r.gate.Limit(cn.claims, n, payload); err == nil {
				err = r.sub.SubmitAsync(ctx, b, nil, nil, fr.done)
			}
			if err != nil {
				r.m.Error(consumer.Reason(err))
				line := errLine(err) // one string for every line it answers
				for _, i := range idx {
					answers[i] = line
				}
			} else {
				r.m.Received(r.set.Topics.Get(first), n, payload)
				if reply {
					var rs []protocol.Range
					select {
					case rs = <-results:
					case <-time.After(r.cfg.AckTimeout):
						r.m.Error("ack_timeout")
						rs = []protocol.Range{{Count: uint32(n), Status: protocol.StatusRetryable, Reason: "ack_timeout",
							Message: "Kafka did not acknowledge in time; the records stay queued and may still be delivered"}}
					}
					k := 0
					for _, rg := range rs {
						// One string a range, not a line: 100,000 lines
						// refused alike hold one answer, not 100,000.
						line := ""
						if rg.Status != protocol.StatusOK {
							line = "ERR " + rg.Reason + " " + oneLine(rg.Message)
						}
						for j := 0; j < int(rg.Count) && k < len(idx); j++ {
							if line != "" {
								answers[idx[k]] = line
							}
							k++
						}
					}
				}
			}
		}
		if !reply {
			continue
		}
		writing()
		for _, a := range answers {
			if a != "" {
				_, _ = w.WriteString(a)
				if err := w.WriteByte('\n'); err != nil {
					return
				}
			}
		}
		if err := w.Flush(); err != nil {
			return
		}
	}
}

func errLine(err error) string {
	_, reason, msg, _ := outcome(err)
	return "ERR " + reason + " " + oneLine(msg)
}

func oneLine(s string) string { return strings.ReplaceAll(strings.ReplaceAll(s, "\n", " "), "\r", " ") }

func itoa(n int) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
		if n == 0 {
			return string(b[i:])
		}
	}
}

// lineReader reads text-mode lines from a connection. Its buffer starts at
// lineStart bytes, which every connection has, and grows only as a line
// needs, each step reserved from the shared memory budget: connections
// holding long unfinished lines are bounded by the budget, not by
// connections × the longest line.
type lineReader struct {
	ctx  context.Context // ends at shutdown
	c    net.Conn
	buf  []byte
	r, w int // unread: buf[r:w]
	body *httpbody.Reader
	res  httpbody.Buf // holds the reservation of the growth past lineStart
}

const lineStart = 4 << 10

var (
	errLineTooLong = errors.New("line too long")
	errLineTimeout = errors.New("line not finished in time")
)

func newLineReader(ctx context.Context, c net.Conn, prefix []byte, body *httpbody.Reader) *lineReader {
	lr := &lineReader{ctx: ctx, c: c, buf: make([]byte, lineStart), body: body}
	lr.w = copy(lr.buf, prefix)
	return lr
}

// hasLine reports whether a whole line is already read.
func (lr *lineReader) hasLine() bool { return bytes.IndexByte(lr.buf[lr.r:lr.w], '\n') >= 0 }

// readLine returns the next line without its newline, valid until the next
// call. It waits up to idle for the line's first byte, then body for the
// rest; a line over max bytes is errLineTooLong. At the end of the stream
// an unfinished last line is returned with io.EOF.
func (lr *lineReader) readLine(idle, body time.Duration, max int) ([]byte, error) {
	scanned := 0 // buf[r:r+scanned] holds no newline
	started, timed := lr.w > lr.r, false
	for {
		if i := bytes.IndexByte(lr.buf[lr.r+scanned:lr.w], '\n'); i >= 0 {
			line := lr.buf[lr.r : lr.r+scanned+i]
			lr.r += scanned + i + 1
			return line, nil
		}
		scanned = lr.w - lr.r
		if scanned > max {
			return nil, errLineTooLong
		}
		if lr.w == len(lr.buf) {
			if lr.r > 0 {
				lr.w = copy(lr.buf, lr.buf[lr.r:lr.w])
				lr.r = 0
			} else if err := lr.grow(min(2*len(lr.buf), max+1)); err != nil {
				return nil, err
			}
		}
		switch {
		case !started:
			_ = lr.c.SetReadDeadline(time.Now().Add(idle))
		case !timed:
			_ = lr.c.SetReadDeadline(time.Now().Add(body))
			timed = true
		}
		// After setting it: Stream.Shutdown ends ctx, then sets a deadline
		// of now to wake readers, which a later deadline would undo.
		if err := lr.ctx.Err(); err != nil {
			return nil, err
		}
		n, err := lr.c.Read(lr.buf[lr.w:])
		lr.w += n
		started = started || n > 0
		if err != nil {
			if errors.Is(err, io.EOF) && lr.w > lr.r {
				line := lr.buf[lr.r:lr.w]
				lr.r = lr.w
				return line, io.EOF
			}
			if started && errors.Is(err, os.ErrDeadlineExceeded) && lr.ctx.Err() == nil {
				return nil, errLineTimeout
			}
			return nil, err
		}
	}
}

// skipLine drops the rest of the current line, through its newline,
// without growing the buffer; the line must end within body.
func (lr *lineReader) skipLine(body time.Duration) error {
	_ = lr.c.SetReadDeadline(time.Now().Add(body))
	for {
		if i := bytes.IndexByte(lr.buf[lr.r:lr.w], '\n'); i >= 0 {
			lr.r += i + 1
			return nil
		}
		lr.r, lr.w = 0, 0
		n, err := lr.c.Read(lr.buf)
		lr.w = n
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) && lr.ctx.Err() == nil {
				return errLineTimeout
			}
			return err
		}
	}
}

// grow enlarges the buffer to n bytes, reserving the difference.
func (lr *lineReader) grow(n int) error {
	if n <= len(lr.buf) {
		return errLineTooLong
	}
	if !lr.body.Reserve(&lr.res, int64(n-len(lr.buf))) {
		return httpbody.ErrNoRoom
	}
	nb := make([]byte, n)
	lr.w = copy(nb, lr.buf[lr.r:lr.w])
	lr.r, lr.buf = 0, nb
	return nil
}

// shrink goes back to lineStart bytes, and gives the growth's reservation
// back, when what is unread fits.
func (lr *lineReader) shrink() {
	if len(lr.buf) == lineStart || lr.w-lr.r > lineStart {
		return
	}
	nb := make([]byte, lineStart)
	lr.w = copy(nb, lr.buf[lr.r:lr.w])
	lr.r, lr.buf = 0, nb
	lr.body.Release(&lr.res)
}

func (lr *lineReader) close() { lr.body.Release(&lr.res) }
