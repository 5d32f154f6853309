package lz4frame

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"testing"

	"github.com/pierrec/lz4/v4"
	"github.com/twmb/franz-go/pkg/kgo"

	"go.opentelemetry.io/collector/pdata/plog/plogotlp"

	"github.com/ferryhq/ferry/tools/otlpgen"
)

// decodeLZ4 reads a frame with pierrec/lz4, the reader franz-go's consumers
// use (the broker's and Java's KafkaLZ4BlockInputStream read the same
// standard frame).
func decodeLZ4(t testing.TB, frame []byte) []byte {
	t.Helper()
	got, err := io.ReadAll(lz4.NewReader(bytes.NewReader(frame)))
	if err != nil {
		t.Fatalf("lz4 reader: %v", err)
	}
	return got
}

func compressLZ4(src []byte) []byte { return Append(nil, src) }

// ferryCompressor is Append behind franz-go's Compressor, as the Kafka
// exporter uses it, to compare with franz-go's default.
type ferryCompressor struct{}

func (ferryCompressor) Compress(dst *bytes.Buffer, src []byte, _ ...kgo.CompressFlag) ([]byte, kgo.CompressionCodecType) {
	dst.Grow(MaxLen(len(src)))
	return Append(dst.AvailableBuffer(), src), kgo.CodecLz4
}

// The header is the one pierrec/lz4's writer gives for the same options,
// checksum byte included.
func TestLZ4FrameHeader(t *testing.T) {
	var b bytes.Buffer
	w := lz4.NewWriter(&b)
	if err := w.Apply(lz4.BlockSizeOption(lz4.Block64Kb), lz4.ChecksumOption(false)); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	want := b.Bytes()[:7]
	if got := compressLZ4([]byte("x"))[:7]; !bytes.Equal(got, want) {
		t.Fatalf("header % x, pierrec/lz4 writes % x", got, want)
	}
}

// lz4Inputs are the shapes a batch takes: empty, tiny, block edges,
// incompressible, text logs, long runs, and a Kafka-like mix of repeated
// framing around random bodies.
func lz4Inputs() map[string][]byte {
	rng := rand.New(rand.NewPCG(1, 2))
	random := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	g := otlpgen.New(7)
	var text, mix []byte
	for len(text) < 300<<10 {
		text = append(text, g.Text(1024)...)
	}
	for len(mix) < 300<<10 {
		mix = append(mix, "\x00\x02\x14resource.service.name\x12generator.service"...)
		mix = append(mix, g.String(1024)...)
	}
	// What ferry's OTLP records hold: export requests of 100 logs.
	var otlpText, otlpRandom []byte
	for i := 0; len(otlpText) < 1<<20; i++ {
		b, _ := plogotlp.NewExportRequestFromLogs(g.LogsOf(100, 1024, otlpgen.BodyText)).MarshalProto()
		otlpText = append(otlpText, b...)
		b, _ = plogotlp.NewExportRequestFromLogs(g.LogsOf(100, 1024, otlpgen.BodyRandom)).MarshalProto()
		otlpRandom = append(otlpRandom, b...)
	}
	in := map[string][]byte{
		"otlp logs, text":   otlpText,
		"otlp logs, random": otlpRandom,
		"empty":             {},
		"one byte":          {'a'},
		"short":             []byte("hello hello hello hello"),
		"zeros 64K":         make([]byte, lz4BlockSize),
		"zeros 64K+1":       make([]byte, lz4BlockSize+1),
		"zeros 1M":          make([]byte, 1<<20),
		"random 200K":       random(200 << 10),
		"text":              text,
		"kafka-like":        mix,
	}
	// Matches that end at every distance from a block's end.
	for tail := 0; tail < 20; tail++ {
		b := bytes.Repeat([]byte("abcdefgh"), 40)
		b = append(b, random(tail)...)
		in[fmt.Sprintf("tail %d", tail)] = b
	}
	return in
}

// strictLZ4Frame decodes a frame as ferry writes it (header, blocks, end
// mark) with the LZ4 block format's rules enforced that lenient readers
// such as pierrec/lz4 let pass but a strict one may refuse: a match's
// offset is 1 to its position, a block's last match starts at least 12
// bytes before its end and ends at least 5 before it, and its last
// sequence is literals only.
func strictLZ4Frame(frame []byte) ([]byte, error) {
	if len(frame) < 11 || !bytes.Equal(frame[:4], lz4Magic[:]) || frame[4] != lz4FLG || frame[5] != lz4BD || frame[6] != lz4HC {
		return nil, fmt.Errorf("bad frame header % x", frame[:min(len(frame), 7)])
	}
	var out []byte
	for p := 7; ; {
		if p+4 > len(frame) {
			return nil, fmt.Errorf("truncated at %d", p)
		}
		size := binary.LittleEndian.Uint32(frame[p:])
		p += 4
		if size == 0 {
			if p != len(frame) {
				return nil, fmt.Errorf("%d bytes after the end mark", len(frame)-p)
			}
			return out, nil
		}
		n := int(size &^ lz4Stored)
		if n > len(frame)-p || n > lz4BlockSize {
			return nil, fmt.Errorf("block of %d bytes at %d", n, p)
		}
		if size&lz4Stored != 0 {
			out = append(out, frame[p:p+n]...)
		} else {
			var err error
			if out, err = strictLZ4Block(out, frame[p:p+n]); err != nil {
				return nil, err
			}
		}
		p += n
	}
}

