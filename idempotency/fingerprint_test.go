package idempotency

import (
	"bytes"
	"testing"
)

// TestFingerprintFrameTellsBodiesApart: one changed byte anywhere, or a
// body one byte longer, is another fingerprint; the same bytes are the
// same one.
func TestFingerprintFrameTellsBodiesApart(t *testing.T) {
	body := bytes.Repeat([]byte("0123456789"), 1000)
	want := FingerprintFrame(body)
	if FingerprintFrame(append([]byte(nil), body...)) != want {
		t.Fatal("the same bytes, another fingerprint")
	}
	seen := map[[16]byte]int{want: -1}
	for i := 0; i < len(body); i += 97 {
		b := append([]byte(nil), body...)
		b[i] ^= 1
		f := FingerprintFrame(b)
		if j, ok := seen[f]; ok {
			t.Fatalf("byte %d changed: the fingerprint of %d", i, j)
		}
		seen[f] = i
	}
	if FingerprintFrame(append(body, 0)) == want {
		t.Fatal("a longer body, the same fingerprint")
	}
}

func BenchmarkFingerprint256KiB(b *testing.B) {
	body := bytes.Repeat([]byte("x"), 256<<10)
	b.SetBytes(int64(len(body)))
	b.Run("sha256", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for range b.N {
			Fingerprint(body)
		}
	})
	b.Run("frame", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for range b.N {
			FingerprintFrame(body)
		}
	})
}
