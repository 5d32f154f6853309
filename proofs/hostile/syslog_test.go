package hostile

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/ferryhq/ferry/proofs/harness/agenttest"
	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
)

// closedWithin reports whether the agent closed c within d.
func closedWithin(c net.Conn, d time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, c)
	return err == nil // EOF (or a reset, as an error other than the deadline: see below)
}

// The syslog receiver's bounds against the real binary over the network,
// with the well-behaved HTTP client alongside: each attack fails if its
// bound is removed (an octet count read as it claims, a line held whole,
// a partial frame held past frame_timeout, connections past
// max_connections).
func TestSyslogAttacks(t *testing.T) {
	brokers := kafkatest.Shared(t)
	topic := kafkatest.NewTopic(t, brokers, "syslog-hostile", 1)
	goodTopic := kafkatest.NewTopic(t, brokers, "syslog-good", 1)
	tcp := agenttest.FreeAddr(t)
	a := agenttest.Start(t, ferryBin, agentConfig(brokers), "receivers.syslog.enabled=true", "receivers.syslog.tcp="+tcp,
		"receivers.syslog.udp=", "receivers.syslog.socket=", "receivers.syslog.tls_listen=", "receivers.syslog.topic="+topic,
		"receivers.syslog.frame_timeout=2s", "receivers.syslog.max_connections=200")
	good := runGood("http://"+a.HTTP, goodTopic)

	attack(t, a, "Syslog: an octet count of 999999999999", func() (string, bool, string) {
		c, err := net.Dial("tcp", tcp)
		if err != nil {
			return err.Error(), false, ""
		}
		defer c.Close()
		_, _ = c.Write([]byte("999999999999 <13>1 - - - - - - x"))
		start := time.Now()
		ok := closedWithin(c, 5*time.Second) && time.Since(start) < time.Second
		dropped := a.Metric(`ferry_syslog_dropped_records_total{reason="frame_too_large"}`)
		return fmt.Sprintf("closed in %s, counted %v", time.Since(start).Round(time.Millisecond), dropped), ok && dropped == 1,
			"refused from its digits: nothing of it is reserved or read"
	}, nil)

	attack(t, a, "Syslog: a never-ending line (64 MiB, no LF)", func() (string, bool, string) {
		c, err := net.Dial("tcp", tcp)
		if err != nil {
			return err.Error(), false, ""
		}
		defer c.Close()
		go func() {
			chunk := append([]byte("<13>"), bytes.Repeat([]byte("x"), 1<<20)...)
			_ = c.SetWriteDeadline(time.Now().Add(20 * time.Second))
			for i := 0; i < 64; i++ {
				if _, err := c.Write(chunk); err != nil {
					return
				}
			}
		}()
		start := time.Now()
		ok := closedWithin(c, 20*time.Second)
		trunc := a.Metric(`ferry_syslog_truncated_messages_total{transport="tcp"}`)
		return fmt.Sprintf("truncated at max_message_bytes (%v), closed after %s", trunc, time.Since(start).Round(100*time.Millisecond)),
			ok && trunc >= 1 && time.Since(start) < 6*time.Second, "the rest of the line is skipped unread into memory; frame_timeout (2s) ends it"
	}, nil)

	attack(t, a, "Syslog: 150 slowloris connections, each a partial 60 KB frame", func() (string, bool, string) {
		var conns []net.Conn
		for i := 0; i < 150; i++ {
			c, err := net.Dial("tcp", tcp)
			if err != nil {
				continue
			}
			_, _ = c.Write(append([]byte("60000 <13>1 - - - - - - "), bytes.Repeat([]byte("s"), 30000)...))
			conns = append(conns, c)
		}
		start := time.Now()
		var wg sync.WaitGroup
		var mu sync.Mutex
		closed := 0
		for _, c := range conns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				if closedWithin(c, 10*time.Second) {
					mu.Lock()
					closed++
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		return fmt.Sprintf("%d of %d cut after %s", closed, len(conns), time.Since(start).Round(100*time.Millisecond)),
			closed == len(conns) && len(conns) == 150 && time.Since(start) < 6*time.Second, "each partial frame's reserved buffer is held at most frame_timeout (2s)"
	}, nil)

	attack(t, a, "Syslog: connection flood, 400 (max_connections 200)", func() (string, bool, string) {
		var conns []net.Conn
		for i := 0; i < 400; i++ {
			if c, err := net.Dial("tcp", tcp); err == nil {
				conns = append(conns, c)
			}
		}
		time.Sleep(300 * time.Millisecond)
		refused := 0
		for _, c := range conns {
			_ = c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
			if _, err := c.Read(make([]byte, 1)); err == io.EOF {
				refused++
			}
			c.Close()
		}
		return fmt.Sprintf("%d closed at once", refused), refused >= 190, ""
	}, nil)

	good.stop()
	got := kafkatest.UpTo(t, brokers, goodTopic, 60*time.Second)
	seen := map[string]bool{}
	for _, r := range got {
		seen[string(r.Value)] = true
	}
	if int64(len(seen)) < good.n.Load() {
		t.Fatalf("%d records acknowledged to the good client, %d in Kafka", good.n.Load(), len(seen))
	}
}
