// Package deadletter owns where records go that Kafka refused for a reason
// retrying cannot fix (too large, unknown or refused topic, a chosen
// partition the topic no longer has) after their
// client was already answered (spool and spill delivery): an NDJSON file,
// or a Kafka topic with the file as its fallback.
//
// Each file line is one record with why it failed:
//
//	{"time":"…","reason":"record_too_large","error":"…","topic":"orders",
//	 "timestamp":"…","partition":3,"key":"<base64>","value":"<base64>",
//	 "headers":{"k":"<base64>"}}
//
// time is when the record was dead-lettered; timestamp is the record's
// own (absent if it had none), partition the one its client chose (absent
// if none). Lines written before those two fields existed lack them.
// ferry deadletter replay sends the lines again (replay.go).
//
// A dead-letter topic record keeps key, value and headers and adds the
// headers ferry.dead_letter.reason and ferry.dead_letter.topic, and
// ferry.dead_letter.partition when its partition was chosen (decimal). The file is
// bounded by max_bytes; beyond it a dead letter is dropped, counted
// (sink="dropped") and logged, because retrying a record that can never be
// delivered would hold its spool segment forever.
package deadletter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/bytesize"
	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/record"
	"github.com/ferryhq/ferry/telemetry"
)

// Config is the user configuration (YAML delivery.dead_letter).
type Config struct {
	// File receives dead letters as NDJSON (and topic failures).
	File string `yaml:"file"`
	// MaxBytes bounds the file.
	MaxBytes bytesize.Size `yaml:"max_bytes"`
	// Topic, when set, receives dead letters in Kafka first.
	Topic string `yaml:"topic"`
}

// FixedTopics is the dead-letter topic, when set, for the exporter to
// create if it is missing (the caller asks only in the delivery modes
// that write dead letters).
func (c *Config) FixedTopics() []string {
	if c.Topic == "" {
		return nil
	}
	return []string{c.Topic}
}

// Validate names the first invalid field.
func (c *Config) Validate() error {
	if c.File == "" {
		return fmt.Errorf("file: a path is required")
	}
	if c.MaxBytes < 1<<20 {
		return fmt.Errorf("max_bytes: %s is below 1MiB", c.MaxBytes)
	}
	return nil
}

// Writer stores dead letters.
type Writer struct {
	cfg   Config
	next  consumer.Consumer // Kafka, for the dead-letter topic
	log   *telemetry.Limited
	count *prometheus.CounterVec

	mu   sync.Mutex
	f    *os.File
	size int64
}

// New opens the dead-letter file lazily (on the first dead letter). next
// is the exporter the topic is written through; nil disables the topic.
func New(cfg Config, set telemetry.Settings, next consumer.Consumer) (*Writer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	w := &Writer{cfg: cfg, next: next, log: telemetry.NewLimited(set.Logger.With("component", "deadletter"), 10*time.Second)}
	w.count = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_dead_letter_records_total",
		Help: "Records Kafka refused for good after their client was answered, by where they went (file, topic, dropped) and why."},
		[]string{"sink", "reason"})
	set.Registry.MustRegister(w.count)
	return w, nil
}

type line struct {
	Time      time.Time         `json:"time"`
	Reason    string            `json:"reason"`
	Error     string            `json:"error"`
	Topic     string            `json:"topic"`
	Timestamp *time.Time        `json:"timestamp,omitempty"`
	Partition *int32            `json:"partition,omitempty"`
	Key       []byte            `json:"key,omitempty"`
	Value     []byte            `json:"value"`
	Headers   map[string][]byte `json:"headers,omitempty"`
}

// Write stores r and calls done once it is durable: fsynced in the file,
// or acknowledged by Kafka in the dead-letter topic (the file if the topic
// fails). done gets the error if the record could not be stored anywhere;
// the caller keeps it then. The record's memory is not kept past the call.
func (w *Writer) Write(r *record.Record, reason string, cause error, done func(error)) {
	if w.cfg.Topic != "" && w.next != nil && r.Topic != w.cfg.Topic {
		w.toTopic(r, reason, cause, done)
		return
	}
	done(w.toFile(r, reason, cause))
}

