package syslogreceiver

// TCP framing (RFC 6587), chosen per frame as rsyslog does: a frame that
// starts with a digit is octet-counted ("LEN SP MSG", LEN excluding the
// space), anything else is non-transparent (the message runs to LF).

import "bytes"

// Outcomes of splitFrame.
const (
	frameNeedMore  = iota // no whole frame yet: read more
	frameMsg              // msg is one message; n bytes consumed
	frameTruncated        // a line longer than max: msg is its first max bytes, the rest is to be skipped to its LF
	frameTooLarge         // an octet count over max (or of more than 10 digits): the stream cannot go on
	frameBadCount         // digits not followed by a space: the stream cannot go on
)

// maxPrefix is the longest "LEN SP" splitFrame reads: ten digits (a count
// of more is refused unread) and the space.
const maxPrefix = 11

// splitFrame finds the first frame of buf for messages of at most max
// bytes. It needs at most max+maxPrefix bytes of buf to decide, so a reader
// never holds more than that for one frame; an octet count is checked
// against max from its digits, before any of its message is read.
func splitFrame(buf []byte, max int) (kind int, msg []byte, n int) {
	if len(buf) == 0 {
		return frameNeedMore, nil, 0
	}
	if isDigit(buf[0]) {
		v, i := 0, 0
		for i < len(buf) && isDigit(buf[i]) {
			if i == 10 {
				return frameTooLarge, nil, 0
			}
			v = v*10 + int(buf[i]-'0')
			i++
		}
		if v > max {
			return frameTooLarge, nil, 0
		}
		if i == len(buf) {
			return frameNeedMore, nil, 0
		}
		if buf[i] != ' ' {
			return frameBadCount, nil, 0
		}
		end := i + 1 + v
		if end > len(buf) {
			return frameNeedMore, nil, 0
		}
		return frameMsg, buf[i+1 : end], end
	}
	look := buf[:min(len(buf), max+1)]
	if i := bytes.IndexByte(look, '\n'); i >= 0 {
		msg = buf[:i]
		if len(msg) > 0 && msg[len(msg)-1] == '\r' {
			msg = msg[:len(msg)-1]
		}
		return frameMsg, msg, i + 1
	}
	if len(buf) > max {
		return frameTruncated, buf[:max], max
	}
	return frameNeedMore, nil, 0
}

// trimMsg drops what ends a message without being part of it: a trailing
// LF, CRLF or NUL (UDP senders and octet-counted ones often add one).
func trimMsg(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == '\r' || b[len(b)-1] == 0) {
		b = b[:len(b)-1]
	}
	return b
}
