package kafkaexporter

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ferryhq/ferry/tlsfiles"
)

// OAuthConfig is SASL OAUTHBEARER with tokens from an OAuth 2.0
// client-credentials grant (RFC 6749 section 4.4): ferry asks the identity
// provider's token endpoint for an access token and hands it to the
// brokers (exporter.kafka.sasl.oauthbearer).
type OAuthConfig struct {
	// TokenEndpoint is the provider's token URL. https, or http on a
	// loopback address only (the client secret crosses it).
	TokenEndpoint string `yaml:"token_endpoint"`
	ClientID      string `yaml:"client_id"`
	// ClientSecret, or ClientSecretFile holding it (trailing newline
	// ignored; read at every token request, so a rotated file needs no
	// reload).
	ClientSecret     Secret `yaml:"client_secret"`
	ClientSecretFile string `yaml:"client_secret_file"`
	// ClientAuth: "basic" sends the client's id and secret as HTTP Basic
	// authentication (RFC 6749 section 2.3.1, what every provider must
	// accept); "post" sends them in the form body (client_secret_post).
	ClientAuth string `yaml:"client_auth"`
	// Scope and Audience are sent with the request when set (audience is
	// not in RFC 6749 but Auth0, Okta and Keycloak read it).
	Scope    string `yaml:"scope"`
	Audience string `yaml:"audience"`
	// Extensions are SASL extensions sent to the broker with the token
	// (RFC 7628 section 3.1), e.g. Confluent Cloud's logicalCluster and
	// identityPoolId.
	Extensions map[string]string `yaml:"extensions"`
	// CAFile: PEM certificates the token endpoint's must chain to; empty:
	// the system's roots.
	CAFile string `yaml:"ca_file"`
	// Timeout bounds one token request.
	Timeout time.Duration `yaml:"timeout"`
}

// maxTokenResponse bounds what ferry reads of a token endpoint's answer:
// an access token is a few KiB; a provider (or something in its place)
// answering more is cut off before memory is spent on it.
const maxTokenResponse = 256 << 10

func (c *OAuthConfig) problems() []error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.TokenEndpoint == "" {
		add("sasl.oauthbearer.token_endpoint: required for OAUTHBEARER")
	} else if u, err := url.Parse(c.TokenEndpoint); err != nil || u.Host == "" {
		add("sasl.oauthbearer.token_endpoint: %q is not a URL", c.TokenEndpoint)
	} else if u.Scheme != "https" && !(u.Scheme == "http" && loopback(u.Hostname())) {
		add("sasl.oauthbearer.token_endpoint: %q must be https (http only on a loopback address: the client secret crosses it)", c.TokenEndpoint)
	}
	if c.ClientID == "" {
		add("sasl.oauthbearer.client_id: required for OAUTHBEARER")
	}
	if (c.ClientSecret == "") == (c.ClientSecretFile == "") {
		add("sasl.oauthbearer: set one of client_secret and client_secret_file")
	}
	if c.ClientAuth != "basic" && c.ClientAuth != "post" {
		add("sasl.oauthbearer.client_auth: %q is not one of basic, post", c.ClientAuth)
	}
	if c.Timeout < 100*time.Millisecond || c.Timeout > 5*time.Minute {
		add("sasl.oauthbearer.timeout: %s is outside 100ms..5m", c.Timeout)
	}
	for k, v := range c.Extensions {
		if err := checkExtension(k, v); err != nil {
			add("sasl.oauthbearer.extensions: %w", err)
		}
	}
	return errs
}

// checkExtension applies RFC 7628's grammar (key = 1*ALPHA, value =
// *(VCHAR / SP / HTAB / CR / LF)); "auth" is the token's own key.
func checkExtension(k, v string) error {
	if k == "" || k == "auth" {
		return fmt.Errorf("key %q is not allowed", k)
	}
	for _, r := range k {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return fmt.Errorf("key %q: letters only (RFC 7628)", k)
		}
	}
	for _, r := range v {
		if !(r >= 0x21 && r <= 0x7e || r == ' ' || r == '\t' || r == '\r' || r == '\n') {
			return fmt.Errorf("value of %q: printable ASCII only (RFC 7628)", k)
		}
	}
	return nil
}

func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// secret is the client secret: inline, or the file's content now.
func (c *OAuthConfig) secret() (string, error) {
	if c.ClientSecretFile == "" {
		return string(c.ClientSecret), nil
	}
	b, err := os.ReadFile(c.ClientSecretFile)
	if err != nil {
		return "", fmt.Errorf("sasl.oauthbearer.client_secret_file: %w", err)
	}
	s := strings.TrimRight(string(b), "\r\n")
	if s == "" {
		return "", fmt.Errorf("sasl.oauthbearer.client_secret_file %s is empty", c.ClientSecretFile)
	}
	return s, nil
}

