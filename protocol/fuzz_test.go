package protocol

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// FuzzDecode: no input crashes the decoders or makes them allocate beyond
// the limits; whatever decodes re-encodes, with this package's encoders, to
// frames that decode the same.
//
// Compared after one normalisation, of what the encoders cannot carry: the
// decoder ignores the flags of every frame but Produce, and the request id
// of Hello and HelloOK (docs/protocol.md: both are 0 there), while
// AppendHello, AppendHelloOK, AppendResult and AppendError write 0 flags
// and AppendHello(OK) a request id of 0; so those are set to what the
// encoders write before the comparison. A Produce frame keeps its flags
// (bits 2-7 included, passed to AppendFrame) and its body is compressed
// again with the codec its flags name: the compressed bytes differ, the
// records must not. The second decode's frame limit is the re-encoded
// stream's length: recompression may make a body a few bytes larger than
// the one that fitted; its decompressed size is no larger than before.
func FuzzDecode(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join(vectorDir, "*.bin"))
	for _, p := range files {
		if b, err := os.ReadFile(p); err == nil {
			f.Add(b)
		}
	}
	// Seeds of what the vectors do not cover: a Produce frame with flag
	// bits past the codec's, a repeated topic named again rather than
	// elided, and frames whose flags and request ids the encoders drop.
	rec := Record{Topic: []byte("t"), Value: []byte("v")}
	body := AppendRecord(AppendRecord(AppendProduceCount(nil, 2), "", &rec), "", &rec)
	f.Add(AppendFrame(nil, TypeProduce, 0xf0, 3, body))
	hello := AppendHello(nil, Hello{Version: 1, ClientName: "c"})
	hello[9], hello[5] = 9, 0x80 // request id 9, flags 0x80
	f.Add(hello)
	f.Add(AppendResult(AppendError(nil, 4, "r", "m"), 4, []Range{{Count: 0, Status: StatusRetryable, RetryAfter: 2 * time.Hour}}))
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
		for i := range frames {
			switch frames[i].Type {
			case "produce", "preamble":
			case "hello", "hello_ok":
				frames[i].Flags, frames[i].RequestID = 0, 0
			case "result":
				// The receipt flag is the result's only one: it says a
				// receipt follows, which the encoder writes.
				frames[i].Flags &= FlagReceipt
			default:
				frames[i].Flags = 0
			}
		}
		enc := reencode(t, frames)
		l2 := l
		l2.MaxFrameBytes = max(l.MaxFrameBytes, len(enc))
		again, err := decodeAll(enc, l2)
		if err != nil {
			t.Fatalf("the re-encoding of %d decoded frames does not decode: %v\n%s", len(frames), err, normalize(frames))
		}
		if g, w := normalize(again), normalize(frames); !bytes.Equal(g, w) {
			t.Fatalf("re-encoded frames decode differently:\n%s\nwant\n%s", g, w)
		}
	})
}

// reencode writes decoded frames back with the package's encoders (encode,
// the vectors' writer, for every frame but Produce, whose full flags it
// cannot carry).
func reencode(t *testing.T, frames []vframe) []byte {
	t.Helper()
	var out []byte
	for _, f := range frames {
		if f.Type != "produce" {
			out = append(out, encode(t, vector{Frames: []vframe{f}})...)
			continue
		}
		var body []byte
		if f.Flags&FlagRequestID != 0 {
			body = AppendRequestID(body, f.ClientRequestID)
		}
		if f.Flags&FlagSequence != 0 {
			body = AppendSequence(body, f.Sequence)
		}
		body = AppendProduceCount(body, len(f.Records))
		prev := ""
		for _, r := range f.Records {
			pr := toRecord(r)
			body = AppendRecord(body, prev, &pr)
			prev = r.Topic
		}
		body, err := Compress(nil, body, f.Flags&compressMask)
		if err != nil {
			t.Fatalf("compressing with codec %d: %v", f.Flags&compressMask, err)
		}
		out = AppendFrame(out, TypeProduce, f.Flags, f.RequestID, body)
	}
	return out
}

// FuzzSplitRequestID: the connection path's read of a version 2 produce
// body's request id never crashes, never reads past the body, and sorts
// every input one of three ways: a valid id and the rest of the body, a
// field that reads but holds no valid id (ErrInvalidRequestID: the frame
// alone is refused), or malformed (a length past the body).
func FuzzSplitRequestID(f *testing.F) {
	rec := Record{Topic: []byte("t"), Value: []byte("v")}
	records := AppendRecord(AppendProduceCount(nil, 1), "", &rec)
	for _, id := range []string{"req-1", "", "a b", string(bytes.Repeat([]byte("r"), 129)), string(bytes.Repeat([]byte("r"), 128))} {
		f.Add(append(AppendRequestID(nil, id), records...))
	}
	f.Add([]byte{50, 'r'})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
	f.Fuzz(func(t *testing.T, body []byte) {
		id, rest, err := SplitRequestID(body)
		switch {
		case err == nil:
			if !ValidRequestID(id) || len(id)+len(rest) > len(body) || !bytes.HasSuffix(body, rest) {
				t.Fatalf("%q: id %q rest %q", body, id, rest)
			}
		case errors.Is(err, ErrInvalidRequestID):
			if id != nil || rest != nil {
				t.Fatalf("%q: refused but returned %q %q", body, id, rest)
			}
		case !errors.Is(err, ErrMalformed):
			t.Fatalf("%q: %v is neither malformed nor invalid_request_id", body, err)
		}
	})
}