// strictLZ4Block appends the decoded block to out.
func strictLZ4Block(out, b []byte) ([]byte, error) {
	base := len(out)
	length := func(i, n int) (int, int, error) {
		if n < 15 {
			return n, i, nil
		}
		for {
			if i >= len(b) {
				return 0, 0, fmt.Errorf("length past the block")
			}
			n += int(b[i])
			i++
			if b[i-1] != 255 {
				return n, i, nil
			}
		}
	}
	type match struct{ start, end int }
	var last *match
	for i := 0; ; {
		if i >= len(b) {
			return nil, fmt.Errorf("block ends without a last sequence")
		}
		tok := b[i]
		ll, j, err := length(i+1, int(tok>>4))
		if err != nil {
			return nil, err
		}
		if j+ll > len(b) {
			return nil, fmt.Errorf("literals past the block")
		}
		out = append(out, b[j:j+ll]...)
		i = j + ll
		if i == len(b) {
			// The last sequence: literals only. Now the block's length is
			// known, so the end rules are checked.
			n := len(out) - base
			if n >= 13 && tok&15 != 0 {
				return nil, fmt.Errorf("last sequence has a match")
			}
			if last != nil && (last.start > n-12 || last.end > n-5) {
				return nil, fmt.Errorf("last match %d..%d of a %d-byte block", last.start, last.end, n)
			}
			return out, nil
		}
		if i+2 > len(b) {
			return nil, fmt.Errorf("offset past the block")
		}
		off := int(b[i]) | int(b[i+1])<<8
		ml, k, err := length(i+2, int(tok&15))
		if err != nil {
			return nil, err
		}
		i = k
		pos := len(out) - base
		if off == 0 || off > pos {
			return nil, fmt.Errorf("offset %d at %d", off, pos)
		}
		for range ml + 4 {
			out = append(out, out[len(out)-off])
		}
		last = &match{pos, pos + ml + 4}
	}
}

func TestLZ4RoundTrip(t *testing.T) {
	for name, src := range lz4Inputs() {
		frame := compressLZ4(src)
		if got := decodeLZ4(t, frame); !bytes.Equal(got, src) {
			t.Fatalf("%s: %d bytes in, %d bytes back, not the same", name, len(src), len(got))
		}
		if got, err := strictLZ4Frame(frame); err != nil || !bytes.Equal(got, src) {
			t.Fatalf("%s: strict decoder: %v (%d bytes back of %d)", name, err, len(got), len(src))
		}
		if bound := 7 + len(src) + 4*(len(src)/lz4BlockSize+1) + 4; len(frame) > bound {
			t.Fatalf("%s: %d bytes of frame for %d, above the bound %d", name, len(frame), len(src), bound)
		}
		checkStoredBlocks(t, frame, src)
	}
	// Compressible input comes out smaller than it went in.
	in := lz4Inputs()
	for _, name := range []string{"text", "kafka-like", "zeros 1M", "zeros 64K+1", "otlp logs, text"} {
		if n, m := len(compressLZ4(in[name])), len(in[name]); n >= m {
			t.Fatalf("%s: %d bytes of frame for %d", name, n, m)
		}
	}
}

// checkStoredBlocks walks the frame ferry wrote for src and fails if a
// block is stored where mayStore says that chunk of src had to be
// compressed.
func checkStoredBlocks(t testing.TB, frame, src []byte) {
	t.Helper()
	for p := 7; len(src) > 0; {
		size := binary.LittleEndian.Uint32(frame[p:])
		chunk := src[:min(len(src), lz4BlockSize)]
		src = src[len(chunk):]
		if size&lz4Stored != 0 && !mayStore(chunk) {
			t.Fatalf("a block of %d bytes stored, which pierrec/lz4 compresses to %d", len(chunk), pierrecBlock(chunk))
		}
		p += 4 + int(size&^lz4Stored)
	}
}

