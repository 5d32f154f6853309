package load

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/tools/bench/verify"
)

type ConsumeResult struct {
	Topic    string  `json:"topic"`
	Records  int64   `json:"records"`
	Bytes    int64   `json:"bytes"`
	Seconds  float64 `json:"seconds"`
	MBSec    float64 `json:"mb_per_sec"`
	NMsgSec  float64 `json:"records_per_sec"`
	Expected int64   `json:"expected,omitempty"`
	// With --verify: counted against the sequence ids produce --seq wrote.
	Lost       *int64 `json:"lost,omitempty"`
	Duplicated *int64 `json:"duplicated,omitempty"`
	OutOfOrder *int64 `json:"out_of_order,omitempty"`
	// With --otlp-items: log records and spans in the OTLP values, and the
	// values that were not OTLP requests.
	OTLPItems *int64 `json:"otlp_items,omitempty"`
	NotOTLP   *int64 `json:"not_otlp,omitempty"`
}

// msDuration accepts a Go duration (10s) or, as ConsumerPerformance's
// --timeout, a number of milliseconds.
type msDuration struct{ d *time.Duration }

func (m msDuration) String() string {
	if m.d == nil {
		return ""
	}
	return m.d.String()
}

func (m msDuration) Set(v string) error {
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		*m.d = time.Duration(n) * time.Millisecond
		return nil
	}
	d, err := time.ParseDuration(v)
	*m.d = d
	return err
}

