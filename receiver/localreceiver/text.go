package localreceiver

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"time"

	"github.com/ferryhq/ferry/auth/token"
	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/protocol"
	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/routing"
)

// text serves a text-mode connection: "topic<TAB>value" lines. Lines that
// arrive together go as one batch; each is answered "OK" or
// "ERR <reason> <message>" in order once durable, unless "#noreply" was
// sent. "#token <token>" authenticates the lines after it.
func (r *Receiver) text(ctx context.Context, c net.Conn, prefix []byte) {
	maxLine := min(r.limits.MaxFrameBytes, 1<<20)
	br := bufio.NewReaderSize(io.MultiReader(bytes.NewReader(prefix), c), maxLine+1)
	w := bufio.NewWriter(c)
	cn := &conn{r: r, ctx: ctx, c: c} // for check()
	reply := true
	authed := !r.gate.Enabled()
	tok := "" // the #token line's token, checked again on every batch of lines
	var lines [][]byte
	for ctx.Err() == nil {
		_ = c.SetReadDeadline(time.Now().Add(r.cfg.IdleTimeout))
		lines = lines[:0]
		size := 0
		// One line (waiting for it), then every full line already here.
		for len(lines) < r.limits.MaxRecords && size < r.limits.MaxFrameBytes {
			if len(lines) > 0 {
				peek, _ := br.Peek(br.Buffered())
				if bytes.IndexByte(peek, '\n') < 0 {
					break
				}
			}
			line, err := br.ReadSlice('\n')
			if errors.Is(err, bufio.ErrBufferFull) {
				r.m.Error("line_too_long")
				_, _ = w.WriteString("ERR line_too_long a line is longer than " + itoa(maxLine) + " bytes\n")
				_ = w.Flush()
				return
			}
			if err != nil && len(line) == 0 {
				if len(lines) == 0 {
					return // the client left or idled out
				}
				break
			}
			line = bytes.TrimRight(line, "\r\n")
			// ReadSlice's bytes are overwritten by the next read: keep a copy.
			lines = append(lines, append([]byte(nil), line...))
			size += len(line)
			if err != nil {
				break
			}
		}
		var answers []string
		checked := false
		b := r.batchP.Get().(*record.Batch)
		var idx []int
		now := time.Now()
		payload := 0
		for i, line := range lines {
			switch {
			case bytes.HasPrefix(line, []byte("#noreply")):
				reply = false
				answers = append(answers, "")
				continue
			case bytes.HasPrefix(line, []byte("#token ")):
				claims, err := r.gate.Check(string(bytes.TrimSpace(line[len("#token "):])))
				if err != nil {
					r.m.Error("unauthenticated")
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
				answers = append(answers, errLine(err))
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
		if len(b.Records) == 0 {
			b.Reset()
			r.batchP.Put(b)
		}
		if n := len(b.Records); n > 0 {
			b.MemBytes = int64(size + n*record.Overhead)
			fr := &frame{n: n}
			results := make(chan []protocol.Range, 1)
			fr.finish = func(rs []protocol.Range) { results <- rs }
			b.OnFailure = fr.onFailure
			first := b.Records[0].Topic // b may be recycled as soon as it is handed on
			var err error
			if err = r.gate.Limit(cn.claims, n, payload); err == nil {
				err = r.sub.SubmitAsync(ctx, b, nil, nil, fr.done)
			}
			if err != nil {
				r.m.Error(consumer.Reason(err))
				for _, i := range idx {
					answers[i] = errLine(err)
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
						for j := 0; j < int(rg.Count) && k < len(idx); j++ {
							if rg.Status != protocol.StatusOK {
								answers[idx[k]] = "ERR " + rg.Reason + " " + oneLine(rg.Message)
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
		for _, a := range answers {
			if a != "" {
				_, _ = w.WriteString(a)
				_ = w.WriteByte('\n')
			}
		}
		_ = c.SetWriteDeadline(time.Now().Add(30 * time.Second))
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
