package hostile

import (
	"fmt"
	"io"
	"net"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/auth/token"
	"github.com/ferryhq/ferry/proofs/harness/agenttest"
	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
	"github.com/ferryhq/ferry/protocol"
)

// v3Conn opens a version 3 connection with producer id pid (and token
// tok), asking for idempotence; granted says whether the agent gave it.
func v3Conn(a *agenttest.Agent, pid []byte, tok string) (c net.Conn, granted bool, err error) {
	c, err = net.Dial("unix", a.Socket)
	if err != nil {
		return nil, false, err
	}
	pre := protocol.PreambleFor(protocol.Version3)
	out := protocol.AppendHello(pre[:], protocol.Hello{Version: 3, ClientName: "hostile", Token: tok,
		Features: protocol.FeatureIdempotence, ProducerID: pid})
	if _, err := c.Write(out); err != nil {
		c.Close()
		return nil, false, err
	}
	h, body, err := readRaw(c)
	if err != nil || h.Type != protocol.TypeHelloOK {
		c.Close()
		return nil, false, fmt.Errorf("hello: type %d %v", h.Type, err)
	}
	ok, err := protocol.DecodeHelloOK(body, protocol.DefaultLimits)
	return c, err == nil && ok.Features&protocol.FeatureIdempotence != 0, err
}

// readRaw reads one frame's header and body.
func readRaw(c net.Conn) (protocol.FrameHeader, []byte, error) {
	var hdr [10]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return protocol.FrameHeader{}, nil, err
	}
	h, err := protocol.ParseHeader(hdr, 1<<20)
	if err != nil {
		return h, nil, err
	}
	body := make([]byte, h.BodyLen())
	_, err = io.ReadFull(c, body)
	return h, body, err
}

// seqFrame is a sequenced produce frame of one record.
func seqFrame(id uint32, seq uint64, topic, value string) []byte {
	body := protocol.AppendSequence(nil, seq)
	body = protocol.AppendProduceCount(body, 1)
	body = protocol.AppendRecord(body, "", &protocol.Record{Topic: []byte(topic), Value: []byte(value)})
	return produceFrame(protocol.FlagSequence, id, body)
}

