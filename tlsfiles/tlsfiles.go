// Package tlsfiles owns the TLS material ferry reads from files — a CA
// bundle, a certificate and its key — for its listeners and for its
// connections to Kafka. A Loader parses the files once and again only when
// they change (size or modification time), so certificates rotated on disk
// apply to the next handshake without a restart, and an unchanged file
// costs a stat per handshake, not a parse.
package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"strings"
	"sync"
)

// Files names the PEM files; each may be empty. Cert and Key go together.
type Files struct {
	CA, Cert, Key string
	// Prefix is put before the keys in errors ("tls." gives "tls.ca_file").
	Prefix string
	// CAKey is the CA file's key name in errors (default "ca_file").
	CAKey string
}

// Material is what the files hold: nil where a file is not set.
type Material struct {
	Pool *x509.CertPool
	Cert *tls.Certificate
}

// Loader reads Files, again when they change.
type Loader struct {
	f     Files
	mu    sync.Mutex
	stamp string
	m     *Material
}

// New checks the files by loading them once.
func New(f Files) (*Loader, error) {
	if f.CAKey == "" {
		f.CAKey = "ca_file"
	}
	if (f.Cert == "") != (f.Key == "") {
		return nil, fmt.Errorf("%scert_file and %skey_file: set both or neither", f.Prefix, f.Prefix)
	}
	l := &Loader{f: f}
	if _, err := l.Load(); err != nil {
		return nil, err
	}
	return l, nil
}

// Load returns the material as the files are now; the same pointer while
// they have not changed.
func (l *Loader) Load() (*Material, error) {
	stamp := stampOf(l.f.CA, l.f.Cert, l.f.Key)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m != nil && stamp == l.stamp {
		return l.m, nil
	}
	m := &Material{}
	if l.f.CA != "" {
		pem, err := os.ReadFile(l.f.CA)
		if err != nil {
			return nil, fmt.Errorf("%s%s: %w", l.f.Prefix, l.f.CAKey, err)
		}
		m.Pool = x509.NewCertPool()
		if !m.Pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s%s %s: no PEM certificate in it", l.f.Prefix, l.f.CAKey, l.f.CA)
		}
	}
	if l.f.Cert != "" {
		c, err := tls.LoadX509KeyPair(l.f.Cert, l.f.Key)
		if err != nil {
			return nil, fmt.Errorf("%scert_file/key_file: %w", l.f.Prefix, err)
		}
		m.Cert = &c
	}
	l.m, l.stamp = m, stamp
	return m, nil
}

// stampOf identifies the files' current contents cheaply.
func stampOf(files ...string) string {
	var b strings.Builder
	for _, f := range files {
		if f == "" {
			continue
		}
		if fi, err := os.Stat(f); err == nil {
			fmt.Fprintf(&b, "%s:%d:%d;", f, fi.Size(), fi.ModTime().UnixNano())
		} else {
			fmt.Fprintf(&b, "%s:missing;", f)
		}
	}
	return b.String()
}

// Version parses a min_version setting: "" or "1.2", or "1.3".
func Version(v string) (uint16, error) {
	switch v {
	case "", "1.2":
		return tls.VersionTLS12, nil
	case "1.3":
		return tls.VersionTLS13, nil
	}
	return 0, fmt.Errorf("min_version: %q is not 1.2 or 1.3", v)
}
