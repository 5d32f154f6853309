package filereceiver

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/ferryhq/ferry/bytesize"
	"github.com/ferryhq/ferry/receiver"
	"github.com/ferryhq/ferry/routing"
)

// Config is the user configuration (YAML receivers.files); default.yaml
// holds its defaults and says what each key does.
type Config struct {
	Enabled bool `yaml:"enabled"`
	// Include and Exclude are globs (filepath.Match) over full paths.
	Include []string `yaml:"include"`
	Exclude []string `yaml:"exclude"`
	// PollInterval: how often the globs are matched again.
	PollInterval time.Duration `yaml:"poll_interval"`
	// StartAt (beginning, end) applies to files found at the first start,
	// when there is no checkpoint yet.
	StartAt string `yaml:"start_at"`
	// MaxOpenFiles bounds the file descriptors held (LRU).
	MaxOpenFiles int `yaml:"max_open_files"`
	// MaxLineBytes: longer lines are split into pieces this long.
	MaxLineBytes bytesize.Size `yaml:"max_line_bytes"`
	// Topic and Key are templates over {file.name}, {file.dir},
	// {file.path}, {path.N}, {host}.
	Topic string `yaml:"topic"`
	Key   string `yaml:"key"`
	// Encoding: utf-8 (as is) or latin-1 (converted to UTF-8).
	Encoding string `yaml:"encoding"`
	// ReadRateBytes bounds the bytes read per second (0: unbounded).
	ReadRateBytes bytesize.Size `yaml:"read_rate_bytes"`
	// FingerprintBytes: how many first bytes identify a file (with its
	// device and inode).
	FingerprintBytes int `yaml:"fingerprint_bytes"`
	// CheckpointDir holds checkpoints.json.
	CheckpointDir string `yaml:"checkpoint_dir"`
	// RotateWait: a file renamed away or deleted is let go once read to its
	// end and unchanged for this long.
	RotateWait time.Duration `yaml:"rotate_wait"`
	// MaxInflightBytes and MaxFileInflightBytes bound what was read and is
	// not yet acknowledged, over all files and per file.
	MaxInflightBytes     bytesize.Size `yaml:"max_inflight_bytes"`
	MaxFileInflightBytes bytesize.Size `yaml:"max_file_inflight_bytes"`
	// Compression: none, gzip (every file), auto (names ending in .gz).
	Compression string `yaml:"compression"`
	// Multiline joins lines into one record (stack traces).
	Multiline Multiline `yaml:"multiline"`
	// Headers are added to every record: name -> template (as topic).
	Headers map[string]string `yaml:"headers"`
	// JSON reads the key and timestamp from JSON-object lines.
	JSON JSONLines `yaml:"json"`
}

// JSONLines is receivers.files.json.
type JSONLines struct {
	Enabled bool `yaml:"enabled"`
	// KeyField: a top-level field whose value is the record's key.
	KeyField string `yaml:"key_field"`
	// TimestampField: a top-level field whose value is the record's
	// timestamp, in TimestampFormat.
	TimestampField  string `yaml:"timestamp_field"`
	TimestampFormat string `yaml:"timestamp_format"`
}

// maxExtraHeaders bounds headers:, so a record's overhead stays within
// keyOverhead.
const maxExtraHeaders = 16

// Multiline is receivers.files.multiline: at most one of the patterns.
type Multiline struct {
	// StartPattern matches the first line of every record.
	StartPattern string `yaml:"start_pattern"`
	// ContinuePattern matches the lines that belong to the line before.
	ContinuePattern string `yaml:"continue_pattern"`
	// MaxLines: a longer group is cut into records of this many lines.
	MaxLines int `yaml:"max_lines"`
	// FlushTimeout: a group whose file has not grown for this long is
	// sent as it is.
	FlushTimeout time.Duration `yaml:"flush_timeout"`
}

// On reports whether the receiver runs.
func (c *Config) On() bool { return c.Enabled }

