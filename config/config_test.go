package config

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/ferryhq/ferry/bytesize"
	"github.com/ferryhq/ferry/exporter/kafkaexporter"
	"github.com/ferryhq/ferry/receiver/httpreceiver"
)

func TestDefaultsMatchTheConventions(t *testing.T) {
	c := Default()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	http := c.Receivers.ReceiverConfig("http").(*httpreceiver.Config)
	if http.Listen != "127.0.0.1:8088" || c.Telemetry.Admin.Listen != "127.0.0.1:8089" ||
		len(kafkaCfg(c).Brokers) != 1 || kafkaCfg(c).Brokers[0] != "127.0.0.1:9092" {
		t.Fatalf("default listeners/brokers changed: %+v", c)
	}
	if c.Queue.MemoryLimit != 256<<20 || http.MaxRequestBytes != 8<<20 ||
		kafkaCfg(c).Compression != "lz4" || kafkaCfg(c).Linger != 50*time.Millisecond ||
		kafkaCfg(c).Acks != "all" || !kafkaCfg(c).Idempotent || kafkaCfg(c).Partitioner != "murmur2" {
		t.Fatalf("documented defaults changed: %+v", c)
	}
}

// TestDefaultYAMLIsComplete: `ferry config default` must print every key.
func TestDefaultYAMLIsComplete(t *testing.T) {
	var doc yaml.Node
	if err := yaml.Unmarshal(DefaultYAML(), &doc); err != nil {
		t.Fatal(err)
	}
	var missing []string
	var walk func(n *yaml.Node, typ reflect.Type, path string)
	walk = func(n *yaml.Node, typ reflect.Type, path string) {
		for typ.Kind() == reflect.Pointer {
			typ = typ.Elem()
		}
		if typ.Kind() != reflect.Struct || typ == reflect.TypeOf(time.Time{}) {
			return
		}
		// The keys as config reads them: each receiver's and exporter's
		// section is its factory's Config; inline structs add their keys.
		fields := map[string]reflect.Type{}
		switch typ {
		case reflect.TypeOf(Receivers{}):
			fields = receiverKeyTypes()
		case reflect.TypeOf(Exporter{}):
			fields = exporterKeyTypes()
		default:
			yamlFields(typ, fields)
		}
		for name, ft := range fields {
			if st := ft; st.Kind() == reflect.Pointer && st.Elem().Kind() == reflect.Struct && st.Elem().NumField() == 0 {
				continue // a component without settings has no section
			}
			var child *yaml.Node
			for j := 0; n != nil && j+1 < len(n.Content); j += 2 {
				if n.Content[j].Value == name {
					child = n.Content[j+1]
				}
			}
			if child == nil {
				missing = append(missing, path+name)
				continue
			}
			walk(child, ft, path+name+".")
		}
	}
	walk(doc.Content[0], reflect.TypeOf(Config{}), "")
	if len(missing) > 0 {
		t.Fatalf("default.yaml lacks: %v", missing)
	}
}

func TestErrorsNameTheKey(t *testing.T) {
	cases := map[string]string{
		"exporter:\n  kafka:\n    compresion: lz4\n":                                 "unknown key exporter.kafka.compresion",
		"queue:\n  memory_limit: lots\n":                                             "queue.memory_limit",
		"exporter:\n  kafka:\n    linger: 5\n":                                       "exporter.kafka.linger",
		"exporter:\n  kafka:\n    acks: some\n":                                      "exporter.kafka.acks",
		"exporter:\n  kafka:\n    brokers: []\n":                                     "exporter.kafka.brokers",
		"exporter:\n  kafka:\n    acks: leader\n":                                    "exporter.kafka.idempotent",
		"receivers:\n  http:\n    max_request_bytes: 1GiB\n":                         "max_request_bytes",
		"exporter:\n  type: nats\n":                                                  "exporter.type",
		"exporter:\n  nats:\n    url: x\n":                                           "unknown key exporter.nats",
		"telemetry:\n  log:\n    level: loud\n":                                      "telemetry.log.level",
		"delivery:\n  mode: spool\n  spool:\n    linger: 2m\n":                       "delivery.spool.linger",
		"processors:\n  span_metrics:\n    enabled: true\n    max_series: 0\n":       "processors.span_metrics.max_series",
		"processors:\n  span_metrics:\n    enabled: true\n    buckets: [1s, 10ms]\n": "processors.span_metrics.buckets[1]",
		"processors:\n  span_metrics:\n    enabled: true\n    interval: 10ms\n":      "processors.span_metrics.interval",
		"processors:\n  span_metrics:\n    enabled: true\n    expire_after: 1s\n":    "processors.span_metrics.expire_after",
		"processors:\n  span_metrics:\n    intervall: 1s\n":                          "unknown key processors.span_metrics.intervall",
	}
	for src, want := range cases {
		_, err := Parse([]byte(src), nil)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %v, want an error naming %s", src, err, want)
		}
	}
}

