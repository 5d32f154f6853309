//go:build amd64 || arm64

package lz4frame

import (
	"fmt"
	"unsafe"
)

// load32 and load64 read 4 and 8 bytes of b at i, little-endian, without
// Go's bounds checks, on the 64-bit little-endian targets ferry ships
// (lz4_load_other.go elsewhere). With the checks the encoder ran 27%
// slower on OTLP text logs (822 against 1116 MB/s, BenchmarkLZ4), and on
// an agent forwarding logs compression is the largest single cost. Every
// call in putLZ4Block is in bounds by the limits written beside it; with
// -race or -tags lz4check (make test, the fuzz runs) each load is checked
// and panics if it is not.
func load32(b []byte, i int) uint32 {
	if lz4Checked && (i < 0 || i+4 > len(b)) {
		panic(fmt.Sprintf("lz4: load32 at %d of %d bytes", i, len(b)))
	}
	return *(*uint32)(unsafe.Add(unsafe.Pointer(unsafe.SliceData(b)), i))
}

func load64(b []byte, i int) uint64 {
	if lz4Checked && (i < 0 || i+8 > len(b)) {
		panic(fmt.Sprintf("lz4: load64 at %d of %d bytes", i, len(b)))
	}
	return *(*uint64)(unsafe.Add(unsafe.Pointer(unsafe.SliceData(b)), i))
}
