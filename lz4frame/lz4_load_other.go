//go:build !amd64 && !arm64

package lz4frame

import "encoding/binary"

// load32 and load64 are lz4_load.go's, with Go's bounds checks, on targets
// where an unaligned or big-endian load would not be what the encoder
// expects.
func load32(b []byte, i int) uint32 { return binary.LittleEndian.Uint32(b[i:]) }
func load64(b []byte, i int) uint64 { return binary.LittleEndian.Uint64(b[i:]) }
