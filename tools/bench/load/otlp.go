package load

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	neturl "net/url"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.opentelemetry.io/collector/pdata/plog/plogotlp"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/ferryhq/ferry/tools/otlpgen"
)

// OTLPCmd is a closed-loop OTLP load: --concurrency workers each send a
// request and wait for its answer, over OTLP/HTTP (bk-collector's
// "benchmark server" table) or OTLP/gRPC. Requests are marshalled once and
// the same bytes resent (a raw gRPC codec, pre-serialised HTTP/1.1), so the
// generator's own CPU stays small beside the agent it measures.
func OTLPCmd(args []string) error {
	fs := flag.NewFlagSet("otlp", flag.ContinueOnError)
	target := fs.String("target", "http://127.0.0.1:4318", "OTLP endpoint: http://host:port for --protocol http, host:port (or http://host:port) for grpc")
	protocol := fs.String("protocol", "http", "http (OTLP/HTTP protobuf, POST /v1/<signal>) or grpc (OTLP/gRPC)")
	signal := fs.String("signal", "logs", "logs, traces or metrics")
	count := fs.Int("count", 10, "items per request (logs, spans; metrics: data points of each of gauge, counter, histogram)")
	length := fs.Int("length", 1024, "logs: bytes of body per log record")
	perTrace := fs.Int("spans-per-trace", 1, "traces: consecutive spans of a request sharing a trace id (1: every span its own trace, the worst case for ferry's default split by trace)")
	body := fs.String("body", otlpgen.BodyRandom, "logs: what a body holds: random (letters and digits, which lz4 cannot compress) or text (application log lines, compressing about as real logs do)")
	requests := fs.Int("requests", 10000, "requests to send (with --duration: at most)")
	duration := fs.Duration("duration", 0, "stop sending after this long, even if --requests are not all sent")
	concurrency := fs.Int("concurrency", 16, "requests in flight (workers, each waiting for its answer)")
	asJSON := fs.Bool("json", false, "send OTLP/JSON instead of protobuf (http only)")
	exporter := fs.String("exporter", "kafka", "what the agent's exporter is, for the table's last column")
	header := fs.Bool("header", true, "print the table header")
	clientKind := fs.String("client", "raw", "http: raw (pre-serialized HTTP/1.1, cheap like wrk) or std (net/http)")
	report := fs.String("report-json", "", "also write the result as JSON to this file")
	retry := fs.Bool("retry", true, "retry a request answered 429/503 (gRPC RESOURCE_EXHAUSTED/UNAVAILABLE: an agent's backpressure) or whose connection failed, after 20 ms, as OTLP exporters retry, until --duration ends and for at most 1 min; QPS counts accepted requests")
	failOnError := fs.Bool("fail-on-error", true, "exit non-zero when a request failed (the report is written either way)")
	format := fs.String("format", FormatOTLP, "what is on the wire: otlp; zipkin (--signal traces: Zipkin v2 JSON to /api/v2/spans, the same spans otlpgen makes for OTLP); remote_write (--signal metrics: Prometheus remote write 1.0, --count series of one sample, to /api/v1/write); remote_write_otlp (the same samples as the OTLP request ferry's remote write door makes of them, over OTLP)")
	rate := fs.Float64("rate", 0, "requests per second (0 = as fast as answers come): request i is due at start + i/rate and sent then, by one of --concurrency workers; latency counts from when it was due, so a slow agent is not excused by the wait it caused")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *count < 1 || *requests < 1 || *concurrency < 1 || *perTrace < 1 {
		return fmt.Errorf("--count, --requests, --concurrency and --spans-per-trace must be positive")
	}
	if *protocol != "http" && *protocol != "grpc" {
		return fmt.Errorf("--protocol %q: want http or grpc", *protocol)
	}
	if *rate < 0 {
		return fmt.Errorf("--rate must not be negative")
	}
	if !slices.Contains(otlpgen.Bodies, *body) {
		return fmt.Errorf("--body %q: want one of %v", *body, otlpgen.Bodies)
	}
	if *protocol == "grpc" && *asJSON {
		return fmt.Errorf("--json is for --protocol http")
	}
	door, err := formatRequest(*format, *signal)
	if err != nil {
		return err
	}
	if *format == FormatZipkin || *format == FormatRemoteWrite {
		if *protocol != "http" || *asJSON {
			return fmt.Errorf("--format %s is sent over --protocol http in its own encoding (no --json)", *format)
		}
	}
	// A pool of distinct requests, so bodies differ and compression in the
	// exporter is honest.
	const poolSize = 16
	pool := make([][]byte, poolSize)
	for i := range pool {
		g := otlpgen.New(uint64(i + 1))
		var b []byte
		var err error
		switch {
		case *format != FormatOTLP:
			b, err = doorBody(*format, uint64(i+1), *count)
		case *signal == "logs":
			req := plogotlp.NewExportRequestFromLogs(g.LogsOf(*count, *length, *body))
			b, err = marshal(req.MarshalProto, req.MarshalJSON, *asJSON)
		case *signal == "traces":
			req := ptraceotlp.NewExportRequestFromTraces(g.TracesOf(*count, *perTrace))
			b, err = marshal(req.MarshalProto, req.MarshalJSON, *asJSON)
		case *signal == "metrics":
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
	newSender, closeAll, err := otlpSenders(*protocol, *clientKind, *target, *signal, *asJSON, *concurrency, pool, door)
	if err != nil {
		return err
	}
	defer closeAll()

	var next, ok, failed, retried, abandoned atomic.Int64
	var lat hist
	byCause := sync.Map{}     // failed requests by status code or cause
	abandonedBy := sync.Map{} // requests the agent still pushed back when the run ended, by cause
	start := time.Now()
	var deadline time.Time
	if *duration > 0 {
		deadline = start.Add(*duration)
	}
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
				fmt.Fprintf(os.Stderr, "%d requests (%d items), %.0f req/s, %.1f ms avg, %d retried after backpressure, %d failed, %s elapsed\n",
					n, n*int64(*count), float64(n)/el.Seconds(), ms(lat.mean()), retried.Load(), failed.Load(), el.Round(time.Second))
			}
		}
	}()
	var wg sync.WaitGroup
	for w := 0; w < *concurrency; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			send := newSender(w)
			for {
				if !deadline.IsZero() && time.Now().After(deadline) {
					return
				}
				i := next.Add(1) - 1
				if i >= int64(*requests) {
					return
				}
				t0 := time.Now()
				if *rate > 0 {
					due := start.Add(time.Duration(float64(i) / *rate * float64(time.Second)))
					if !deadline.IsZero() && due.After(deadline) {
						return
					}
					time.Sleep(time.Until(due))
					t0 = due
				}
				for first := time.Now(); ; {
					res, code := send(int(i % poolSize))
					switch {
					case res == answerOK:
						ok.Add(1)
						lat.add(time.Since(t0), 1)
					case res == answerBusy && *retry && retryAllowed(first, deadline):
						retried.Add(1)
						time.Sleep(retryPause)
						continue
					case res == answerBusy && *retry && time.Since(first) < maxRetry:
						// The run ended while the agent pushed this one back:
						// not sent, which is not the agent failing it.
						abandoned.Add(1)
						v, _ := abandonedBy.LoadOrStore(code, new(atomic.Int64))
						v.(*atomic.Int64).Add(1)
					default:
						failed.Add(1)
						v, _ := byCause.LoadOrStore(code, new(atomic.Int64))
						v.(*atomic.Int64).Add(1)
					}
					break
				}
			}
		}()
	}
	wg.Wait()
	close(done)
	elapsed := time.Since(start)
	qps := float64(ok.Load()) / elapsed.Seconds()
	items := ok.Load() * int64(*count)
	shape := fmt.Sprintf("%d", *length)
	if *length >= 1024 && *length%1024 == 0 {
		shape = fmt.Sprintf("%dKB", *length/1024)
	}
	if *body != otlpgen.BodyRandom {
		shape += " " + *body
	}
	if *signal != "logs" {
		shape = "-"
	}
	if *header {
		fmt.Println("| core | protocol | signal | count/request | logLength | requests | QPS | items/s | elapsed | p50 ms | p99 ms | exporter |")
		fmt.Println("| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
	}
	fmt.Printf("| %d | %s | %s | %d | %s | %d | %.0f | %.0f | %s | %.1f | %.1f | %s |\n", runtime.NumCPU(), *protocol, *signal, *count, shape,
		ok.Load(), qps, float64(items)/elapsed.Seconds(), elapsed.Round(time.Millisecond), ms(lat.quantile(0.5)), ms(lat.quantile(0.99)), *exporter)
	causes := func(m *sync.Map) []string {
		var out []string
		m.Range(func(k, v any) bool {
			out = append(out, fmt.Sprintf("%v: %d", k, v.(*atomic.Int64).Load()))
			return true
		})
		slices.Sort(out)
		return out
	}
	failures, pushedBack := causes(&byCause), causes(&abandonedBy)
	if *report != "" {
		b, _ := json.MarshalIndent(map[string]any{"protocol": *protocol, "signal": *signal, "count": *count, "length": *length, "requests": ok.Load(),
			"items": items, "items_per_sec": float64(items) / elapsed.Seconds(),
			"qps": qps, "seconds": elapsed.Seconds(), "p50_ms": ms(lat.quantile(0.5)), "p99_ms": ms(lat.quantile(0.99)),
			"failed": failed.Load(), "failures": strings.Join(failures, ", "), "retried": retried.Load(),
			"abandoned": abandoned.Load(), "abandoned_causes": strings.Join(pushedBack, ", "), "exporter": *exporter}, "", "  ")
		if err := os.WriteFile(*report, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	if r := retried.Load(); r > 0 {
		fmt.Fprintf(os.Stderr, "%d requests were retried after backpressure (429/503, RESOURCE_EXHAUSTED/UNAVAILABLE) or a failed connection\n", r)
	}
	if a := abandoned.Load(); a > 0 {
		fmt.Fprintf(os.Stderr, "%d requests were still pushed back when the run ended, and not sent (%s)\n", a, strings.Join(pushedBack, ", "))
	}
	var runErr error
	switch {
	case failed.Load() > 0:
		runErr = fmt.Errorf("%d requests failed (%s)", failed.Load(), strings.Join(failures, ", "))
	case ok.Load() == 0 && abandoned.Load() > 0:
		runErr = fmt.Errorf("no request was accepted: the agent pushed back or could not be reached for the whole run (%s)", strings.Join(pushedBack, ", "))
	}
	if runErr != nil {
		if *failOnError {
			return runErr
		}
		fmt.Fprintln(os.Stderr, runErr)
	}
	return nil
}

// A request the agent pushed back on, or could not be reached for, is sent
// again after retryPause, as OTLP exporters do, but not past the end of
// --duration (a run ends on time even when the agent is down): then it is
// reported as not sent, with its last cause; nor for longer than maxRetry,
// after which it counts as failed.
const (
	retryPause = 20 * time.Millisecond
	maxRetry   = time.Minute
)

func retryAllowed(first, deadline time.Time) bool {
	now := time.Now()
	return now.Sub(first) < maxRetry && (deadline.IsZero() || now.Add(retryPause).Before(deadline))
}

// connCause names why a connection failed in words that group in the
// report (the full error carries ports and addresses).
func connCause(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE):
		return "connection reset"
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return "connection closed"
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	}
	return "connection error"
}

