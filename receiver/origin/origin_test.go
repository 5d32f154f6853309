package origin

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
)

// served is what one request through a wrapped handler did: which of the
// inner handler and the refusal ran, and the response.
type served struct {
	next, refused int
	rec           *httptest.ResponseRecorder
	refusedReq    *http.Request
}

// serve sends req through p.Wrap with an inner handler that answers 200
// "inner" and a refusal that answers 403 "refused", and counts the calls.
func serve(t *testing.T, p *Policy, req *http.Request) *served {
	t.Helper()
	s := &served{rec: httptest.NewRecorder()}
	inner := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		s.next++
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("inner"))
	})
	refuse := func(w http.ResponseWriter, r *http.Request) {
		s.refused++
		s.refusedReq = r
		w.WriteHeader(http.StatusForbidden)
		_, _ = w.Write([]byte("refused"))
	}
	p.Wrap(inner, refuse).ServeHTTP(s.rec, req)
	return s
}

func post(origin string) *http.Request {
	req := httptest.NewRequest(http.MethodPost, "/v1/traces", strings.NewReader("{}"))
	req.Header.Set("Content-Type", "text/plain")
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	return req
}

func preflight(origin, method, headers string) *http.Request {
	req := httptest.NewRequest(http.MethodOptions, "/v1/traces", nil)
	req.Header.Set("Origin", origin)
	if method != "" {
		req.Header.Set("Access-Control-Request-Method", method)
	}
	if headers != "" {
		req.Header.Set("Access-Control-Request-Headers", headers)
	}
	return req
}

// corsHeaders are the headers an allowed origin is answered with; a
// refused or origin-less request must carry none of them.
var corsHeaders = []string{"Access-Control-Allow-Origin", "Access-Control-Allow-Methods",
	"Access-Control-Allow-Headers", "Access-Control-Max-Age"}

func noCORS(t *testing.T, s *served) {
	t.Helper()
	for _, h := range corsHeaders {
		if v, ok := s.rec.Header()[h]; ok {
			t.Errorf("%s: %q set", h, v)
		}
	}
	if slices.Contains(s.rec.Header().Values("Vary"), "Origin") {
		t.Error("Vary: Origin set")
	}
}

// TestNoOriginPassesUntouched: programs (SDKs, curl) send no Origin, and
// are served whatever the policy, even with no origin configured, without
// CORS headers; an OPTIONS without Origin is not a preflight either.
func TestNoOriginPassesUntouched(t *testing.T) {
	for _, allowed := range [][]string{nil, {}, {"https://app.example.com"}, {"*"}} {
		for _, req := range []*http.Request{post(""), httptest.NewRequest(http.MethodOptions, "/v1/traces", nil)} {
			req.Header.Set("Access-Control-Request-Method", "POST")
			s := serve(t, New(allowed), req)
			if s.next != 1 || s.refused != 0 || s.rec.Code != http.StatusOK || s.rec.Body.String() != "inner" {
				t.Errorf("allowed %q, %s without Origin: next %d, refused %d, %d %q",
					allowed, req.Method, s.next, s.refused, s.rec.Code, s.rec.Body)
			}
			noCORS(t, s)
		}
	}
}

// TestRefusedWithoutAllowedOrigins: with no allowed_origins (the default)
// any request carrying an Origin goes to the refusal, never to the inner
// handler, and is not given CORS headers (the page cannot read the
// answer) — including the "null" origin of sandboxed frames and file://.
func TestRefusedWithoutAllowedOrigins(t *testing.T) {
	for _, allowed := range [][]string{nil, {}} {
		for _, o := range []string{"https://evil.example", "http://127.0.0.1:4318", "null"} {
			req := post(o)
			s := serve(t, New(allowed), req)
			if s.next != 0 || s.refused != 1 || s.rec.Code != http.StatusForbidden || s.rec.Body.String() != "refused" {
				t.Errorf("allowed %q, Origin %q: next %d, refused %d, %d %q",
					allowed, o, s.next, s.refused, s.rec.Code, s.rec.Body)
			}
			if s.refusedReq != req {
				t.Errorf("Origin %q: the refusal was not given the request", o)
			}
			noCORS(t, s)
		}
	}
}