// FixedTopics is the topic when it has no placeholders (a template's
// names depend on what is read, so ferry does not create them).
func (c *Config) FixedTopics() []string {
	if !c.Enabled {
		return nil
	}
	return routing.FixedTopic(c.Topic)
}

// KeyedPlacement: a key template, or a key read from JSON lines, keeps the
// records given one key on one partition, through the partitioner.
func (c *Config) KeyedPlacement() []string {
	if !c.Enabled {
		return nil
	}
	var out []string
	if c.Key != "" {
		out = append(out, fmt.Sprintf("key is %q (records with one key share a partition through it)", c.Key))
	}
	if c.JSON.Enabled && c.JSON.KeyField != "" {
		out = append(out, fmt.Sprintf("json.key_field is %q (lines with one key share a partition through it)", c.JSON.KeyField))
	}
	return out
}

// keyOverhead is what a record may carry besides its line: the key and the
// path header (each up to a path's length) and the offset headers.
const keyOverhead = 16 << 10

// recordBytes is the largest record a line makes: latin-1 doubles the
// bytes above 0x7F in UTF-8.
func (c *Config) recordBytes() int64 {
	n := int64(c.MaxLineBytes)
	if c.Encoding == "latin-1" {
		n *= 2
	}
	return n + keyOverhead
}

// chunkBytes is the most one read (and one batch) takes from a file: a
// whole longest line and its line end always fit.
func (c *Config) chunkBytes() int { return max(256<<10, int(c.MaxLineBytes)) + 4<<10 }

