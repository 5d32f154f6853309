package faults

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
)

// idemReq is one client request with its Idempotency-Key and what the
// client learnt of it before the agent died.
type idemReq struct {
	key      string
	body     []byte
	answered bool // 200 before the kill
	unknown  bool // sent, no answer (the kill cut it)
}

// sendIdem posts r to addr: the status, whether the answer was a replay,
// the accepted count.
func sendIdem(addr, topic string, r *idemReq) (code int, replayed bool, body string, err error) {
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/messages/"+topic, bytes.NewReader(r.body))
	req.Header.Set("Content-Type", "application/x-ndjson")
	req.Header.Set("Idempotency-Key", r.key)
	cl := &http.Client{Timeout: 30 * time.Second}
	res, err := cl.Do(req)
	if err != nil {
		return 0, false, "", err
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	return res.StatusCode, res.Header.Get("Idempotent-Replayed") == "true", string(b), nil
}

// 13. Exactly once with client retries: clients send requests with
// Idempotency-Keys and the agent is SIGKILLed while they do — right after
// answering some, in the middle of others. Restarted on the same spool,
// every request is resent with its key until answered: those answered
// before the kill are answered again as the original (replayed, nothing
// stored), those the kill cut are either replayed (their first copy was
// stored) or stored now; a read_committed consumer sees every record
// exactly once.
func TestIdempotencyKeyAcrossAgentKill(t *testing.T) {
	brokers := kafkatest.Shared(t)
	topic := kafkatest.NewTopic(t, brokers, "fault-idem", 3)
	dir := t.TempDir()
	sets := append(spoolSets(t, "spool", dir), "delivery.spool.fsync=always", "delivery.guarantee=exactly_once")
	a := startAgent(t, brokers, sets...)
	const clients, perClient, batch = 6, 120, 10
	reqs := make([][]*idemReq, clients)
	for c := range reqs {
		for i := range perClient {
			var b strings.Builder
			for j := range batch {
				fmt.Fprintf(&b, "c%d-r%d-%d\n", c, i, j)
			}
			reqs[c] = append(reqs[c], &idemReq{key: fmt.Sprintf("client-%d-req-%d", c, i), body: []byte(b.String())})
		}
	}
	var answered atomic.Int64
	var dead atomic.Bool
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, r := range reqs[c] {
				if dead.Load() {
					return
				}
				code, _, body, err := sendIdem(a.HTTP, topic, r)
				switch {
				case err != nil:
					r.unknown = true
					return
				case code == 200:
					r.answered = true
					answered.Add(1)
				default:
					// Refused (503 as it dies): the client will retry.
					r.unknown = true
					if !dead.Load() {
						t.Errorf("%s answered %d %s before the kill", r.key, code, body)
					}
					return
				}
			}
		}()
	}
	// The kill: as soon as a third of the requests were answered, with the
	// clients sending back to back (some answered an instant before, some
	// in flight).
	for answered.Load() < clients*perClient/3 {
		time.Sleep(time.Millisecond)
	}
	a.Kill()
	dead.Store(true)
	wg.Wait()
	a2 := startAgent(t, brokers, sets...)

	var replayedAnswered, replayedCut, storedCut, fresh int
	for c := range reqs {
		for _, r := range reqs[c] {
			var code int
			var replayed bool
			var body string
			for try := 0; ; try++ {
				var err error
				code, replayed, body, err = sendIdem(a2.HTTP, topic, r)
				if err == nil && code == 200 {
					break
				}
				if try > 100 {
					t.Fatalf("%s: %d %s %v after 100 retries", r.key, code, body, err)
				}
				time.Sleep(100 * time.Millisecond) // 409 in flight, or 503 while starting
			}
			if !strings.Contains(body, fmt.Sprintf(`"accepted":%d`, batch)) {
				t.Fatalf("%s: answered %s, want the original count %d", r.key, body, batch)
			}
			switch {
			case r.answered && !replayed:
				t.Fatalf("%s was answered 200 before the kill, and stored again after it", r.key)
			case r.answered:
				replayedAnswered++
			case r.unknown && replayed:
				replayedCut++
			case r.unknown:
				storedCut++
			default:
				fresh++
			}
		}
	}
	t.Logf("answered before the kill and replayed: %d; cut by the kill: %d replayed (stored before it), %d stored after; never sent before: %d",
		replayedAnswered, replayedCut, storedCut, fresh)
	if replayedAnswered == 0 {
		t.Fatal("no request was answered before the kill")
	}
	// Every request once more: every one is a replay now.
	for c := range reqs {
		r := reqs[c][0]
		if code, replayed, body, err := sendIdem(a2.HTTP, topic, r); err != nil || code != 200 || !replayed {
			t.Fatalf("%s resent: %d %v %s %v", r.key, code, replayed, body, err)
		}
	}
	waitMetric(t, a2, `ferry_idempotency_replayed_total`, float64(replayedAnswered+replayedCut+clients))

	want := clients * perClient * batch
	seen := waitCommitted(t, brokers, topic, want)
	dups, missing := 0, 0
	for c := range clients {
		for i := range perClient {
			for j := range batch {
				switch n := seen[fmt.Sprintf("c%d-r%d-%d", c, i, j)]; {
				case n == 0:
					missing++
				case n > 1:
					dups += n - 1
				}
			}
		}
	}
	a2.Stop()
	if missing > 0 || dups > 0 || len(seen) != want {
		t.Fatalf("read_committed: %d missing, %d duplicated, %d distinct of %d", missing, dups, len(seen), want)
	}
}