// TestExactOrigins: a listed origin is served with its CORS headers (the
// request's own origin echoed, Vary: Origin so caches keep answers apart);
// the match is the whole origin, case-insensitively, so a different
// scheme, port, subdomain or a listed origin used as a prefix is refused.
func TestExactOrigins(t *testing.T) {
	p := New([]string{"https://app.example.com", "http://localhost:3000"})
	for _, o := range []string{"https://app.example.com", "HTTPS://App.Example.COM", "http://localhost:3000"} {
		s := serve(t, p, post(o))
		if s.next != 1 || s.refused != 0 || s.rec.Code != http.StatusOK {
			t.Errorf("Origin %q: next %d, refused %d, %d", o, s.next, s.refused, s.rec.Code)
		}
		if got := s.rec.Header().Get("Access-Control-Allow-Origin"); got != o {
			t.Errorf("Origin %q: Access-Control-Allow-Origin %q", o, got)
		}
		if !slices.Contains(s.rec.Header().Values("Vary"), "Origin") {
			t.Errorf("Origin %q: Vary %q", o, s.rec.Header().Values("Vary"))
		}
		// Not a preflight: no preflight answers on a POST.
		for _, h := range corsHeaders[1:] {
			if v := s.rec.Header().Get(h); v != "" {
				t.Errorf("Origin %q, POST: %s %q", o, h, v)
			}
		}
	}
	for _, o := range []string{
		"http://app.example.com",              // scheme
		"https://app.example.com:8443",        // port
		"https://www.app.example.com",         // subdomain
		"https://app.example.com.evil.net",    // listed origin as a prefix
		"https://app.example.co",              // listed origin extends it
		"https://app.example.com/",            // not an origin's form
		"http://localhost:30001",              // port prefix
		"http://localhost:3000 https://x.org", // a list is not a match
		"null",
	} {
		s := serve(t, p, post(o))
		if s.next != 0 || s.refused != 1 {
			t.Errorf("Origin %q: next %d, refused %d", o, s.next, s.refused)
		}
		noCORS(t, s)
	}
}

// TestWildcard: "*" among the origins allows any origin, echoed back (not
// "*"); only the whole entry "*" is a wildcard, a pattern like
// "https://*.example.com" is compared literally and allows nothing else.
func TestWildcard(t *testing.T) {
	for _, allowed := range [][]string{{"*"}, {"https://a.example", "*"}} {
		p := New(allowed)
		for _, o := range []string{"https://anything.example", "null", "http://127.0.0.1:8080"} {
			s := serve(t, p, post(o))
			if s.next != 1 || s.refused != 0 {
				t.Errorf("allowed %q, Origin %q: next %d, refused %d", allowed, o, s.next, s.refused)
			}
			if got := s.rec.Header().Get("Access-Control-Allow-Origin"); got != o {
				t.Errorf("allowed %q, Origin %q: Access-Control-Allow-Origin %q", allowed, o, got)
			}
		}
	}
	p := New([]string{"https://*.example.com"})
	for _, o := range []string{"https://a.example.com", "https://example.com"} {
		if s := serve(t, p, post(o)); s.next != 0 || s.refused != 1 {
			t.Errorf("pattern, Origin %q: next %d, refused %d", o, s.next, s.refused)
		}
	}
	if s := serve(t, p, post("https://*.example.com")); s.next != 1 || s.refused != 0 {
		t.Errorf("pattern as written: next %d, refused %d", s.next, s.refused)
	}
}

