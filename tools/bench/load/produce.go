// Package load owns ferry-bench's load: produce (through ferry over HTTP,
// or straight to Kafka with the same producer settings), consume (reading a
// topic back, with verify's delivery check), topic administration, and the
// OTLP/HTTP request load; each prints the columns of the Kafka tool it
// stands beside, so scripts and tables treat both alike.
package load

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/client"
	"github.com/ferryhq/ferry/tools/bench/verify"
)

type produceOpts struct {
	topic       string
	numRecords  int64
	recordSize  int
	throughput  float64
	target      string
	batch       int
	concurrency int
	duration    time.Duration
	flushWait   time.Duration
	props       []string
	reportJSON  string
	key         bool
	wait        bool
	payloadFile string
	payloadSep  string
	seq         bool
	metrics     bool
	metricsURL  string
	sync        bool
	// What a user can multiply (BENCHMARKS.md section 12): topics written,
	// distinct keys, distinct tokens, connections.
	topics      int
	keySpace    int
	tokensFile  string
	connections int
}

// Result is the machine-readable outcome (--report-json), used by the demo.
type Result struct {
	Target      string           `json:"target"`
	Records     int64            `json:"records_acked"`
	Failed      int64            `json:"records_failed"`
	RecordSize  int              `json:"record_size"`
	Seconds     float64          `json:"seconds"`
	RecordsSec  float64          `json:"records_per_sec"`
	MBSec       float64          `json:"mb_per_sec"`
	AvgMS       float64          `json:"avg_latency_ms"`
	MaxMS       float64          `json:"max_latency_ms"`
	P50MS       float64          `json:"p50_ms"`
	P95MS       float64          `json:"p95_ms"`
	P99MS       float64          `json:"p99_ms"`
	P999MS      float64          `json:"p999_ms"`
	FailedCodes map[string]int64 `json:"failed_by_status,omitempty"`
	Seq         *verify.Report   `json:"seq,omitempty"`
}

