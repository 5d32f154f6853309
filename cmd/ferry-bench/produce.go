package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
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
	props       []string
	reportJSON  string
	key         bool
	wait        bool
}

// result is the machine-readable outcome (--report-json), used by the demo.
type result struct {
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
}

func produceCmd(args []string) error {
	var o produceOpts
	fs := flag.NewFlagSet("produce", flag.ContinueOnError)
	fs.StringVar(&o.topic, "topic", "ferry-bench", "topic to produce to")
	fs.Int64Var(&o.numRecords, "num-records", 1_000_000, "records to send (an upper bound when --duration is set)")
	fs.IntVar(&o.recordSize, "record-size", 100, "bytes per record value")
	fs.Float64Var(&o.throughput, "throughput", -1, "records/sec to aim for; -1 = as fast as possible")
	fs.StringVar(&o.target, "target", "http://127.0.0.1:8088", "http://host:port (through ferry) or kafka://host:port (straight to the broker)")
	fs.IntVar(&o.batch, "batch", 100, "records per HTTP request (NDJSON); http target only")
	fs.IntVar(&o.concurrency, "concurrency", 8, "concurrent HTTP requests; http target only")
	fs.DurationVar(&o.duration, "duration", 0, "stop after this long (0 = when --num-records are sent)")
	fs.StringVar(&o.reportJSON, "report-json", "", "also write the result as JSON to this file")
	fs.BoolVar(&o.wait, "wait", true, "http target: wait for Kafka's acknowledgement (false: ?wait=false, answered on enqueue)")
	fs.BoolVar(&o.key, "keys", false, "give every record a key (worker-sequence); default keyless")
	var props multi
	fs.Var(&props, "producer-props", "kafka target: k=v producer settings (acks, linger.ms, compression.type, batch.size); repeatable")
	if err := fs.Parse(args); err != nil {
		return err
	}
	o.props = props
	if o.recordSize < 1 || o.batch < 1 || o.concurrency < 1 || o.numRecords < 1 {
		return fmt.Errorf("--record-size, --batch, --concurrency and --num-records must be positive")
	}
	pool := newPayloadPool(o.recordSize)
	r := &run{o: o, pool: pool, start: time.Now()}
	if o.throughput > 0 {
		r.pace = time.Duration(float64(time.Second) / o.throughput)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if o.duration > 0 {
		ctx, cancel = context.WithTimeout(ctx, o.duration)
		defer cancel()
	}
	stopProgress := r.progress(5 * time.Second)
	var err error
	switch {
	case strings.HasPrefix(o.target, "http://"):
		err = r.http(ctx)
	case strings.HasPrefix(o.target, "kafka://"):
		err = r.kafka(ctx)
	default:
		err = fmt.Errorf("--target %q: want http://host:port or kafka://host:port", o.target)
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
type payloadPool struct {
	data []byte
	size int
}

func newPayloadPool(size int) *payloadPool {
	const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	n := max(4<<20, 16*size)
	d := make([]byte, n)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range d {
		d[i] = alphabet[rng.IntN(len(alphabet))]
	}
	return &payloadPool{data: d, size: size}
}

func (p *payloadPool) pick(rng *rand.Rand) []byte {
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
}

// claim reserves up to n records to send, honouring --num-records and
// --throughput; 0 means stop.
func (r *run) claim(ctx context.Context, n int) int {
	if ctx.Err() != nil {
		return 0
	}
	after := r.issued.Add(int64(n))
	if over := after - r.o.numRecords; over > 0 {
		n -= int(over)
		if n <= 0 {
			return 0
		}
	}
	if r.pace > 0 {
		due := r.start.Add(time.Duration(after-int64(n)) * r.pace)
		if d := time.Until(due); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
				return 0
			}
		}
	}
	return n
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
	endpoint := fmt.Sprintf("http://%s/v1/messages/%s", u.Host, url.PathEscape(r.o.topic))
	if !r.o.wait {
		endpoint += "?wait=false"
	}
	tr := &http.Transport{
		MaxIdleConns: r.o.concurrency, MaxIdleConnsPerHost: r.o.concurrency, MaxConnsPerHost: r.o.concurrency,
		DialContext:        (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		DisableCompression: true,
	}
	client := &http.Client{Transport: tr, Timeout: 60 * time.Second}
	var wg sync.WaitGroup
	for w := 0; w < r.o.concurrency; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			body := make([]byte, 0, r.o.batch*(r.o.recordSize+1))
			var seq int
			for {
				n := r.claim(ctx, r.o.batch)
				if n == 0 {
					return
				}
				body = body[:0]
				for i := 0; i < n; i++ {
					body = append(body, r.pool.pick(rng)...)
					body = append(body, '\n')
				}
				req, _ := http.NewRequest(http.MethodPost, endpoint, bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/x-ndjson")
				if r.o.key {
					req.Header.Set("X-Ferry-Key", fmt.Sprintf("w%d-%d", w, seq))
					seq++
				}
				t0 := time.Now()
				resp, err := client.Do(req)
				if err != nil {
					r.fail("conn_error", n)
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
				} else {
					r.fail(strconv.Itoa(resp.StatusCode), n)
					if ra := resp.Header.Get("Retry-After"); ra != "" {
						time.Sleep(50 * time.Millisecond) // brief, so the run still measures the ceiling
					}
				}
			}
		}(w)
	}
	wg.Wait()
	r.end = time.Now()
	tr.CloseIdleConnections()
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
	}
	for _, p := range r.o.props {
		k, v, _ := strings.Cut(p, "=")
		switch k {
		case "acks":
			switch v {
			case "all", "-1":
				opts = append(opts, kgo.RequiredAcks(kgo.AllISRAcks()))
			case "1":
				opts = append(opts, kgo.RequiredAcks(kgo.LeaderAck()), kgo.DisableIdempotentWrite())
			case "0":
				opts = append(opts, kgo.RequiredAcks(kgo.NoAck()), kgo.DisableIdempotentWrite())
			}
		case "linger.ms":
			ms, _ := strconv.Atoi(v)
			opts = append(opts, kgo.ProducerLinger(time.Duration(ms)*time.Millisecond))
		case "compression.type":
			c := map[string]kgo.CompressionCodec{"none": kgo.NoCompression(), "gzip": kgo.GzipCompression(),
				"snappy": kgo.SnappyCompression(), "lz4": kgo.Lz4Compression(), "zstd": kgo.ZstdCompression()}[v]
			opts = append(opts, kgo.ProducerBatchCompression(c))
		case "batch.size":
			n, _ := strconv.Atoi(v)
			opts = append(opts, kgo.ProducerBatchMaxBytes(int32(n)))
		default:
			return fmt.Errorf("--producer-props %s: unsupported (acks, linger.ms, compression.type, batch.size)", k)
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
			r.fail("kafka_error", 1)
		} else {
			r.lat.add(time.Since(rec.Timestamp), 1)
			r.acked.Add(1)
		}
		*rec = kgo.Record{}
		recPool.Put(rec)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	var seq int
	for {
		n := r.claim(ctx, 64)
		if n == 0 {
			break
		}
		for i := 0; i < n; i++ {
			rec := recPool.Get().(*kgo.Record)
			rec.Value = r.pool.pick(rng)
			if r.o.key {
				rec.Key = strconv.AppendInt(nil, int64(seq), 10)
				seq++
			}
			rec.Timestamp = time.Now()
			cl.Produce(context.Background(), rec, promise)
		}
	}
	fctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := cl.Flush(fctx); err != nil {
		return fmt.Errorf("flush: %w", err)
	}
	r.end = time.Now()
	return nil
}

// progress prints a line like ProducerPerformance's windows every interval.
func (r *run) progress(every time.Duration) func() {
	done := make(chan struct{})
	stopped := make(chan struct{})
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
	res := result{
		Target: r.o.target, Records: a, Failed: r.failed.Load(), RecordSize: r.o.recordSize, Seconds: sec,
		RecordsSec: rate, MBSec: rate * float64(r.o.recordSize) / (1 << 20),
		AvgMS: ms(r.lat.mean()), MaxMS: ms(r.lat.max()),
		P50MS: ms(r.lat.quantile(0.5)), P95MS: ms(r.lat.quantile(0.95)), P99MS: ms(r.lat.quantile(0.99)), P999MS: ms(r.lat.quantile(0.999)),
	}
	// Kafka's ProducerPerformance final line, so scripts that parse it work.
	fmt.Printf("%d records sent, %.1f records/sec (%.2f MB/sec), %.1f ms avg latency, %.1f ms max latency, %d ms 50th, %d ms 95th, %d ms 99th, %d ms 99.9th.\n",
		a, rate, res.MBSec, res.AvgMS, res.MaxMS, int(res.P50MS), int(res.P95MS), int(res.P99MS), int(res.P999MS))
	if res.Failed > 0 {
		res.FailedCodes = map[string]int64{}
		r.codes.Range(func(k, v any) bool {
			res.FailedCodes[k.(string)] = v.(*atomic.Int64).Load()
			return true
		})
		fmt.Printf("%d records failed: %v\n", res.Failed, res.FailedCodes)
	}
	if r.o.reportJSON != "" {
		b, _ := json.MarshalIndent(res, "", "  ")
		if err := os.WriteFile(r.o.reportJSON, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	return nil
}
