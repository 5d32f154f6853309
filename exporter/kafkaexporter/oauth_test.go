package kafkaexporter

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"gopkg.in/yaml.v3"
)

// idp is a token endpoint for the token source's tests: it checks the
// client's credentials and answers what answer says.
type idp struct {
	*httptest.Server
	requests atomic.Int64
	mu       sync.Mutex
	forms    []map[string]string // each request's form, with "basic:" for Basic auth
	answer   func(n int64, w http.ResponseWriter)
}

func newIDP(t *testing.T, tlsServer bool, answer func(n int64, w http.ResponseWriter)) *idp {
	p := &idp{answer: answer}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := p.requests.Add(1)
		r.ParseForm()
		f := map[string]string{}
		for k := range r.PostForm {
			f[k] = r.PostForm.Get(k)
		}
		if u, pw, ok := r.BasicAuth(); ok {
			f["basic:"] = u + ":" + pw
		}
		p.mu.Lock()
		p.forms = append(p.forms, f)
		p.mu.Unlock()
		p.answer(n, w)
	})
	if tlsServer {
		p.Server = httptest.NewTLSServer(h)
	} else {
		p.Server = httptest.NewServer(h)
	}
	t.Cleanup(p.Close)
	return p
}

func (p *idp) form(i int) map[string]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.forms[i]
}

func tokenJSON(tok string, expiresIn any) func(int64, http.ResponseWriter) {
	return func(n int64, w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"access_token": fmt.Sprintf("%s-%d", tok, n), "token_type": "Bearer", "expires_in": expiresIn})
	}
}

func oauthCfg(endpoint string) OAuthConfig {
	return OAuthConfig{TokenEndpoint: endpoint, ClientID: "ferry agent", ClientSecret: "s3cret&=", ClientAuth: "basic", Timeout: 5 * time.Second}
}

func newTS(t *testing.T, c OAuthConfig) *tokenSource {
	t.Helper()
	if errs := c.problems(); len(errs) > 0 {
		t.Fatal(errs)
	}
	ts, err := newTokenSource(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ts.close)
	return ts
}

// The client-credentials request as RFC 6749 4.4 has it, with the client
// authenticated by HTTP Basic (each part form-encoded, 2.3.1) or in the
// form; the token is kept while valid: a second connection costs no request.
func TestOAuthRequestAndCache(t *testing.T) {
	for _, auth := range []string{"basic", "post"} {
		t.Run(auth, func(t *testing.T) {
			p := newIDP(t, false, tokenJSON("tok", 3600))
			c := oauthCfg(p.URL)
			c.ClientAuth, c.Scope, c.Audience = auth, "kafka:write", "kafka-cluster"
			ts := newTS(t, c)
			for i := 0; i < 3; i++ {
				tok, err := ts.token(context.Background())
				if err != nil || tok != "tok-1" {
					t.Fatalf("token %q, %v", tok, err)
				}
			}
			if n := p.requests.Load(); n != 1 {
				t.Fatalf("%d requests for one valid token", n)
			}
			f := p.form(0)
			want := map[string]string{"grant_type": "client_credentials", "scope": "kafka:write", "audience": "kafka-cluster"}
			if auth == "basic" {
				want["basic:"] = "ferry+agent:s3cret%26%3D"
			} else {
				want["client_id"], want["client_secret"] = "ferry agent", "s3cret&="
			}
			if fmt.Sprint(f) != fmt.Sprint(want) {
				t.Fatalf("request %v, want %v", f, want)
			}
		})
	}
}

// Many connections authenticating at once while no token is held share one
// request to the provider.
func TestOAuthOneRequestForManyConnections(t *testing.T) {
	release := make(chan struct{})
	p := newIDP(t, false, func(n int64, w http.ResponseWriter) {
		<-release
		tokenJSON("tok", 60)(n, w)
	})
	ts := newTS(t, oauthCfg(p.URL))
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if tok, err := ts.token(context.Background()); err != nil || tok != "tok-1" {
				errs <- fmt.Errorf("%q %v", tok, err)
			}
		}()
	}
	time.Sleep(100 * time.Millisecond)
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := p.requests.Load(); n != 1 {
		t.Fatalf("%d requests", n)
	}
}

