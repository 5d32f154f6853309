package kafkafront

import (
	"bytes"
	"context"
	"encoding/binary"
	"github.com/ferryhq/ferry/receiver"
	"net"
	"reflect"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/telemetry"
)

// TestTopLevelErrorFieldsExist: every API answered UNSUPPORTED_VERSION by
// setting a top-level ErrorCode has that field in kmsg's response (a
// kmsg upgrade that renamed it would otherwise panic at run time).
func TestTopLevelErrorFieldsExist(t *testing.T) {
	for key := range topLevelError {
		req := kmsg.RequestForKey(key)
		if req == nil {
			t.Fatalf("API key %d unknown to kmsg", key)
		}
		f := reflect.ValueOf(req.ResponseKind()).Elem().FieldByName("ErrorCode")
		if !f.IsValid() || f.Kind() != reflect.Int16 {
			t.Fatalf("%s response has no int16 ErrorCode", kmsg.NameForKey(key))
		}
	}
}

func testConfig() Config {
	return Config{Enabled: true, Listen: "127.0.0.1:0", MaxRequestBytes: 1 << 20, MaxDecompressedBytes: 4 << 20,
		MaxRecords: 1000, MaxPartitions: 100, MaxInflightBytes: 4 << 20, IdleTimeout: time.Minute, BodyTimeout: 10 * time.Second,
		AckTimeout: 5 * time.Second, MetadataMaxAge: time.Minute, Topics: []string{"*"}}
}

// TestUnreadAnswersStopTheReader: a client that pipelines a million small
// requests and never reads an answer (each answer larger than its request)
// gets its connection stopped once 1 MiB of answers wait, so ferry holds a
// bounded amount for it instead of three times what it sent.
func TestUnreadAnswersStopTheReader(t *testing.T) {
	set := telemetry.TestSettings()
	sink := consumer.Func(func(context.Context, *record.Batch) error { return nil })
	r, err := New(testConfig(), receiver.Env{Set: set, Next: sink, Pre: nil, Topics: func(context.Context, []string) ([]TopicInfo, error) { return nil, nil }})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer r.Shutdown(context.Background())
	c, err := net.Dial("tcp", r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// ApiVersions v3: client software name and version, no tags.
	req := []byte{0, 0, 0, 0, 0, 18, 0, 3, 0, 0, 0, 1, 0, 1, 'x', 0, 2, 'x', 2, '1', 0}
	binary.BigEndian.PutUint32(req, uint32(len(req)-4))
	const total = 1_000_000
	go func() {
		_ = c.SetWriteDeadline(time.Now().Add(20 * time.Second))
		batch := bytes.Repeat(req, 1000)
		for range total / 1000 {
			if _, err := c.Write(batch); err != nil {
				return
			}
		}
	}()
	handled := func() float64 {
		mfs, _ := set.Registry.Gather()
		for _, mf := range mfs {
			if mf.GetName() != "ferry_receiver_requests_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "code" && l.GetValue() == "ApiVersions" {
						return m.GetCounter().GetValue()
					}
				}
			}
		}
		return 0
	}
	last, still := -1.0, 0
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline) && still < 10; time.Sleep(100 * time.Millisecond) {
		if h := handled(); h == last {
			still++
		} else {
			last, still = h, 0
		}
	}
	// Kernel socket buffers on both sides hold some answers too; what
	// matters is that the reader stopped far short of the million.
	if last >= total/2 {
		t.Fatalf("ferry handled %.0f of %d pipelined requests whose answers nobody read", last, total)
	}
	t.Logf("reader stopped after %.0f requests", last)
}
