package compat

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/proofs/harness/agenttest"
	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
	"github.com/ferryhq/ferry/proofs/harness/testcerts"
)

// rsyslogd returns the path of a real rsyslogd (with its gtls driver),
// installing it with scripts/rsyslog-local when missing; a test that needs
// it fails rather than skips when it cannot be had.
func rsyslogd(t *testing.T) string {
	t.Helper()
	kafkatest.SkipShort(t)
	_, file, _, _ := runtime.Caller(0)
	out, err := exec.Command(filepath.Join(filepath.Dir(file), "..", "..", "scripts", "rsyslog-local")).Output()
	if err != nil {
		t.Fatalf("scripts/rsyslog-local: %v", err)
	}
	return strings.TrimSpace(string(out))
}

func port(addr string) string { _, p, _ := net.SplitHostPort(addr); return p }

// waitUDPBound waits until a socket is bound to addr (127.0.0.1:PORT) by
// some process, per /proc/net/udp, up to 20 s.
func waitUDPBound(t *testing.T, addr string) {
	t.Helper()
	p, err := strconv.Atoi(port(addr))
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("0100007F:%04X ", p)
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if b, err := os.ReadFile("/proc/net/udp"); err == nil && strings.Contains(string(b), want) {
			return
		}
	}
	t.Fatalf("nothing bound %s within 20 s", addr)
}

