package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/server"
	"github.com/ferryhq/ferry/telemetry"
)

func TestEndpoints(t *testing.T) {
	set := telemetry.TestSettings()
	down := errors.New("kafka unreachable: dial refused")
	var fail error = down
	set.Health.Register("kafka", func() error { return fail })
	a := New(testConfig(), set)
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer a.Shutdown(context.Background())
	get := func(path string) (int, map[string]any) {
		res, err := http.Get("http://" + a.Addr() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var m map[string]any
		_ = json.NewDecoder(res.Body).Decode(&m)
		return res.StatusCode, m
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Fatalf("healthz %d", code)
	}
	metrics := func() string {
		res, err := http.Get("http://" + a.Addr() + "/metrics")
		if err != nil || res.StatusCode != 200 {
			t.Fatalf("metrics: %v", err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return string(b)
	}
	code, body := get("/readyz")
	if code != 503 || body["ready"] != false || !strings.Contains(fmt.Sprint(body["not_ready"]), "dial refused") {
		t.Fatalf("readyz while down: %d %v", code, body)
	}
	if m := metrics(); !strings.Contains(m, "\nferry_ready 0\n") {
		t.Fatalf("ferry_ready while not ready:\n%s", m)
	}
	fail = nil
	if code, _ := get("/readyz"); code != 200 {
		t.Fatalf("readyz when up: %d", code)
	}
	if m := metrics(); !strings.Contains(m, "\nferry_ready 1\n") {
		t.Fatalf("ferry_ready while ready:\n%s", m)
	}
	if code, _ := get("/debug/pprof/"); code != 404 {
		t.Fatalf("pprof served without being enabled: %d", code)
	}
}

// TestChecksHost: the admin server answers only requests addressed to
// itself, so a page whose DNS name rebinds to 127.0.0.1 cannot read
// metrics or trigger actions from the user's browser.
func TestChecksHost(t *testing.T) {
	set := telemetry.TestSettings()
	a := New(testConfig(), set)
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer a.Shutdown(context.Background())
	get := func(host string) int {
		req, _ := http.NewRequest(http.MethodGet, "http://"+a.Addr()+"/healthz", nil)
		if host != "" {
			req.Host = host
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	for _, h := range []string{"", "localhost:8089", "127.0.0.1", "[::1]:8089"} {
		if c := get(h); c != 200 {
			t.Errorf("Host %q: %d", h, c)
		}
	}
	if c := get("evil.example:8089"); c != http.StatusMisdirectedRequest {
		t.Fatalf("rebound Host: %d, want 421", c)
	}
}

func testConfig() Config {
	return Config{HTTPConfig: server.HTTPConfig{Listen: "127.0.0.1:0", ReadTimeout: 5 * time.Second, IdleTimeout: time.Minute, MaxHeaderBytes: 64 << 10}}
}

// An admin server listening on every interface (a container, a probe by
// IP) answers requests addressed to any IP: an IP in the Host header is
// not what a DNS-rebinding page can send. A name it does not own stays
// refused, and a loopback-only server still refuses other addresses.
func TestHostGuardOnWildcard(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {})
	for _, c := range []struct {
		listen, host string
		want         int
	}{
		{"0.0.0.0:8089", "10.1.2.3:8089", 200},
		{"[::]:8089", "[fd00::1]:8089", 200},
		{"0.0.0.0:8089", "evil.example:8089", http.StatusMisdirectedRequest},
		{"127.0.0.1:8089", "10.1.2.3:8089", http.StatusMisdirectedRequest},
		{"10.1.2.3:8089", "10.1.2.3:8089", 200},
	} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/healthz", nil)
		req.Host = c.host
		hostGuard(c.listen, ok).ServeHTTP(rec, req)
		if rec.Code != c.want {
			t.Errorf("listen %s, Host %s: %d, want %d", c.listen, c.host, rec.Code, c.want)
		}
	}
}
