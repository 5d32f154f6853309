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
	"reflect"
	"strings"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/aws"
	"github.com/twmb/franz-go/pkg/sasl/oauth"
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
	// Mechanism: "" (none), PLAIN, SCRAM-SHA-256, SCRAM-SHA-512,
	// OAUTHBEARER (OAuthBearer) or AWS_MSK_IAM (AWSMSKIAM).
	Mechanism string `yaml:"mechanism"`
	Username  string `yaml:"username"`
	// Password, or PasswordFile holding it (trailing newline ignored; read
	// again at every connection, so a rotated file needs no reload).
	Password     Secret `yaml:"password"`
	PasswordFile string `yaml:"password_file"`
	// OAuthBearer: the client-credentials grant OAUTHBEARER takes its
	// tokens from (oauth.go).
	OAuthBearer OAuthConfig `yaml:"oauthbearer"`
	// AWSMSKIAM: the credentials AWS_MSK_IAM signs with (awsiam.go).
	AWSMSKIAM AWSConfig `yaml:"aws_msk_iam"`
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

func (c *SASLConfig) validate() error { return errors.Join(c.problems()...) }

// problems is every invalid SASL field, each its own error (so each is
// named by its full key).
func (c *SASLConfig) problems() []error {
	var errs []error
	userPass := c.Username != "" || c.Password != "" || c.PasswordFile != ""
	o := c.OAuthBearer
	oauthSet := o.TokenEndpoint != "" || o.ClientID != "" || o.ClientSecret != "" || o.ClientSecretFile != "" || o.Scope != "" || o.Audience != "" || len(o.Extensions) > 0 || o.CAFile != ""
	if oauthSet && c.Mechanism != "OAUTHBEARER" {
		errs = append(errs, errors.New("sasl.oauthbearer is set but sasl.mechanism is not OAUTHBEARER"))
	}
	if c.AWSMSKIAM != (AWSConfig{}) && c.Mechanism != "AWS_MSK_IAM" {
		errs = append(errs, errors.New("sasl.aws_msk_iam is set but sasl.mechanism is not AWS_MSK_IAM"))
	}
	switch c.Mechanism {
	case "":
		if userPass {
			errs = append(errs, errors.New("sasl: username or password set but sasl.mechanism is empty"))
		}
	case "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512":
		if c.Username == "" {
			errs = append(errs, fmt.Errorf("sasl.username: required for %s", c.Mechanism))
		}
		if (c.Password == "") == (c.PasswordFile == "") {
			errs = append(errs, fmt.Errorf("sasl: set one of sasl.password and sasl.password_file for %s", c.Mechanism))
		}
	case "OAUTHBEARER", "AWS_MSK_IAM":
		if userPass {
			errs = append(errs, fmt.Errorf("sasl: username and password are not used by %s (see sasl.%s)", c.Mechanism, map[string]string{"OAUTHBEARER": "oauthbearer", "AWS_MSK_IAM": "aws_msk_iam"}[c.Mechanism]))
		}
		if c.Mechanism == "OAUTHBEARER" {
			errs = append(errs, o.problems()...)
		} else {
			errs = append(errs, c.AWSMSKIAM.problems()...)
		}
	default:
		errs = append(errs, fmt.Errorf("sasl.mechanism: %q is not one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER, AWS_MSK_IAM", c.Mechanism))
	}
	return errs
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
	brokers     []string
	// fetched and warn are given to OAUTHBEARER's token source (metrics
	// and the log); nil in `ferry validate`.
	fetched func(result string)
	warn    func(err error)
	// authed counts each authentication begun (metrics); nil in tests.
	authed func()
}

type secState struct {
	tls   TLSConfig
	sasl  SASLConfig
	files *tlsfiles.Loader // nil without TLS
	oauth *tokenSource     // OAUTHBEARER only
}

// CheckFiles reads the TLS and SASL files as New does, so `ferry
// validate` finds a file that is missing or unreadable before `ferry run`
// does.
func (c *Config) CheckFiles() error {
	sec, err := newSecurity(c.TLS, c.SASL, c.DialTimeout, c.Brokers)
	if err == nil {
		sec.close()
	}
	return err
}

func newSecurity(t TLSConfig, s SASLConfig, dialTimeout time.Duration, brokers []string) (*security, error) {
	sec := &security{dialTimeout: dialTimeout, brokers: brokers}
	if err := sec.set(t, s); err != nil {
		return nil, err
	}
	return sec, nil
}

