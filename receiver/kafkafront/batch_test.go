package kafkafront

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/protocol"
)

// TestDecompressEveryCodec: what franz-go's compressors write (the same
// formats as the Java client and librdkafka) comes back byte for byte,
// and output one byte over the room left is refused, in every codec.
func TestDecompressEveryCodec(t *testing.T) {
	plain := bytes.Repeat([]byte("ferry kafka front "), 2000)
	for _, c := range []struct {
		codec int
		kc    kgo.CompressionCodec
	}{{codecGzip, kgo.GzipCompression()}, {codecSnappy, kgo.SnappyCompression()}, {codecLZ4, kgo.Lz4Compression()}, {codecZstd, kgo.ZstdCompression()}} {
		t.Run(fmt.Sprint(c.codec), func(t *testing.T) {
			comp, err := kgo.DefaultCompressor(c.kc)
			if err != nil {
				t.Fatal(err)
			}
			z, _ := comp.Compress(new(bytes.Buffer), plain)
			z = append([]byte(nil), z...)
			dst := make([]byte, 3, 3+len(plain))
			out, err := decompress(dst, z, c.codec)
			if err != nil || !bytes.Equal(out[3:], plain) || &out[0] != &dst[0] {
				t.Fatalf("decompress: err %v, %d bytes, same memory %v", err, len(out)-3, &out[0] == &dst[0])
			}
			_, err = decompress(make([]byte, 0, len(plain)-1), z, c.codec)
			var tl *protocol.TooLargeError
			if !errors.As(err, &tl) {
				t.Fatalf("one byte over: %v", err)
			}
		})
	}
}
