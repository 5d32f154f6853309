package hostile

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferryhq/ferry/proofs/harness/agenttest"
	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
)

var ferryBin string

func TestMain(m *testing.M) {
	flag.Parse()
	bin, cleanup := agenttest.BuildForTests()
	defer cleanup()
	ferryBin = bin
	reports.M = m
	kafkatest.Main(reports)
}

// ---- a well-behaved client ----

// goodClient posts NDJSON batches of records "good:<seq>" to topic and
// remembers which were acknowledged, until stopped.
type goodClient struct {
	acked   sync.Map // seq → struct{}
	n       atomic.Int64
	refused atomic.Int64
	stopped atomic.Bool
	done    chan struct{}
}

func runGood(url, topic string) *goodClient {
	g := &goodClient{done: make(chan struct{})}
	go func() {
		defer close(g.done)
		cl := &http.Client{Timeout: 30 * time.Second}
		for seq := 0; !g.stopped.Load(); seq += 50 {
			var b bytes.Buffer
			for i := 0; i < 50; i++ {
				fmt.Fprintf(&b, "good:%d\n", seq+i)
			}
			res, err := cl.Post(url+"/v1/messages/"+topic, "application/x-ndjson", &b)
			if err != nil {
				g.refused.Add(1)
				time.Sleep(50 * time.Millisecond)
				continue
			}
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
			if res.StatusCode == 200 {
				for i := 0; i < 50; i++ {
					g.acked.Store(seq+i, struct{}{})
				}
				g.n.Add(50)
			} else {
				g.refused.Add(1)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	return g
}

func (g *goodClient) stop() { g.stopped.Store(true); <-g.done }

// ---- the report ----

// row is one attack's line in docs/reliability.md.
// Forged and Lost are nil where the attack did not count them: the table
// then says "not measured" rather than a zero nobody counted.
type row struct {
	Attack   string  `json:"attack"`
	Answer   string  `json:"answer"`
	PeakMiB  float64 `json:"peak_rss_mib"`
	Forged   *int64  `json:"forged,omitempty"`
	Lost     *int64  `json:"lost,omitempty"`
	Note     string  `json:"note"`
	Limit    float64 `json:"limit_mib"`
	Verified bool    `json:"-"`
}

// counted marks a count as measured.
func counted(n int64) *int64 { return &n }

func cell(n *int64) string {
	if n == nil {
		return "not measured"
	}
	return fmt.Sprintf("**%d**", *n)
}

var reports = &agenttest.Report[row]{Env: "FERRY_HOSTILE_REPORT", Begin: "<!-- hostile:begin -->", End: "<!-- hostile:end -->", Render: render}

func report(t *testing.T, r row) { reports.Add(t, r) }

func render(rows []row) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Measured by `make hostile` on %s, %s: the real binary and a real broker; every attack over the network while a well-behaved client sends records with sequence ids. Peak RSS is the process's VmHWM during the attack (reset before each).\n\n",
		time.Now().UTC().Format("2006-01-02"), agenttest.Machine())
	b.WriteString("| attack | answer | peak RSS (bound) | records forged into Kafka | acknowledged records lost | notes |\n")
	b.WriteString("|---|---|---:|---:|---:|---|\n")
	for _, r := range rows {
		bound := "–"
		if r.Limit > 0 {
			bound = fmt.Sprintf("%.0f MiB (≤ %.0f)", r.PeakMiB, r.Limit)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n", r.Attack, r.Answer, bound, cell(r.Forged), cell(r.Lost), r.Note)
	}
	return b.String()
}
