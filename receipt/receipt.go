// Package receipt owns what delivery receipts share across receivers: the
// request id a client may attach to every record of a request, whose
// receipts a client may read, how a receipt is written in JSON, and (in
// store.go) the bounded in-memory store that answers for records the spool
// took before Kafka had them.
//
// A receipt says where a record is in Kafka: topic, partition, offset. In
// delivery mode kafka (and spill, from memory) the answer already waits
// for Kafka's acknowledgement, so the receipt comes with it (see
// record.Receipt). In spool mode (and spill, to disk) the client is
// answered when the spool has the records under its fsync policy, before
// Kafka does: the answer carries a receipt id, the records' place in the
// spool, and GET /receipts/{id} on the HTTP listener answers "pending"
// until the exporter's acknowledgements arrive, then the ranges.
//
// Who may read a receipt: whoever sent the request, proved by the same
// application token (a hash of it is kept with the receipt, never the
// token); with authentication off, whoever holds the id, which carries 64
// random bits so it cannot be guessed from the sequence number it carries.
// A receipt of another token answers 404, as an unknown one does, so ids
// do not leak what other tenants sent.
package receipt

import (
	"crypto/sha256"
	"encoding/binary"
	"strconv"

	"github.com/ferryhq/ferry/record"
)

// HeaderKey is the Kafka header ferry writes a client's request id into,
// on every record of the request: "where is my log" then has an answer in
// Kafka itself. It is in ferry's own header namespace (ferry.*), which
// receivers drop from clients' own headers, so it cannot be spoofed.
const HeaderKey = "ferry.request_id"

// MaxRequestIDBytes bounds a request id: it is copied into every record.
const MaxRequestIDBytes = 128

// ValidRequestID: 1 to MaxRequestIDBytes of A-Z a-z 0-9 and . _ : - (UUIDs,
// trace ids, ULIDs, hex, dotted names). Nothing a log line or a header
// consumer would need to escape.
func ValidRequestID(s string) bool {
	if len(s) == 0 || len(s) > MaxRequestIDBytes {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == ':' || c == '-') {
			return false
		}
	}
	return true
}

// Owner is who may read a receipt: a hash of the request's token (0 for
// none). The token itself is never kept.
func Owner(token string) uint64 {
	if token == "" {
		return 0
	}
	h := sha256.Sum256([]byte(token))
	return binary.LittleEndian.Uint64(h[:]) | 1
}

// AppendJSON appends ranges as a JSON array of
// {"topic":..,"partition":..,"offset":..,"count":..}.
func AppendJSON(dst []byte, ranges []record.Range) []byte {
	dst = append(dst, '[')
	for i, r := range ranges {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"topic":`...)
		dst = strconv.AppendQuote(dst, r.Topic)
		dst = append(dst, `,"partition":`...)
		dst = strconv.AppendInt(dst, int64(r.Partition), 10)
		dst = append(dst, `,"offset":`...)
		dst = strconv.AppendInt(dst, r.Offset, 10)
		dst = append(dst, `,"count":`...)
		dst = strconv.AppendInt(dst, int64(r.Count), 10)
		dst = append(dst, '}')
	}
	return append(dst, ']')
}
