package pipeline

import (
	"context"
	"github.com/ferryhq/ferry/receiver/httpreceiver"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/auth/token"
	"github.com/ferryhq/ferry/config"
	"github.com/ferryhq/ferry/telemetry"
)

const (
	reloadKey1 = "1111111111111111111111111111111111111111111111111111111111111111"
	reloadKey2 = "2222222222222222222222222222222222222222222222222222222222222222"
)

func reloadConfig(t *testing.T, key string, id int, extra ...string) *config.Config {
	t.Helper()
	sets := append([]string{
		"exporter.type=blackhole", "receivers.otlp.enabled=false",
		"receivers.http.listen=127.0.0.1:0", "telemetry.admin.listen=127.0.0.1:0",
		// The default socket would create ferry-data/ in the package's folder.
		"receivers.local.enabled=false",
		"receivers.http.auth.mode=required", "receivers.http.auth.sources=[header]",
		"auth.keys=[{id: " + string(rune('0'+id)) + ", secret: " + key + ", issue: true}]",
	}, extra...)
	cfg, err := config.Parse(nil, sets)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func issueWith(t *testing.T, cfg *config.Config, app string) string {
	ring, err := cfg.Auth.Keyring()
	if err != nil {
		t.Fatal(err)
	}
	tok, err := ring.Issue(token.Claims{App: app})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestReloadRotatesKeysWithoutRestart: keys, limits and auth settings change
// while the agent runs; a bad configuration changes nothing.
func TestReloadRotatesKeysWithoutRestart(t *testing.T) {
	cfg1 := reloadConfig(t, reloadKey1, 1)
	p, err := New(cfg1, telemetry.TestSettings())
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer p.Shutdown(context.Background())
	url := "http://" + p.Receiver("http").(*httpreceiver.Receiver).Addr() + "/v1/messages/t"
	status := func(tok string) int {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader("m"))
		req.Header.Set("Content-Type", "text/plain")
		req.Header.Set("X-Ferry-Token", tok)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	tok1 := issueWith(t, cfg1, "shop")
	if c := status(tok1); c != 200 {
		t.Fatalf("key 1 before reload: %d", c)
	}
	cfg2 := reloadConfig(t, reloadKey2, 2)
	tok2 := issueWith(t, cfg2, "shop")
	if c := status(tok2); c != 401 {
		t.Fatalf("key 2 before reload: %d", c)
	}
	if warn, err := p.Reload(cfg2); err != nil || warn != "" {
		t.Fatalf("reload: %v %q", err, warn)
	}
	if c := status(tok2); c != 200 {
		t.Fatalf("key 2 after reload: %d", c)
	}
	if c := status(tok1); c != 401 {
		t.Fatalf("key 1 after it was removed: %d", c)
	}
	// A bad configuration (one Parse would refuse) changes nothing.
	bad := reloadConfig(t, reloadKey2, 2)
	bad.Auth.Keys[0].Secret = "short"
	if _, err := p.Reload(bad); err == nil {
		t.Fatal("bad configuration accepted")
	}
	if c := status(tok2); c != 200 {
		t.Fatalf("after a refused reload: %d", c)
	}
	// Auth mode itself is reloadable; a queue change needs a restart.
	open := reloadConfig(t, reloadKey2, 2, "receivers.http.auth.mode=optional", "queue.memory_limit=64MiB")
	warn, err := p.Reload(open)
	if err != nil || !strings.Contains(warn, "queue") {
		t.Fatalf("reload: %v, warning %q", err, warn)
	}
	if c := status(""); c != 200 {
		t.Fatalf("no token after switching to optional: %d", c)
	}
	// The Go runtime's settings are applied when ferry run starts.
	rt := reloadConfig(t, reloadKey2, 2, "receivers.http.auth.mode=optional", "queue.memory_limit=64MiB", "runtime.monitor_deep_sleep=true")
	if warn, err := p.Reload(rt); err != nil || !strings.Contains(warn, "runtime") {
		t.Fatalf("reload: %v, warning %q", err, warn)
	}
	_ = time.Second
}