// The ratio is pierrec/lz4's (franz-go's default) within a few per cent
// on what ferry sends: the speed is not bought with bytes on the wire.
func TestLZ4Ratio(t *testing.T) {
	def, err := kgo.DefaultCompressor(kgo.Lz4Compression())
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"text", "kafka-like", "zeros 1M"} {
		src := lz4Inputs()[name]
		var b bytes.Buffer
		ref, _ := def.Compress(&b, src)
		got := compressLZ4(src)
		t.Logf("%s: %d bytes: ferry %d, pierrec/lz4 %d", name, len(src), len(got), len(ref))
		if float64(len(got)) > 1.1*float64(len(ref))+64 {
			t.Fatalf("%s: %d bytes, pierrec/lz4 %d", name, len(got), len(ref))
		}
	}
	// Incompressible input is stored, not expanded past the framing.
	src := lz4Inputs()["random 200K"]
	if got := compressLZ4(src); len(got) > len(src)+7+4*4+4 {
		t.Fatalf("random: %d bytes for %d", len(got), len(src))
	}
}

// Every block length up to past the end rules, of text, runs and random
// bytes, is one LZ4 block the strict decoder reads back whole (or stored).
// Under -race the encoder's unchecked loads are checked (lz4_checked.go).
func TestLZ4BlockEveryLength(t *testing.T) {
	in := lz4Inputs()
	for _, name := range []string{"text", "kafka-like", "zeros 1M", "random 200K", "otlp logs, text"} {
		for n := 0; n <= 300; n++ {
			checkLZ4Block(t, in[name][:n])
		}
		for _, n := range []int{4095, 4096, lz4BlockSize - 1, lz4BlockSize} {
			checkLZ4Block(t, in[name][len(in[name])-n:])
		}
	}
	// Repeated text is compressed at every length past two periods and
	// a few words, to about one period's literals and one long match
	// (the period's bytes, the sequences' tokens and offsets, the match's
	// length bytes, the last literals).
	for p := 1; p <= 64; p++ {
		for n := 2*p + 32; n <= 2*p+300; n++ {
			checkPeriodicBlock(t, periodic(in["text"][:p], n), p+24+n/255)
		}
	}
}

// dirtyTable is a table as the pool may hand it over: full of positions
// of an earlier, longer block, every one past the end of a short one.
func dirtyTable() *lz4Table {
	t := new(lz4Table)
	for i := range t {
		t[i] = 0xffff - uint16(i)
	}
	return t
}

// checkPeriodicBlock checks src, a pattern of at most 64 bytes repeated
// over at least two periods and 32 bytes, with checkLZ4Block, and that it
// was compressed, not refused, to at most bound bytes, and at most three
// quarters of src whatever the bound (a pattern with repeats of its own
// inside, cut off at its end, takes a short sequence a period: 55% at
// worst over 300,000 random ones).
func checkPeriodicBlock(t testing.TB, src []byte, bound int) {
	t.Helper()
	checkLZ4Block(t, src)
	bound = min(bound, 3*len(src)/4)
	if o := putLZ4Block(new(lz4Table), make([]byte, len(src)), 0, src); o < 0 || o > bound {
		t.Fatalf("%d bytes of a pattern repeated: block of %d, want at most %d", len(src), o, bound)
	}
}

// pierrecBlock is the size of src as one LZ4 block by pierrec/lz4, the
// compressor franz-go uses by default, or 0 if it does not compress src.
func pierrecBlock(src []byte) int {
	var c lz4.Compressor
	n, err := c.CompressBlock(src, make([]byte, lz4.CompressBlockBound(len(src))))
	if err != nil || n >= len(src) {
		return 0
	}
	return n
}

// mayStore reports whether storing src uncompressed is an acceptable
// answer: pierrec/lz4 does not save a quarter of it either. ferry's
// search skips faster through incompressible runs, so on input pierrec
// barely compresses (kafka-like's 4 KiB of random bodies: 0.5%) it may
// find nothing worth writing; on input with a quarter to save it must
// not store.
func mayStore(src []byte) bool {
	n := pierrecBlock(src)
	return n == 0 || 4*n > 3*len(src)
}

// periodic is pat repeated to n bytes: input any LZ4 encoder must
// compress once n is past a couple of periods.
func periodic(pat []byte, n int) []byte {
	return bytes.Repeat(pat, n/len(pat)+1)[:n]
}

