package syslogreceiver

// Datagram listeners (UDP, the Unix socket): one message per datagram,
// gathered for up to packetLinger into one batch.

import (
	"errors"
	"net"
	"os"
	"time"
)

// packetLinger is the longest a datagram waits for others to share its
// batch.
const packetLinger = 2 * time.Millisecond

// servePackets reads datagrams until the listener is closed. The staging
// buffer is the listener's own, allocated once: a batch's datagrams are
// read into it back to back, so reading costs no allocation and no
// reservation; the batch's own buffer is reserved before it is written.
func (r *Receiver) servePackets(pc net.PacketConn, tr int) {
	stage := make([]byte, maxBatchBytes+r.max+1)
	b := builder{r: r, tr: tr}
	var raws [][]byte
	var trun []bool
	w := 0
	var first time.Time
	flush := func() {
		if len(raws) > 0 {
			r.handDatagrams(&b, raws, trun)
		}
		raws, trun, w = raws[:0], trun[:0], 0
	}
	for {
		if len(raws) > 0 {
			_ = pc.SetReadDeadline(first.Add(packetLinger))
		} else {
			_ = pc.SetReadDeadline(time.Time{})
		}
		n, _, err := pc.ReadFrom(stage[w : w+r.max+1])
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				flush()
				continue
			}
			flush()
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Not expected on a datagram socket: counted, and go on.
			r.m.Error("read_error")
			time.Sleep(10 * time.Millisecond)
			continue
		}
		msg := stage[w : w+n]
		trunc := n > r.max
		if trunc {
			// Longer than max_message_bytes (the kernel cut it at the
			// buffer's max+1): delivered truncated, counted.
			msg = msg[:r.max]
			r.sm.truncated[tr].Inc()
			r.m.Error("message_too_long")
		}
		if msg = trimMsg(msg); len(msg) == 0 {
			continue
		}
		if len(raws) == 0 {
			first = time.Now()
		}
		raws = append(raws, msg)
		trun = append(trun, trunc)
		w += n
		if len(raws) == maxBatchMessages || w > maxBatchBytes {
			flush()
		}
	}
}

// handDatagrams hands one batch of datagrams on, or drops and counts it:
// a datagram's sender cannot be made to wait.
func (r *Receiver) handDatagrams(b *builder, raws [][]byte, trun []bool) {
	for len(raws) > 0 {
		k := b.handBatch(raws, trun, false)
		raws, trun = raws[k:], trun[k:]
	}
}
