package status

import (
	"bytes"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"encoding/json"
	"math"
	"net/http"
	"regexp"
)

// page is the status page: one self-contained file (inline CSS, script and
// SVG charts; no external asset, font or library) that polls /status
// every second. The first report is written into it, so it shows numbers
// before its first poll, and a plain `curl /` shows them too.
//
//go:embed page.html
var page []byte

var (
	pageHead, pageTail = func() ([]byte, []byte) {
		h, t, ok := bytes.Cut(page, []byte("/*STATUS*/"))
		if !ok {
			panic("status: page.html has no /*STATUS*/ marker")
		}
		return h, t
	}()
	// The page may run its own script and nothing else, fetch only from
	// the agent, load nothing, and be framed by no one: a page that would
	// inject markup through a label value (an app name from a token) could
	// not run it, and could not send the numbers anywhere.
	pageCSP = func() string {
		m := regexp.MustCompile(`(?s)<script>(.*?)</script>`).FindSubmatch(page)
		if m == nil {
			panic("status: page.html has no inline script")
		}
		sum := sha256.Sum256(m[1])
		return "default-src 'none'; script-src 'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'; " +
			"style-src 'unsafe-inline'; connect-src 'self'; img-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
	}()
)

// ServePage answers GET /: the status page with the current report.
func (s *Status) ServePage(w http.ResponseWriter, _ *http.Request) {
	r := s.Report(math.Inf(1))
	// encoding/json escapes <, > and & in strings: a label value cannot
	// close the script element the report sits in.
	js, err := json.Marshal(r)
	if err != nil || r == nil {
		js = []byte("null")
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Content-Security-Policy", pageCSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	_, _ = w.Write(pageHead)
	_, _ = w.Write(js)
	_, _ = w.Write(pageTail)
}
