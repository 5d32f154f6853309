package kafkaexporter

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// TLSConfig is how ferry connects to the brokers over TLS (exporter.kafka.tls).
type TLSConfig struct {
	Enabled bool `yaml:"enabled"`
	// CAFile: PEM certificates the brokers' must chain to; empty: the
	// system's roots.
	CAFile string `yaml:"ca_file"`
	// CertFile and KeyFile: ferry's own certificate, for brokers that
	// require client certificates (mTLS). Both or neither.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ServerName checked in the brokers' certificates; empty: the host of
	// each broker's address.
	ServerName string `yaml:"server_name"`
	// MinVersion: "1.2" or "1.3".
	MinVersion string `yaml:"min_version"`
}

// SASLConfig is how ferry authenticates to the brokers (exporter.kafka.sasl).
type SASLConfig struct {
	// Mechanism: "" (none), PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512.
	Mechanism string `yaml:"mechanism"`
	Username  string `yaml:"username"`
	// Password, or PasswordFile holding it (trailing newline ignored; read
	// again at every connection, so a rotated file needs no reload).
	Password     Secret `yaml:"password"`
	PasswordFile string `yaml:"password_file"`
}

// Secret is a configuration value that must never reach a log or an
// answer: it prints as [redacted] in every format and marshals so.
type Secret string

func (Secret) String() string                 { return "[redacted]" }
func (Secret) GoString() string               { return "[redacted]" }
func (Secret) LogValue() slog.Value           { return slog.StringValue("[redacted]") }
func (s Secret) MarshalYAML() (any, error)    { return redacted(s), nil }
func (s Secret) MarshalJSON() ([]byte, error) { return []byte(`"` + redacted(s) + `"`), nil }

func redacted(s Secret) string {
	if s == "" {
		return ""
	}
	return "[redacted]"
}

func (c *TLSConfig) validate() error {
	if (c.CertFile == "") != (c.KeyFile == "") {
		return errors.New("tls.cert_file and tls.key_file: set both (mTLS) or neither")
	}
	if _, err := tlsVersion(c.MinVersion); err != nil {
		return err
	}
	if !c.Enabled && (c.CAFile != "" || c.CertFile != "" || c.ServerName != "") {
		return errors.New("tls: files or server_name are set but tls.enabled is false")
	}
	return nil
}

func tlsVersion(v string) (uint16, error) {
	switch v {
	case "", "1.2":
		return tls.VersionTLS12, nil
	case "1.3":
		return tls.VersionTLS13, nil
	}
	return 0, fmt.Errorf("tls.min_version: %q is not 1.2 or 1.3", v)
}

func (c *SASLConfig) validate() error {
	switch c.Mechanism {
	case "":
		if c.Username != "" || c.Password != "" || c.PasswordFile != "" {
			return errors.New("sasl: username or password set but sasl.mechanism is empty")
		}
		return nil
	case "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512":
	default:
		return fmt.Errorf("sasl.mechanism: %q is not one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512", c.Mechanism)
	}
	if c.Username == "" {
		return fmt.Errorf("sasl.username: required for %s", c.Mechanism)
	}
	if (c.Password == "") == (c.PasswordFile == "") {
		return fmt.Errorf("sasl: set one of sasl.password and sasl.password_file for %s", c.Mechanism)
	}
	return nil
}

// password is the SASL password: inline, or the file's content now.
func (c *SASLConfig) password() (string, error) {
	if c.PasswordFile == "" {
		return string(c.Password), nil
	}
	b, err := os.ReadFile(c.PasswordFile)
	if err != nil {
		return "", fmt.Errorf("sasl.password_file: %w", err)
	}
	p := strings.TrimRight(string(b), "\r\n")
	if p == "" {
		return "", fmt.Errorf("sasl.password_file %s is empty", c.PasswordFile)
	}
	return p, nil
}

// security holds the TLS and SASL settings the Kafka client dials and
// authenticates with. Both are looked up at every new connection, so a
// reload (SetSecurity) or rotated certificate and password files apply to
// the next connection without restarting the client.
type security struct {
	cur         atomic.Pointer[secState]
	dialTimeout time.Duration
}

type secState struct {
	tls  TLSConfig
	sasl SASLConfig

	mu    sync.Mutex
	conf  *tls.Config // built from the files as they were at stamp
	stamp string
}

func newSecurity(t TLSConfig, s SASLConfig, dialTimeout time.Duration) (*security, error) {
	sec := &security{dialTimeout: dialTimeout}
	if err := sec.set(t, s); err != nil {
		return nil, err
	}
	return sec, nil
}

