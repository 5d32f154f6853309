// Package origin owns what ferry's HTTP listeners accept from web browsers.
// ferry listens on 127.0.0.1, and any web page a user on the host opens can
// make the browser POST to 127.0.0.1 (a "simple" text/plain request needs
// no CORS preflight): with auth none, a page could write records to Kafka.
// Browsers always say which page a request comes from in the Origin header,
// and programs (SDKs, curl, agents) do not send one, so a request with an
// Origin is refused unless its origin is configured (allowed_origins), in
// which case CORS is answered so browser OTLP exporters work.
package origin

import (
	"net/http"
	"strings"
)

// Policy is a listener's allowed origins ("*" allows any).
type Policy struct {
	allowed []string
	any     bool
}

// New returns the policy for allowed (none: browsers are refused).
func New(allowed []string) *Policy {
	p := &Policy{allowed: allowed}
	for _, o := range allowed {
		if o == "*" {
			p.any = true
		}
	}
	return p
}

func (p *Policy) allows(o string) bool {
	if p.any {
		return true
	}
	for _, a := range p.allowed {
		if strings.EqualFold(a, o) {
			return true
		}
	}
	return false
}

// Wrap answers browser requests per the policy around next: refused (by
// calling refuse) when the origin is not allowed; CORS headers and the
// preflight answered when it is. Requests without Origin pass untouched.
func (p *Policy) Wrap(next http.Handler, refuse func(w http.ResponseWriter, r *http.Request)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o := r.Header.Get("Origin")
		if o == "" {
			next.ServeHTTP(w, r)
			return
		}
		if !p.allows(o) {
			refuse(w, r)
			return
		}
		h := w.Header()
		h.Set("Access-Control-Allow-Origin", o)
		h.Add("Vary", "Origin")
		if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
			h.Set("Access-Control-Allow-Methods", "POST")
			if rh := r.Header.Get("Access-Control-Request-Headers"); rh != "" {
				h.Set("Access-Control-Allow-Headers", rh)
			}
			h.Set("Access-Control-Max-Age", "3600")
			w.WriteHeader(http.StatusNoContent)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// RefusalMessage is what a refused browser request is told.
const RefusalMessage = "requests from web pages (an Origin header) are refused unless their origin is listed in allowed_origins"