// logger (util-linux) → ferry over UDP and TCP, and logger → a real
// rsyslogd → ferry over TCP (octet-counted) and TLS (gtls, octet-counted,
// RFC 5425) → the real binary → a real Kafka: every message is in Kafka
// once, parsed.
func TestSyslogIntoKafka(t *testing.T) {
	brokers := kafkatest.Shared(t)
	bin := rsyslogd(t)
	topic := kafkatest.NewTopic(t, brokers, "syslog", 1)
	certs := testcerts.New(t)
	udp, tcp, tlsAddr := agenttest.FreeAddr(t), agenttest.FreeAddr(t), agenttest.FreeAddr(t)
	dir := t.TempDir()
	sock := filepath.Join(dir, "s.sock")
	a := agenttest.Start(t, ferryBin, fmt.Sprintf("exporter: {kafka: {brokers: [%s]}}\ntelemetry: {report_interval: 0s}\n", brokers),
		"receivers.syslog.enabled=true", "receivers.syslog.udp="+udp, "receivers.syslog.tcp="+tcp, "receivers.syslog.tls_listen="+tlsAddr,
		"receivers.syslog.tls.cert_file="+certs.ServerCert, "receivers.syslog.tls.key_file="+certs.ServerKey,
		"receivers.syslog.socket="+sock, "receivers.syslog.topic="+topic)

	// rsyslogd: two UDP inputs, one forwarding over TCP and one over TLS.
	inTCP, inTLS := agenttest.FreeAddr(t), agenttest.FreeAddr(t)
	conf := fmt.Sprintf(`
global(workDirectory="%[1]s" defaultNetstreamDriverCAFile="%[2]s" net.enableDNS="off")
module(load="imudp")
input(type="imudp" address="127.0.0.1" port="%[3]s" ruleset="viatcp")
input(type="imudp" address="127.0.0.1" port="%[4]s" ruleset="viatls")
ruleset(name="viatcp") {
  action(type="omfwd" target="127.0.0.1" port="%[5]s" protocol="tcp" TCP_Framing="octet-counted" template="RSYSLOG_SyslogProtocol23Format")
}
ruleset(name="viatls") {
  action(type="omfwd" target="127.0.0.1" port="%[6]s" protocol="tcp" TCP_Framing="octet-counted" template="RSYSLOG_SyslogProtocol23Format"
         StreamDriver="gtls" StreamDriverMode="1" StreamDriverAuthMode="x509/name" StreamDriverPermittedPeers="localhost")
}
`, dir, certs.CA, port(inTCP), port(inTLS), port(tcp), port(tlsAddr))
	cf := filepath.Join(dir, "rsyslog.conf")
	if err := os.WriteFile(cf, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	rs := exec.Command(bin, "-n", "-f", cf, "-i", filepath.Join(dir, "rsyslog.pid"))
	var rsLog agenttest.SyncBuffer
	rs.Stdout, rs.Stderr = &rsLog, &rsLog
	if err := rs.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = rs.Process.Kill()
		_ = rs.Wait()
		if t.Failed() {
			t.Logf("rsyslogd:\n%s", rsLog.String())
		}
	})
	// rsyslogd binds its UDP inputs some time after it starts, and a
	// datagram sent before is lost: a fixed 500 ms wait lost all 100 on a
	// loaded machine (make test's parallel packages).
	for _, in := range []string{inTCP, inTLS} {
		waitUDPBound(t, in)
	}

	const n = 50
	send := func(via string, args ...string) {
		for i := 0; i < n; i++ {
			msg := fmt.Sprintf("%s-%d", via, i)
			all := append([]string{"-t", "e2e", "-p", "local1.err", "--rfc5424", "--sd-id", "e2e@1", "--sd-param", `via="` + via + `"`}, args...)
			if out, err := exec.Command("logger", append(all, msg)...).CombinedOutput(); err != nil {
				t.Fatalf("logger %s: %v\n%s", via, err, out)
			}
		}
	}
	send("udp", "--server", "127.0.0.1", "--port", port(udp), "--udp")
	send("tcp", "--server", "127.0.0.1", "--port", port(tcp), "--tcp", "--octet-count")
	send("unix", "--socket", sock)
	send("rsyslog-tcp", "--server", "127.0.0.1", "--port", port(inTCP), "--udp")
	send("rsyslog-tls", "--server", "127.0.0.1", "--port", port(inTLS), "--udp")

	want := 5 * n
	recs := kafkatest.UpTo(t, brokers, topic, 60*time.Second)
	deadline := time.Now().Add(30 * time.Second)
	syslogRecords := func() int {
		k := 0
		for _, r := range recs {
			if !strings.HasPrefix(string(r.Value), "kafkatest-marker-") {
				k++
			}
		}
		return k
	}
	for syslogRecords() < want && time.Now().Before(deadline) {
		time.Sleep(time.Second)
		recs = kafkatest.UpTo(t, brokers, topic, 10*time.Second)
	}
	seen := map[string]int{}
	for _, r := range recs {
		if strings.HasPrefix(string(r.Value), "kafkatest-marker-") {
			continue // UpTo's own
		}
		var m map[string]any
		if err := json.Unmarshal(r.Value, &m); err != nil {
			t.Fatalf("not JSON: %s", r.Value)
		}
		if m["app_name"] != "e2e" || m["facility_name"] != "local1" || m["severity_name"] != "err" || m["protocol"] != "rfc5424" {
			t.Errorf("fields: %s", r.Value)
		}
		msg, _ := m["message"].(string)
		via := msg[:strings.LastIndexByte(msg, '-')]
		if m["sd.e2e@1.via"] != via {
			t.Errorf("structured data: %s", r.Value)
		}
		seen[msg]++
	}
	for _, via := range []string{"udp", "tcp", "unix", "rsyslog-tcp", "rsyslog-tls"} {
		for i := 0; i < n; i++ {
			if c := seen[fmt.Sprintf("%s-%d", via, i)]; c != 1 {
				t.Errorf("%s-%d is in Kafka %d times", via, i, c)
			}
		}
	}
	if got := a.Metric(`ferry_syslog_messages_total{transport="tls"}`); got != n {
		t.Errorf("ferry_syslog_messages_total{transport=tls} = %v, want %d", got, n)
	}
	t.Logf("%d records in Kafka from logger and rsyslogd over UDP, TCP, the Unix socket and TLS", syslogRecords())
}