func TestSetOverrides(t *testing.T) {
	c, err := Parse([]byte("queue:\n  memory_limit: 64MiB\n"), []string{
		"exporter.kafka.brokers=[127.0.0.1:1,127.0.0.1:2]", "exporter.kafka.linger=20ms", "queue.memory_limit=128MiB"})
	if err != nil {
		t.Fatal(err)
	}
	if len(kafkaCfg(c).Brokers) != 2 || kafkaCfg(c).Linger != 20*time.Millisecond || c.Queue.MemoryLimit != 128<<20 {
		t.Fatalf("overrides not applied: %+v %v %v", kafkaCfg(c).Brokers, kafkaCfg(c).Linger, c.Queue.MemoryLimit)
	}
	if kafkaCfg(c).Compression != "lz4" {
		t.Fatal("keys not set must keep their defaults")
	}
	if _, err := Parse(nil, []string{"nokey"}); err == nil {
		t.Fatal("--set without = accepted")
	}
	if _, err := Parse(nil, []string{"queue.memory_limit.x=1"}); err == nil {
		t.Fatal("--set through a scalar accepted")
	}
}

func TestExpandEnv(t *testing.T) {
	env := map[string]string{"B": "10.0.0.1:9092"}
	look := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	out, err := ExpandEnv([]byte("a: ${B}\nb: ${MISSING:-dflt}\nc: pa$$word\nd: $lone # ${DOC} stays\n# ${ALSO}\ne: \"#${B}\""), look)
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != "a: 10.0.0.1:9092\nb: dflt\nc: pa$word\nd: $lone # ${DOC} stays\n# ${ALSO}\ne: \"#10.0.0.1:9092\"" {
		t.Fatalf("got %q", out)
	}
	if _, err := ExpandEnv([]byte("x: 1\ny: ${NOPE}"), look); err == nil || !strings.Contains(err.Error(), "line 2") || !strings.Contains(err.Error(), "NOPE") {
		t.Fatalf("unset variable: %v", err)
	}
}

