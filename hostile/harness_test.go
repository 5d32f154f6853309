package hostile

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/agenttest"
	"github.com/ferryhq/ferry/internal/kafkatest"
)

var ferryBin string

func TestMain(m *testing.M) {
	flag.Parse()
	if !testing.Short() {
		dir, err := os.MkdirTemp("", "ferry-hostile")
		if err != nil {
			panic(err)
		}
		root, _ := filepath.Abs("..")
		if ferryBin, err = agenttest.Build(root, dir); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		defer os.RemoveAll(dir)
	}
	kafkatest.Main(&reportRunner{m})
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
type row struct {
	Attack   string  `json:"attack"`
	Answer   string  `json:"answer"`
	PeakMiB  float64 `json:"peak_rss_mib"`
	Forged   int64   `json:"forged"`
	Lost     int64   `json:"lost"`
	Note     string  `json:"note"`
	Limit    float64 `json:"limit_mib"`
	Verified bool    `json:"-"`
}

var (
	reportMu sync.Mutex
	rows     []row
)

func report(t *testing.T, r row) {
	t.Helper()
	b, _ := json.Marshal(r)
	t.Logf("result: %s", b)
	reportMu.Lock()
	rows = append(rows, r)
	reportMu.Unlock()
}

type reportRunner struct{ m *testing.M }

func (r *reportRunner) Run() int {
	code := r.m.Run()
	if path := os.Getenv("FERRY_HOSTILE_REPORT"); path != "" && len(rows) > 0 && code == 0 {
		if err := writeReport(path); err != nil {
			fmt.Fprintln(os.Stderr, "hostile report:", err)
			return 1
		}
	}
	return code
}

const beginMark, endMark = "<!-- hostile:begin -->", "<!-- hostile:end -->"

func writeReport(path string) error {
	doc, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	i, j := bytes.Index(doc, []byte(beginMark)), bytes.Index(doc, []byte(endMark))
	if i < 0 || j < i {
		return fmt.Errorf("%s has no %s … %s section", path, beginMark, endMark)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n\nMeasured by `make hostile` on %s, %s: the real binary and a real broker; every attack over the network while a well-behaved client sends records with sequence ids. Peak RSS is the process's VmHWM during the attack (reset before each).\n\n",
		beginMark, time.Now().UTC().Format("2006-01-02"), machine())
	b.WriteString("| attack | answer | peak RSS (bound) | records forged into Kafka | acknowledged records lost | notes |\n")
	b.WriteString("|---|---|---:|---:|---:|---|\n")
	for _, r := range rows {
		bound := "–"
		if r.Limit > 0 {
			bound = fmt.Sprintf("%.0f MiB (≤ %.0f)", r.PeakMiB, r.Limit)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | **%d** | **%d** | %s |\n", r.Attack, r.Answer, bound, r.Forged, r.Lost, r.Note)
	}
	b.WriteString("\n")
	out := append(append(append([]byte{}, doc[:i]...), b.String()...), doc[j:]...)
	return os.WriteFile(path, out, 0o644)
}

func machine() string {
	cpu := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "model name"); ok {
				cpu = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	return fmt.Sprintf("%d cores, %s", runtime.NumCPU(), cpu)
}
