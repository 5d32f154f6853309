package kafkaexporter

import (
	"bytes"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/lz4frame"
)

// lz4Compressor writes the lz4 record batches ferry sends to Kafka with
// ferry's own LZ4 frame encoder (package lz4frame: 2.5x franz-go's default
// on OTLP text logs, output within a few per cent of its size).
type lz4Compressor struct{}

var _ kgo.Compressor = lz4Compressor{}

// Compress implements kgo.Compressor: dst is franz-go's pooled buffer, used
// until the returned slice has been copied into the request.
func (lz4Compressor) Compress(dst *bytes.Buffer, src []byte, _ ...kgo.CompressFlag) ([]byte, kgo.CompressionCodecType) {
	dst.Grow(lz4frame.MaxLen(len(src)))
	return lz4frame.Append(dst.AvailableBuffer(), src), kgo.CodecLz4
}