func ProduceCmd(args []string) error {
	var o produceOpts
	fs := flag.NewFlagSet("produce", flag.ContinueOnError)
	fs.StringVar(&o.topic, "topic", "ferry-bench", "topic to produce to")
	fs.Int64Var(&o.numRecords, "num-records", 1_000_000, "records to send (an upper bound when --duration is set)")
	fs.IntVar(&o.recordSize, "record-size", 100, "bytes per record value")
	fs.Float64Var(&o.throughput, "throughput", -1, "records/sec to aim for; -1 = as fast as possible")
	fs.StringVar(&o.target, "target", "http://127.0.0.1:8088", "http://host:port (through ferry over HTTP), unix:PATH or ferry://host:port (through ferry over the local protocol, with the Go client), or kafka://host:port (straight to the broker)")
	fs.BoolVar(&o.sync, "sync", false, "local protocol: each worker sends its --batch records with ProduceSync and waits (pan's client's habit); default asynchronous Produce")
	fs.IntVar(&o.batch, "batch", 100, "records per HTTP request (NDJSON); local protocol: records per ProduceSync with --sync")
	fs.IntVar(&o.concurrency, "concurrency", 8, "concurrent HTTP requests; local protocol: goroutines producing")
	fs.DurationVar(&o.duration, "duration", 0, "stop after this long (0 = when --num-records are sent)")
	fs.DurationVar(&o.flushWait, "flush-timeout", time.Minute, "kafka and local targets: how long to wait, once sending stops, for the records still unanswered")
	fs.StringVar(&o.reportJSON, "report-json", "", "also write the Result as JSON to this file")
	fs.BoolVar(&o.wait, "wait", true, "http target: wait for Kafka's acknowledgement (false: ?wait=false, answered on enqueue)")
	fs.BoolVar(&o.key, "keys", false, "give every record a key (worker-sequence); default keyless")
	fs.StringVar(&o.payloadFile, "payload-file", "", "take record values from this file, split by --payload-delimiter, picked at random (as ProducerPerformance); --record-size is then ignored")
	fs.StringVar(&o.payloadSep, "payload-delimiter", "\\n", "delimiter of --payload-file (\\n is a newline)")
	fs.BoolVar(&o.seq, "seq", false, "start every value with a sequence id (#producer.stream.seq.) for consume --verify; needs --record-size ≥ 16")
	fs.BoolVar(&o.metrics, "print-metrics", false, "print the producer's metrics at the end (kafka target: the client's; http target: requests, bytes, statuses, and the agent's own with --metrics-url)")
	fs.StringVar(&o.metricsURL, "metrics-url", "", "http target: the agent's /metrics, printed with --print-metrics")
	fs.IntVar(&o.topics, "topics", 1, "spread the records over this many topics, --topic-0 … --topic-(N-1), in turn (http: a request at a time; local and kafka: a record at a time); 1 = --topic itself")
	fs.IntVar(&o.keySpace, "key-space", 0, "give records keys drawn at random from this many distinct ones (k000000000 …, 10 bytes; http: one key a request); 0 = see --keys")
	fs.StringVar(&o.tokensFile, "tokens", "", "application tokens, one a line: http sends one picked at random with each request (Authorization: Bearer); local gives connection i the token i mod their number in its hello")
	fs.IntVar(&o.connections, "connections", 0, "http and local targets: this many connections, one worker each (it replaces --concurrency), every one used in turn at a fixed --throughput; 0 = the usual shared client")
	bootstrap := fs.String("bootstrap-server", "", "Kafka broker: the same as --target kafka://HOST:PORT")
	var props multi
	fs.Var(&props, "command-property", "the same as --producer-props (ProducerPerformance's newer name)")
	interval := fs.Int64("reporting-interval", 5000, "milliseconds between progress lines when not on a terminal")
	fs.Var(&props, "producer-props", "k=v producer settings, repeatable or space-separated in one value: bootstrap.servers, acks, linger.ms, compression.type, batch.size, buffer.memory, enable.idempotence, client.id, request.timeout.ms, max.in.flight.requests.per.connection")
	if err := fs.Parse(args); err != nil {
		return err
	}
	for _, p := range props {
		o.props = append(o.props, strings.Fields(p)...)
	}
	for _, p := range o.props {
		if k, v, _ := strings.Cut(p, "="); k == "bootstrap.servers" {
			*bootstrap = strings.Split(v, ",")[0]
		}
	}
	if *bootstrap != "" {
		o.target = "kafka://" + *bootstrap
	}
	if o.recordSize < 1 || o.batch < 1 || o.concurrency < 1 || o.numRecords < 1 {
		return fmt.Errorf("--record-size, --batch, --concurrency and --num-records must be positive")
	}
	if o.topics < 1 || o.keySpace < 0 || o.connections < 0 {
		return fmt.Errorf("--topics must be positive, --key-space and --connections not negative")
	}
	if o.connections > 0 {
		o.concurrency = o.connections
	}
	var tokens []string
	if o.tokensFile != "" {
		var err error
		if tokens, err = readTokens(o.tokensFile); err != nil {
			return err
		}
	}
	if o.seq && o.recordSize < verify.MinRecord {
		return fmt.Errorf("--seq needs --record-size ≥ %d to hold the id", verify.MinRecord)
	}
	if o.seq && o.payloadFile != "" {
		return fmt.Errorf("--seq and --payload-file exclude each other: the id replaces the start of the value")
	}
	pool := newPayloadPool(o.recordSize)
	if o.payloadFile != "" {
		var err error
		if pool, err = loadPayloads(o.payloadFile, o.payloadSep); err != nil {
			return err
		}
		if strings.HasPrefix(o.target, "http://") {
			for _, p := range pool.list {
				if bytes.IndexByte(p, '\n') >= 0 {
					return fmt.Errorf("--payload-file: a payload contains a newline, which NDJSON over http cannot carry")
				}
			}
		}
	}
	r := &run{o: o, pool: pool, start: time.Now(), producer: verify.NewProducerID(), topics: topicNames(o.topic, o.topics), tokens: tokens}
	if o.throughput > 0 {
		r.pace = time.Duration(float64(time.Second) / o.throughput)
	}
	// SIGINT ends the run as --duration does, with the final line and
	// --report-json: the cost curves stop their load when the window ends.
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt)
	defer cancel()
	if o.duration > 0 {
		ctx, cancel = context.WithTimeout(ctx, o.duration)
		defer cancel()
	}
	stopProgress := r.progress(time.Duration(max(*interval, 100)) * time.Millisecond)
	var err error
	switch {
	case strings.HasPrefix(o.target, "http://"):
		err = r.http(ctx)
	case strings.HasPrefix(o.target, "kafka://"):
		err = r.kafka(ctx)
	case strings.HasPrefix(o.target, "unix:"):
		err = r.local(ctx, o.target)
	case strings.HasPrefix(o.target, "ferry://"):
		err = r.local(ctx, "tcp:"+strings.TrimPrefix(o.target, "ferry://"))
	default:
		err = fmt.Errorf("--target %q: want http://host:port, unix:PATH, ferry://host:port or kafka://host:port", o.target)
	}
	stopProgress()
	if err != nil {
		return err
	}
	return r.finish()
}

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

