package kafkaexporter

import (
	"bytes"
	"io"
	"testing"

	"github.com/pierrec/lz4/v4"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestLZ4Compressor: what the exporter hands franz-go for codec lz4 is an
// LZ4 frame a standard reader decodes (package lz4frame has the encoder's
// own tests; proofs/compat has Kafka's Java consumer reading it).
func TestLZ4Compressor(t *testing.T) {
	src := bytes.Repeat([]byte("a log line that repeats, as logs do; "), 5000)
	var b bytes.Buffer
	out, codec := lz4Compressor{}.Compress(&b, src)
	if codec != kgo.CodecLz4 {
		t.Fatalf("codec %v", codec)
	}
	got, err := io.ReadAll(lz4.NewReader(bytes.NewReader(out)))
	if err != nil || !bytes.Equal(got, src) {
		t.Fatalf("read back: %v, %d of %d bytes", err, len(got), len(src))
	}
	if len(out) > len(src)/4 {
		t.Fatalf("%d bytes compressed to %d", len(src), len(out))
	}
}