// TestPreflight: the CORS preflight of an allowed origin is answered by the
// wrapper (204, POST, the requested headers, an hour's cache) without the
// inner handler; a disallowed origin's preflight is refused; an OPTIONS
// without Access-Control-Request-Method is not a preflight and is served.
func TestPreflight(t *testing.T) {
	p := New([]string{"https://app.example.com"})
	const o = "https://app.example.com"

	s := serve(t, p, preflight(o, "POST", "content-type, x-ferry-token"))
	if s.next != 0 || s.refused != 0 || s.rec.Code != http.StatusNoContent || s.rec.Body.Len() != 0 {
		t.Fatalf("preflight: next %d, refused %d, %d %q", s.next, s.refused, s.rec.Code, s.rec.Body)
	}
	for h, want := range map[string]string{
		"Access-Control-Allow-Origin":  o,
		"Access-Control-Allow-Methods": "POST",
		"Access-Control-Allow-Headers": "content-type, x-ferry-token",
		"Access-Control-Max-Age":       "3600",
	} {
		if got := s.rec.Header().Get(h); got != want {
			t.Errorf("preflight: %s %q, want %q", h, got, want)
		}
	}
	if !slices.Contains(s.rec.Header().Values("Vary"), "Origin") {
		t.Errorf("preflight: Vary %q", s.rec.Header().Values("Vary"))
	}

	// No headers asked for: none allowed.
	s = serve(t, p, preflight(o, "POST", ""))
	if s.rec.Code != http.StatusNoContent || s.next != 0 {
		t.Fatalf("preflight without headers: next %d, %d", s.next, s.rec.Code)
	}
	if _, ok := s.rec.Header()["Access-Control-Allow-Headers"]; ok {
		t.Errorf("preflight without headers: Access-Control-Allow-Headers %q", s.rec.Header().Get("Access-Control-Allow-Headers"))
	}

	// A disallowed origin's preflight: refused, nothing allowed.
	s = serve(t, p, preflight("https://evil.example", "POST", "content-type"))
	if s.next != 0 || s.refused != 1 || s.rec.Code != http.StatusForbidden {
		t.Fatalf("disallowed preflight: next %d, refused %d, %d", s.next, s.refused, s.rec.Code)
	}
	noCORS(t, s)

	// OPTIONS without Access-Control-Request-Method: the inner handler's.
	s = serve(t, p, preflight(o, "", ""))
	if s.next != 1 || s.refused != 0 || s.rec.Code != http.StatusOK {
		t.Fatalf("plain OPTIONS: next %d, refused %d, %d", s.next, s.refused, s.rec.Code)
	}
	if got := s.rec.Header().Get("Access-Control-Allow-Origin"); got != o {
		t.Errorf("plain OPTIONS: Access-Control-Allow-Origin %q", got)
	}
	if got := s.rec.Header().Get("Access-Control-Allow-Methods"); got != "" {
		t.Errorf("plain OPTIONS: Access-Control-Allow-Methods %q", got)
	}
}

// TestPolicyIsReusable: one wrapped handler serves many requests, each
// judged on its own (no state carried from an allowed one to the next).
func TestPolicyIsReusable(t *testing.T) {
	p := New([]string{"https://app.example.com"})
	var next, refused int
	h := p.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { next++ }),
		func(http.ResponseWriter, *http.Request) { refused++ })
	for i, o := range []string{"https://app.example.com", "https://evil.example", "", "https://app.example.com", "https://evil.example"} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, post(o))
		if o == "https://evil.example" && rec.Header().Get("Access-Control-Allow-Origin") != "" {
			t.Errorf("request %d (%q) answered with a previous request's CORS header", i, o)
		}
	}
	if next != 3 || refused != 2 {
		t.Fatalf("next %d, refused %d; want 3 and 2", next, refused)
	}
}

// TestRefusalMessageNamesTheSetting: the refusal tells the user which
// setting lets a web page in.
func TestRefusalMessageNamesTheSetting(t *testing.T) {
	if !strings.Contains(RefusalMessage, "allowed_origins") || !strings.Contains(RefusalMessage, "Origin") {
		t.Fatalf("RefusalMessage %q does not name the Origin header and allowed_origins", RefusalMessage)
	}
}