// payloadPool is a pre-generated block of random printable bytes; a record's
// value is a slice of it at a random offset, so values differ (compression
// figures stay honest) and generating them costs nothing during the run.
// With --payload-file it is the file's payloads instead.
type payloadPool struct {
	data []byte
	size int
	list [][]byte
}

func loadPayloads(path, sep string) (*payloadPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	sep = strings.ReplaceAll(sep, `\n`, "\n")
	var list [][]byte
	for _, p := range bytes.Split(b, []byte(sep)) {
		if len(p) > 0 {
			list = append(list, p)
		}
	}
	if len(list) == 0 {
		return nil, fmt.Errorf("--payload-file %s: no payloads", path)
	}
	fmt.Fprintf(os.Stderr, "read %d payloads from %s\n", len(list), path)
	return &payloadPool{list: list}, nil
}

func newPayloadPool(size int) *payloadPool {
	const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	n := max(4<<20, 16*size)
	if size > 1<<20 {
		n = 4 * size // 10 MB records: 40 MB of values, not 160
	}
	d := make([]byte, n)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range d {
		d[i] = alphabet[rng.IntN(len(alphabet))]
	}
	return &payloadPool{data: d, size: size}
}

func (p *payloadPool) pick(rng *rand.Rand) []byte {
	if p.list != nil {
		return p.list[rng.IntN(len(p.list))]
	}
	off := rng.IntN(len(p.data) - p.size + 1)
	return p.data[off : off+p.size : off+p.size]
}

type run struct {
	o      produceOpts
	pool   *payloadPool
	start  time.Time
	end    time.Time
	pace   time.Duration
	issued atomic.Int64 // records claimed for sending
	acked  atomic.Int64
	failed atomic.Int64
	lat    hist
	codes  sync.Map // status -> *atomic.Int64

	topics []string // --topics: the names, in turn
	tokens []string // --tokens
	reqN   atomic.Int64

	producer string // sequence-id prefix of this run
	ledger   verify.Ledger
	sentB    atomic.Int64 // payload bytes acknowledged
	reqs     atomic.Int64
	reqB     atomic.Int64
	km       kmetrics
}

// value returns a record value: with --seq the id, then pool bytes up to
// --record-size, appended to dst.
func (r *run) value(dst []byte, rng *rand.Rand, stream int, seq int64) []byte {
	if !r.o.seq {
		return append(dst, r.pool.pick(rng)...)
	}
	start := len(dst)
	dst = verify.AppendSeq(dst, r.producer, stream, seq)
	if pad := r.o.recordSize - (len(dst) - start); pad > 0 {
		dst = append(dst, r.pool.pick(rng)[:pad]...)
	}
	return dst
}

// claim reserves up to n records to send, honouring --num-records and
// --throughput; 0 means stop. first is the sequence id of the first.
func (r *run) claim(ctx context.Context, n int) (first int64, _ int) {
	if ctx.Err() != nil {
		return 0, 0
	}
	after := r.issued.Add(int64(n))
	first = after - int64(n)
	if over := after - r.o.numRecords; over > 0 {
		n -= int(over)
		if n <= 0 {
			return 0, 0
		}
	}
	if r.pace > 0 {
		due := r.start.Add(time.Duration(after-int64(n)) * r.pace)
		if d := time.Until(due); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
				r.ledger.Fail(first, int64(n)) // claimed, never sent
				return 0, 0
			}
		}
	}
	return first, n
}

func (r *run) fail(code string, n int) {
	r.failed.Add(int64(n))
	v, _ := r.codes.LoadOrStore(code, new(atomic.Int64))
	v.(*atomic.Int64).Add(int64(n))
}