// tokenSource hands out the current access token to each connection that
// authenticates, fetching a new one before the current one expires.
//
// franz-go asks for a token whenever it (re)authenticates a connection,
// from its connection goroutine: a produce call never waits here. A token
// still valid is returned at once; one past 80% of its lifetime (less up to
// 5% of jitter, so a fleet does not ask the provider in step) is replaced
// in the background, so that a broker's re-authentication
// (connections.max.reauth.ms, KIP-368) finds a fresh token. Only when no
// valid token is held does a connection wait, for one request shared by
// every connection waiting. A failed request is retried with backoff (1 s
// doubling to 10 s as Kafka's own client does, with jitter); in between,
// connections get the error at once instead of each asking the provider
// again.
type tokenSource struct {
	cfg   OAuthConfig
	files *tlsfiles.Loader // nil: the system's roots
	// fetched counts token requests by result ("ok", "error"); nil in
	// `ferry validate`.
	fetched func(result string)
	// warn reports a failed background refresh (the token in hand is
	// still valid, so no connection fails yet).
	warn func(err error)
	now  func() time.Time

	mu        sync.Mutex
	tok       string
	exp       time.Time // when tok stops being valid
	issued    time.Time
	refreshAt time.Time // when to replace it
	fetching  chan struct{}
	lastErr   error
	retryAt   time.Time
	failures  int
	timer     *time.Timer
	closed    bool
}

func newTokenSource(c OAuthConfig) (*tokenSource, error) {
	ts := &tokenSource{cfg: c, now: time.Now}
	if c.CAFile != "" {
		var err error
		if ts.files, err = tlsfiles.New(tlsfiles.Files{CA: c.CAFile, Prefix: "sasl.oauthbearer."}); err != nil {
			return nil, err
		}
	}
	if _, err := c.secret(); err != nil {
		return nil, err
	}
	return ts, nil
}

// close stops background refreshes (a reload replaced the settings, or the
// exporter stopped); a connection still holding ts may fetch on demand.
func (ts *tokenSource) close() {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	ts.closed = true
	if ts.timer != nil {
		ts.timer.Stop()
	}
}

// invalidate drops tok, which a broker refused, so that the next
// connection asks for another; a token issued in the last 10 s is kept
// (the broker refusing a fresh token is a setting, such as the audience,
// that a new token will not fix, and the provider is not asked again at
// each reconnection).
func (ts *tokenSource) invalidate(tok string) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if tok != "" && ts.tok == tok && ts.now().Sub(ts.issued) > 10*time.Second {
		ts.tok = ""
	}
}

// retryNow lets the next connection ask the provider at once, whatever
// the backoff after failures says.
func (ts *tokenSource) retryNow() {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	ts.retryAt = time.Time{}
}

// token returns a valid access token, waiting for a request to the
// provider only when none is held. ctx bounds the wait, not the request,
// which other connections may be waiting on too.
func (ts *tokenSource) token(ctx context.Context) (string, error) {
	ts.mu.Lock()
	for {
		now := ts.now()
		if ts.tok != "" && now.Before(ts.exp) {
			if !now.Before(ts.refreshAt) && ts.fetching == nil && !now.Before(ts.retryAt) {
				ts.startFetch()
			}
			tok := ts.tok
			ts.mu.Unlock()
			return tok, nil
		}
		if ts.fetching == nil {
			if ts.lastErr != nil && now.Before(ts.retryAt) {
				err := ts.lastErr
				ts.mu.Unlock()
				return "", err
			}
			ts.startFetch()
		}
		done := ts.fetching
		ts.mu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
			return "", ctx.Err()
		}
		ts.mu.Lock()
		if ts.tok == "" || !ts.now().Before(ts.exp) {
			// The request this connection waited for failed.
			err := ts.lastErr
			ts.mu.Unlock()
			if err == nil {
				err = errors.New("OAUTHBEARER: no token")
			}
			return "", err
		}
	}
}

