// Package oauthtest is a small OAuth 2.0 identity provider for the tests
// of ferry's SASL OAUTHBEARER: a client-credentials token endpoint (RFC
// 6749 section 4.4) over HTTPS that issues RS256-signed JWTs, and the JWKS
// (RFC 7517) that Kafka's own validator
// (OAuthBearerValidatorCallbackHandler) checks their signatures with.
//
// It must be running before the broker starts, since the broker reads the
// JWKS at start-up: a test binary starts it from TestMain and passes
// JWKSURL to kafka-local start --oauth-jwks.
package oauthtest

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Audience is the aud claim of a token when the request names no
// audience; kafka-local's OAUTHBEARER listener expects it.
const Audience = "kafka-local"

// Server is the identity provider.
type Server struct {
	// TokenURL is the HTTPS token endpoint; CAFile the PEM certificate
	// it is served with (its own CA).
	TokenURL, CAFile string
	// JWKSURL is the key set, over plain HTTP on loopback (what the
	// broker fetches).
	JWKSURL string
	// Issuer is the iss claim of every token.
	Issuer string

	token, jwks *httptest.Server
	key         *rsa.PrivateKey
	kid         string

	mu       sync.Mutex
	clients  map[string]*client
	failures map[string]int
	down     bool
}

type client struct {
	secret   string
	life     time.Duration
	requests int
}

// Start starts both endpoints; dir receives the CA file.
func Start(dir string) (*Server, error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	s := &Server{key: key, kid: "ferry-test-1", clients: map[string]*client{}, failures: map[string]int{}}
	s.jwks = httptest.NewServer(http.HandlerFunc(s.serveJWKS))
	s.token = httptest.NewUnstartedServer(http.HandlerFunc(s.serveToken))
	s.token.StartTLS()
	s.JWKSURL = s.jwks.URL + "/jwks.json"
	s.TokenURL = s.token.URL + "/oauth2/token"
	s.Issuer = s.token.URL
	s.CAFile = filepath.Join(dir, "idp-ca.pem")
	if err := os.WriteFile(s.CAFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.token.Certificate().Raw}), 0o600); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// Close stops both endpoints.
func (s *Server) Close() {
	s.token.Close()
	s.jwks.Close()
}

// AddClient registers a client whose tokens live for life.
func (s *Server) AddClient(id, secret string, life time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.clients[id] = &client{secret: secret, life: life}
}

// Requests is how many tokens the client was issued.
func (s *Server) Requests(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.clients[id]; c != nil {
		return c.requests
	}
	return 0
}

// SetDown makes the token endpoint answer 503 temporarily_unavailable
// (an outage of the provider) until SetDown(false).
func (s *Server) SetDown(down bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down = down
}

// Refused is how many requests for the client were refused (wrong secret).
func (s *Server) Refused(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failures[id]
}

func (s *Server) serveJWKS(w http.ResponseWriter, _ *http.Request) {
	b64 := base64.RawURLEncoding.EncodeToString
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"keys": []map[string]string{{
		"kty": "RSA", "use": "sig", "alg": "RS256", "kid": s.kid,
		"n": b64(s.key.N.Bytes()), "e": b64(big.NewInt(int64(s.key.E)).Bytes()),
	}}})
}

// serveToken is the client-credentials grant with client_secret_basic or
// client_secret_post, answering as RFC 6749 sections 5.1 and 5.2 say.
func (s *Server) serveToken(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if r.Method != http.MethodPost || r.ParseForm() != nil {
		oauthError(w, http.StatusBadRequest, "invalid_request", "POST a form")
		return
	}
	if r.PostForm.Get("grant_type") != "client_credentials" {
		oauthError(w, http.StatusBadRequest, "unsupported_grant_type", "client_credentials only")
		return
	}
	id, secret := r.PostForm.Get("client_id"), r.PostForm.Get("client_secret")
	if u, p, ok := r.BasicAuth(); ok {
		// RFC 6749 2.3.1: form-encoded before Basic.
		id, secret = unescape(u), unescape(p)
	}
	s.mu.Lock()
	if s.down {
		s.mu.Unlock()
		oauthError(w, http.StatusServiceUnavailable, "temporarily_unavailable", "the provider is down")
		return
	}
	c := s.clients[id]
	if c == nil || c.secret != secret {
		s.failures[id]++
		s.mu.Unlock()
		oauthError(w, http.StatusUnauthorized, "invalid_client", "client authentication failed")
		return
	}
	c.requests++
	life := c.life
	s.mu.Unlock()
	// The audience asked for, as Auth0 and Okta issue it; by default the
	// broker's.
	aud := Audience
	if a := r.PostForm.Get("audience"); a != "" {
		aud = a
	}
	now := time.Now()
	claims := map[string]any{"iss": s.Issuer, "sub": id, "aud": aud, "iat": now.Unix(), "nbf": now.Unix() - 5,
		"exp": now.Add(life).Unix(), "scope": r.PostForm.Get("scope")}
	tok, err := s.sign(claims)
	if err != nil {
		oauthError(w, http.StatusInternalServerError, "server_error", err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	json.NewEncoder(w).Encode(map[string]any{"access_token": tok, "token_type": "Bearer", "expires_in": int(life / time.Second)})
}

// sign makes a compact JWS (RFC 7515) with RS256.
func (s *Server) sign(claims map[string]any) (string, error) {
	h, _ := json.Marshal(map[string]string{"alg": "RS256", "typ": "JWT", "kid": s.kid})
	c, err := json.Marshal(claims)
	if err != nil {
		return "", err
	}
	b64 := base64.RawURLEncoding.EncodeToString
	in := b64(h) + "." + b64(c)
	sum := sha256.Sum256([]byte(in))
	sig, err := rsa.SignPKCS1v15(rand.Reader, s.key, crypto.SHA256, sum[:])
	if err != nil {
		return "", err
	}
	return in + "." + b64(sig), nil
}

func oauthError(w http.ResponseWriter, status int, code, desc string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"error":%q,"error_description":%q}`, code, desc)
}

func unescape(s string) string {
	out, err := url.QueryUnescape(s)
	if err != nil {
		return s
	}
	return out
}
