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
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/ferryhq/ferry/tlsfiles"
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
	if _, err := tlsfiles.Version(c.MinVersion); err != nil {
		return fmt.Errorf("tls.%w", err)
	}
	if !c.Enabled && (c.CAFile != "" || c.CertFile != "" || c.ServerName != "") {
		return errors.New("tls: files or server_name are set but tls.enabled is false")
	}
	return nil
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
	tls   TLSConfig
	sasl  SASLConfig
	files *tlsfiles.Loader // nil without TLS
}

// CheckFiles reads the TLS and SASL files as New does, so `ferry
// validate` finds a file that is missing or unreadable before `ferry run`
// does.
func (c *Config) CheckFiles() error {
	_, err := newSecurity(c.TLS, c.SASL, c.DialTimeout)
	return err
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
		var err error
		if st.files, err = tlsfiles.New(tlsfiles.Files{CA: t.CAFile, Cert: t.CertFile, Key: t.KeyFile, Prefix: "tls."}); err != nil {
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

// tlsConfig is the TLS configuration from the files as they are now.
func (st *secState) tlsConfig() (*tls.Config, error) {
	m, err := st.files.Load()
	if err != nil {
		return nil, err
	}
	minV, _ := tlsfiles.Version(st.tls.MinVersion)
	c := &tls.Config{MinVersion: minV, ServerName: st.tls.ServerName, RootCAs: m.Pool}
	if m.Cert != nil {
		c.Certificates = []tls.Certificate{*m.Cert}
	}
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
