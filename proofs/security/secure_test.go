package security

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"flag"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/proofs/harness/agenttest"
	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
	"github.com/ferryhq/ferry/proofs/harness/oauthtest"
)

var (
	ferryBin string
	broker   *kafkatest.Secure // one secured broker for the package's tests
	// idp issues the OAUTHBEARER listener's tokens; it runs before the
	// broker, which reads its JWKS at start-up.
	idp *oauthtest.Server
)

// reauthMS is the OAUTHBEARER listener's connections.max.reauth.ms: every
// connection re-authenticates this often, and before its token expires.
const reauthMS = 6000

func TestMain(m *testing.M) {
	flag.Parse()
	bin, cleanup := agenttest.BuildForTests()
	ferryBin = bin
	var dir string
	if !testing.Short() {
		var err error
		if dir, err = os.MkdirTemp("", "ferry-security-"); err == nil {
			idp, err = oauthtest.Start(dir)
		}
		if err == nil {
			broker, err = kafkatest.NewSecureWith(kafkatest.SecureOptions{OAuthJWKS: idp.JWKSURL, OAuthIssuer: idp.Issuer, ReauthMS: reauthMS})
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	code := m.Run()
	if broker != nil {
		broker.Stop()
	}
	if idp != nil {
		idp.Close()
	}
	if dir != "" {
		os.RemoveAll(dir)
	}
	cleanup()
	os.Exit(code)
}

// secured is the package's broker (tests skip under -short).
func secured(t *testing.T) *kafkatest.Secure {
	t.Helper()
	kafkatest.SkipShort(t)
	return broker
}

// post sends n NDJSON records "<tag>:<i>" and returns the answer's status and body.
func post(t *testing.T, a *agenttest.Agent, topic, tag string, n int) (int, string) {
	t.Helper()
	var b strings.Builder
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "%s:%d\n", tag, i)
	}
	res, err := (&http.Client{Timeout: 90 * time.Second}).Post("http://"+a.HTTP+"/v1/messages/"+topic, "application/x-ndjson", strings.NewReader(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(body)
}

// readyz returns /readyz's status and body.
func readyz(t *testing.T, a *agenttest.Agent) (int, string) {
	t.Helper()
	res, err := http.Get("http://" + a.Admin + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(body)
}

// waitReadyz waits until /readyz answers want and its body contains every
// one of words; it returns the body.
func waitReadyz(t *testing.T, a *agenttest.Agent, want int, words ...string) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body := readyz(t, a)
		ok := code == want
		for _, w := range words {
			ok = ok && strings.Contains(body, w)
		}
		if ok {
			return body
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz: want %d with %q, last %d %s", want, words, code, body)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// countTags counts the records in topic by tag (the part before ':').
func countTags(t *testing.T, brokers, topic string, want int) map[string]int {
	t.Helper()
	got := map[string]int{}
	for _, r := range kafkatest.Consume(t, brokers, topic, want, 60*time.Second) {
		tag, _, _ := strings.Cut(string(r.Value), ":")
		got[tag]++
	}
	return got
}

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// Every mechanism delivers, with the password from a file or from the
// environment, and the password never appears in the agent's output.
func TestEveryMechanismDelivers(t *testing.T) {
	b := secured(t)
	topic := kafkatest.NewTopic(t, b.Addr, "secure", 3)
	dir := t.TempDir()
	pwFile := writeFile(t, dir, "pw", b.Password+"\n")
	t.Setenv("FERRY_TEST_KAFKA_PASSWORD", b.Password)
	tlsSets := []string{"exporter.kafka.tls.enabled=true", "exporter.kafka.tls.ca_file=" + b.CAFile}
	cases := []struct {
		tag, yaml string
		sets      []string
	}{
		{"plain", "", append([]string{"exporter.kafka.brokers=[" + b.SASL + "]", "exporter.kafka.sasl.mechanism=PLAIN",
			"exporter.kafka.sasl.username=" + b.User, "exporter.kafka.sasl.password_file=" + pwFile}, tlsSets...)},
		{"scram256", "", append([]string{"exporter.kafka.brokers=[" + b.SASL + "]", "exporter.kafka.sasl.mechanism=SCRAM-SHA-256",
			"exporter.kafka.sasl.username=" + b.User, "exporter.kafka.sasl.password_file=" + pwFile}, tlsSets...)},
		// The password from the environment, through the config file.
		{"scram512", "exporter:\n  kafka:\n    sasl:\n      mechanism: SCRAM-SHA-512\n      username: " + b.User + "\n      password: ${FERRY_TEST_KAFKA_PASSWORD}\n",
			append([]string{"exporter.kafka.brokers=[" + b.SASL + "]"}, tlsSets...)},
		{"mtls", "", append([]string{"exporter.kafka.brokers=[" + b.MTLS + "]", "exporter.kafka.tls.cert_file=" + b.ClientCert,
			"exporter.kafka.tls.key_file=" + b.ClientKey}, tlsSets...)},
	}
	for _, c := range cases {
		t.Run(c.tag, func(t *testing.T) {
			a := agenttest.Start(t, ferryBin, c.yaml, c.sets...)
			waitReadyz(t, a, 200)
			if code, body := post(t, a, topic, c.tag, 500); code != 200 || !strings.Contains(body, `"accepted":500`) {
				t.Fatalf("answer %d %s", code, body)
			}
			a.Stop()
			if strings.Contains(a.Logs.String(), b.Password) {
				t.Fatal("the password appears in the agent's output")
			}
		})
	}
	got := countTags(t, b.Addr, topic, 500*len(cases))
	for _, c := range cases {
		if got[c.tag] != 500 {
			t.Errorf("%s: %d of 500 records in Kafka (%v)", c.tag, got[c.tag], got)
		}
	}
}

// A wrong password: /readyz names the mechanism and the user, the agent
// stays up, a client's records wait; a reload with the right password
// delivers them, the waiting request is answered 200, nothing is lost.
func TestWrongPasswordFixedByReload(t *testing.T) {
	b := secured(t)
	topic := kafkatest.NewTopic(t, b.Addr, "secure-pw", 1)
	cfg := func(pw string) string {
		return fmt.Sprintf("receivers:\n  http:\n    ack_timeout: 2m\nexporter:\n  kafka:\n    brokers: [%s]\n    tls: {enabled: true, ca_file: %s}\n"+
			"    sasl: {mechanism: SCRAM-SHA-256, username: %s, password: %q}\n", b.SASL, b.CAFile, b.User, pw)
	}
	a := agenttest.Start(t, ferryBin, cfg("not-the-password"))
	body := waitReadyz(t, a, 503, "SCRAM-SHA-256", b.User, "authentication")
	t.Logf("/readyz while the password is wrong: %s", body)
	answered := make(chan string, 1)
	go func() {
		code, body := post(t, a, topic, "waited", 300)
		answered <- fmt.Sprint(code, " ", body)
	}()
	time.Sleep(3 * time.Second)
	select {
	case ans := <-answered:
		t.Fatalf("answered before Kafka could have the records: %s", ans)
	default:
	}
	if err := os.WriteFile(a.Config, []byte(cfg(b.Password)), 0o600); err != nil {
		t.Fatal(err)
	}
	a.Reload()
	select {
	case ans := <-answered:
		if !strings.HasPrefix(ans, "200 ") {
			t.Fatalf("after the reload: %s", ans)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the waiting request was not answered after the reload")
	}
	waitReadyz(t, a, 200)
	if got := countTags(t, b.Addr, topic, 300); got["waited"] != 300 {
		t.Fatalf("%v of 300 records in Kafka", got)
	}
	if strings.Contains(a.Logs.String(), b.Password) || strings.Contains(a.Logs.String(), "not-the-password") {
		t.Fatal("a password appears in the agent's output")
	}
	a.Stop()
}

// A CA that did not sign the broker's certificate: /readyz says the
// certificate is not trusted and names the file; a reload with the right
// CA makes the agent ready and delivers.
func TestUntrustedCertificate(t *testing.T) {
	b := secured(t)
	topic := kafkatest.NewTopic(t, b.Addr, "secure-ca", 1)
	other := otherCA(t)
	cfg := func(ca string) string {
		return fmt.Sprintf("exporter:\n  kafka:\n    brokers: [%s]\n    tls: {enabled: true, ca_file: %s, cert_file: %s, key_file: %s}\n",
			b.MTLS, ca, b.ClientCert, b.ClientKey)
	}
	a := agenttest.Start(t, ferryBin, cfg(other))
	body := waitReadyz(t, a, 503, "not signed by a trusted CA", other)
	t.Logf("/readyz with the wrong CA: %s", body)
	if err := os.WriteFile(a.Config, []byte(cfg(b.CAFile)), 0o600); err != nil {
		t.Fatal(err)
	}
	a.Reload()
	waitReadyz(t, a, 200)
	if code, body := post(t, a, topic, "trusted", 100); code != 200 {
		t.Fatalf("answer %d %s", code, body)
	}
	if got := countTags(t, b.Addr, topic, 100); got["trusted"] != 100 {
		t.Fatalf("%v of 100 records in Kafka", got)
	}
	a.Stop()
}

// otherCA writes a CA certificate that signed nothing the broker has.
func otherCA(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "not the broker's CA"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return writeFile(t, t.TempDir(), "other-ca.pem", string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})))
}
