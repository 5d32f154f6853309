package kafkafront

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"testing"
	"unsafe"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// FuzzProduce: whatever bytes a client sends as a Produce body, the walk
// that bounds it and kmsg's decode never panic, the walk never counts more
// partitions than kmsg then finds, and every record batch and record the
// decoder accepts lies inside the bytes it was given (no length can reach
// past them).
func FuzzProduce(f *testing.F) {
	var rec []byte
	body := []byte{0, 0, 0} // attributes, timestamp delta, offset delta
	body = binary.AppendVarint(body, 1)
	body = append(body, 'k')
	body = binary.AppendVarint(body, 1)
	body = append(body, 'v')
	body = binary.AppendVarint(body, 1)
	body = binary.AppendVarint(body, 1)
	body = append(body, 'h')
	body = binary.AppendVarint(body, -1)
	rec = binary.AppendVarint(rec, int64(len(body)))
	rec = append(rec, body...)
	batch := make([]byte, 61)
	binary.BigEndian.PutUint32(batch[8:], uint32(49+len(rec)))
	batch[16] = 2
	binary.BigEndian.PutUint64(batch[27:], 1_700_000_000_000)
	binary.BigEndian.PutUint32(batch[57:], 1)
	batch = append(batch, rec...)
	binary.BigEndian.PutUint32(batch[17:], crc32.Checksum(batch[21:], crc32c))
	for _, v := range []int16{3, 7, 9, 12} {
		req := kmsg.NewPtrProduceRequest()
		req.Version, req.Acks = v, -1
		t := kmsg.NewProduceRequestTopic()
		t.Topic = "t"
		p := kmsg.NewProduceRequestTopicPartition()
		p.Records = batch
		t.Partitions = append(t.Partitions, p)
		req.Topics = append(req.Topics, t)
		f.Add(v, req.AppendTo(nil))
	}
	f.Fuzz(func(t *testing.T, ver int16, b []byte) {
		ver = 3 + (ver&0x7fff)%10
		n, err := countPartitions(b, ver, 1<<20)
		req := kmsg.NewPtrProduceRequest()
		req.SetVersion(ver)
		if err != nil || req.ReadFrom(b) != nil {
			return
		}
		parts := 0
		for _, tp := range req.Topics {
			parts += len(tp.Partitions)
			for _, p := range tp.Partitions {
				checkBatches(t, p.Records)
			}
		}
		if parts > n {
			t.Fatalf("walk counted %d partitions, kmsg decoded %d", n, parts)
		}
	})
}

// checkBatches decodes what it can and checks every slice stays inside b.
func checkBatches(t *testing.T, b []byte) {
	inside := func(src, s []byte) {
		if len(s) > 0 && !within(src, s) {
			t.Fatalf("a decoded slice lies outside the bytes it came from")
		}
	}
	for len(b) > 0 {
		bt, rest, err := nextBatch(b)
		if err != nil {
			if !errors.Is(err, errCorrupt) && !errors.Is(err, errOldFormat) {
				t.Fatalf("batch error of no known kind: %v", err)
			}
			return
		}
		inside(b, bt.records)
		data := bt.records
		if bt.attrs&attrCodec != 0 {
			out, err := decompress(make([]byte, 0, 1<<16), data, int(bt.attrs&attrCodec))
			if err != nil {
				return
			}
			data = out
		}
		for i := int32(0); i < bt.count && len(data) > 0; i++ {
			r, rest, err := nextRecord(data)
			if err != nil {
				break
			}
			inside(data, r.key)
			inside(data, r.value)
			h := r.headers
			for j := 0; j < r.nheaders; j++ {
				var k, v []byte
				if k, v, h, err = nextHeader(h); err != nil {
					break
				}
				inside(data, k)
				inside(data, v)
			}
			data = rest
		}
		b = rest
	}
}

// within: s lies inside b's bytes.
func within(b, s []byte) bool {
	if len(b) == 0 {
		return false
	}
	lo, hi := uintptrOf(&b[0]), uintptrOf(&b[0])+uintptr(len(b))
	p := uintptrOf(&s[0])
	return p >= lo && p+uintptr(len(s)) <= hi
}

func uintptrOf(p *byte) uintptr { return uintptr(unsafe.Pointer(p)) }