// A token is replaced in the background at about 80% of its lifetime, with
// no connection asking: a broker's re-authentication finds a fresh one.
func TestOAuthRefreshedBeforeExpiry(t *testing.T) {
	p := newIDP(t, false, tokenJSON("tok", 5)) // the shortest lifetime taken (minTokenLife)
	ts := newTS(t, oauthCfg(p.URL))
	start := time.Now()
	if tok, err := ts.token(context.Background()); err != nil || tok != "tok-1" {
		t.Fatalf("%q %v", tok, err)
	}
	for p.requests.Load() < 2 {
		if time.Since(start) > 8*time.Second {
			t.Fatal("no refresh within 8 s of a 5 s token")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if d := time.Since(start); d < 3500*time.Millisecond || d > 4500*time.Millisecond {
		t.Errorf("refreshed after %v, want about 3.75-4 s", d)
	}
	// The refreshed token is there before the first one expires.
	time.Sleep(50 * time.Millisecond)
	if tok, _ := ts.token(context.Background()); tok == "tok-1" {
		t.Fatal("still the first token after the refresh")
	}
}

// A refused client is a clear error naming the provider's error code and
// the settings to check, never the secret; it is not asked again at once
// (backoff), and the client secret file is read again at the next request.
func TestOAuthRefusedClientAndRotatedSecret(t *testing.T) {
	secretFile := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(secretFile, []byte("wrong-secret\n"), 0o600)
	p := newIDP(t, false, nil)
	p.answer = func(n int64, w http.ResponseWriter) {
		if p.form(int(n) - 1)["basic:"] != "ferry:right-secret" {
			w.WriteHeader(http.StatusUnauthorized)
			w.Write([]byte(`{"error":"invalid_client","error_description":"Invalid client\nsecret"}`))
			return
		}
		tokenJSON("tok", 60)(n, w)
	}
	c := oauthCfg(p.URL)
	c.ClientID, c.ClientSecret, c.ClientSecretFile = "ferry", "", secretFile
	ts := newTS(t, c)
	_, err := ts.token(context.Background())
	if err == nil {
		t.Fatal("a refused client got a token")
	}
	msg := err.Error()
	for _, w := range []string{"refused client \"ferry\"", "HTTP 401", "invalid_client", "Invalid client secret", "client_id and the client secret"} {
		if !strings.Contains(msg, w) {
			t.Errorf("error %q lacks %q", msg, w)
		}
	}
	if strings.Contains(msg, "wrong-secret") {
		t.Fatal("the secret is in the error")
	}
	if _, err2 := ts.token(context.Background()); err2 == nil || p.requests.Load() != 1 {
		t.Fatalf("asked again at once: %d requests, %v", p.requests.Load(), err2)
	}
	os.WriteFile(secretFile, []byte("right-secret"), 0o600)
	ts.mu.Lock()
	ts.retryAt = time.Time{} // the backoff has passed
	ts.mu.Unlock()
	if tok, err := ts.token(context.Background()); err != nil || tok != "tok-2" {
		t.Fatalf("after the secret file was fixed: %q %v", tok, err)
	}
}

// What a token endpoint answers is bounded, checked and never trusted to
// be a well-formed bearer token.
func TestOAuthHostileAnswers(t *testing.T) {
	cases := []struct {
		name, body, want string
	}{
		{"huge", `{"access_token":"` + strings.Repeat("a", 300<<10) + `"}`, "more than 256 KiB"},
		{"not json", `<html>`, "not JSON"},
		{"no token", `{"token_type":"Bearer"}`, "without an access_token"},
		{"mac token", `{"access_token":"x","token_type":"mac"}`, `"mac" token`},
		{"control byte", `{"access_token":"a\u0001b"}`, "byte a bearer token cannot hold"},
		{"bad lifetime", `{"access_token":"a","expires_in":"soon"}`, "expires_in"},
		{"negative lifetime", `{"access_token":"a","expires_in":-5}`, "expires_in"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := newIDP(t, false, func(_ int64, w http.ResponseWriter) { w.Write([]byte(c.body)) })
			_, err := newTS(t, oauthCfg(p.URL)).token(context.Background())
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want %q", err, c.want)
			}
		})
	}
}

