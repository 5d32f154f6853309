package load

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	neturl "net/url"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/collector/pdata/plog/plogotlp"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"

	"github.com/ferryhq/ferry/internal/otlpgen"
)

// OTLPCmd reproduces bk-collector's "benchmark server" table: a number of
// OTLP/HTTP requests of logCount × logLength (or spans, or data points)
// sent with a concurrency, reporting requests per second.
func OTLPCmd(args []string) error {
	fs := flag.NewFlagSet("otlp", flag.ContinueOnError)
	target := fs.String("target", "http://127.0.0.1:4318", "OTLP/HTTP endpoint base")
	signal := fs.String("signal", "logs", "logs, traces or metrics")
	count := fs.Int("count", 10, "items per request (logs, spans; metrics: data points of each of gauge, counter, histogram)")
	length := fs.Int("length", 1024, "logs: bytes of body per log record")
	requests := fs.Int("requests", 10000, "requests to send")
	concurrency := fs.Int("concurrency", 16, "concurrent requests")
	asJSON := fs.Bool("json", false, "send OTLP/JSON instead of protobuf")
	exporter := fs.String("exporter", "kafka", "what ferry's exporter is, for the table's last column")
	header := fs.Bool("header", true, "print the table header")
	clientKind := fs.String("client", "raw", "raw (pre-serialized HTTP/1.1, cheap like wrk) or std (net/http)")
	report := fs.String("report-json", "", "also write the result as JSON to this file")
	retry := fs.Bool("retry", true, "retry a request answered 429 or 503 (ferry's backpressure) after 20 ms, as OTLP exporters retry; QPS counts accepted requests")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *count < 1 || *requests < 1 || *concurrency < 1 {
		return fmt.Errorf("--count, --requests and --concurrency must be positive")
	}
	// A pool of distinct requests, so bodies differ and compression in the
	// exporter is honest.
	const poolSize = 16
	pool := make([][]byte, poolSize)
	for i := range pool {
		g := otlpgen.New(uint64(i + 1))
		var b []byte
		var err error
		switch *signal {
		case "logs":
			req := plogotlp.NewExportRequestFromLogs(g.Logs(*count, *length))
			b, err = marshal(req.MarshalProto, req.MarshalJSON, *asJSON)
		case "traces":
			req := ptraceotlp.NewExportRequestFromTraces(g.Traces(*count))
			b, err = marshal(req.MarshalProto, req.MarshalJSON, *asJSON)
		case "metrics":
			req := pmetricotlp.NewExportRequestFromMetrics(g.Metrics(*count, *count, *count))
			b, err = marshal(req.MarshalProto, req.MarshalJSON, *asJSON)
		default:
			return fmt.Errorf("--signal %q: want logs, traces or metrics", *signal)
		}
		if err != nil {
			return err
		}
		pool[i] = b
	}
	url := strings.TrimSuffix(*target, "/") + "/v1/" + *signal
	ctype := "application/x-protobuf"
	if *asJSON {
		ctype = "application/json"
	}
	tr := &http.Transport{MaxIdleConns: *concurrency, MaxIdleConnsPerHost: *concurrency, MaxConnsPerHost: *concurrency, DisableCompression: true}
	client := &http.Client{Transport: tr, Timeout: 60 * time.Second}
	defer tr.CloseIdleConnections()

	var next, ok, failed, retried atomic.Int64
	var lat hist
	codes := sync.Map{}
	start := time.Now()
	done := make(chan struct{})
	tty := IsTTY(os.Stderr)
	go func() {
		every := 5 * time.Second
		if tty {
			every = 200 * time.Millisecond
		}
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				if tty {
					fmt.Fprint(os.Stderr, "\r\033[K")
				}
				return
			case <-t.C:
				n := ok.Load()
				el := time.Since(start)
				if tty {
					fmt.Fprint(os.Stderr, Bar(n, int64(*requests), "requests", el, float64(n)/el.Seconds()))
					continue
				}
				fmt.Fprintf(os.Stderr, "%d/%d requests, %.0f req/s, %.1f ms avg, %d retried after 429/503, %d failed, %s elapsed\n",
					n, *requests, float64(n)/el.Seconds(), ms(lat.mean()), retried.Load(), failed.Load(), el.Round(time.Second))
			}
		}
	}()
	u, err := neturl.Parse(url)
	if err != nil {
		return err
	}
	rawReqs := make([][]byte, poolSize)
	for i := range pool {
		rawReqs[i] = buildRawRequest(u.Host, u.Path, ctype, pool[i])
	}
	var wg sync.WaitGroup
	for w := 0; w < *concurrency; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rc := &rawClient{addr: u.Host}
			defer rc.close()
			for {
				i := next.Add(1) - 1
				if i >= int64(*requests) {
					return
				}
				t0 := time.Now()
			again:
				var code int
				var err error
				if *clientKind == "raw" {
					code, err = rc.do(rawReqs[i%poolSize])
				} else {
					req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(pool[i%poolSize]))
					req.Header.Set("Content-Type", ctype)
					var res *http.Response
					if res, err = client.Do(req); err == nil {
						_, _ = io.Copy(io.Discard, res.Body)
						res.Body.Close()
						code = res.StatusCode
					}
				}
				if err != nil {
					failed.Add(1)
					v, _ := codes.LoadOrStore("conn_error", new(atomic.Int64))
					v.(*atomic.Int64).Add(1)
					continue
				}
				if *retry && (code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable) {
					retried.Add(1)
					time.Sleep(20 * time.Millisecond)
					goto again
				}
				if code == http.StatusOK {
					ok.Add(1)
					lat.add(time.Since(t0), 1)
				} else {
					failed.Add(1)
					v, _ := codes.LoadOrStore(strconv.Itoa(code), new(atomic.Int64))
					v.(*atomic.Int64).Add(1)
				}
			}
		}()
	}
	wg.Wait()
	close(done)
	elapsed := time.Since(start)
	qps := float64(ok.Load()) / elapsed.Seconds()
	shape := fmt.Sprintf("%d", *length)
	if *length >= 1024 && *length%1024 == 0 {
		shape = fmt.Sprintf("%dKB", *length/1024)
	}
	if *signal != "logs" {
		shape = "-"
	}
	if *header {
		fmt.Println("| core | signal | count/request | logLength | requests | QPS | elapsed | p50 ms | p99 ms | exporter |")
		fmt.Println("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
	}
	fmt.Printf("| %d | %s | %d | %s | %d | %.0f | %s | %.1f | %.1f | %s |\n", runtime.NumCPU(), *signal, *count, shape,
		ok.Load(), qps, elapsed.Round(time.Millisecond), ms(lat.quantile(0.5)), ms(lat.quantile(0.99)), *exporter)
	if *report != "" {
		b, _ := json.MarshalIndent(map[string]any{"signal": *signal, "count": *count, "length": *length, "requests": ok.Load(),
			"qps": qps, "seconds": elapsed.Seconds(), "p50_ms": ms(lat.quantile(0.5)), "p99_ms": ms(lat.quantile(0.99)),
			"failed": failed.Load(), "retried": retried.Load(), "exporter": *exporter}, "", "  ")
		if err := os.WriteFile(*report, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	if r := retried.Load(); r > 0 {
		fmt.Fprintf(os.Stderr, "%d requests were retried after 429/503 (ferry's memory bound pushing back)\n", r)
	}
	if f := failed.Load(); f > 0 {
		var parts []string
		codes.Range(func(k, v any) bool {
			parts = append(parts, fmt.Sprintf("%v: %d", k, v.(*atomic.Int64).Load()))
			return true
		})
		return fmt.Errorf("%d requests failed (%s)", f, strings.Join(parts, ", "))
	}
	return nil
}

func marshal(proto, js func() ([]byte, error), asJSON bool) ([]byte, error) {
	if asJSON {
		return js()
	}
	return proto()
}