// checkLZ4Block compresses src as one block after a 3-byte prefix, in
// room for a stored block exactly: the prefix is untouched, the block is
// smaller than src and decodes to src, and it is refused (to be stored)
// only where mayStore says storing is acceptable.
func checkLZ4Block(t testing.TB, src []byte) {
	t.Helper()
	buf := make([]byte, 3+len(src))
	copy(buf, "xyz")
	o := putLZ4Block(dirtyTable(), buf, 3, src)
	if string(buf[:3]) != "xyz" {
		t.Fatalf("%d bytes: the prefix was written over: % x", len(src), buf[:3])
	}
	if o < 0 {
		if !mayStore(src) {
			t.Fatalf("%d bytes refused, which pierrec/lz4 compresses to %d", len(src), pierrecBlock(src))
		}
		return
	}
	if o >= len(buf) {
		t.Fatalf("%d bytes: a block of %d, not smaller than storing it", len(src), o-3)
	}
	dec, err := strictLZ4Block(nil, buf[3:o])
	if err != nil || !bytes.Equal(dec, src) {
		t.Fatalf("%d bytes: strict decoder: %v (%d bytes back, same %v)", len(src), err, len(dec), bytes.Equal(dec, src))
	}
}

// FuzzLZ4 checks that any input comes back whole through a standard LZ4
// reader.
func FuzzLZ4(f *testing.F) {
	for _, src := range lz4Inputs() {
		if len(src) < 4096 {
			f.Add(src)
		}
	}
	f.Add(bytes.Repeat([]byte("0123456789"), 20))
	f.Fuzz(func(t *testing.T, src []byte) {
		// Half the inputs are repeated past a block's end, so blocks after
		// the first and matches near a block's start are fuzzed too.
		if len(src) > 0 && src[0]&1 == 1 {
			src = bytes.Repeat(src, lz4BlockSize/len(src)+2)[:lz4BlockSize+len(src)]
		}
		frame := compressLZ4(src)
		if got := decodeLZ4(t, frame); !bytes.Equal(got, src) {
			t.Fatalf("%d bytes in, %d back, not the same", len(src), len(got))
		}
		if got, err := strictLZ4Frame(frame); err != nil || !bytes.Equal(got, src) {
			t.Fatalf("strict decoder: %v (%d bytes back of %d)", err, len(got), len(src))
		}
		checkStoredBlocks(t, frame, src)
		// The input's first bytes repeated over a block and 4 KiB:
		// compressible, so the frame is far smaller than the input.
		if len(src) > 0 {
			p := min(len(src), 64)
			rep := periodic(src[:p], lz4BlockSize+4096)
			frame := compressLZ4(rep)
			if got, err := strictLZ4Frame(frame); err != nil || !bytes.Equal(got, rep) {
				t.Fatalf("repeated: strict decoder: %v (%d bytes back of %d)", err, len(got), len(rep))
			}
			if bound := 3 * len(rep) / 4; len(frame) > bound {
				t.Fatalf("a %d-byte pattern repeated to %d bytes: frame of %d, want at most %d", p, len(rep), len(frame), bound)
			}
		}
	})
}

// FuzzLZ4Block runs the block encoder on any input up to a block, repeated
// past its length on odd first bytes so long matches and the end rules
// are reached: it never writes outside its room, and what it writes
// decodes to the input. The fuzz runs build with -tags lz4check, so a load
// out of bounds panics.
func FuzzLZ4Block(f *testing.F) {
	for _, src := range lz4Inputs() {
		if len(src) < 4096 {
			f.Add(src)
		}
	}
	f.Fuzz(func(t *testing.T, src []byte) {
		if len(src) > 0 && src[0]&1 == 1 {
			src = bytes.Repeat(src, 4096/len(src)+1)
		}
		checkLZ4Block(t, src[:min(len(src), lz4BlockSize)])
		// Its first bytes repeated: compressed, never refused.
		if len(src) > 0 {
			p := min(len(src), 64)
			checkPeriodicBlock(t, periodic(src[:p], 2*p+32+int(src[len(src)-1])), lz4BlockSize)
		}
	})
}

// BenchmarkLZ4 compares ferry's compressor with franz-go's default on a
// 1 MB batch of each shape (run with -benchmem; ratio is output/input).
func BenchmarkLZ4(b *testing.B) {
	def, err := kgo.DefaultCompressor(kgo.Lz4Compression())
	if err != nil {
		b.Fatal(err)
	}
	in := lz4Inputs()
	for _, name := range []string{"text", "kafka-like", "random 200K", "otlp logs, text", "otlp logs, random"} {
		src := in[name]
		for _, c := range []struct {
			name string
			c    kgo.Compressor
		}{{"ferry", ferryCompressor{}}, {"pierrec", def}} {
			b.Run(name+"/"+c.name, func(b *testing.B) {
				var buf bytes.Buffer
				b.SetBytes(int64(len(src)))
				var n int
				for i := 0; i < b.N; i++ {
					buf.Reset()
					out, _ := c.c.Compress(&buf, src)
					n = len(out)
				}
				b.ReportMetric(float64(n)/float64(len(src)), "ratio")
			})
		}
	}
}