// set checks the settings (reading every file once) and makes them the
// ones the next connection uses; on error nothing changes. OAUTHBEARER's
// token is kept when its settings did not change (a reload of something
// else must not cost a token request); otherwise the next connection asks
// for a new one.
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
	old := sec.cur.Load()
	switch s.Mechanism {
	case "":
	case "OAUTHBEARER":
		if old != nil && old.oauth != nil && reflect.DeepEqual(old.sasl.OAuthBearer, s.OAuthBearer) {
			if _, err := s.OAuthBearer.secret(); err != nil {
				return err
			}
			// A reload is the operator saying "try now" (a fixed secret
			// file, a provider back up): the backoff does not delay it.
			old.oauth.retryNow()
			st.oauth = old.oauth
			break
		}
		ts, err := newTokenSource(s.OAuthBearer)
		if err != nil {
			return err
		}
		ts.fetched, ts.warn = sec.fetched, sec.warn
		st.oauth = ts
	case "AWS_MSK_IAM":
		if _, _, err := s.AWSMSKIAM.credentials(); err != nil {
			return err
		}
		if err := awsRegionKnown(sec.brokers); err != nil {
			return err
		}
	default:
		if _, err := s.password(); err != nil {
			return err
		}
	}
	sec.cur.Store(st)
	if old != nil && old.oauth != nil && old.oauth != st.oauth {
		old.oauth.close()
	}
	return nil
}

// close stops OAUTHBEARER's background token refreshes.
func (sec *security) close() {
	if st := sec.cur.Load(); st != nil && st.oauth != nil {
		st.oauth.close()
	}
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
	if m.sec.authed != nil {
		m.sec.authed()
	}
	st := m.sec.cur.Load()
	s := st.sasl
	var mech sasl.Mechanism
	switch s.Mechanism {
	case "OAUTHBEARER":
		ts := st.oauth
		var tok string
		mech = oauth.Oauth(func(ctx context.Context) (oauth.Auth, error) {
			var err error
			if tok, err = ts.token(ctx); err != nil {
				return oauth.Auth{}, noCredentials{err}
			}
			return oauth.Auth{Token: tok, Extensions: s.OAuthBearer.Extensions}, nil
		})
		sess, first, err := mech.Authenticate(ctx, host)
		if err != nil {
			return nil, nil, err
		}
		return &oauthSession{Session: sess, refused: func() { ts.invalidate(tok) }}, first, nil
	case "AWS_MSK_IAM":
		return aws.ManagedStreamingIAM(awsAuth(s.AWSMSKIAM)).Authenticate(ctx, host)
	}
	pass, err := s.password()
	if err != nil {
		return nil, nil, noCredentials{err}
	}
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

// noCredentials is why a connection could not authenticate before
// reaching the broker: no token (the identity provider down, a client
// secret being fixed), or a password or AWS credentials file unreadable.
// It is temporary in franz-go's sense (Temporary() true makes it a
// retryable broker error), so the client keeps the records and retries the
// connection as when a broker is unreachable, instead of failing them.
type noCredentials struct{ err error }

func (e noCredentials) Error() string   { return e.err.Error() }
func (e noCredentials) Unwrap() error   { return e.err }
func (e noCredentials) Temporary() bool { return true }

// oauthSession answers a broker's refusal of the token as RFC 7628
// section 3.2.2 asks (the server sends a JSON error as a challenge, the
// client answers %x01 and the server then fails the authentication), so
// the failure arrives as Kafka's SASL_AUTHENTICATION_FAILED with the
// broker's reason (franz-go's own session calls the challenge an error of
// its own, which neither readiness nor a retry recognizes). The refused
// token is dropped, so the next connection asks for a fresh one (a token
// revoked, or signed by a key the provider rotated).
type oauthSession struct {
	sasl.Session
	refused func()
}

func (s *oauthSession) Challenge(resp []byte) (bool, []byte, error) {
	if len(resp) != 0 {
		s.refused()
		return false, []byte{0x01}, nil
	}
	return s.Session.Challenge(resp)
}

// describe turns a connection error into the words readiness and the log
// give: what failed (TLS, or which SASL mechanism for which user) and why.
func (sec *security) describe(err error) string {
	st := sec.cur.Load()
	var te tlsError
	switch {
	case errors.Is(err, kerr.SaslAuthenticationFailed) && st.sasl.Mechanism == "OAUTHBEARER":
		return fmt.Sprintf("SASL OAUTHBEARER: the broker refused the token issued to client %q by %s (check sasl.oauthbearer.scope and audience against the broker's expected audience and issuer): %v",
			st.sasl.OAuthBearer.ClientID, st.sasl.OAuthBearer.TokenEndpoint, err)
	case errors.Is(err, kerr.SaslAuthenticationFailed) && st.sasl.Mechanism == "AWS_MSK_IAM":
		who := "unknown credentials"
		if a, from, cerr := st.sasl.AWSMSKIAM.credentials(); cerr == nil {
			who = fmt.Sprintf("access key %s from %s", a.AccessKey, from)
		}
		return fmt.Sprintf("SASL AWS_MSK_IAM authentication with %s failed (check the IAM policy's kafka-cluster:Connect and the credentials): %v", who, err)
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
