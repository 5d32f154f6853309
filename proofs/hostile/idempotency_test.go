package hostile

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ferryhq/ferry/auth/token"
	"github.com/ferryhq/ferry/proofs/harness/agenttest"
	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
)

// TestIdempotencyKeyAttacks: Idempotency-Key's doors on the real binary in
// spool mode, while a well-behaved client sends records: keys past their
// bound or with characters a header could smuggle (refused before the body
// is read, counted), 20,000 distinct keys against a 64 KiB store (memory
// and disk bounded, the oldest evicted and counted), a key reused with
// other bodies (422, nothing stored), and one application probing
// another's key (its own scope: a fresh request, nothing learned).
func TestIdempotencyKeyAttacks(t *testing.T) {
	brokers := kafkatest.Shared(t)
	goodTopic := kafkatest.NewTopic(t, brokers, "good-idem", 3)
	topic := kafkatest.NewTopic(t, brokers, "hostile-idem", 3)
	dir := t.TempDir()
	a := agenttest.Start(t, ferryBin, agentConfig(brokers), "delivery.mode=spool", "delivery.spool.dir="+dir,
		"delivery.spool.linger=5ms", "delivery.idempotency.max_bytes=64KiB")
	base := "http://" + a.HTTP
	url := base + "/v1/messages/" + topic
	good := runGood(base, goodTopic)
	errs := func(reason string) float64 {
		return a.Metric(`ferry_receiver_errors_total{reason="` + reason + `",receiver="http"}`)
	}

	attack(t, a, "Idempotency-Key of 129 characters, and one posing as a header (a\\r\\nferry.tenant: evil)", func() (string, bool, string) {
		before := errs("invalid_idempotency_key")
		r1 := send(url, "text/plain", "", []byte("x"), "Idempotency-Key", strings.Repeat("k", 129))
		r2 := send(url, "text/plain", "", []byte("x"), "Idempotency-Key", "a b\\r\\nferry.tenant: evil")
		ok := r1.code == 400 && strings.Contains(r1.body, "invalid_idempotency_key") &&
			r2.code == 400 && strings.Contains(r2.body, "invalid_idempotency_key") && errs("invalid_idempotency_key") == before+2
		return r1.String(), ok, "1 to 128 of A-Z a-z 0-9 . _ : - + / =, checked before the body is read; counted"
	}, nil)

	attack(t, a, "20,000 distinct Idempotency-Keys against delivery.idempotency.max_bytes 64KiB", func() (string, bool, string) {
		var wg sync.WaitGroup
		var bad atomic.Value
		for c := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := c; i < 20000; i += 8 {
					r := send(url, "text/plain", "", []byte("k"), "Idempotency-Key", fmt.Sprintf("flood-%06d", i))
					if r.code != 200 {
						bad.Store(fmt.Sprintf("key %d: %s", i, r.String()))
						return
					}
				}
			}()
		}
		wg.Wait()
		if b := bad.Load(); b != nil {
			return b.(string), false, ""
		}
		keys, evicted := a.Metric("ferry_idempotency_keys"), a.Metric(`ferry_idempotency_evicted_total{reason="bytes"}`)
		// ~110 bytes a key: at most ~600 fit in 64 KiB.
		ok := keys > 0 && keys <= 64<<10/96 && evicted >= 20000-keys-1
		// The newest key is still known; the oldest is not (accepted again).
		newest := send(url, "text/plain", "", []byte("k"), "Idempotency-Key", "flood-019999")
		ok = ok && newest.code == 200
		// And on disk: the sealed key files within max_bytes, plus the
		// active one (a quarter of it).
		var disk int64
		logs, _ := filepath.Glob(filepath.Join(dir, "dedup-*.log"))
		for _, f := range logs {
			if fi, err := os.Stat(f); err == nil {
				disk += fi.Size()
			}
		}
		ok = ok && disk > 0 && disk <= 64<<10+16<<10+512
		return fmt.Sprintf("200 ×20,000; %v keys kept, %v evicted (bytes); key log %d bytes in %d files", keys, evicted, disk, len(logs)), ok,
			"memory and the key log bounded by max_bytes; the oldest go first, counted; a retry of an evicted key is accepted again"
	}, nil)

	attack(t, a, "One Idempotency-Key reused with 100 other bodies", func() (string, bool, string) {
		first := send(url, "text/plain", "", []byte("original"), "Idempotency-Key", "reused")
		if first.code != 200 {
			return first.String(), false, "the first use"
		}
		// Not the spool's appended count: the well-behaved client beside
		// the attack appends meanwhile. The original body's retry must be
		// a replay (counted), and each other body refused before storing.
		replayed := a.Metric("ferry_idempotency_replayed_total")
		var last reply
		for i := range 100 {
			last = send(url, "text/plain", "", []byte(fmt.Sprintf("other-%d", i)), "Idempotency-Key", "reused")
			if last.code != 422 || !strings.Contains(last.body, "idempotency_key_reused") {
				return last.String(), false, fmt.Sprintf("body %d", i)
			}
		}
		same := send(url, "text/plain", "", []byte("original"), "Idempotency-Key", "reused")
		ok := same.code == 200 && a.Metric("ferry_idempotency_replayed_total") == replayed+1
		return last.String(), ok, "422 idempotency_key_reused, nothing stored; the original body still answers 200 (replayed)"
	}, nil)

	attack(t, a, "Application B probing application A's Idempotency-Key", func() (string, bool, string) {
		ta, tb := issue(t, token.Claims{App: "tenant-a"}), issue(t, token.Claims{App: "tenant-b"})
		ra := send(url, "text/plain", "", []byte("a's secret"), "Idempotency-Key", "order-1", "Authorization", "Bearer "+ta)
		rb := send(url, "text/plain", "", []byte("b's guess"), "Idempotency-Key", "order-1", "Authorization", "Bearer "+tb)
		rn := send(url, "text/plain", "", []byte("anonymous"), "Idempotency-Key", "order-1")
		ok := ra.code == 200 && rb.code == 200 && rn.code == 200 && !strings.Contains(rb.body, "reused")
		return rb.String(), ok, "keys are scoped per application: B's request is its own (200), never 422 or a replay of A's"
	}, nil)

	good.stop()
	if good.n.Load() == 0 {
		t.Fatalf("the well-behaved client had nothing accepted (%d refused)", good.refused.Load())
	}
}
