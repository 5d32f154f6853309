package syslogreceiver

// Stream connections (TCP, TLS): frames read into a buffer that grows,
// reserved, only as far as one frame needs; batches of the frames read
// handed on before more is read.

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"time"

	"github.com/ferryhq/ferry/receiver/httpbody"
)

// streamStart is what every connection's buffer starts at (not reserved:
// max_connections bounds it); growth past it is reserved.
const streamStart = 4 << 10

func (r *Receiver) streamHandler(tr int) func(ctx context.Context, c net.Conn) {
	return func(ctx context.Context, c net.Conn) {
		s := &stream{r: r, tr: tr, ctx: ctx, c: c, buf: make([]byte, streamStart), b: builder{r: r, tr: tr}}
		defer r.body.Release(&s.res)
		s.run()
	}
}

type stream struct {
	r    *Receiver
	tr   int
	ctx  context.Context
	c    net.Conn
	buf  []byte
	rd   int // unread: buf[rd:wr]
	wr   int
	res  httpbody.Buf // the reservation of buf's growth past streamStart
	b    builder
	raws [][]byte
	trun []bool
	// skipping: the rest of a truncated line is being read and dropped.
	skipping bool
	// frameAt: when the partial frame (or the skipped line) began.
	frameAt time.Time
}

func (s *stream) remote() any { return s.c.RemoteAddr().String() }

// run reads frames until the sender leaves, breaks the framing, or stalls.
func (s *stream) run() {
	for s.drain() && s.readMore() {
	}
}

// drain hands on every whole frame buffered (frames already read go before
// any more is read); false when the stream cannot go on (counted).
func (s *stream) drain() bool {
	for {
		fatal := s.take()
		if len(s.raws) > 0 {
			s.hand()
			continue
		}
		if fatal != "" {
			s.r.m.Error(fatal)
			s.r.drop(s.tr, fatal, 1, "remote", s.remote())
			return false
		}
		return true
	}
}

// take moves the whole frames buffered (a batch's worth at most) into
// s.raws; a non-empty result is the reason the stream cannot go on.
func (s *stream) take() (fatal string) {
	r := s.r
	s.raws, s.trun = s.raws[:0], s.trun[:0]
	size := 0
	for len(s.raws) < maxBatchMessages && size < maxBatchBytes {
		if s.skipping {
			i := bytes.IndexByte(s.buf[s.rd:s.wr], '\n')
			if i < 0 {
				s.rd = s.wr
				return ""
			}
			s.rd += i + 1
			s.skipping = false
			s.frameAt = time.Now()
			continue
		}
		kind, msg, n := splitFrame(s.buf[s.rd:s.wr], r.max)
		switch kind {
		case frameNeedMore:
			return ""
		case frameTooLarge:
			return "frame_too_large"
		case frameBadCount:
			return "invalid_frame"
		case frameTruncated:
			s.skipping = true
			r.sm.truncated[s.tr].Inc()
			r.m.Error("message_too_long")
		}
		s.rd += n
		if kind == frameMsg {
			// The next frame's first bytes are here already (or will come).
			s.frameAt = time.Now()
		}
		if msg = trimMsg(msg); len(msg) == 0 {
			continue
		}
		s.raws = append(s.raws, msg)
		s.trun = append(s.trun, kind == frameTruncated)
		size += len(msg)
	}
	return ""
}

// hand writes s.raws into batches and hands them on, waiting for room.
func (s *stream) hand() {
	for raws, trun := s.raws, s.trun; len(raws) > 0; {
		k := s.b.handBatch(raws, trun, true)
		raws, trun = raws[k:], trun[k:]
	}
	s.raws = s.raws[:0]
	s.shrink()
}

// readMore reads at least one byte into the buffer, growing it (reserved)
// when a partial frame fills it; false when the connection is done.
func (s *stream) readMore() bool {
	r := s.r
	partial := s.wr > s.rd || s.skipping
	if s.rd == s.wr {
		s.rd, s.wr = 0, 0
	} else if s.rd > 0 {
		s.wr = copy(s.buf, s.buf[s.rd:s.wr])
		s.rd = 0
	}
	if s.wr == len(s.buf) {
		// A partial frame fills the buffer: splitFrame decides within
		// max_message_bytes + maxPrefix, so this never goes past it.
		n := min(2*len(s.buf), r.max+maxPrefix+1)
		// No room: wait (not reading) until the frame's deadline.
		if !r.growReserve(s.ctx, &s.res, int64(n-len(s.buf)), s.frameAt.Add(r.cfg.FrameTimeout)) {
			reason := "queue_full"
			if s.ctx.Err() != nil {
				reason = "shutting_down"
			}
			r.m.Error(reason)
			r.drop(s.tr, reason, 1, "remote", s.remote())
			return false
		}
		nb := make([]byte, n)
		copy(nb, s.buf[:s.wr])
		s.buf = nb
	}
	if partial {
		_ = s.c.SetReadDeadline(s.frameAt.Add(r.cfg.FrameTimeout))
	} else {
		_ = s.c.SetReadDeadline(time.Now().Add(r.cfg.IdleTimeout))
	}
	// After setting it: Stream.Shutdown ends ctx, then sets a deadline of
	// now to wake readers, which a later deadline would undo.
	if s.ctx.Err() != nil {
		if s.wr > s.rd {
			r.drop(s.tr, "shutting_down", 1, "remote", s.remote())
		}
		return false
	}
	n, err := s.c.Read(s.buf[s.wr:])
	if n > 0 && !partial {
		s.frameAt = time.Now()
	}
	s.wr += n
	if err == nil {
		return true
	}
	if errors.Is(err, io.EOF) {
		s.atEOF()
		return false
	}
	// Bytes that came with the error are framed first: their whole frames
	// go on. What is left is one partial frame, read and lost: counted. A
	// truncated line being skipped is not one: its message went on.
	if !s.drain() {
		return false
	}
	timeout := errors.Is(err, os.ErrDeadlineExceeded) && s.ctx.Err() == nil
	switch {
	case s.wr > s.rd:
		reason := "read_error"
		if s.ctx.Err() != nil {
			reason = "shutting_down"
		} else if timeout {
			// A frame (and its reservation) held past frame_timeout.
			reason = "frame_timeout"
		}
		r.m.Error(reason)
		r.drop(s.tr, reason, 1, "remote", s.remote(), "err", err)
	case s.skipping && timeout:
		r.m.Error("frame_timeout")
	}
	return false
}

// atEOF: the sender closed. Whole frames still buffered go on; an
// unterminated last line is a message (rsyslog sends one so); a partial
// octet-counted frame is counted.
func (s *stream) atEOF() {
	r := s.r
	if !s.drain() {
		return
	}
	rest := s.buf[s.rd:s.wr]
	s.rd = s.wr
	if s.skipping || len(trimMsg(rest)) == 0 {
		return
	}
	if isDigit(rest[0]) {
		r.m.Error("truncated_frame")
		r.drop(s.tr, "truncated_frame", 1, "remote", s.remote())
		return
	}
	s.raws = append(s.raws[:0], trimMsg(rest))
	s.trun = append(s.trun[:0], false)
	s.hand()
}

// shrink goes back to streamStart bytes, giving the growth's reservation
// back, when what is unread fits.
func (s *stream) shrink() {
	if len(s.buf) == streamStart || s.wr-s.rd > streamStart {
		return
	}
	nb := make([]byte, streamStart)
	s.wr = copy(nb, s.buf[s.rd:s.wr])
	s.rd, s.buf = 0, nb
	s.r.body.Release(&s.res)
}