// expires_in as a string (some providers), and a JWT's exp when the answer
// has no expires_in.
func TestOAuthLifetime(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	c := oauthCfg("https://idp.example/token")
	if _, life, err := parseTokenResponse(c, 200, []byte(`{"access_token":"a","expires_in":"3599"}`), now); err != nil || life != 3599*time.Second {
		t.Fatalf("%v %v", life, err)
	}
	claims := base64.RawURLEncoding.EncodeToString([]byte(fmt.Sprintf(`{"sub":"ferry","exp":%d}`, now.Unix()+120)))
	jwt := "eyJhbGciOiJSUzI1NiJ9." + claims + ".c2ln"
	if _, life, err := parseTokenResponse(c, 200, []byte(`{"access_token":"`+jwt+`"}`), now); err != nil || life != 120*time.Second {
		t.Fatalf("JWT exp: %v %v", life, err)
	}
	if _, life, err := parseTokenResponse(c, 200, []byte(`{"access_token":"opaque"}`), now); err != nil || life != 5*time.Minute {
		t.Fatalf("opaque without expires_in: %v %v", life, err)
	}
}

// The token endpoint over TLS with its own CA (ca_file); without it the
// system's roots refuse the test CA.
func TestOAuthEndpointCA(t *testing.T) {
	p := newIDP(t, true, tokenJSON("tok", 60))
	ca := filepath.Join(t.TempDir(), "ca.pem")
	os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.Certificate().Raw}), 0o600)
	c := oauthCfg(p.URL)
	if _, err := newTS(t, c).token(context.Background()); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("untrusted endpoint: %v", err)
	}
	c.CAFile = ca
	if tok, err := newTS(t, c).token(context.Background()); err != nil || tok == "" {
		t.Fatalf("with ca_file: %q %v", tok, err)
	}
}

// Settings are checked before any request; the secret never prints.
func TestOAuthConfigChecked(t *testing.T) {
	ok := SASLConfig{Mechanism: "OAUTHBEARER", OAuthBearer: oauthCfg("https://idp.example/oauth2/token")}
	ok.OAuthBearer.Extensions = map[string]string{"logicalCluster": "lkc-123", "identityPoolId": "pool-Ab1"}
	if err := ok.validate(); err != nil {
		t.Fatal(err)
	}
	y, _ := yaml.Marshal(ok)
	j, _ := json.Marshal(ok)
	if s := fmt.Sprintf("%v %+v %s %s", ok, ok, y, j); strings.Contains(s, "s3cret") {
		t.Fatalf("client secret printed: %s", s)
	}
	bad := func(f func(*SASLConfig)) error {
		c := ok
		c.OAuthBearer.Extensions = nil
		f(&c)
		return c.validate()
	}
	for want, f := range map[string]func(*SASLConfig){
		"token_endpoint: required":      func(c *SASLConfig) { c.OAuthBearer.TokenEndpoint = "" },
		"must be https":                 func(c *SASLConfig) { c.OAuthBearer.TokenEndpoint = "http://idp.example/token" },
		"client_id: required":           func(c *SASLConfig) { c.OAuthBearer.ClientID = "" },
		"set one of client_secret":      func(c *SASLConfig) { c.OAuthBearer.ClientSecretFile = "/x" },
		"not one of basic, post":        func(c *SASLConfig) { c.OAuthBearer.ClientAuth = "jwt" },
		"timeout":                       func(c *SASLConfig) { c.OAuthBearer.Timeout = 0 },
		`key "auth" is not allowed`:     func(c *SASLConfig) { c.OAuthBearer.Extensions = map[string]string{"auth": "x"} },
		"letters only":                  func(c *SASLConfig) { c.OAuthBearer.Extensions = map[string]string{"a_b": "x"} },
		"printable ASCII only":          func(c *SASLConfig) { c.OAuthBearer.Extensions = map[string]string{"ab": "x\x01"} },
		"username and password are not": func(c *SASLConfig) { c.Username = "u" },
		"mechanism is not OAUTHBEARER":  func(c *SASLConfig) { c.Mechanism = "PLAIN"; c.Username, c.Password = "u", "p" },
	} {
		if err := bad(f); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("want %q, got %v", want, err)
		}
	}
	// http is fine on loopback (a local identity provider or proxy).
	if err := bad(func(c *SASLConfig) { c.OAuthBearer.TokenEndpoint = "http://127.0.0.1:8080/token" }); err != nil {
		t.Fatal(err)
	}
}