// answer is what became of one request.
type answer int

const (
	answerOK   answer = iota
	answerBusy        // the agent pushed back: retryable
	answerFailed
)

// otlpSenders returns a constructor of one worker's send function (each
// worker owns its connection state) and a func closing what they share.
// The string a send returns with a failure names it for the report.
func otlpSenders(protocol, clientKind, target, signal string, asJSON bool, concurrency int, pool [][]byte, door doorRequest) (func(w int) func(i int) (answer, string), func(), error) {
	if protocol == "grpc" {
		addr := strings.TrimPrefix(strings.TrimPrefix(target, "http://"), "grpc://")
		method := map[string]string{
			"logs":    "/opentelemetry.proto.collector.logs.v1.LogsService/Export",
			"traces":  "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
			"metrics": "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
		}[signal]
		// One HTTP/2 connection per 8 workers: one connection's flow
		// control would cap the load below what the agent can take.
		conns := make([]*grpc.ClientConn, (concurrency+7)/8)
		for i := range conns {
			cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawCodec{}), grpc.MaxCallRecvMsgSize(64<<20)))
			if err != nil {
				return nil, nil, err
			}
			conns[i] = cc
		}
		closeAll := func() {
			for _, cc := range conns {
				cc.Close()
			}
		}
		return func(w int) func(int) (answer, string) {
			cc := conns[w%len(conns)]
			return func(i int) (answer, string) {
				req, res := rawMsg(pool[i]), rawMsg(nil)
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				err := cc.Invoke(ctx, method, &req, &res)
				cancel()
				switch c := status.Code(err); c {
				case codes.OK:
					return answerOK, ""
				case codes.Unavailable:
					// The message says whether the agent refused the
					// connection or is shedding load.
					return answerBusy, c.String() + " " + strconv.Quote(cut(status.Convert(err).Message(), 160))
				case codes.ResourceExhausted:
					// OTLP's rule: RESOURCE_EXHAUSTED is retried only with
					// RetryInfo (backpressure); without, it is "too large".
					for _, d := range status.Convert(err).Details() {
						if _, ok := d.(*errdetails.RetryInfo); ok {
							return answerBusy, c.String()
						}
					}
					return answerFailed, c.String()
				default:
					// The message names the cause; long ones are cut so
					// failures still group.
					return answerFailed, c.String() + " " + strconv.Quote(cut(status.Convert(err).Message(), 100))
				}
			}
		}, closeAll, nil
	}
	url := strings.TrimSuffix(target, "/") + door.path
	u, err := neturl.Parse(url)
	if err != nil {
		return nil, nil, err
	}
	ctype := door.ctype
	if asJSON {
		ctype = "application/json"
	}
	tr := &http.Transport{MaxIdleConns: concurrency, MaxIdleConnsPerHost: concurrency, MaxConnsPerHost: concurrency, DisableCompression: true}
	client := &http.Client{Transport: tr, Timeout: 60 * time.Second}
	rawReqs := make([][]byte, len(pool))
	for i := range pool {
		rawReqs[i] = buildRawRequest(u.Host, u.Path, ctype, door.headers, pool[i])
	}
	var mu sync.Mutex
	var raws []*rawClient
	closeAll := func() {
		tr.CloseIdleConnections()
		mu.Lock()
		defer mu.Unlock()
		for _, rc := range raws {
			rc.close()
		}
	}
	return func(int) func(int) (answer, string) {
		rc := &rawClient{addr: u.Host}
		mu.Lock()
		raws = append(raws, rc)
		mu.Unlock()
		return func(i int) (answer, string) {
			var code int
			var err error
			if clientKind == "raw" {
				code, err = rc.do(rawReqs[i])
			} else {
				req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(pool[i]))
				req.Header.Set("Content-Type", ctype)
				for _, h := range door.headers {
					k, v, _ := strings.Cut(h, ": ")
					req.Header.Set(k, v)
				}
				var res *http.Response
				if res, err = client.Do(req); err == nil {
					_, _ = io.Copy(io.Discard, res.Body)
					res.Body.Close()
					code = res.StatusCode
				}
			}
			switch {
			case err != nil:
				// Retried like a 503: an exporter retries a connection
				// the agent did not take.
				return answerBusy, connCause(err)
			case code/100 == 2: // OTLP 200, Zipkin 202, remote write 204
				return answerOK, ""
			case code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable:
				return answerBusy, strconv.Itoa(code)
			}
			return answerFailed, strconv.Itoa(code)
		}
	}, closeAll, nil
}

func cut(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

func marshal(proto, js func() ([]byte, error), asJSON bool) ([]byte, error) {
	if asJSON {
		return js()
	}
	return proto()
}