// TestSequenceAttacks: the local protocol's version 3 sequences on the
// real binary in spool mode (a 64 KiB idempotency store) while a
// well-behaved client sends: 20,000 sequenced frames pipelined from one
// producer (the store and its key log stay within max_bytes, the oldest
// evicted and counted), a sequence reused for 100 other records (refused
// for good, nothing stored), and one application sending under another's
// producer id and sequence (its own scope: stored as its own, never a
// replay of the other's).
func TestSequenceAttacks(t *testing.T) {
	brokers := kafkatest.Shared(t)
	goodTopic := kafkatest.NewTopic(t, brokers, "good-seq", 3)
	topic := kafkatest.NewTopic(t, brokers, "hostile-seq", 3)
	a := agenttest.Start(t, ferryBin, agentConfig(brokers), "delivery.mode=spool", "delivery.spool.dir="+t.TempDir(),
		"delivery.spool.linger=5ms", "delivery.idempotency.max_bytes=64KiB", "receivers.local.auth.mode=optional")
	good := runGood("http://"+a.HTTP, goodTopic)

	attack(t, a, "Local protocol v3: 20,000 sequenced frames pipelined from one producer against delivery.idempotency.max_bytes 64KiB", func() (string, bool, string) {
		c, granted, err := v3Conn(a, []byte("flood-producer-1"), "")
		if err != nil || !granted {
			return fmt.Sprintf("granted %v: %v", granted, err), false, "idempotence in spool mode"
		}
		defer c.Close()
		const n = 20000
		// Pipelined, the reservations of frames still being stored can
		// take the whole store: those frames are answered retryable
		// idempotency_full (a client sends them again), never stored
		// unrecognised.
		errc := make(chan string, 1)
		var okN, fullN int
		go func() {
			bad := ""
			for i := 0; i < n; i++ {
				_, desc, err := readFrame(c)
				switch {
				case err == nil && desc == "result ok ":
					okN++
				case err == nil && desc == "result retryable idempotency_full":
					fullN++
				default:
					bad = fmt.Sprintf("frame %d: %q %v", i, desc, err)
				}
				if bad != "" {
					break
				}
			}
			errc <- bad
		}()
		var buf []byte
		for i := 1; i <= n; i++ {
			buf = append(buf, seqFrame(uint32(i), uint64(i), topic, "s")...)
			if len(buf) > 32<<10 || i == n {
				if _, err := c.Write(buf); err != nil {
					return err.Error(), false, ""
				}
				buf = buf[:0]
			}
		}
		if bad := <-errc; bad != "" {
			return bad, false, "every frame answered ok or retryable idempotency_full"
		}
		keys, evicted := a.Metric("ferry_idempotency_keys"), a.Metric(`ferry_idempotency_evicted_total{reason="bytes"}`)
		ok := okN > 0 && keys > 0 && keys <= 64<<10/96 && evicted >= float64(okN)-keys-1
		return fmt.Sprintf("ok ×%d, retryable idempotency_full ×%d; %v keys kept, %v evicted (bytes)", okN, fullN, keys, evicted), ok,
			"the store bounded by max_bytes (~135 bytes a frame): frames past what it holds in flight are refused retryable; the oldest accepted go first, counted"
	}, nil)

	attack(t, a, "Local protocol v3: one sequence reused for 100 other records", func() (string, bool, string) {
		c, _, err := v3Conn(a, []byte("reused-producer1"), "")
		if err != nil {
			return err.Error(), false, ""
		}
		defer c.Close()
		_, _ = c.Write(seqFrame(1, 5, topic, "original"))
		if _, desc, err := readFrame(c); err != nil || desc != "result ok " {
			return desc, false, "the first use"
		}
		replayed := a.Metric("ferry_idempotency_replayed_total")
		last := ""
		for i := range 100 {
			_, _ = c.Write(seqFrame(uint32(i+2), 5, topic, fmt.Sprintf("other-%d", i)))
			_, desc, err := readFrame(c)
			if err != nil || desc != "result permanent sequence_reused" {
				return desc, false, fmt.Sprintf("records %d", i)
			}
			last = desc
		}
		_, _ = c.Write(seqFrame(200, 5, topic, "original"))
		_, same, _ := readFrame(c)
		ok := same == "result ok " && a.Metric("ferry_idempotency_replayed_total") == replayed+1
		return last, ok, "permanent sequence_reused, nothing stored; the original records still answer ok (replayed); the connection goes on"
	}, nil)

	attack(t, a, "Local protocol v3: application B sending under application A's producer id and sequence", func() (string, bool, string) {
		ta, tb := issue(t, token.Claims{App: "tenant-a"}), issue(t, token.Claims{App: "tenant-b"})
		pid := []byte("shared-producer!")
		replayed := a.Metric("ferry_idempotency_replayed_total")
		var answers []string
		for _, tok := range []string{ta, tb} {
			c, granted, err := v3Conn(a, pid, tok)
			if err != nil || !granted {
				return fmt.Sprintf("granted %v: %v", granted, err), false, ""
			}
			_, _ = c.Write(seqFrame(1, 1, topic, "from "+tok[:8]))
			_, desc, _ := readFrame(c)
			answers = append(answers, desc)
			c.Close()
		}
		ok := answers[0] == "result ok " && answers[1] == "result ok " && a.Metric("ferry_idempotency_replayed_total") == replayed
		return strings.Join(answers, "; "), ok, "sequences are scoped per application: B's frame is its own (stored), never refused as reused nor answered as A's replay"
	}, nil)

	good.stop()
	if good.n.Load() == 0 {
		t.Fatalf("the well-behaved client had nothing accepted (%d refused)", good.refused.Load())
	}
}