// A reload that leaves the OAUTHBEARER settings alone keeps the token (no
// request); one that changes them asks again.
func TestOAuthReloadKeepsToken(t *testing.T) {
	p := newIDP(t, false, tokenJSON("tok", 3600))
	s := SASLConfig{Mechanism: "OAUTHBEARER", OAuthBearer: oauthCfg(p.URL)}
	sec, err := newSecurity(TLSConfig{}, s, time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sec.close()
	tok := func() string {
		v, err := sec.cur.Load().oauth.token(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if v := tok(); v != "tok-1" {
		t.Fatal(v)
	}
	if err := sec.set(TLSConfig{MinVersion: "1.3"}, s); err != nil {
		t.Fatal(err)
	}
	if v := tok(); v != "tok-1" {
		t.Fatalf("an unrelated reload cost a token: %s", v)
	}
	s.OAuthBearer.Scope = "other"
	if err := sec.set(TLSConfig{}, s); err != nil {
		t.Fatal(err)
	}
	if v := tok(); v != "tok-2" {
		t.Fatalf("changed settings kept the old token: %s", v)
	}
}

// A broker's refusal (RFC 7628 3.2.2: a JSON error as the challenge) is
// answered with %x01 so the broker ends with SASL_AUTHENTICATION_FAILED
// and its reason; the refused token is dropped unless it is fresh.
func TestOAuthBrokerRefusal(t *testing.T) {
	p := newIDP(t, false, tokenJSON("tok", 3600))
	sec, err := newSecurity(TLSConfig{}, SASLConfig{Mechanism: "OAUTHBEARER", OAuthBearer: oauthCfg(p.URL)}, time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sec.close()
	sess, first, err := mechanism{sec}.Authenticate(context.Background(), "127.0.0.1:9092")
	if err != nil || !strings.Contains(string(first), "auth=Bearer tok-1\x01") {
		t.Fatalf("initial response %q, %v", first, err)
	}
	done, out, err := sess.Challenge([]byte(`{"status":"invalid_token"}`))
	if done || string(out) != "\x01" || err != nil {
		t.Fatalf("refusal answered %v %q %v, want %%x01", done, out, err)
	}
	ts := sec.cur.Load().oauth
	if tok, _ := ts.token(context.Background()); tok != "tok-1" {
		t.Fatalf("a token refused in its first 10 s was dropped: %s", tok)
	}
	ts.mu.Lock()
	ts.issued = ts.issued.Add(-time.Minute)
	ts.mu.Unlock()
	sess, _, _ = mechanism{sec}.Authenticate(context.Background(), "127.0.0.1:9092")
	sess.Challenge([]byte(`{"status":"invalid_token"}`))
	if tok, _ := ts.token(context.Background()); tok != "tok-2" {
		t.Fatalf("an older refused token was kept: %s", tok)
	}
	// Accepted: the broker's empty answer ends the exchange.
	sess, _, _ = mechanism{sec}.Authenticate(context.Background(), "127.0.0.1:9092")
	if done, _, err := sess.Challenge(nil); !done || err != nil {
		t.Fatalf("acceptance: %v %v", done, err)
	}
}

// A connection that could not get a token fails with an error franz-go
// retries (like an unreachable broker), so records wait instead of
// failing while the provider is down or the secret is being fixed.
func TestOAuthNoTokenIsRetried(t *testing.T) {
	p := newIDP(t, false, func(_ int64, w http.ResponseWriter) { w.WriteHeader(http.StatusServiceUnavailable) })
	sec, err := newSecurity(TLSConfig{}, SASLConfig{Mechanism: "OAUTHBEARER", OAuthBearer: oauthCfg(p.URL)}, time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sec.close()
	_, _, err = mechanism{sec}.Authenticate(context.Background(), "127.0.0.1:9092")
	if err == nil || !kgo.IsRetryableBrokerErr(err) || !strings.Contains(err.Error(), "is unavailable (retried with backoff): HTTP 503") {
		t.Fatalf("no token: %v (retryable %v)", err, kgo.IsRetryableBrokerErr(err))
	}
}
