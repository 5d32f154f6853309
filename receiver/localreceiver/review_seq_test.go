package localreceiver

import (
	"bytes"
	"testing"

	"github.com/ferryhq/ferry/consumer/consumertest"
	"github.com/ferryhq/ferry/protocol"
)

// TestReviewReplayNeverClaimsUnstoredRecords: a frame part of which the
// agent refused on its own (a topic not allowed) is stored, and its answer
// lost. The agent restarts on its spool with a wider topics list (an
// operator's change, within delivery.idempotency.window); the client
// resends the frame under its sequence, as it must. The records the
// first copy refused were never stored and are not stored now: the
// client must not be told they were accepted.
func TestReviewReplayNeverClaimsUnstoredRecords(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t)
	cfg.Topics = []string{"ok-*"}
	a := startSeqAgent(t, dir, cfg, &consumertest.Sink{})
	pid := []byte("0123456789abcdef")
	c, br, _ := dial3(t, a.r, pid, protocol.FeatureIdempotence)
	recs := []protocol.Record{{Topic: []byte("ok-1"), Value: []byte("a")}, {Topic: []byte("no"), Value: []byte("b")}}
	_, rs := roundTrip(t, c, br, seqFrame(t, 1, 1, "", 0, recs...))
	if len(rs) != 2 || rs[0].Status != protocol.StatusOK || rs[1].Status != protocol.StatusPermanent {
		t.Fatalf("first copy: %+v", rs)
	}
	c.Close()
	a.stop()

	cfg.Topics = []string{"*"}
	sink := &consumertest.Sink{}
	a = startSeqAgent(t, dir, cfg, sink)
	defer a.stop()
	c, br, _ = dial3(t, a.r, pid, protocol.FeatureIdempotence)
	_, rs = roundTrip(t, c, br, seqFrame(t, 1, 1, "", 0, recs...))
	storedB := false
	for _, r := range sink.Records() {
		if bytes.Equal(r.Value, []byte("b")) {
			storedB = true
		}
	}
	// Record "b" is the frame's second record: either it is stored now,
	// or its answer must not be OK.
	k := uint32(0)
	for _, rg := range rs {
		n := rg.Count
		if n == 0 {
			n = 2
		}
		if k < 2 && k+n > 1 && rg.Status == protocol.StatusOK && !storedB {
			t.Fatalf("record b (never stored: the first copy refused it) answered accepted: %+v", rs)
		}
		k += n
	}
}