// startFetch runs one token request in the background; ts.mu is held.
func (ts *tokenSource) startFetch() {
	done := make(chan struct{})
	ts.fetching = done
	go func() {
		tok, life, err := ts.fetch()
		ts.mu.Lock()
		defer ts.mu.Unlock()
		now := ts.now()
		if err != nil {
			ts.failures++
			ts.lastErr = err
			// 1s, 2s, 4s ... 10s (the default of Kafka's
			// sasl.login.retry.backoff.max.ms), each between half and
			// all of it.
			back := time.Second << min(ts.failures-1, 6)
			back = min(back, 10*time.Second)
			back = back/2 + rand.N(back/2+1)
			ts.retryAt = now.Add(back)
			if ts.tok != "" && now.Before(ts.exp) {
				if ts.warn != nil {
					ts.warn(err)
				}
				ts.schedule(back)
			}
		} else {
			ts.tok, ts.exp, ts.issued = tok, now.Add(life), now
			ts.failures, ts.lastErr, ts.retryAt = 0, nil, time.Time{}
			// 80% of the lifetime, less up to 5% of jitter.
			in := life*8/10 - rand.N(life/20+1)
			ts.refreshAt = now.Add(in)
			ts.schedule(in)
		}
		ts.fetching = nil
		close(done)
	}()
}

// schedule refreshes in the background after d (so a token is replaced
// even while no connection authenticates); ts.mu is held.
func (ts *tokenSource) schedule(d time.Duration) {
	if ts.closed {
		return
	}
	if ts.timer != nil {
		ts.timer.Stop()
	}
	ts.timer = time.AfterFunc(max(d, 100*time.Millisecond), func() {
		ts.mu.Lock()
		defer ts.mu.Unlock()
		if !ts.closed && ts.fetching == nil {
			ts.startFetch()
		}
	})
}

// fetch asks the token endpoint for a token once: the token and how long
// it is valid.
func (ts *tokenSource) fetch() (string, time.Duration, error) {
	tok, life, err := ts.request()
	if ts.fetched != nil {
		if err != nil {
			ts.fetched("error")
		} else {
			ts.fetched("ok")
		}
	}
	return tok, life, err
}