func (r *run) http(ctx context.Context) error {
	u, err := url.Parse(r.o.target)
	if err != nil {
		return err
	}
	endpoints := make([]string, len(r.topics))
	for i, t := range r.topics {
		endpoints[i] = fmt.Sprintf("http://%s/v1/messages/%s", u.Host, url.PathEscape(t))
		if !r.o.wait {
			endpoints[i] += "?wait=false"
		}
	}
	newTransport := func(conns int) *http.Transport {
		return &http.Transport{
			MaxIdleConns: conns, MaxIdleConnsPerHost: conns, MaxConnsPerHost: conns,
			DialContext:        (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
			DisableCompression: true,
		}
	}
	// --connections: a transport of one connection per worker, so there
	// are exactly that many, each used in turn.
	transports := []*http.Transport{newTransport(r.o.concurrency)}
	if r.o.connections > 0 {
		transports = make([]*http.Transport, r.o.connections)
		for i := range transports {
			transports[i] = newTransport(1)
		}
	}
	var wg sync.WaitGroup
	for w := 0; w < r.o.concurrency; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			client := &http.Client{Transport: transports[w%len(transports)], Timeout: 60 * time.Second}
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			var key []byte
			body := make([]byte, 0, r.o.batch*(r.o.recordSize+1))
			var seq int
			for {
				first, n := r.claim(ctx, r.o.batch)
				if n == 0 {
					return
				}
				body = body[:0]
				for i := 0; i < n; i++ {
					body = r.value(body, rng, w, first+int64(i))
					body = append(body, '\n')
				}
				r.reqs.Add(1)
				r.reqB.Add(int64(len(body)))
				req, _ := http.NewRequest(http.MethodPost, endpoints[r.reqN.Add(1)%int64(len(endpoints))], bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/x-ndjson")
				if r.tokens != nil {
					req.Header.Set("Authorization", "Bearer "+r.tokens[rng.IntN(len(r.tokens))])
				}
				if r.o.keySpace > 0 {
					key = appendKey(key[:0], rng.IntN(r.o.keySpace))
					req.Header.Set("X-Ferry-Key", string(key))
				} else if r.o.key {
					req.Header.Set("X-Ferry-Key", fmt.Sprintf("w%d-%d", w, seq))
					seq++
				}
				t0 := time.Now()
				resp, err := client.Do(req)
				if err != nil {
					r.fail("conn_error", n)
					r.ledger.Fail(first, int64(n))
					if ctx.Err() == nil {
						time.Sleep(100 * time.Millisecond)
					}
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusAccepted {
					r.lat.add(time.Since(t0), n)
					r.acked.Add(int64(n))
					r.sentB.Add(int64(len(body) - n))
				} else {
					r.fail(strconv.Itoa(resp.StatusCode), n)
					r.ledger.Fail(first, int64(n))
					if ra := resp.Header.Get("Retry-After"); ra != "" {
						time.Sleep(50 * time.Millisecond) // brief, so the run still measures the ceiling
					}
				}
			}
		}(w)
	}
	wg.Wait()
	r.end = time.Now()
	for _, tr := range transports {
		tr.CloseIdleConnections()
	}
	return nil
}

func (r *run) kafka(ctx context.Context) error {
	host := strings.TrimPrefix(r.o.target, "kafka://")
	opts := []kgo.Opt{
		kgo.SeedBrokers(host),
		kgo.DefaultProduceTopic(r.o.topic),
		// The same producer settings ferry's exporter uses by default, so the
		// two targets compare like for like; --producer-props overrides.
		kgo.ProducerBatchCompression(kgo.Lz4Compression()),
		kgo.ProducerLinger(5 * time.Millisecond),
		kgo.ProducerBatchMaxBytes(1_000_000),
		kgo.MaxBufferedRecords(100_000),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
		kgo.ClientID("ferry-bench"),
		kgo.WithHooks(&r.km),
	}
	for _, p := range r.o.props {
		k, v, _ := strings.Cut(p, "=")
		n, _ := strconv.Atoi(v)
		switch k {
		case "bootstrap.servers":
		case "acks":
			switch v {
			case "all", "-1":
				opts = append(opts, kgo.RequiredAcks(kgo.AllISRAcks()))
			case "1":
				opts = append(opts, kgo.RequiredAcks(kgo.LeaderAck()), kgo.DisableIdempotentWrite())
			case "0":
				opts = append(opts, kgo.RequiredAcks(kgo.NoAck()), kgo.DisableIdempotentWrite())
			default:
				return fmt.Errorf("--producer-props acks=%s: want all, -1, 1 or 0", v)
			}
		case "linger.ms":
			opts = append(opts, kgo.ProducerLinger(time.Duration(n)*time.Millisecond))
		case "compression.type":
			c, ok := map[string]kgo.CompressionCodec{"none": kgo.NoCompression(), "gzip": kgo.GzipCompression(),
				"snappy": kgo.SnappyCompression(), "lz4": kgo.Lz4Compression(), "zstd": kgo.ZstdCompression()}[v]
			if !ok {
				return fmt.Errorf("--producer-props compression.type=%s: want none, gzip, snappy, lz4 or zstd", v)
			}
			opts = append(opts, kgo.ProducerBatchCompression(c))
		case "batch.size":
			opts = append(opts, kgo.ProducerBatchMaxBytes(int32(n)))
		case "buffer.memory":
			opts = append(opts, kgo.MaxBufferedBytes(n))
		case "enable.idempotence":
			if v == "false" {
				opts = append(opts, kgo.DisableIdempotentWrite())
			}
		case "client.id":
			opts = append(opts, kgo.ClientID(v))
		case "request.timeout.ms":
			opts = append(opts, kgo.ProduceRequestTimeout(time.Duration(n)*time.Millisecond))
		case "max.in.flight.requests.per.connection":
			if n == 1 {
				opts = append(opts, kgo.MaxProduceRequestsInflightPerBroker(1))
			}
		default:
			return fmt.Errorf("--producer-props %s: unsupported (bootstrap.servers, acks, linger.ms, compression.type, batch.size, buffer.memory, enable.idempotence, client.id, request.timeout.ms, max.in.flight.requests.per.connection)", k)
		}
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return err
	}
	defer cl.Close()
	recPool := sync.Pool{New: func() any { return new(kgo.Record) }}
	promise := func(rec *kgo.Record, err error) {
		if err != nil {
			// Counted whatever the error, ctx's too: franz-go fails with the
			// record's ctx also records it had buffered and not sent (the
			// local target's ctx error is only Produce's wait for room).
			r.fail("kafka_error", 1)
			if r.o.seq {
				_, _, seq, _ := verify.ParseSeq(rec.Value)
				r.ledger.Fail(seq, 1)
			}
		} else {
			r.lat.add(time.Since(rec.Timestamp), 1)
			r.acked.Add(1)
			r.sentB.Add(int64(len(rec.Value)))
		}
		*rec = kgo.Record{}
		recPool.Put(rec)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	var seq int
	for {
		first, n := r.claim(ctx, 64)
		if n == 0 {
			break
		}
		for i := 0; i < n; i++ {
			rec := recPool.Get().(*kgo.Record)
			if r.o.seq {
				rec.Value = r.value(make([]byte, 0, r.o.recordSize), rng, 0, first+int64(i))
			} else {
				rec.Value = r.pool.pick(rng)
			}
			if len(r.topics) > 1 {
				rec.Topic = r.topicOf(first + int64(i))
			}
			if r.o.keySpace > 0 {
				rec.Key = appendKey(nil, rng.IntN(r.o.keySpace))
			} else if r.o.key {
				rec.Key = strconv.AppendInt(nil, int64(seq), 10)
				seq++
			}
			rec.Timestamp = time.Now()
			// ctx, not Background: with the client's buffer full and the
			// brokers silent, Produce blocks, and --duration must still end
			// the run (such a record is failed with ctx's error).
			cl.Produce(ctx, rec, promise)
		}
	}
	fctx, cancel := context.WithTimeout(context.Background(), r.o.flushWait)
	defer cancel()
	if err := cl.Flush(fctx); err != nil {
		return fmt.Errorf("%d records still unanswered by Kafka %s after sending stopped: %w", cl.BufferedProduceRecords(), r.o.flushWait, err)
	}
	r.end = time.Now()
	return nil
}

// local sends through ferry with the Go client over the local protocol.
func (r *run) local(ctx context.Context, addr string) error {
	opts := client.Options{Addrs: []string{addr}, ClientName: "ferry-bench"} // the client's defaults
	for _, p := range r.o.props {
		if k, v, _ := strings.Cut(p, "="); k == "compression.type" && v != "none" {
			opts.Compression = v
		}
	}
	// --connections: a client (one connection) per worker; --tokens: each
	// connection's hello carries one.
	clients := make([]*client.Client, max(1, r.o.connections))
	for i := range clients {
		o := opts
		if r.tokens != nil {
			o.Token = r.tokens[i%len(r.tokens)]
		}
		c, err := client.New(o)
		if err != nil {
			for _, c := range clients[:i] {
				_ = c.Close(context.Background())
			}
			return err
		}
		clients[i] = c
	}
	recPool := sync.Pool{New: func() any { return &client.Record{Topic: r.o.topic} }}
	cb := func(rec *client.Record, err error) {
		if err != nil {
			code := "local_error"
			var fe *client.Error
			switch {
			case errors.As(err, &fe):
				code = fe.Reason
			case errors.Is(err, client.ErrBufferFull):
				code = "buffer_full" // the buffer stayed full for MaxBlock
			case errors.Is(err, client.ErrClosed):
				code = "closed" // unanswered by --flush-timeout
			case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
				code = "" // the run ended while Produce waited: never sent
			}
			if code != "" {
				r.fail(code, 1)
			}
			if r.o.seq {
				_, _, seq, _ := verify.ParseSeq(rec.Value)
				r.ledger.Fail(seq, 1)
			}
		} else {
			r.lat.add(time.Since(rec.Timestamp), 1)
			r.acked.Add(1)
			r.sentB.Add(int64(len(rec.Value)))
		}
		recPool.Put(rec)
	}
	var wg sync.WaitGroup
	for w := 0; w < r.o.concurrency; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			c := clients[w%len(clients)]
			rng := rand.New(rand.NewPCG(uint64(w), 11))
			var seq int
			var batch []*client.Record
			for {
				first, n := r.claim(ctx, r.o.batch)
				if n == 0 {
					return
				}
				batch = batch[:0]
				for i := 0; i < n; i++ {
					rec := recPool.Get().(*client.Record)
					if r.o.seq {
						rec.Value = r.value(rec.Value[:0], rng, w, first+int64(i))
					} else {
						// A slice of the read-only pool, as the kafka target
						// does: copying it first cost this door a copy of
						// every value that the direct one does not make, so
						// the tool, not ferry, set part of the local/direct
						// ratio (against a blackhole agent, 16 B: 10-15%
						// more records/s for the same tool CPU).
						rec.Value = r.pool.pick(rng)
					}
					rec.Timestamp = time.Now()
					rec.Topic = r.topicOf(first + int64(i))
					if r.o.keySpace > 0 {
						rec.Key = appendKey(rec.Key[:0], rng.IntN(r.o.keySpace))
					} else if r.o.key {
						rec.Key = strconv.AppendInt(append(rec.Key[:0], 'w'), int64(w*1_000_000+seq), 10)
						seq++
					}
					if !r.o.sync {
						c.Produce(ctx, rec, cb) // ctx: --duration ends a blocked Produce too
						continue
					}
					batch = append(batch, rec)
				}
				if r.o.sync {
					r.produceSync(c, batch, cb)
				}
			}
		}(w)
	}
	wg.Wait()
	fctx, cancel := context.WithTimeout(context.Background(), r.o.flushWait)
	defer cancel()
	for _, c := range clients {
		if err := c.Close(fctx); err != nil {
			return fmt.Errorf("flush: %w", err)
		}
	}
	r.end = time.Now()
	return nil
}

