package hostile

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryhq/ferry/proofs/harness/agenttest"
	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
)

// get is send's GET.
func get(url string) reply {
	cl := &http.Client{Timeout: 60 * time.Second}
	res, err := cl.Get(url)
	if err != nil {
		return reply{err: err}
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return reply{code: res.StatusCode, body: string(b)}
}

// TestReceiptAttacks: delivery receipts' doors on the real binary in spool
// mode (where receipts are kept in a store and looked up): guessed ids, a
// request id past its bound or with characters a header could smuggle, and
// many concurrent lookups of one large receipt, while a well-behaved client
// sends records. Each is answered by its own bound, within the RSS bound.
func TestReceiptAttacks(t *testing.T) {
	brokers := kafkatest.Shared(t)
	goodTopic := kafkatest.NewTopic(t, brokers, "good-receipts", 3)
	topic := kafkatest.NewTopic(t, brokers, "hostile-receipts", 3)
	a := agenttest.Start(t, ferryBin, agentConfig(brokers), "delivery.mode=spool", "delivery.spool.dir="+t.TempDir(),
		"delivery.spool.linger=5ms")
	base := "http://" + a.HTTP
	good := runGood(base, goodTopic)

	attack(t, a, "Receipt lookups: 5,000 guessed ids", func() (string, bool, string) {
		var last reply
		for i := range 5000 {
			last = get(fmt.Sprintf("%s/receipts/%d-%016x", base, i, uint64(i)*0x9e3779b97f4a7c15))
			if last.code != 404 || !strings.Contains(last.body, "unknown_receipt") {
				return last.String(), false, fmt.Sprintf("lookup %d", i)
			}
		}
		return last.String(), true, "every one 404 unknown_receipt, like another token's: an id tells nothing"
	}, nil)

	attack(t, a, "Request id of 129 characters", func() (string, bool, string) {
		r := send(base+"/v1/messages/"+topic, "text/plain", "", []byte("x"), "X-Ferry-Request-Id", strings.Repeat("r", 129))
		ok := r.code == 400 && strings.Contains(r.body, "invalid_request_id")
		return r.String(), ok, "1 to 128 of A-Z a-z 0-9 . _ : -"
	}, nil)

	attack(t, a, "Request id with spaces and backslashes posing as a header (a\\r\\nferry.tenant: evil)", func() (string, bool, string) {
		r := send(base+"/v1/messages/"+topic, "text/plain", "", []byte("x"), "X-Ferry-Request-Id", "a b\\r\\nferry.tenant: evil")
		ok := r.code == 400 && strings.Contains(r.body, "invalid_request_id")
		return r.String(), ok, "refused before a record is made"
	}, nil)

	// One request of 30,000 records asking for a receipt, then 64 lookups
	// of it at once: an answer is built outside the store's lock, at most
	// a few at a time, and paged at 10,000 ranges.
	var body bytes.Buffer
	for i := range 30_000 {
		fmt.Fprintf(&body, "%d\n", i)
	}
	ans := send(base+"/v1/messages/"+topic+"?receipt=true", "application/x-ndjson", "", body.Bytes())
	var got struct {
		Accepted  int    `json:"accepted"`
		ReceiptID string `json:"receipt_id"`
	}
	if ans.code != 200 || json.Unmarshal([]byte(ans.body), &got) != nil || got.Accepted != 30_000 || got.ReceiptID == "" {
		t.Fatalf("30,000 records with ?receipt=true: %s %.300s", ans.String(), ans.body)
	}
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(get(base+"/receipts/"+got.ReceiptID).body, `"state":"done"`) {
		if time.Now().After(deadline) {
			t.Fatalf("receipt %s not done after 60 s", got.ReceiptID)
		}
		time.Sleep(100 * time.Millisecond)
	}
	attack(t, a, "64 concurrent lookups of a 30,000-record receipt", func() (string, bool, string) {
		var wg sync.WaitGroup
		var mu sync.Mutex
		bad := ""
		for range 64 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := get(base + "/receipts/" + got.ReceiptID)
				var st struct {
					State    string `json:"state"`
					Records  int    `json:"records"`
					Receipts []struct {
						Count int `json:"count"`
					} `json:"receipts"`
				}
				n := 0
				if r.code == 200 && json.Unmarshal([]byte(r.body), &st) == nil {
					for _, rg := range st.Receipts {
						n += rg.Count
					}
				}
				if r.code != 200 || st.State != "done" || st.Records != 30_000 || n != 30_000 {
					mu.Lock()
					bad = fmt.Sprintf("%s state %q records %d ranges cover %d", r.String(), st.State, st.Records, n)
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		if bad != "" {
			return bad, false, ""
		}
		return "200", true, "each answer whole (30,000 records in its ranges); built outside the store's lock, 4 at a time"
	}, nil)

	good.stop()
	time.Sleep(time.Second)
	if good.n.Load() == 0 {
		t.Fatalf("the well-behaved client had nothing accepted (%d refused)", good.refused.Load())
	}
}