func TestByteSize(t *testing.T) {
	for in, want := range map[string]bytesize.Size{"8MiB": 8 << 20, "512KiB": 512 << 10, "1GB": 1e9, "100": 100, "1.5KiB": 1536} {
		got, err := bytesize.Parse(in)
		if err != nil || got != want {
			t.Errorf("%s = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "-1", "ten", "5XB"} {
		if _, err := bytesize.Parse(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestRefusesConfigurationsThatCannotWork: settings that would deadlock
// the spool reader, make requests that can never be spooled, make the
// Kafka client's buffer the bound instead of the queue, or expose the
// profiler beyond loopback are refused, naming the keys.
func TestRefusesConfigurationsThatCannotWork(t *testing.T) {
	cases := map[string][]string{
		"spool reader cannot hold a record": {"delivery.mode=spool", "queue.memory_limit=1MiB", "receivers.http.max_request_bytes=64KiB",
			"receivers.otlp.enabled=false", "receivers.local.enabled=false", "exporter.kafka.max_batch_bytes=1000000"},
		"local frame over half the memory": {"queue.memory_limit=12MiB", "receivers.local.max_frame_bytes=8MiB", "receivers.otlp.max_request_bytes=1MiB",
			"receivers.http.max_request_bytes=1MiB"},
		"read_ahead below two records":  {"delivery.mode=spool", "delivery.spool.read_ahead=1MiB"},
		"spool smaller than a request":  {"delivery.mode=spill", "delivery.spool.max_bytes=4MiB", "delivery.spool.segment_bytes=1MiB"},
		"client buffer below the queue": {"exporter.kafka.max_buffered_bytes=64MiB"},
		"pprof off loopback":            {"telemetry.admin.pprof=true", "telemetry.admin.listen=0.0.0.0:8089"},
		"span metrics without otlp":     {"processors.span_metrics.enabled=true", "receivers.otlp.enabled=false"},
	}
	want := map[string][]string{
		"spool reader cannot hold a record": {"queue.memory_limit", "exporter.kafka.max_batch_bytes"},
		"local frame over half the memory":  {"receivers.local.max_frame_bytes", "queue.memory_limit"},
		"read_ahead below two records":      {"delivery.spool.read_ahead", "exporter.kafka.max_batch_bytes"},
		"spool smaller than a request":      {"delivery.spool.max_bytes", "max_request_bytes"},
		"client buffer below the queue":     {"exporter.kafka.max_buffered_bytes", "queue.memory_limit"},
		"pprof off loopback":                {"telemetry.admin.pprof", "telemetry.admin.listen"},
		"span metrics without otlp":         {"processors.span_metrics.enabled", "receivers.otlp.enabled"},
	}
	for name, set := range cases {
		_, err := Parse(nil, set)
		if err == nil {
			t.Errorf("%s: accepted", name)
			continue
		}
		for _, k := range want[name] {
			if !strings.Contains(err.Error(), k) {
				t.Errorf("%s: %v does not name %s", name, err, k)
			}
		}
	}
}

// TestFileWithNoSettingsIsAnError: a named configuration file that holds
// no setting once expanded is refused, never read as the defaults (which
// may run with authentication off); no file at all is the defaults.
func TestFileWithNoSettingsIsAnError(t *testing.T) {
	t.Setenv("FERRY_EMPTY", "")
	for _, src := range []string{"", "\n\n", "# only a comment\n", "{}", "---\n", "${FERRY_EMPTY}\n"} {
		f := filepath.Join(t.TempDir(), "ferry.yaml")
		if err := os.WriteFile(f, []byte(src), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := Load(f, nil); err == nil || !strings.Contains(err.Error(), "holds no settings") {
			t.Fatalf("%q: %v, want refused", src, err)
		}
	}
	if _, err := Load("", nil); err != nil {
		t.Fatalf("no file: %v", err)
	}
}

// TestValidateReportsEveryError: a configuration wrong in several places
// is refused with every error at once, each naming its full key path.
func TestValidateReportsEveryError(t *testing.T) {
	_, err := Parse(nil, []string{"receivers.local.max_records_per_frame=0", "receivers.kafka.enabled=true",
		"receivers.kafka.ack_timeout=1ms", "queue.memory_limit=16MiB", "shutdown_timeout=10ms"})
	if err == nil {
		t.Fatal("accepted")
	}
	for _, key := range []string{"receivers.local.max_records_per_frame", "receivers.kafka.ack_timeout",
		"receivers.kafka.max_decompressed_bytes", "shutdown_timeout"} {
		if !strings.Contains(err.Error(), "config: "+key) {
			t.Errorf("no error naming %s in:\n%v", key, err)
		}
	}
}

// TestUnknownReceiver: a section for a receiver ferry does not have is
// refused naming the ones it has.
func TestUnknownReceiver(t *testing.T) {
	_, err := Parse([]byte("receivers:\n  zipkin: {enabled: true}\n"), nil)
	if err == nil || !strings.Contains(err.Error(), "receivers.zipkin") || !strings.Contains(err.Error(), "http") {
		t.Fatalf("%v", err)
	}
}

// kafkaCfg is c's exporter.kafka section.
func kafkaCfg(c *Config) *kafkaexporter.Config {
	return c.Exporter.Config("kafka").(*kafkaexporter.Config)
}

// Every invalid field of a section is reported at once, each with its full
// key path, so a user fixes a file in one pass.
func TestEveryErrorAtOnce(t *testing.T) {
	_, err := Parse(nil, []string{"exporter.kafka.acks=most", "exporter.kafka.linger=2m", "exporter.kafka.partitioner=hash", "queue.memory_limit=1KiB"})
	if err == nil {
		t.Fatal("accepted")
	}
	for _, want := range []string{"exporter.kafka.acks", "exporter.kafka.linger", "exporter.kafka.partitioner", "queue.memory_limit"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not name %s:\n%v", want, err)
		}
	}
}

// Every key `ferry config default` prints is one config reads: a typo in a
// component's own default.yaml is caught here, not by a user.
func TestDefaultYAMLHasNoUnknownKeys(t *testing.T) {
	var doc yaml.Node
	if err := yaml.Unmarshal(DefaultYAML(), &doc); err != nil {
		t.Fatal(err)
	}
	if err := checkKeys(doc.Content[0], reflect.TypeOf(Config{}), ""); err != nil {
		t.Fatal(err)
	}
}

// The topics ferry creates are the ones the configuration names in full:
// by default the three OTLP topics; a fixed files/syslog topic and the
// dead-letter topic when those are on; never a template a request fills,
// never a disabled receiver's, never a topic the receiver's patterns refuse.
func TestFixedTopics(t *testing.T) {
	for _, c := range []struct {
		name string
		sets []string
		want []string
	}{
		{"defaults", nil, []string{"otlp_logs", "otlp_metrics", "otlp_spans"}},
		{"otlp off", []string{"receivers.otlp.enabled=false"}, nil},
		{"signal template", []string{"receivers.otlp.traces.topic=otel-{signal}", "receivers.otlp.logs.topic=otel-{signal}-{tenant}"},
			[]string{"otel-traces", "otlp_metrics"}},
		{"request-filled templates", []string{"receivers.otlp.traces.topic=t-{resource.service.name}", "receivers.otlp.metrics.topic=m-{header.x}",
			"receivers.otlp.logs.topic=l-{business_id}"}, nil},
		{"patterns refuse", []string{`receivers.otlp.topics=["otlp_spans"]`}, []string{"otlp_spans"}},
		{"files and syslog", []string{"receivers.files.enabled=true", `receivers.files.include=["/var/log/*.log"]`, "receivers.files.topic=host-logs",
			"receivers.syslog.enabled=true", "receivers.syslog.topic=syslog"},
			[]string{"host-logs", "otlp_logs", "otlp_metrics", "otlp_spans", "syslog"}},
		{"files template", []string{"receivers.files.enabled=true", `receivers.files.include=["/var/log/*.log"]`, "receivers.files.topic=logs-{file.name}"},
			[]string{"otlp_logs", "otlp_metrics", "otlp_spans"}},
		{"dead letters in kafka mode", []string{"delivery.dead_letter.topic=dlq"}, []string{"otlp_logs", "otlp_metrics", "otlp_spans"}},
		{"dead letters in spool mode", []string{"delivery.mode=spool", "delivery.dead_letter.topic=dlq"},
			[]string{"dlq", "otlp_logs", "otlp_metrics", "otlp_spans"}},
		{"one name once", []string{"receivers.otlp.logs.topic=otlp_spans"}, []string{"otlp_metrics", "otlp_spans"}},
	} {
		cfg, err := Parse(nil, c.sets)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := cfg.FixedTopics(); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: FixedTopics() = %q, want %q", c.name, got, c.want)
		}
	}
	if d := kafkaCfg(Default()).CreateTopics; !d.Enabled || d.Partitions != -1 || d.ReplicationFactor != -1 {
		t.Errorf("create_topics defaults to %+v; default.yaml and the README say enabled, -1, -1", d)
	}
}

// A partitioner that ignores keys warns about each setting that keeps
// records together through their key, naming both keys; other
// configurations warn about nothing.
func TestWarningsNameKeysThatDoNotPlace(t *testing.T) {
	const rr = "exporter.kafka.partitioner=round_robin"
	for _, c := range []struct {
		name string
		sets []string
		want []string // one substring per warning, in order
	}{
		{"defaults", nil, nil},
		{"murmur2 with trace_id", []string{"receivers.otlp.traces.partition=trace_id"}, nil},
		{"uniform_bytes with a key", []string{"exporter.kafka.partitioner=uniform_bytes", "receivers.otlp.logs.key=\"{resource.host.name}\""}, nil},
		{"round_robin, otlp defaults", []string{rr}, []string{"receivers.otlp.metrics.partition is resource", "receivers.otlp.logs.partition is resource"}},
		{"round_robin, trace_id and a key", []string{rr, "receivers.otlp.traces.partition=trace_id", "receivers.otlp.metrics.partition=none",
			"receivers.otlp.logs.key=\"{resource.host.name}\""},
			[]string{"receivers.otlp.traces.partition is trace_id", `receivers.otlp.logs.key is "{resource.host.name}"`}},
		{"round_robin, otlp off", []string{rr, "receivers.otlp.enabled=false"}, nil},
		{"round_robin, spans as flat_json", []string{rr, "receivers.otlp.traces.encoding=flat_json", "receivers.otlp.metrics.partition=none",
			"receivers.otlp.logs.partition=none"}, []string{"receivers.otlp.traces.partition is trace_partition with encoding flat_json"}},
		{"round_robin, spans to a topic per resource", []string{rr, `receivers.otlp.traces.topic="spans-{resource.service.name}"`,
			"receivers.otlp.metrics.partition=none", "receivers.otlp.logs.partition=none"},
			[]string{"receivers.otlp.traces.partition is trace_partition with a topic decided per resource"}},
		{"round_robin, trace_partition and none alone", []string{rr, "receivers.otlp.metrics.partition=none", "receivers.otlp.logs.partition=none"}, nil},
		{"round_robin, files and syslog keyed", []string{rr, "receivers.otlp.enabled=false", "receivers.files.enabled=true",
			`receivers.files.include=["/var/log/*.log"]`, "receivers.files.key=\"{file.name}\"", "receivers.syslog.enabled=true", "receivers.syslog.key=\"{hostname}\"",
			"receivers.files.json.enabled=true", "receivers.files.json.key_field=user"},
			[]string{"receivers.files.key", "receivers.files.json.key_field", "receivers.syslog.key"}},
	} {
		cfg, err := Parse(nil, c.sets)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		got := cfg.Warnings()
		if len(got) != len(c.want) {
			t.Errorf("%s: %d warnings %q, want %d", c.name, len(got), got, len(c.want))
			continue
		}
		for i, w := range got {
			if !strings.Contains(w, c.want[i]) || !strings.Contains(w, "exporter.kafka.partitioner is round_robin") {
				t.Errorf("%s: warning %q does not name %q and the partitioner", c.name, w, c.want[i])
			}
		}
	}
}

// Exactly once needs the spool and a Kafka exporter that can run
// transactions; each missing piece is named.
func TestExactlyOnceNeeds(t *testing.T) {
	for _, c := range []struct {
		sets []string
		want string
	}{
		{[]string{"delivery.guarantee=exactly_once"}, "needs delivery.mode spool"},
		{[]string{"delivery.guarantee=exactly_once", "delivery.mode=spill"}, "needs delivery.mode spool"},
		{[]string{"delivery.guarantee=exactly_once", "delivery.mode=spool", "exporter.kafka.acks=leader", "exporter.kafka.idempotent=false"}, "acks: all and idempotent: true"},
		{[]string{"delivery.guarantee=exactly_once", "delivery.mode=spool", "exporter.type=blackhole"}, "blackhole"},
		{[]string{"delivery.guarantee=exactly_once", "delivery.mode=spool", "delivery.exactly_once.commit_interval=0s"}, "delivery.exactly_once.commit_interval"},
		{[]string{"delivery.guarantee=exactly_once", "delivery.mode=spool", "delivery.exactly_once.transaction_timeout=500ms"}, "delivery.exactly_once.transaction_timeout"},
		{[]string{"delivery.guarantee=exactly_once", "delivery.mode=spool", "delivery.exactly_once.state_topic=bad topic"}, "delivery.exactly_once.state_topic"},
		{[]string{"delivery.guarantee=twice"}, "delivery.guarantee"},
		{[]string{"delivery.guarantee=exactly_once", "delivery.mode=spool", "delivery.dead_letter.topic=ferry-state"}, "ferry's positions only"},
	} {
		_, err := Parse(nil, c.sets)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error with %q", c.sets, err, c.want)
		}
	}
	if _, err := Parse(nil, []string{"delivery.guarantee=exactly_once", "delivery.mode=spool"}); err != nil {
		t.Fatalf("exactly once with the spool refused: %v", err)
	}
}
