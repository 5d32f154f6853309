package load

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// The flags of BENCHMARKS.md section 12 (cost curves): --topics spreads
// requests over that many topics evenly, --key-space draws keys from that
// many, --tokens sends the file's tokens, --connections opens exactly that
// many connections and uses each.
func TestMultiplyFlagsOverHTTP(t *testing.T) {
	var mu sync.Mutex
	topics, keys, tokens, conns := map[string]int{}, map[string]bool{}, map[string]bool{}, map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		topics[strings.TrimPrefix(r.URL.Path, "/v1/messages/")]++
		keys[r.Header.Get("X-Ferry-Key")] = true
		tokens[strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")] = true
		conns[r.RemoteAddr]++
		mu.Unlock()
	}))
	defer srv.Close()
	tokFile := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokFile, []byte("tok-a\n\ntok-b\ntok-c\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := ProduceCmd([]string{"--target", srv.URL, "--topic", "t", "--topics", "5", "--key-space", "3", "--tokens", tokFile,
		"--connections", "7", "--batch", "2", "--num-records", "2800", "--throughput", "40000", "--record-size", "10",
		"--reporting-interval", "100000"}); err != nil {
		t.Fatal(err)
	}
	if len(topics) != 5 {
		t.Fatalf("topics written: %v, want t-0 … t-4", topics)
	}
	for i := 0; i < 5; i++ {
		if n := topics["t-"+string(rune('0'+i))]; n != 280 {
			t.Errorf("topic t-%d had %d requests, want 280 (1,400 in turn over 5)", i, n)
		}
	}
	if len(keys) != 3 || !keys["k000000000"] || !keys["k000000002"] {
		t.Errorf("keys: %v, want k000000000 … k000000002", keys)
	}
	if len(tokens) != 3 || !tokens["tok-a"] || !tokens["tok-c"] {
		t.Errorf("tokens: %v, want tok-a, tok-b, tok-c", tokens)
	}
	if len(conns) != 7 {
		t.Errorf("connections: %d (%v), want 7", len(conns), conns)
	}
	for addr, n := range conns {
		if n < 100 {
			t.Errorf("connection %s carried %d of 1,400 requests: not used in turn", addr, n)
		}
	}
}

func TestFlagsRefuseBadCounts(t *testing.T) {
	for _, args := range [][]string{{"--topics", "0"}, {"--key-space", "-1"}, {"--connections", "-2"}, {"--tokens", "/nonexistent/tokens"}} {
		if err := ProduceCmd(append(args, "--target", "http://127.0.0.1:1", "--num-records", "1")); err == nil {
			t.Errorf("%v: accepted", args)
		}
	}
}

func TestKeysAreTenBytes(t *testing.T) {
	if k := string(appendKey(nil, 42)); k != "k000000042" {
		t.Fatalf("appendKey(42) = %q", k)
	}
	if got := topicNames("x", 1); len(got) != 1 || got[0] != "x" {
		t.Fatalf("topicNames(x, 1) = %v", got)
	}
}