func (w *Writer) toTopic(r *record.Record, reason string, cause error, done func(error)) {
	c := record.Record{Topic: w.cfg.Topic, Key: clone(r.Key), Value: clone(r.Value), Timestamp: r.Timestamp}
	for _, h := range r.Headers {
		c.Headers = append(c.Headers, record.Header{Key: h.Key, Value: clone(h.Value)})
	}
	c.Headers = append(c.Headers, record.Header{Key: "ferry.dead_letter.reason", Value: []byte(reason)},
		record.Header{Key: "ferry.dead_letter.topic", Value: []byte(r.Topic)})
	if p, ok := r.Partition(); ok {
		// The partition it was placed on (the Kafka front's client chose
		// it; the OTLP receiver grouped its traces there): a record
		// without a key says no more where it belongs.
		c.Headers = append(c.Headers, record.Header{Key: "ferry.dead_letter.partition", Value: strconv.AppendInt(nil, int64(p), 10)})
	}
	b := &record.Batch{Records: []record.Record{c}, MemBytes: int64(c.Size())}
	topic := r.Topic
	b.OnDone(func(err error) {
		if err == nil {
			w.count.WithLabelValues("topic", reason).Inc()
			w.log.Log(slog.LevelWarn, "topic:"+reason, "record sent to the dead-letter topic",
				"topic", topic, "dead_letter_topic", w.cfg.Topic, "reason", reason, "err", cause)
			done(nil)
			return
		}
		done(w.toFile(&b.Records[0], reason, fmt.Errorf("%v; and the dead-letter topic failed: %w", cause, err)))
	})
	if err := w.next.Consume(context.Background(), b); err != nil {
		b.PopDone()
		done(w.toFile(&c, reason, fmt.Errorf("%v; and the dead-letter topic refused it: %w", cause, err)))
	}
}

func clone(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append([]byte{}, b...)
}

func (w *Writer) toFile(r *record.Record, reason string, cause error) error {
	l := line{Time: time.Now().UTC(), Reason: reason, Topic: r.Topic, Key: r.Key, Value: r.Value}
	if !r.Timestamp.IsZero() {
		ts := r.Timestamp.UTC()
		l.Timestamp = &ts
	}
	if p, ok := r.Partition(); ok {
		l.Partition = &p
	}
	if cause != nil {
		l.Error = cause.Error()
	}
	if len(r.Headers) > 0 {
		l.Headers = make(map[string][]byte, len(r.Headers))
		for _, h := range r.Headers {
			l.Headers[h.Key] = h.Value
		}
	}
	out, err := json.Marshal(&l)
	if err != nil {
		return err
	}
	out = append(out, '\n')
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.size+int64(len(out)) > int64(w.cfg.MaxBytes) {
		w.count.WithLabelValues("dropped", reason).Inc()
		w.log.Log(slog.LevelError, "full", "dead-letter file is at max_bytes; a record Kafka refused is DROPPED",
			"file", w.cfg.File, "topic", r.Topic, "reason", reason, "err", cause)
		return nil
	}
	if w.f == nil {
		if err := os.MkdirAll(filepath.Dir(w.cfg.File), 0o755); err != nil {
			return err
		}
		f, err := os.OpenFile(w.cfg.File, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			w.log.Log(slog.LevelError, "open", "dead-letter file cannot be opened; the record stays in the spool", "err", err)
			return err
		}
		fi, _ := f.Stat()
		w.f, w.size = f, fi.Size()
	}
	if _, err := w.f.Write(out); err != nil {
		w.log.Log(slog.LevelError, "write", "dead-letter write failed; the record stays in the spool", "err", err)
		return err
	}
	if err := w.f.Sync(); err != nil {
		return err
	}
	w.size += int64(len(out))
	w.count.WithLabelValues("file", reason).Inc()
	w.log.Log(slog.LevelWarn, "file:"+reason, "record written to the dead-letter file",
		"file", w.cfg.File, "topic", r.Topic, "reason", reason, "err", cause)
	return nil
}

// Decode reads one line of the dead-letter file (for tools and tests):
// the record as it was (its own timestamp, zero if the line has none; the
// partition its client chose; headers sorted by key), why it failed, and
// the error.
func Decode(b []byte) (r record.Record, reason, errText string, err error) {
	var l line
	if err = json.Unmarshal(b, &l); err != nil {
		return r, "", "", err
	}
	if l.Topic == "" {
		return r, "", "", errors.New("not a dead letter: no topic")
	}
	r = record.Record{Topic: l.Topic, Key: l.Key, Value: l.Value}
	if l.Timestamp != nil {
		r.Timestamp = *l.Timestamp
	}
	if l.Partition != nil && *l.Partition >= 0 {
		r.SetPartition(*l.Partition)
	}
	for k, v := range l.Headers {
		r.Headers = append(r.Headers, record.Header{Key: k, Value: v})
	}
	slices.SortFunc(r.Headers, func(a, b record.Header) int { return strings.Compare(a.Key, b.Key) })
	return r, l.Reason, l.Error, nil
}

// Close closes the file.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f != nil {
		return w.f.Close()
	}
	return nil
}