// Check validates the section against the agent's bounds and returns every
// error it finds, each naming its key.
func (c *Config) Check(b receiver.Bounds) []error {
	if !c.Enabled {
		return nil
	}
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if len(c.Include) == 0 {
		add("include: no glob given: nothing to read")
	}
	for _, p := range c.Include {
		if _, err := filepath.Match(p, ""); err != nil || p == "" {
			add("include: %q is not a valid glob", p)
		}
	}
	for _, p := range c.Exclude {
		if _, err := filepath.Match(p, ""); err != nil || p == "" {
			add("exclude: %q is not a valid glob", p)
		}
	}
	if c.PollInterval < 10*time.Millisecond || c.PollInterval > time.Hour {
		add("poll_interval: %s is outside 10ms..1h", c.PollInterval)
	}
	if c.StartAt != "beginning" && c.StartAt != "end" {
		add("start_at: %q is not one of beginning, end", c.StartAt)
	}
	if c.MaxOpenFiles < 1 || c.MaxOpenFiles > 1<<20 {
		add("max_open_files: %d is outside 1..1048576", c.MaxOpenFiles)
	}
	if c.MaxLineBytes < 16 || c.MaxLineBytes > 64<<20 {
		add("max_line_bytes: %s is outside 16B..64MiB", c.MaxLineBytes)
	} else if b.MaxRecordBytes > 0 && c.recordBytes() > b.MaxRecordBytes {
		add("max_line_bytes: %s (%s once converted to UTF-8 with encoding %s) and the key and headers (up to %s) exceed the exporter's largest record (%s)",
			c.MaxLineBytes, bytesize.Size(c.recordBytes()-keyOverhead), c.Encoding, bytesize.Size(keyOverhead), bytesize.Size(b.MaxRecordBytes))
	}
	if t, err := parseTemplate(c.Topic); err != nil {
		add("topic: %v", err)
	} else if t.static() && !routing.ValidTopic(c.Topic) {
		add("topic: %q is not a valid Kafka topic name (1 to 249 of a-z A-Z 0-9 . _ -)", c.Topic)
	}
	if c.Key != "" {
		if _, err := parseTemplate(c.Key); err != nil {
			add("key: %v", err)
		}
	}
	if c.Compression != "none" && c.Compression != "gzip" && c.Compression != "auto" {
		add("compression: %q is not one of none, gzip, auto", c.Compression)
	}
	if c.Encoding != "utf-8" && c.Encoding != "latin-1" {
		add("encoding: %q is not one of utf-8, latin-1", c.Encoding)
	}
	if c.ReadRateBytes < 0 {
		add("read_rate_bytes: %s is negative", c.ReadRateBytes)
	} else if c.ReadRateBytes > 0 && c.ReadRateBytes < 1024 {
		add("read_rate_bytes: %s is below 1KiB", c.ReadRateBytes)
	}
	if c.FingerprintBytes < 16 || c.FingerprintBytes > 64<<10 {
		add("fingerprint_bytes: %d is outside 16..65536", c.FingerprintBytes)
	}
	if c.CheckpointDir == "" {
		add("checkpoint_dir: a directory is required")
	}
	if c.RotateWait < 0 || c.RotateWait > time.Hour {
		add("rotate_wait: %s is outside 0..1h", c.RotateWait)
	}
	if m := c.Multiline; m.StartPattern != "" || m.ContinuePattern != "" {
		if m.StartPattern != "" && m.ContinuePattern != "" {
			add("multiline: start_pattern and continue_pattern are both set; give one")
		}
		for key, p := range map[string]string{"start_pattern": m.StartPattern, "continue_pattern": m.ContinuePattern} {
			if _, err := regexp.Compile(p); err != nil {
				add("multiline.%s: %v", key, err)
			}
		}
		if m.MaxLines < 2 || m.MaxLines > maxBatchRecords {
			add("multiline.max_lines: %d is outside 2..%d", m.MaxLines, maxBatchRecords)
		}
		if m.FlushTimeout < 10*time.Millisecond || m.FlushTimeout > time.Hour {
			add("multiline.flush_timeout: %s is outside 10ms..1h", m.FlushTimeout)
		}
	}
	if len(c.Headers) > maxExtraHeaders {
		add("headers: %d given, at most %d", len(c.Headers), maxExtraHeaders)
	}
	for name, tmpl := range c.Headers {
		switch {
		case name == "" || len(name) > 256:
			add("headers: a name must be 1 to 256 bytes")
		case strings.HasPrefix(name, routing.ReservedHeaderPrefix):
			add("headers: %q: names starting with %q are ferry's own", name, routing.ReservedHeaderPrefix)
		}
		if _, err := parseTemplate(tmpl); err != nil {
			add("headers.%s: %v", name, err)
		}
	}
	if j := c.JSON; j.Enabled {
		if j.KeyField == "" && j.TimestampField == "" {
			add("json: enabled with neither key_field nor timestamp_field: nothing to read from the lines")
		}
		switch j.TimestampFormat {
		case "rfc3339", "unix", "unix_ms", "unix_us", "unix_ns":
		default:
			add("json.timestamp_format: %q is not one of rfc3339, unix, unix_ms, unix_us, unix_ns", j.TimestampFormat)
		}
	}
	chunk := bytesize.Size(c.chunkBytes())
	if c.MaxFileInflightBytes < 2*chunk {
		add("max_file_inflight_bytes: %s is below two reads of a file (%s): max_line_bytes plus 4KiB, at least 260KiB each",
			c.MaxFileInflightBytes, 2*chunk)
	}
	if c.MaxInflightBytes < c.MaxFileInflightBytes {
		add("max_inflight_bytes: %s is below max_file_inflight_bytes (%s)", c.MaxInflightBytes, c.MaxFileInflightBytes)
	}
	if b.MemoryLimit > 0 && int64(c.MaxInflightBytes) > b.MemoryLimit/2 {
		add("max_inflight_bytes: %s exceeds half of queue.memory_limit (%s): the files would crowd out every other receiver",
			c.MaxInflightBytes, bytesize.Size(b.MemoryLimit))
	}
	return errs
}

// CheckFiles has nothing to read: the files come and go while ferry runs,
// and the checkpoint directory is created at Start.
func (c *Config) CheckFiles() error { return nil }
