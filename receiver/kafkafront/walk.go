package kafkafront

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// errMalformed: a request that does not parse; the connection is closed
// (after a framing error nothing later on it can be trusted).
var errMalformed = errors.New("malformed request")

// countPartitions walks a Produce request body (after the request header)
// without decoding it and returns its topic-partitions, failing as soon as
// they exceed limit. kmsg allocates a struct per partition it decodes, ten
// times the few bytes a partition takes on the wire; walking first keeps a
// hostile request's decode to limit partitions whatever its size.
func countPartitions(b []byte, version int16, limit int) (int, error) {
	w := walker{b: b, flexible: version >= 9}
	w.nullableString() // transactional_id
	w.skip(2 + 4)      // acks, timeout
	topics := w.arrayLen()
	if topics > limit {
		// Each topic counts at least one: over the limit before its bytes.
		return topics, &limitError{what: "topic-partitions in one produce request", limit: limit, field: "max_partitions_per_request"}
	}
	total := 0
	for t := 0; t < topics && w.err == nil; t++ {
		w.nullableString() // topic name
		parts := w.arrayLen()
		// A topic is an entry of kmsg's decode and of the answer even
		// with no partition: it counts as one.
		total += max(parts, 1)
		if total > limit {
			return total, &limitError{what: "topic-partitions in one produce request", limit: limit, field: "max_partitions_per_request"}
		}
		for p := 0; p < parts && w.err == nil; p++ {
			w.skip(4) // partition index
			w.nullableBytes()
			w.tags()
		}
		w.tags()
	}
	w.tags()
	if w.err != nil {
		return total, w.err
	}
	return total, nil
}

// limitError: the request is over one of the front's bounds.
type limitError struct {
	what  string
	limit int
	field string
}

func (e *limitError) Error() string {
	return fmt.Sprintf("more than %d %s (receivers.kafka.%s)", e.limit, e.what, e.field)
}

// walker reads Kafka's primitive types, in the classic or the flexible
// (compact, tagged) encoding, recording the first error.
type walker struct {
	b        []byte
	flexible bool
	err      error
}

func (w *walker) fail(what string) {
	if w.err == nil {
		w.err = fmt.Errorf("%w: %s", errMalformed, what)
	}
	w.b = nil
}

func (w *walker) skip(n int) {
	if n < 0 || n > len(w.b) {
		w.fail("truncated")
		return
	}
	w.b = w.b[n:]
}

// uvarint reads Kafka's unsigned varint as kmsg and Kafka's own decoder
// do: 32 bits, five bytes at most (the walk used to take ten, so a header
// kmsg never sees accepted what a body's decode refuses).
func (w *walker) uvarint() uint64 {
	var v uint32
	for i := 0; i < 5 && i < len(w.b); i++ {
		c := w.b[i]
		if i == 4 {
			if c > 0x0f {
				break
			}
			w.b = w.b[5:]
			return uint64(v | uint32(c)<<28)
		}
		v |= uint32(c&0x7f) << (7 * i)
		if c < 0x80 {
			w.b = w.b[i+1:]
			return uint64(v)
		}
	}
	w.fail("bad varint")
	return 0
}

func (w *walker) int16() int {
	if len(w.b) < 2 {
		w.fail("truncated")
		return 0
	}
	v := int(int16(binary.BigEndian.Uint16(w.b)))
	w.b = w.b[2:]
	return v
}

func (w *walker) int32() int {
	if len(w.b) < 4 {
		w.fail("truncated")
		return 0
	}
	v := int(int32(binary.BigEndian.Uint32(w.b)))
	w.b = w.b[4:]
	return v
}

// length reads a (compact) length; -1 is null.
func (w *walker) length(classic func() int) int {
	if w.flexible {
		v := w.uvarint()
		if v > uint64(len(w.b))+1 {
			w.fail("length past the end")
			return 0
		}
		return int(v) - 1
	}
	v := classic()
	if v < -1 || v > len(w.b) {
		w.fail("length past the end")
		return 0
	}
	return v
}

func (w *walker) nullableString() { w.skip(max(w.length(w.int16), 0)) }
func (w *walker) nullableBytes()  { w.skip(max(w.length(w.int32), 0)) }
func (w *walker) arrayLen() int   { return max(w.length(w.int32), 0) }

func (w *walker) tags() {
	if !w.flexible || w.err != nil {
		return
	}
	n := w.uvarint()
	if n > uint64(len(w.b)) {
		w.fail("tag count")
		return
	}
	for i := uint64(0); i < n && w.err == nil; i++ {
		w.uvarint()
		size := w.uvarint()
		if size > uint64(len(w.b)) {
			w.fail("tag size")
			return
		}
		w.skip(int(size))
	}
}

// checkBody walks the flexible body of a request the front decodes with
// kmsg (all but Produce, which countPartitions walks) far enough to bound
// its tagged fields before kmsg sees it: kmsg reads a tag count and loops
// that many times even past the end of the body, so a count of 2^28 in
// five bytes cost seconds of CPU per request (found by FuzzMetadata). The
// fields are kmsg's, version by version; what this walk refuses kmsg
// would refuse too, only later.
func checkBody(key, ver int16, b []byte) error {
	w := walker{b: b, flexible: true}
	switch {
	case key == 3 && ver >= 9: // Metadata
		n := w.arrayLen()
		for i := 0; i < n && w.err == nil; i++ {
			if ver >= 10 {
				w.skip(16) // topic id
			}
			w.nullableString()
			w.tags()
		}
		if ver >= 4 {
			w.skip(1) // allow_auto_topic_creation
		}
		if ver >= 8 && ver <= 10 {
			w.skip(1) // include_cluster_authorized_operations
		}
		if ver >= 8 {
			w.skip(1) // include_topic_authorized_operations
		}
	case key == 18 && ver >= 3: // ApiVersions
		w.nullableString() // client software name
		w.nullableString() // and version
		if ver >= 5 {
			w.nullableString()
			w.skip(4)
		}
	case key == 22 && ver >= 2: // InitProducerId
		w.nullableString() // transactional id
		w.skip(4)          // transaction timeout
		if ver >= 3 {
			w.skip(8 + 2) // producer id, epoch
		}
	case key == 36 && ver >= 2: // SaslAuthenticate
		w.nullableBytes()
	case key == 10 && ver >= 4: // FindCoordinator (answered unsupported)
		w.skip(1) // key type
		n := w.arrayLen()
		for i := 0; i < n && w.err == nil; i++ {
			w.nullableString()
		}
	default:
		return nil
	}
	w.tags()
	return w.err
}
