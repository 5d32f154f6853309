package hostile

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/pierrec/lz4/v4"

	"github.com/ferryhq/ferry/proofs/harness/agenttest"
	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
	"github.com/ferryhq/ferry/protocol"
)

// TestEmptyHeaders: a record header takes two bytes on a client's wire
// and 80 in the agent's memory (its struct and the Kafka client's copy).
// Requests of records with nothing but empty headers are refused for room,
// or held within the budget, never twenty times it.
func TestEmptyHeaders(t *testing.T) {
	brokers := kafkatest.Shared(t)
	topic := kafkatest.NewTopic(t, brokers, "headers", 1)
	a := agenttest.Start(t, ferryBin, agentConfig(brokers), "receivers.kafka.enabled=true")

	attack(t, a, "Local: an 8 MiB frame of records with 255 empty headers each (4M headers)", func() (string, bool, string) {
		c, err := localConn(t, a, 0)
		if err != nil {
			return err.Error(), false, ""
		}
		defer c.Close()
		hs := make([]protocol.Header, 255)
		first := protocol.AppendRecord(nil, "", &protocol.Record{Topic: []byte(topic), Value: []byte("h"), Headers: hs})
		next := protocol.AppendRecord(nil, topic, &protocol.Record{Topic: []byte(topic), Value: []byte("h"), Headers: hs})
		n := (8<<20 - 64 - len(first)) / len(next)
		body := binary.AppendUvarint(nil, uint64(n+1))
		body = append(body, first...)
		body = append(body, bytes.Repeat(next, n)...)
		if _, err := c.Write(produceFrame(0, 1, body)); err != nil {
			return err.Error(), false, ""
		}
		_, desc, err := readFrame(c)
		if err != nil {
			return err.Error(), false, ""
		}
		return desc, strings.Contains(desc, "queue_full"),
			fmt.Sprintf("%d records, %d headers: their structs are reserved before they are made (they were charged nothing: 80 bytes a header)", n+1, (n+1)*255)
	}, func() int64 { return countValues(t, brokers, topic, prefix("h")) })

	attack(t, a, "Kafka front: 1 MiB of LZ4 decompressing to 32 MiB of records with 8,000 empty headers each (16M headers)", func() (string, bool, string) {
		c, err := net.Dial("tcp", a.KafkaFront)
		if err != nil {
			return err.Error(), false, ""
		}
		defer c.Close()
		// A record: length, attributes, timestamp and offset deltas, no
		// key, no value, 8,000 headers of an empty key and no value.
		const perRecord, records = 8000, 2000
		var raw []byte
		for i := range records {
			var rec []byte
			rec = append(rec, 0)                                        // attributes
			rec = binary.AppendVarint(rec, 0)                           // timestamp delta
			rec = binary.AppendVarint(rec, int64(i))                    // offset delta
			rec = binary.AppendVarint(rec, -1)                          // no key
			rec = binary.AppendVarint(rec, -1)                          // no value
			rec = binary.AppendVarint(rec, perRecord)                   // headers
			rec = append(rec, bytes.Repeat([]byte{0, 1}, perRecord)...) // "" and null
			raw = binary.AppendVarint(raw, int64(len(rec)))
			raw = append(raw, rec...)
		}
		var z bytes.Buffer
		w := lz4.NewWriter(&z)
		_, _ = w.Write(raw)
		_ = w.Close()
		codes, err := produceCodes(c, produceV7(topic, map[int32][]byte{0: recordBatch(3, records, z.Bytes())}))
		if err != nil {
			return err.Error(), false, ""
		}
		return fmt.Sprintf("partition error %d (%d KiB sent, %d MiB decompressed)", codes[0], z.Len()>>10, len(raw)>>20), codes[0] != 0,
			"the headers' structs are reserved as they are made; the partition is told to retry when they do not fit (670 MB of structs, charged 32 MiB, before)"
	}, func() int64 { return countValues(t, brokers, topic, func(string) bool { return true }) })
}