func (ts *tokenSource) request() (string, time.Duration, error) {
	c := ts.cfg
	secret, err := c.secret()
	if err != nil {
		return "", 0, fmt.Errorf("OAUTHBEARER: %w", err)
	}
	form := url.Values{"grant_type": {"client_credentials"}}
	if c.Scope != "" {
		form.Set("scope", c.Scope)
	}
	if c.Audience != "" {
		form.Set("audience", c.Audience)
	}
	if c.ClientAuth == "post" {
		form.Set("client_id", c.ClientID)
		form.Set("client_secret", secret)
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.TokenEndpoint, strings.NewReader(form.Encode()))
	if err != nil {
		return "", 0, fmt.Errorf("OAUTHBEARER: token endpoint: %w", err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "application/json")
	if c.ClientAuth == "basic" {
		// RFC 6749 section 2.3.1: each part form-encoded first.
		req.SetBasicAuth(url.QueryEscape(c.ClientID), url.QueryEscape(secret))
	}
	tr := &http.Transport{Proxy: http.ProxyFromEnvironment, TLSHandshakeTimeout: c.Timeout, DisableKeepAlives: true}
	if ts.files != nil {
		m, err := ts.files.Load()
		if err != nil {
			return "", 0, fmt.Errorf("OAUTHBEARER: %w", err)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: m.Pool, MinVersion: tls.VersionTLS12}
	}
	hc := &http.Client{Transport: tr, Timeout: c.Timeout,
		// A redirect would carry the credentials elsewhere.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := hc.Do(req)
	if err != nil {
		// url.Error names the URL, never the body or the credentials.
		return "", 0, fmt.Errorf("OAUTHBEARER: token endpoint: %w", err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, maxTokenResponse+1))
	if err != nil {
		return "", 0, fmt.Errorf("OAUTHBEARER: token endpoint %s: reading the answer: %w", c.TokenEndpoint, err)
	}
	if len(body) > maxTokenResponse {
		return "", 0, fmt.Errorf("OAUTHBEARER: token endpoint %s answered more than %d KiB", c.TokenEndpoint, maxTokenResponse>>10)
	}
	return parseTokenResponse(c, res.StatusCode, body, ts.now())
}

// tokenError is the token endpoint refusing the request (RFC 6749
// section 5.2), so readiness can say which setting to check.
type tokenError struct {
	endpoint, clientID string
	status             int
	code, desc         string
}

func (e *tokenError) Error() string {
	s := fmt.Sprintf("OAUTHBEARER: token endpoint %s refused client %q: HTTP %d", e.endpoint, e.clientID, e.status)
	if e.status >= 500 || e.status == http.StatusTooManyRequests {
		s = fmt.Sprintf("OAUTHBEARER: token endpoint %s is unavailable (retried with backoff): HTTP %d", e.endpoint, e.status)
	}
	if e.code != "" {
		s += " " + e.code
	}
	if e.desc != "" {
		s += " (" + e.desc + ")"
	}
	switch e.code {
	case "invalid_client", "unauthorized_client":
		s += "; check sasl.oauthbearer.client_id and the client secret"
	case "invalid_scope":
		s += "; check sasl.oauthbearer.scope"
	}
	return s
}

// parseTokenResponse reads a token endpoint's answer (RFC 6749 section
// 5.1). The lifetime is expires_in; without it, the JWT's exp claim; without
// either, 5 minutes (the token is then simply asked for again).
func parseTokenResponse(c OAuthConfig, status int, body []byte, now time.Time) (string, time.Duration, error) {
	var r struct {
		AccessToken string          `json:"access_token"`
		TokenType   string          `json:"token_type"`
		ExpiresIn   json.RawMessage `json:"expires_in"`
		Error       string          `json:"error"`
		Description string          `json:"error_description"`
	}
	jerr := json.Unmarshal(body, &r)
	if status != http.StatusOK {
		return "", 0, &tokenError{endpoint: c.TokenEndpoint, clientID: c.ClientID, status: status, code: printable(r.Error), desc: printable(r.Description)}
	}
	if jerr != nil {
		return "", 0, fmt.Errorf("OAUTHBEARER: token endpoint %s: the answer is not JSON: %v", c.TokenEndpoint, jerr)
	}
	if r.AccessToken == "" {
		return "", 0, fmt.Errorf("OAUTHBEARER: token endpoint %s answered without an access_token", c.TokenEndpoint)
	}
	if r.TokenType != "" && !strings.EqualFold(r.TokenType, "bearer") {
		return "", 0, fmt.Errorf("OAUTHBEARER: token endpoint %s issued a %q token, not a bearer token", c.TokenEndpoint, printable(r.TokenType))
	}
	for i := 0; i < len(r.AccessToken); i++ {
		// RFC 6750's b64token; above all no \x01, which ends the SASL field.
		if b := r.AccessToken[i]; b < 0x21 || b > 0x7e {
			return "", 0, fmt.Errorf("OAUTHBEARER: token endpoint %s issued a token with a byte a bearer token cannot hold", c.TokenEndpoint)
		}
	}
	life := time.Duration(0)
	if len(r.ExpiresIn) > 0 && string(r.ExpiresIn) != "null" {
		// A number, or (some providers) a number in a string.
		s := strings.Trim(string(r.ExpiresIn), `"`)
		n, err := strconv.ParseFloat(s, 64)
		if err != nil || n <= 0 || n > 366*24*3600 {
			return "", 0, fmt.Errorf("OAUTHBEARER: token endpoint %s: expires_in %.40q is not a lifetime in seconds", c.TokenEndpoint, s)
		}
		life = time.Duration(n * float64(time.Second))
	} else if exp, ok := jwtExp(r.AccessToken); ok {
		life = exp.Sub(now)
		if life <= 0 {
			return "", 0, fmt.Errorf("OAUTHBEARER: token endpoint %s issued a token that has already expired (check this host's clock)", c.TokenEndpoint)
		}
	} else {
		life = 5 * time.Minute
	}
	if life < minTokenLife {
		// Refreshed at 80% of its life, such a token would have ferry ask
		// the provider several times a second with no connection asking,
		// and expire on the wire: a misconfigured client or provider,
		// answered as a failure (backed off 1 s … 10 s) that readiness
		// and the log name.
		return "", 0, fmt.Errorf("OAUTHBEARER: token endpoint %s issued a token that lives %s, less than the %s ferry needs to use it before it expires (check the client's token lifetime at the provider, and this host's clock)",
			c.TokenEndpoint, life.Round(time.Millisecond), minTokenLife)
	}
	return r.AccessToken, life, nil
}

// minTokenLife is the shortest token lifetime taken: Kafka's own client
// waits at least sasl.login.refresh.min.period.seconds between refreshes;
// ferry refreshes at 80% of the lifetime, so this bounds the refreshes to
// one every 4 s a token source.
const minTokenLife = 5 * time.Second

// jwtExp is the exp claim of a JWT, unverified (the broker verifies it;
// ferry only needs to know when to ask again).
func jwtExp(tok string) (time.Time, bool) {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return time.Time{}, false
	}
	b, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return time.Time{}, false
	}
	var claims struct {
		Exp json.Number `json:"exp"`
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	if d.Decode(&claims) != nil || claims.Exp == "" {
		return time.Time{}, false
	}
	f, err := claims.Exp.Float64()
	if err != nil || f <= 0 {
		return time.Time{}, false
	}
	return time.Unix(int64(f), 0), true
}

// printable keeps an error text from a provider short and on one line.
func printable(s string) string {
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
}
