package protocol

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The vectors under testdata/protocol/spec were assembled by hand from
// docs/protocol.md (and the LZ4, zstd and xxHash specifications for
// compressed bodies), each byte group annotated with the clause it comes
// from; nothing rewrites them. The vectors one directory up are this
// package's own output and so cannot catch its mistakes: these can.
// testdata/protocol/spec/README.md describes the format.

const specVectorDir = vectorDir + "/spec"

// specVector is testdata/protocol/spec/NAME.json.
type specVector struct {
	Description      string      `json:"description"`
	Clauses          []string    `json:"clauses"`
	EncoderDiffers   string      `json:"encoder_differs,omitempty"`
	Hex              [][2]string `json:"hex"`
	DecompressedBody [][2]string `json:"decompressed_body,omitempty"`
	Frames           []vframe    `json:"frames"`
}

// assemble joins annotated hex, refusing a group without its comment.
func assemble(t *testing.T, groups [][2]string) []byte {
	t.Helper()
	var out []byte
	for i, g := range groups {
		if strings.TrimSpace(g[1]) == "" {
			t.Fatalf("byte group %d (%s) has no comment naming its clause", i, g[0])
		}
		b, err := hex.DecodeString(strings.Join(strings.Fields(g[0]), ""))
		if err != nil || len(b) == 0 {
			t.Fatalf("byte group %d (%q): %v", i, g[0], err)
		}
		out = append(out, b...)
	}
	return out
}

// rawFrame is one frame as it is on the wire.
type rawFrame struct {
	h    FrameHeader
	body []byte
}

// splitFrames cuts b (after an optional preamble) into frames.
func splitFrames(t *testing.T, b []byte) []rawFrame {
	t.Helper()
	if len(b) >= 4 && bytes.HasPrefix(b, []byte("FRY")) {
		b = b[4:]
	}
	var out []rawFrame
	for len(b) > 0 {
		if len(b) < 10 {
			t.Fatalf("%d bytes left, not a frame header", len(b))
		}
		h, err := ParseHeader([10]byte(b[:10]), DefaultLimits.MaxFrameBytes)
		if err != nil || len(b) < 4+int(h.Length) {
			t.Fatalf("frame header %x: %v", b[:10], err)
		}
		out = append(out, rawFrame{h, b[10 : 4+h.Length]})
		b = b[4+h.Length:]
	}
	return out
}

func readSpecVector(t *testing.T, path string) specVector {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := json.NewDecoder(f)
	dec.DisallowUnknownFields() // a misspelt field must not pass unread
	var v specVector
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if v.Description == "" || len(v.Clauses) == 0 || len(v.Frames) == 0 {
		t.Fatalf("%s: a description, the clauses exercised and the frames are required", path)
	}
	return v
}

// TestSpecVectors: every hand-assembled vector decodes to the frames it
// describes, and the encoder writes exactly its bytes, except where the
// spec leaves the encoder a choice (encoder_differs): then the encoder's
// bytes must decode to the same frames, and a compressed body must
// decompress to the annotated body, which is what the encoder writes
// before compressing.
func TestSpecVectors(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join(specVectorDir, "*.json"))
	if len(files) < 8 {
		t.Fatalf("%d hand-assembled vectors in %s, want at least 8", len(files), specVectorDir)
	}
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) {
			v := readSpecVector(t, path)
			raw := assemble(t, v.Hex)
			got, err := decodeAll(raw, DefaultLimits)
			if err != nil {
				t.Fatalf("decoding the hand-assembled bytes: %v", err)
			}
			if g, w := normalize(got), normalize(v.Frames); !bytes.Equal(g, w) {
				t.Fatalf("decoded\n%s\nwant\n%s", g, w)
			}
			enc := encode(t, vector{Frames: v.Frames})
			if v.EncoderDiffers == "" {
				if !bytes.Equal(enc, raw) {
					t.Fatalf("the encoder's bytes differ from the hand-assembled ones:\nencoder %x\nvector  %x", enc, raw)
				}
				if v.DecompressedBody != nil {
					t.Fatal("decompressed_body given for a vector whose bytes the encoder must match")
				}
				return
			}
			t.Logf("decode compared, not the encoder's bytes: %s", v.EncoderDiffers)
			again, err := decodeAll(enc, DefaultLimits)
			if err != nil {
				t.Fatalf("decoding the encoder's bytes: %v", err)
			}
			if g, w := normalize(again), normalize(v.Frames); !bytes.Equal(g, w) {
				t.Fatalf("the encoder's bytes decode to\n%s\nwant\n%s", g, w)
			}
			// Compressed bodies: the vector's decompresses to the annotated
			// body, which is the encoder's body before compression.
			plainFrames := append([]vframe(nil), v.Frames...)
			for i := range plainFrames {
				plainFrames[i].Flags &^= compressMask
			}
			plain := splitFrames(t, encode(t, vector{Frames: plainFrames}))
			ours := splitFrames(t, raw)
			if len(plain) != len(ours) {
				t.Fatalf("%d frames encoded, %d in the vector", len(plain), len(ours))
			}
			compressed := 0
			for i, f := range ours {
				if f.h.Type != TypeProduce || f.h.Compression() == CompressNone {
					continue
				}
				compressed++
				body, err := Decompress(nil, f.body, f.h.Compression(), DefaultLimits.MaxFrameBytes)
				if err != nil {
					t.Fatalf("frame %d: %v", i, err)
				}
				if want := assemble(t, v.DecompressedBody); !bytes.Equal(body, want) {
					t.Fatalf("frame %d decompresses to\n%x\nthe annotated body is\n%x", i, body, want)
				}
				if !bytes.Equal(body, plain[i].body) {
					t.Fatalf("frame %d: the encoder's uncompressed body\n%x\ndiffers from the vector's decompressed body\n%x", i, plain[i].body, body)
				}
			}
			if (compressed > 0) != (v.DecompressedBody != nil) {
				t.Fatalf("%d compressed frames, decompressed_body given: %v", compressed, v.DecompressedBody != nil)
			}
		})
	}
}
