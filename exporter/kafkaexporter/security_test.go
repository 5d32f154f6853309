package kafkaexporter

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

// A password must not reach a log line, an error or a printed config in
// any format.
func TestSecretNeverPrinted(t *testing.T) {
	c := SASLConfig{Mechanism: "PLAIN", Username: "u", Password: "hunter2"}
	y, _ := yaml.Marshal(c)
	j, _ := json.Marshal(c)
	for _, s := range []string{fmt.Sprint(c), fmt.Sprintf("%v %+v %#v %s", c, c, c, c.Password), string(y), string(j)} {
		if strings.Contains(s, "hunter2") {
			t.Fatalf("password printed: %s", s)
		}
	}
	if p, _ := c.password(); p != "hunter2" {
		t.Fatalf("password() = %q", p)
	}
}

// The password file is read at every connection: a rotated file applies
// without a reload; a missing or empty one is an error naming the key.
func TestPasswordFileReadEachTime(t *testing.T) {
	f := filepath.Join(t.TempDir(), "pw")
	c := SASLConfig{Mechanism: "SCRAM-SHA-256", Username: "u", PasswordFile: f}
	if _, err := c.password(); err == nil || !strings.Contains(err.Error(), "sasl.password_file") {
		t.Fatalf("missing file: %v", err)
	}
	os.WriteFile(f, []byte("one\n"), 0o600)
	if p, _ := c.password(); p != "one" {
		t.Fatalf("got %q", p)
	}
	os.WriteFile(f, []byte("two"), 0o600)
	if p, _ := c.password(); p != "two" {
		t.Fatalf("after rotation got %q", p)
	}
	os.WriteFile(f, nil, 0o600)
	if _, err := c.password(); err == nil {
		t.Fatal("empty password file accepted")
	}
}

// writeCA writes a self-signed CA certificate and returns its path.
func writeCA(t *testing.T, dir, name string) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name+".pem")
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// Files are checked at New and on a reload (nothing changes on error), and
// parsed again only when they changed.
func TestTLSFilesCheckedAndReloaded(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.pem")
	os.WriteFile(bad, []byte("not a certificate"), 0o600)
	if _, err := newSecurity(TLSConfig{Enabled: true, CAFile: bad}, SASLConfig{}, time.Second, nil); err == nil || !strings.Contains(err.Error(), "tls.ca_file") {
		t.Fatalf("bad CA file: %v", err)
	}
	if _, err := newSecurity(TLSConfig{Enabled: true, CAFile: filepath.Join(dir, "missing.pem")}, SASLConfig{}, time.Second, nil); err == nil {
		t.Fatal("missing CA file accepted")
	}
	ca := writeCA(t, dir, "ca")
	sec, err := newSecurity(TLSConfig{Enabled: true, CAFile: ca}, SASLConfig{}, time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	c1, _ := sec.cur.Load().tlsConfig()
	c2, _ := sec.cur.Load().tlsConfig()
	if c1.RootCAs != c2.RootCAs {
		t.Fatal("unchanged files parsed again")
	}
	time.Sleep(10 * time.Millisecond)
	writeCA(t, dir, "ca") // rotated in place
	c3, err := sec.cur.Load().tlsConfig()
	if err != nil || c3.RootCAs == c1.RootCAs {
		t.Fatalf("rotated CA not picked up: %v", err)
	}
	if err := sec.set(TLSConfig{Enabled: true, CAFile: bad}, SASLConfig{}); err == nil {
		t.Fatal("reload to a bad CA file accepted")
	}
	if sec.cur.Load().tls.CAFile != ca {
		t.Fatal("a refused reload changed the settings")
	}
}
