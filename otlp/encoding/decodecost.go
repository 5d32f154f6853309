package encoding

import (
	"errors"

	"google.golang.org/protobuf/encoding/protowire"
)

// What pdata allocates decoding an OTLP protobuf request, garbage
// included, at most (TestDecodeCost checks it against runtime.MemStats):
// a message and its slot in its parent's slice for every message (an empty
// attribute took 226 bytes: KeyValue, AnyValue, their pointers), 16
// bytes for every element of a packed array (8, and the slice's growth),
// and twice the request for strings, bytes and the protobuf written back.
// The request's own bytes do not bound it: an attribute can be 2 bytes on
// the wire (an empty KeyValue) and 226 in pdata. A receiver that hands a
// request to pdata (the attribute processor) reserves this first.
const (
	decodeMessageCost = 240
	decodePackedCost  = 16 // a fixed-size element of a packed array
	// An element appended one at a time: a packed field's element sent
	// unpacked (pdata takes both), or any packed varint (1M took 40
	// bytes each).
	decodeAppendedCost = 48
)

// DecodeCost is what pdata takes decoding raw, a request of sig (see
// above). It walks the OTLP schema's message fields only, so a string
// that happens to parse as protobuf is not counted as messages; raw must
// have passed ferry's decoder (CountItems): nesting is bounded there.
func DecodeCost(sig Signal, raw []byte) (int64, error) {
	root := costTraces
	switch sig {
	case Logs:
		root = costLogs
	case Metrics:
		root = costMetrics
	}
	n, elems, err := countMessages(raw, root, 0)
	return 2*int64(len(raw)) + n*decodeMessageCost + elems, err
}

// costSchema is, for one OTLP message type, the message type of each of
// its fields that holds messages, and the packed numeric fields (their
// element size: 8 for fixed64 and double, 0 for varints).
type costSchema struct {
	msgs   map[protowire.Number]*costSchema
	packed map[protowire.Number]int
	// strs: repeated string fields, an element each (its header and slot;
	// its bytes are in the 2x the request), never read inside.
	strs map[protowire.Number]bool
}

var errCostDepth = errors.New("OTLP request nested too deeply")

// countMessages counts the messages in b (a message of type s), and what
// the elements of its numeric arrays cost, recursively.
func countMessages(b []byte, s *costSchema, depth int) (msgs, elems int64, err error) {
	if depth > maxCostDepth {
		return 0, 0, errCostDepth
	}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, 0, protowire.ParseError(n)
		}
		b = b[n:]
		if typ != protowire.BytesType {
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return 0, 0, protowire.ParseError(n)
			}
			b = b[n:]
			if _, ok := s.packed[num]; ok {
				elems += decodeAppendedCost // sent unpacked: 2 bytes a varint
			}
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return 0, 0, protowire.ParseError(n)
		}
		b = b[n:]
		if s.strs[num] {
			msgs++
			continue
		}
		if child := s.msgs[num]; child != nil {
			m, p, err := countMessages(v, child, depth+1)
			if err != nil {
				return 0, 0, err
			}
			msgs, elems = msgs+1+m, elems+p
			continue
		}
		if size, ok := s.packed[num]; ok {
			if size > 0 {
				elems += int64(len(v)/size) * decodePackedCost
			} else {
				for _, c := range v {
					if c < 0x80 { // a varint's last byte
						elems += decodeAppendedCost
					}
				}
			}
		}
	}
	return msgs, elems, nil
}

// maxCostDepth: attribute values nest 32 levels at most (ferry's decoder
// refuses deeper), each level three messages (KeyValue, AnyValue, list),
// under an envelope of about 8.
const maxCostDepth = 3*32 + 16

var costTraces, costLogs, costMetrics = costSchemas()

func costSchemas() (traces, logs, metrics *costSchema) {
	msg := func() *costSchema { return &costSchema{msgs: map[protowire.Number]*costSchema{}} }
	kv, anyValue, array, kvlist := msg(), msg(), msg(), msg()
	kv.msgs[2] = anyValue
	anyValue.msgs[5], anyValue.msgs[6] = array, kvlist
	array.msgs[1] = anyValue
	kvlist.msgs[1] = kv
	resource, scope, entity := msg(), msg(), msg()
	resource.msgs[1], resource.msgs[3] = kv, entity
	scope.msgs[3] = kv
	// An entity's id and description keys: repeated strings.
	entity.strs = map[protowire.Number]bool{3: true, 4: true}
	envelope := func(item *costSchema) *costSchema {
		scoped, resourced, req := msg(), msg(), msg()
		scoped.msgs[1], scoped.msgs[2] = scope, item
		// 1000: the deprecated scope field pdata still decodes (and
		// migrates or drops after): ferry's item walk does not look in it.
		resourced.msgs[1], resourced.msgs[2], resourced.msgs[1000] = resource, scoped, scoped
		req.msgs[1] = resourced
		return req
	}

	span, event, link, status := msg(), msg(), msg(), msg()
	span.msgs[9], span.msgs[11], span.msgs[13], span.msgs[15] = kv, event, link, status
	event.msgs[3] = kv
	link.msgs[4] = kv

	record := msg()
	record.msgs[5], record.msgs[6] = anyValue, kv

	metric := msg()
	exemplar := msg()
	exemplar.msgs[7] = kv
	number := msg()
	number.msgs[7], number.msgs[5] = kv, exemplar
	histogram := msg()
	histogram.msgs[9], histogram.msgs[8] = kv, exemplar
	histogram.packed = map[protowire.Number]int{6: 8, 7: 8}
	buckets := msg()
	buckets.packed = map[protowire.Number]int{2: 0}
	expHistogram := msg()
	expHistogram.msgs[1], expHistogram.msgs[8], expHistogram.msgs[9], expHistogram.msgs[11] = kv, buckets, buckets, exemplar
	quantile := msg()
	summary := msg()
	summary.msgs[7], summary.msgs[6] = kv, quantile
	points := func(p *costSchema) *costSchema { s := msg(); s.msgs[1] = p; return s }
	metric.msgs[5], metric.msgs[7] = points(number), points(number)
	metric.msgs[9], metric.msgs[10], metric.msgs[11] = points(histogram), points(expHistogram), points(summary)
	metric.msgs[12] = kv

	return envelope(span), envelope(record), envelope(metric)
}