// produceSync sends recs with ProduceSync, reporting each through cb (with
// --batch > 1, a failed call's records all count as failed: ProduceSync
// returns one error).
func (r *run) produceSync(c *client.Client, recs []*client.Record, cb func(*client.Record, error)) {
	err := c.ProduceSync(context.Background(), recs...)
	for _, rec := range recs {
		cb(rec, err)
	}
}

// kmetrics collects the Kafka client's figures for --print-metrics from
// franz-go's hooks (names follow the Java producer's where one exists).
type kmetrics struct {
	batches, records, uncompressed, compressed atomic.Int64
	requests, requestErrs, requestNS, maxNS    atomic.Int64
}

func (m *kmetrics) OnProduceBatchWritten(_ kgo.BrokerMetadata, _ string, _ int32, b kgo.ProduceBatchMetrics) {
	m.batches.Add(1)
	m.records.Add(int64(b.NumRecords))
	m.uncompressed.Add(int64(b.UncompressedBytes))
	m.compressed.Add(int64(b.CompressedBytes))
}

func (m *kmetrics) OnBrokerE2E(_ kgo.BrokerMetadata, key int16, e2e kgo.BrokerE2E) {
	if key != 0 {
		return
	}
	if e2e.Err() != nil {
		m.requestErrs.Add(1)
		return
	}
	d := e2e.DurationE2E().Nanoseconds()
	m.requests.Add(1)
	m.requestNS.Add(d)
	for {
		cur := m.maxNS.Load()
		if d <= cur || m.maxNS.CompareAndSwap(cur, d) {
			break
		}
	}
}