// set checks the settings (reading every file once) and makes them the
// ones the next connection uses; on error nothing changes.
func (sec *security) set(t TLSConfig, s SASLConfig) error {
	if err := t.validate(); err != nil {
		return err
	}
	if err := s.validate(); err != nil {
		return err
	}
	st := &secState{tls: t, sasl: s}
	if t.Enabled {
		if _, err := st.tlsConfig(); err != nil {
			return err
		}
	}
	if s.Mechanism != "" {
		if _, err := s.password(); err != nil {
			return err
		}
	}
	sec.cur.Store(st)
	return nil
}

// stampOf identifies the files' current contents cheaply (size and
// modification time), so they are parsed again only when they changed.
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

// tlsConfig is the TLS configuration from the files as they are now.
func (st *secState) tlsConfig() (*tls.Config, error) {
	stamp := stampOf(st.tls.CAFile, st.tls.CertFile, st.tls.KeyFile)
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.conf != nil && stamp == st.stamp {
		return st.conf, nil
	}
	minV, _ := tlsVersion(st.tls.MinVersion)
	c := &tls.Config{MinVersion: minV, ServerName: st.tls.ServerName}
	if st.tls.CAFile != "" {
		pem, err := os.ReadFile(st.tls.CAFile)
		if err != nil {
			return nil, fmt.Errorf("tls.ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls.ca_file %s: no PEM certificate in it", st.tls.CAFile)
		}
		c.RootCAs = pool
	}
	if st.tls.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(st.tls.CertFile, st.tls.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("tls.cert_file/key_file: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	st.conf, st.stamp = c, stamp
	return c, nil
}

// dial connects to a broker, over TLS when it is enabled.
func (sec *security) dial(ctx context.Context, network, host string) (net.Conn, error) {
	st := sec.cur.Load()
	nd := &net.Dialer{Timeout: sec.dialTimeout}
	if !st.tls.Enabled {
		return nd.DialContext(ctx, network, host)
	}
	c, err := st.tlsConfig()
	if err != nil {
		return nil, err
	}
	if c.ServerName == "" {
		c = c.Clone()
		if h, _, err := net.SplitHostPort(host); err == nil {
			c.ServerName = h
		} else {
			c.ServerName = host
		}
	}
	conn, err := (&tls.Dialer{NetDialer: nd, Config: c}).DialContext(ctx, network, host)
	if err != nil {
		return nil, tlsError{err}
	}
	return conn, nil
}

// tlsError marks a failed TLS handshake, so readiness can say so.
type tlsError struct{ err error }

func (e tlsError) Error() string { return "TLS handshake: " + e.err.Error() }
func (e tlsError) Unwrap() error { return e.err }

// mechanism authenticates with the SASL settings current at each
// connection.
type mechanism struct{ sec *security }

func (m mechanism) Name() string { return m.sec.cur.Load().sasl.Mechanism }

func (m mechanism) Authenticate(ctx context.Context, host string) (sasl.Session, []byte, error) {
	s := m.sec.cur.Load().sasl
	pass, err := s.password()
	if err != nil {
		return nil, nil, err
	}
	var mech sasl.Mechanism
	switch s.Mechanism {
	case "PLAIN":
		mech = plain.Auth{User: s.Username, Pass: pass}.AsMechanism()
	case "SCRAM-SHA-256":
		mech = scram.Auth{User: s.Username, Pass: pass}.AsSha256Mechanism()
	case "SCRAM-SHA-512":
		mech = scram.Auth{User: s.Username, Pass: pass}.AsSha512Mechanism()
	default:
		return nil, nil, fmt.Errorf("sasl.mechanism %q", s.Mechanism)
	}
	return mech.Authenticate(ctx, host)
}

// describe turns a connection error into the words readiness and the log
// give: what failed (TLS, or which SASL mechanism for which user) and why.
func (sec *security) describe(err error) string {
	st := sec.cur.Load()
	var te tlsError
	switch {
	case errors.Is(err, kerr.SaslAuthenticationFailed):
		return fmt.Sprintf("SASL %s authentication as %q failed (check sasl.username and the password): %v", st.sasl.Mechanism, st.sasl.Username, err)
	case errors.Is(err, kerr.UnsupportedSaslMechanism):
		return fmt.Sprintf("the broker does not accept SASL mechanism %s: %v", st.sasl.Mechanism, err)
	case errors.As(err, &te):
		var unknown x509.UnknownAuthorityError
		var host x509.HostnameError
		switch {
		case errors.As(err, &unknown):
			return fmt.Sprintf("TLS: the broker's certificate is not signed by a trusted CA (tls.ca_file %q): %v", st.tls.CAFile, err)
		case errors.As(err, &host):
			return fmt.Sprintf("TLS: the broker's certificate does not name the host (tls.server_name): %v", err)
		}
		return err.Error()
	}
	return err.Error()
}