// ConsumeCmd reads a topic from the start without a consumer group and
// prints ConsumerPerformance's columns. It stops after --messages records or
// when nothing arrives for --timeout.
func ConsumeCmd(args []string) error {
	fs := flag.NewFlagSet("consume", flag.ContinueOnError)
	brokers := fs.String("bootstrap-server", "127.0.0.1:9092", "Kafka broker")
	topic := fs.String("topic", "ferry-bench", "topic to read")
	messages := fs.Int64("messages", 0, "stop after this many records (0 = until idle)")
	fs.Int64Var(messages, "num-records", 0, "the same as --messages (ConsumerPerformance's newer name)")
	hideHeader := fs.Bool("hide-header", false, "do not print the column header")
	timeout := 10 * time.Second
	fs.Var(msDuration{&timeout}, "timeout", "stop when no record arrives for this long (10s, or milliseconds as ConsumerPerformance)")
	expect := fs.Int64("expect", -1, "fail unless exactly this many records are read")
	report := fs.String("report-json", "", "also write the result as JSON to this file")
	doVerify := fs.Bool("verify", false, "check the sequence ids of produce --seq: lost, duplicated and out-of-order records (fails if any is lost)")
	produced := fs.String("produced", "", "with --verify: produce's --report-json, so lost counts exactly the acknowledged ids not read")
	otlpItems := fs.Bool("otlp-items", false, "count the log records or spans in values that are OTLP protobuf requests (what ferry's and the OpenTelemetry Collector's otlp_proto encoding write)")
	printRecs := fs.Bool("print", false, "print every record as 'record<TAB>partition<TAB>offset<TAB>ferry.request_id<TAB>value' (for tests that check where records are; values with tabs or newlines are printed as they are)")
	otlpPoints := fs.Bool("otlp-points", false, "with --otlp-items: the values are OTLP metrics requests; count their data points")
	if err := fs.Parse(args); err != nil {
		return err
	}
	count := OTLPItems
	if *otlpPoints {
		count = OTLPPoints
	}
	var ver *verify.Verifier
	if *doVerify {
		var want *verify.Report
		if *produced != "" {
			b, err := os.ReadFile(*produced)
			if err != nil {
				return err
			}
			var res Result
			if err := json.Unmarshal(b, &res); err != nil || res.Seq == nil {
				return fmt.Errorf("--produced %s: not a produce --seq report (%v)", *produced, err)
			}
			want = res.Seq
			if *messages == 0 {
				*messages = want.Issued
			}
		}
		ver = verify.New(want)
	}
	tty := IsTTY(os.Stderr)
	var idled bool
	var lastRec time.Time
	cl, err := kgo.NewClient(kgo.SeedBrokers(*brokers), kgo.ConsumeTopics(*topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxBytes(64<<20))
	if err != nil {
		return err
	}
	defer cl.Close()
	start := time.Now()
	var n, bytes, items, notOTLP int64
	var firstFetch time.Time
	lastProgress := start
	for *messages == 0 || n < *messages {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		fetches := cl.PollFetches(ctx)
		cancel()
		if errs := fetches.Errors(); len(errs) > 0 {
			if ctx.Err() != nil {
				idled = true
				break // idle for --timeout: done
			}
			return fmt.Errorf("fetch: %v", errs[0].Err)
		}
		if firstFetch.IsZero() {
			firstFetch = time.Now()
		}
		lastRec = time.Now()
		fetches.EachRecord(func(r *kgo.Record) {
			n++
			bytes += int64(len(r.Value))
			if ver != nil {
				ver.Add(r.Value, r.Partition)
			}
			if *printRecs {
				var id []byte
				for _, h := range r.Headers {
					if h.Key == "ferry.request_id" {
						id = h.Value
					}
				}
				fmt.Printf("record\t%d\t%d\t%s\t%s\n", r.Partition, r.Offset, id, r.Value)
			}
			if *otlpItems {
				if c, ok := count(r.Value); ok {
					items += c
				} else {
					notOTLP++
				}
			}
		})
		switch {
		case tty && time.Since(lastProgress) >= 200*time.Millisecond:
			el := time.Since(start)
			fmt.Fprint(os.Stderr, Bar(n, *messages, "records", el, float64(n)/el.Seconds()))
			lastProgress = time.Now()
		case !tty && time.Since(lastProgress) >= 5*time.Second:
			fmt.Fprintf(os.Stderr, "%d records read (%.1f MB)\n", n, float64(bytes)/(1<<20))
			lastProgress = time.Now()
		}
	}
	if tty {
		fmt.Fprint(os.Stderr, "\r\033[K")
	}
	end := time.Now()
	if idled {
		end = lastRec // the idle wait is not reading time
		if end.Before(start) {
			end = start
		}
	}
	if firstFetch.IsZero() || firstFetch.After(end) {
		firstFetch = start
	}
	sec := end.Sub(start).Seconds()
	fsec := end.Sub(firstFetch).Seconds()
	mb := float64(bytes) / (1 << 20)
	div := func(a, b float64) float64 {
		if b <= 0 {
			return 0
		}
		return a / b
	}
	// ConsumerPerformance's yyyy-MM-dd HH:mm:ss:SSS (Go's layouts want a dot
	// before milliseconds, so they are appended by hand).
	stamp := func(t time.Time) string {
		return t.Format("2006-01-02 15:04:05") + fmt.Sprintf(":%03d", t.Nanosecond()/1e6)
	}
	if !*hideHeader {
		fmt.Println("start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec")
	}
	fmt.Printf("%s, %s, %.4f, %.4f, %d, %.4f, %d, %d, %.4f, %.4f\n",
		stamp(start), stamp(end), mb, div(mb, sec), n, div(float64(n), sec),
		0, end.Sub(firstFetch).Milliseconds(), div(mb, fsec), div(float64(n), fsec))
	res := ConsumeResult{Topic: *topic, Records: n, Bytes: bytes, Seconds: sec,
		MBSec: div(mb, sec), NMsgSec: div(float64(n), sec), Expected: max(*expect, 0)}
	if *otlpItems {
		fmt.Printf("otlp items: %d (%d records not OTLP)\n", items, notOTLP)
		res.OTLPItems, res.NotOTLP = &items, &notOTLP
	}
	var lost int64
	if ver != nil {
		fmt.Println(ver.Summary())
		l, _ := ver.Lost()
		lost = l
		d, o := ver.Duplicated(), ver.OutOfOrder()
		res.Lost, res.Duplicated, res.OutOfOrder = &l, &d, &o
	}
	if *report != "" {
		b, _ := json.MarshalIndent(res, "", "  ")
		if err := os.WriteFile(*report, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	if *expect >= 0 && n != *expect {
		return fmt.Errorf("read %d records, expected %d", n, *expect)
	}
	if lost > 0 {
		return fmt.Errorf("%d acknowledged records are missing", lost)
	}
	return nil
}

// TopicCmd: ferry-bench topic create|delete --topic T [--partitions N]
// [--if-not-exists].
func TopicCmd(args []string) error {
	if len(args) == 0 || (args[0] != "create" && args[0] != "delete") {
		return fmt.Errorf("usage: ferry-bench topic create|delete --topic T [--partitions N] [--if-not-exists] [--bootstrap-server H:P]")
	}
	fs := flag.NewFlagSet("topic", flag.ContinueOnError)
	brokers := fs.String("bootstrap-server", "127.0.0.1:9092", "Kafka broker")
	topic := fs.String("topic", "ferry-bench", "topic")
	parts := fs.Int("partitions", 1, "partitions (create)")
	ifNotExists := fs.Bool("if-not-exists", false, "create: a topic that already exists is not an error (its partitions are left as they are)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(*brokers))
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if args[0] == "delete" {
		_, err := adm.DeleteTopic(ctx, *topic)
		return err
	}
	resp, err := adm.CreateTopic(ctx, int32(*parts), -1, nil, *topic)
	if err == nil {
		err = resp.Err
	}
	if *ifNotExists && errors.Is(err, kerr.TopicAlreadyExists) {
		fmt.Fprintf(os.Stderr, "topic %s exists\n", *topic)
		return nil
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "created topic %s with %d partitions\n", *topic, *parts)
	return nil
}
