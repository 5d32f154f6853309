package protocol

import (
	"bytes"
	"errors"
	"testing"
)

// TestDecompressStaysInCapacity: a caller that reserved exactly the limit
// (the local receiver, the Kafka front) gets output in that memory: at
// exactly the limit it is accepted without dst moving, one byte more is
// too large — and dst never grows past what was reserved.
func TestDecompressStaysInCapacity(t *testing.T) {
	for _, c := range []byte{CompressLZ4, CompressZstd} {
		plain := bytes.Repeat([]byte("ferry "), 1000) // 6000 bytes
		z, err := Compress(nil, plain, c)
		if err != nil {
			t.Fatal(err)
		}
		dst := make([]byte, 10, 10+len(plain))
		out, err := Decompress(dst, z, c, len(plain))
		if err != nil {
			t.Fatalf("codec %d at exactly the limit: %v", c, err)
		}
		if &out[0] != &dst[0] || cap(out) != cap(dst) || !bytes.Equal(out[10:], plain) {
			t.Fatalf("codec %d: output moved or differs (cap %d, want %d)", c, cap(out), cap(dst))
		}
		dst = make([]byte, 10, 10+len(plain)-1)
		_, err = Decompress(dst, z, c, len(plain)-1)
		var tl *TooLargeError
		if !errors.As(err, &tl) {
			t.Fatalf("codec %d one byte over the limit: %v, want TooLargeError", c, err)
		}
	}
}