var (
	_ kgo.HookProduceBatchWritten = (*kmetrics)(nil)
	_ kgo.HookBrokerE2E           = (*kmetrics)(nil)
)

// printMetrics prints "group:name:{tags} : value" lines sorted by name, the
// shape of ProducerPerformance's --print-metrics.
func (r *run) printMetrics() {
	type kv struct {
		k string
		v float64
	}
	var out []kv
	add := func(group, name string, v float64) {
		out = append(out, kv{fmt.Sprintf("%s:%s:{client-id=ferry-bench}", group, name), v})
	}
	sec := r.end.Sub(r.start).Seconds()
	div := func(a, b float64) float64 {
		if b == 0 {
			return 0
		}
		return a / b
	}
	add("producer-metrics", "record-send-total", float64(r.acked.Load()))
	add("producer-metrics", "record-send-rate", div(float64(r.acked.Load()), sec))
	add("producer-metrics", "record-error-total", float64(r.failed.Load()))
	add("producer-metrics", "record-size-avg", div(float64(r.sentB.Load()), float64(r.acked.Load())))
	add("producer-metrics", "request-latency-avg", ms(r.lat.mean()))
	add("producer-metrics", "request-latency-max", ms(r.lat.max()))
	if strings.HasPrefix(r.o.target, "kafka://") {
		m := &r.km
		add("producer-metrics", "batch-size-avg", div(float64(m.compressed.Load()), float64(m.batches.Load())))
		add("producer-metrics", "records-per-request-avg", div(float64(m.records.Load()), float64(m.batches.Load())))
		add("producer-metrics", "compression-rate-avg", div(float64(m.compressed.Load()), float64(m.uncompressed.Load())))
		add("producer-metrics", "produce-request-total", float64(m.requests.Load()))
		add("producer-metrics", "produce-request-error-total", float64(m.requestErrs.Load()))
		add("producer-metrics", "produce-request-latency-avg", div(float64(m.requestNS.Load())/1e6, float64(m.requests.Load())))
		add("producer-metrics", "produce-request-latency-max", float64(m.maxNS.Load())/1e6)
		add("producer-metrics", "outgoing-byte-total", float64(m.compressed.Load()))
	} else {
		add("http-metrics", "request-total", float64(r.reqs.Load()))
		add("http-metrics", "request-rate", div(float64(r.reqs.Load()), sec))
		add("http-metrics", "outgoing-byte-total", float64(r.reqB.Load()))
		add("http-metrics", "outgoing-byte-rate", div(float64(r.reqB.Load()), sec))
		r.codes.Range(func(k, v any) bool {
			add("http-metrics", "failed-records-"+k.(string), float64(v.(*atomic.Int64).Load()))
			return true
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].k < out[j].k })
	width := 0
	for _, e := range out {
		width = max(width, len(e.k))
	}
	fmt.Println()
	fmt.Printf("%-*s   %s\n", width, "Metric Name", "Value")
	for _, e := range out {
		fmt.Printf("%-*s : %.3f\n", width, e.k, e.v)
	}
	if r.o.metricsURL != "" {
		resp, err := http.Get(r.o.metricsURL)
		if err != nil {
			fmt.Fprintln(os.Stderr, "--metrics-url:", err)
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		fmt.Println()
		fmt.Println("agent metrics (" + r.o.metricsURL + "):")
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "ferry_") && !strings.Contains(line, "_bucket{") {
				fmt.Println("  " + line)
			}
		}
	}
}

