package load

// Bodies of the other doors' formats for `ferry-bench otlp --format`: the
// same load loop and HTTP client, so a door's row and an OTLP row differ
// only in what is on the wire.

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"

	"github.com/klauspost/compress/snappy"
	zipkinv2 "github.com/open-telemetry/opentelemetry-collector-contrib/pkg/translator/zipkin/zipkinv2"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/ferryhq/ferry/otlp/door"
	"github.com/ferryhq/ferry/otlp/prom"
	"github.com/ferryhq/ferry/tools/otlpgen"
)

// Formats --format takes.
const (
	FormatOTLP = "otlp"
	// FormatZipkin: Zipkin v2 JSON (POST /api/v2/spans), the spans otlpgen
	// makes for OTLP converted by the Collector's own translator, so a
	// Zipkin row and an OTLP traces row carry the same spans.
	FormatZipkin = "zipkin"
	// FormatRemoteWrite: Prometheus remote write 1.0 (snappy protobuf,
	// POST /api/v1/write) as a Prometheus server sends it: --count series
	// of one sample each, 8 labels a series.
	FormatRemoteWrite = "remote_write"
	// FormatRemoteWriteOTLP: the same samples as FormatRemoteWrite, as the
	// OTLP metrics request ferry's remote write door makes of them, sent
	// over OTLP: the base a remote write row is compared with.
	FormatRemoteWriteOTLP = "remote_write_otlp"
)

// Formats lists them, for the flag's check.
var Formats = []string{FormatOTLP, FormatZipkin, FormatRemoteWrite, FormatRemoteWriteOTLP}

// doorRequest is what one format sends over HTTP.
type doorRequest struct {
	path, ctype string
	headers     []string // "Name: value"
}

func formatRequest(format, signal string) (doorRequest, error) {
	switch format {
	case FormatZipkin:
		if signal != "traces" {
			return doorRequest{}, fmt.Errorf("--format zipkin is for --signal traces")
		}
		return doorRequest{path: "/api/v2/spans", ctype: "application/json"}, nil
	case FormatRemoteWrite:
		if signal != "metrics" {
			return doorRequest{}, fmt.Errorf("--format remote_write is for --signal metrics")
		}
		return doorRequest{path: "/api/v1/write", ctype: "application/x-protobuf",
			headers: []string{"Content-Encoding: snappy", "X-Prometheus-Remote-Write-Version: 0.1.0"}}, nil
	case FormatRemoteWriteOTLP:
		if signal != "metrics" {
			return doorRequest{}, fmt.Errorf("--format remote_write_otlp is for --signal metrics")
		}
	}
	return doorRequest{path: "/v1/" + signal, ctype: "application/x-protobuf"}, nil
}

// zipkinBody is seed's otlpgen traces of n spans as Zipkin v2 JSON.
func zipkinBody(seed uint64, n int) ([]byte, error) {
	spans, err := zipkinv2.FromTranslator{}.FromTraces(otlpgen.New(seed).Traces(n))
	if err != nil {
		return nil, err
	}
	return json.Marshal(spans)
}

// remoteWriteV1 is a prometheus.WriteRequest of n series of one sample
// each, the shape of a scrape: 20 metric names over a host's series, job
// and instance, and 5 more labels (Prometheus sends labels sorted by
// name). Returned uncompressed.
func remoteWriteV1(seed uint64, n int) []byte {
	names := []string{"http_requests_total", "http_request_duration_seconds_sum", "http_request_duration_seconds_count",
		"process_cpu_seconds_total", "process_resident_memory_bytes", "go_goroutines", "go_gc_duration_seconds_sum",
		"node_cpu_seconds_total", "node_memory_MemAvailable_bytes", "node_network_receive_bytes_total",
		"node_disk_read_bytes_total", "node_filesystem_avail_bytes", "kafka_consumer_lag", "jvm_memory_used_bytes",
		"jvm_threads_current", "db_connections_open", "cache_hits_total", "cache_misses_total", "queue_depth", "up"}
	ts := int64(1764000000000) + int64(seed)*15000
	var b []byte
	for i := 0; i < n; i++ {
		labels := [][2]string{
			{"__name__", names[i%len(names)]},
			{"code", strconv.Itoa(200 + i%5)},
			{"handler", "/api/v1/items/" + strconv.Itoa(i%37)},
			{"instance", "10.0." + strconv.Itoa(int(seed)%250) + ".7:9100"},
			{"job", "node"},
			{"method", []string{"GET", "POST", "PUT"}[i%3]},
			{"region", "eu-west-1"},
			{"series", strconv.Itoa(i)},
		}
		var s []byte
		for _, l := range labels {
			var lb []byte
			lb = protowire.AppendTag(lb, 1, protowire.BytesType)
			lb = protowire.AppendString(lb, l[0])
			lb = protowire.AppendTag(lb, 2, protowire.BytesType)
			lb = protowire.AppendString(lb, l[1])
			s = protowire.AppendTag(s, 1, protowire.BytesType)
			s = protowire.AppendBytes(s, lb)
		}
		var sm []byte
		sm = protowire.AppendTag(sm, 1, protowire.Fixed64Type)
		sm = protowire.AppendFixed64(sm, math.Float64bits(float64(i)*1.5+float64(seed)))
		sm = protowire.AppendTag(sm, 2, protowire.VarintType)
		sm = protowire.AppendVarint(sm, uint64(ts))
		s = protowire.AppendTag(s, 2, protowire.BytesType)
		s = protowire.AppendBytes(s, sm)
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendBytes(b, s)
	}
	return b
}

// doorBody is request seed's body in format: n spans, or n series.
func doorBody(format string, seed uint64, n int) ([]byte, error) {
	switch format {
	case FormatZipkin:
		return zipkinBody(seed, n)
	case FormatRemoteWrite:
		return snappy.Encode(nil, remoteWriteV1(seed, n)), nil
	case FormatRemoteWriteOTLP:
		q := httptest.NewRequest(http.MethodPost, "/api/v1/write", nil)
		q.Header.Set("Content-Type", "application/x-protobuf")
		return prom.RemoteWrite(q, remoteWriteV1(seed, n), nil, door.Limits{MaxBytes: 64 << 20}, nil)
	}
	return nil, fmt.Errorf("--format %q: want one of %v", format, Formats)
}