// progress shows how the run goes: on a terminal a live bar (records,
// rate, elapsed, ETA); otherwise a line like ProducerPerformance's windows
// every interval.
func (r *run) progress(every time.Duration) func() {
	done := make(chan struct{})
	stopped := make(chan struct{})
	if IsTTY(os.Stderr) {
		go func() {
			defer close(stopped)
			t := time.NewTicker(200 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-done:
					fmt.Fprint(os.Stderr, "\r\033[K")
					return
				case now := <-t.C:
					a, el := r.acked.Load(), now.Sub(r.start)
					total, what := r.o.numRecords, "records"
					if r.o.duration > 0 {
						// A timed run: the bar is time, the counts are records.
						total, what = int64(r.o.duration/time.Second), fmt.Sprintf("s, %s records", Human(float64(a)))
						a = int64(el / time.Second)
						fmt.Fprint(os.Stderr, Bar(a, total, what, el, 1))
						continue
					}
					fmt.Fprint(os.Stderr, Bar(a, total, what, el, float64(a)/el.Seconds()))
				}
			}
		}()
		return func() { close(done); <-stopped }
	}
	go func() {
		defer close(stopped)
		t := time.NewTicker(every)
		defer t.Stop()
		last, lastT := int64(0), r.start
		for {
			select {
			case <-done:
				return
			case now := <-t.C:
				a := r.acked.Load()
				sec := now.Sub(lastT).Seconds()
				rate := float64(a-last) / sec
				line := fmt.Sprintf("%d records sent, %.1f records/sec (%.2f MB/sec), %.1f ms avg latency, %.1f ms max latency.",
					a-last, rate, rate*float64(r.o.recordSize)/(1<<20), ms(r.lat.mean()), ms(r.lat.max()))
				if f := r.failed.Load(); f > 0 {
					line += fmt.Sprintf(" (%d failed so far)", f)
				}
				if r.o.duration > 0 {
					line += fmt.Sprintf(" [%s/%s]", now.Sub(r.start).Round(time.Second), r.o.duration)
				} else if a > 0 {
					eta := time.Duration(float64(r.o.numRecords-a) / (float64(a) / now.Sub(r.start).Seconds()) * float64(time.Second))
					line += fmt.Sprintf(" [%d/%d, ETA %s]", a, r.o.numRecords, eta.Round(time.Second))
				}
				fmt.Fprintln(os.Stderr, line)
				last, lastT = a, now
			}
		}
	}()
	return func() { close(done); <-stopped }
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func (r *run) finish() error {
	if r.end.IsZero() {
		r.end = time.Now()
	}
	sec := r.end.Sub(r.start).Seconds()
	a := r.acked.Load()
	rate := float64(a) / sec
	res := Result{
		Target: r.o.target, Records: a, Failed: r.failed.Load(), RecordSize: r.o.recordSize, Seconds: sec,
		RecordsSec: rate, MBSec: rate * float64(r.o.recordSize) / (1 << 20),
		AvgMS: ms(r.lat.mean()), MaxMS: ms(r.lat.max()),
		P50MS: ms(r.lat.quantile(0.5)), P95MS: ms(r.lat.quantile(0.95)), P99MS: ms(r.lat.quantile(0.99)), P999MS: ms(r.lat.quantile(0.999)),
	}
	fmt.Println(FinalLine(res))
	if res.Failed > 0 {
		res.FailedCodes = map[string]int64{}
		r.codes.Range(func(k, v any) bool {
			res.FailedCodes[k.(string)] = v.(*atomic.Int64).Load()
			return true
		})
		fmt.Printf("%d records failed: %v\n", res.Failed, res.FailedCodes)
	}
	if r.o.seq {
		res.Seq = &verify.Report{Producer: r.producer, Issued: min(r.issued.Load(), r.o.numRecords), Failed: r.ledger.Failed()}
	}
	if r.o.metrics {
		r.printMetrics()
	}
	if r.o.reportJSON != "" {
		b, _ := json.MarshalIndent(res, "", "  ")
		if err := os.WriteFile(r.o.reportJSON, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// FinalLine is Kafka's ProducerPerformance final line for res, so scripts
// that parse that tool's output read ferry-bench's too.
func FinalLine(res Result) string {
	return fmt.Sprintf("%d records sent, %.1f records/sec (%.2f MB/sec), %.1f ms avg latency, %.1f ms max latency, %d ms 50th, %d ms 95th, %d ms 99th, %d ms 99.9th.",
		res.Records, res.RecordsSec, res.MBSec, res.AvgMS, res.MaxMS, int(res.P50MS), int(res.P95MS), int(res.P99MS), int(res.P999MS))
}

// topicNames is --topics' names: the topic itself for one, else topic-0 …
// topic-(n-1).
func topicNames(topic string, n int) []string {
	if n <= 1 {
		return []string{topic}
	}
	out := make([]string, n)
	for i := range out {
		out[i] = topic + "-" + strconv.Itoa(i)
	}
	return out
}

// topicOf is the topic of the record (or request) numbered seq: the
// topics in turn, so every one is written at the same rate.
func (r *run) topicOf(seq int64) string { return r.topics[seq%int64(len(r.topics))] }

// appendKey appends key i of --key-space: k and nine digits, so every key
// is 10 bytes and only their number changes between runs.
func appendKey(dst []byte, i int) []byte {
	dst = append(dst, 'k')
	var d [9]byte
	for j := 8; j >= 0; j-- {
		d[j] = byte('0' + i%10)
		i /= 10
	}
	return append(dst, d[:]...)
}

// readTokens reads --tokens: one token a line, blank lines skipped.
func readTokens(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--tokens %s: no tokens", path)
	}
	return out, nil
}
