package protocol

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// The vectors under testdata/protocol are the protocol's conformance suite:
// each NAME.bin is the exact bytes of one or more frames, and NAME.json
// describes them (and, for an invalid one, which error a decoder must give)
// so that any implementation can check its encoder and decoder against them.
// They are written by `go test ./protocol -run TestVectors -update` from the
// cases below, and read back by every run.

var update = flag.Bool("update", false, "rewrite testdata/protocol from the cases")

const vectorDir = "../testdata/protocol"

// vector is NAME.json.
type vector struct {
	Description string `json:"description"`
	File        string `json:"file"`
	Valid       bool   `json:"valid"`
	// malformed | too_large | invalid_request_id (the frame reads, its
	// request id is not valid: that frame is refused, the stream is fine)
	Error  string        `json:"error,omitempty"`
	Limits *vectorLimits `json:"limits,omitempty"`
	Frames []vframe      `json:"frames"`
}

type vectorLimits struct {
	MaxFrameBytes int `json:"max_frame_bytes"`
	MaxRecords    int `json:"max_records"`
}

type vframe struct {
	Type      string `json:"type"`
	Flags     byte   `json:"flags"`
	RequestID uint32 `json:"request_id"`
	// preamble
	Bytes string `json:"bytes,omitempty"`
	// hello
	Version    uint16 `json:"version,omitempty"`
	ClientName string `json:"client_name,omitempty"`
	Token      string `json:"token,omitempty"`
	Features   uint64 `json:"features,omitempty"`
	// hello, version 3: the producer id, hex (absent: none)
	ProducerID string `json:"producer_id,omitempty"`
	// hello_ok
	MaxFrameBytes    uint32 `json:"max_frame_bytes,omitempty"`
	MaxRecords       uint32 `json:"max_records,omitempty"`
	MaxInflightBytes uint32 `json:"max_inflight_bytes,omitempty"`
	Server           string `json:"server,omitempty"`
	// produce
	Records []vrecord `json:"records,omitempty"`
	// produce, version 2 with FlagRequestID (8): the id before the records
	ClientRequestID string `json:"client_request_id,omitempty"`
	// produce, version 3 with FlagSequence (16): the sequence number after
	// the request id (if any), before the records
	Sequence uint64 `json:"sequence,omitempty"`
	// result
	Ranges []vrange `json:"ranges,omitempty"`
	// result, version 2 with FlagReceipt (4)
	Receipt *vreceipt `json:"receipt,omitempty"`
	// error
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

type vrecord struct {
	Topic     string      `json:"topic"`
	Key       *string     `json:"key"` // null: no key
	Value     string      `json:"value"`
	Timestamp int64       `json:"timestamp"`
	Headers   [][2]string `json:"headers"`
}

type vrange struct {
	Count        uint32 `json:"count"`
	Status       string `json:"status"` // ok | retryable | permanent
	Reason       string `json:"reason"`
	RetryAfterMS int64  `json:"retry_after_ms"`
	Message      string `json:"message"`
}

type vreceipt struct {
	SpoolID    string       `json:"spool_id"`
	Placements []vplacement `json:"placements"`
}

type vplacement struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
	Count     uint32 `json:"count"`
}

var statusNames = map[byte]string{StatusOK: "ok", StatusRetryable: "retryable", StatusPermanent: "permanent"}

func str(s string) *string { return &s }

var sample = []vrecord{
	{Topic: "app-logs", Key: str("user-42"), Value: `{"msg":"hello"}`, Timestamp: 1700000000123, Headers: [][2]string{{"trace", "abc"}}},
	{Topic: "app-logs", Key: nil, Value: "second record, same topic (named once)", Timestamp: 0, Headers: [][2]string{}},
	{Topic: "billing", Key: str(""), Value: "empty key, not a missing one", Timestamp: 1700000000999, Headers: [][2]string{{"a", ""}, {"b", "2"}}},
}

// cases are the vectors. Valid ones are encoded from their description;
// invalid ones are given as bytes.
func cases() []struct {
	name string
	v    vector
	raw  []byte
} {
	valid := func(name, desc string, frames ...vframe) struct {
		name string
		v    vector
		raw  []byte
	} {
		return struct {
			name string
			v    vector
			raw  []byte
		}{name, vector{Description: desc, File: name + ".bin", Valid: true, Frames: frames}, nil}
	}
	invalid := func(name, desc, want string, lim *vectorLimits, raw []byte) struct {
		name string
		v    vector
		raw  []byte
	} {
		return struct {
			name string
			v    vector
			raw  []byte
		}{name, vector{Description: desc, File: name + ".bin", Valid: false, Error: want, Limits: lim}, raw}
	}
	produce := func(recs ...vrecord) []byte {
		var body []byte
		body = appendCount(body, len(recs))
		prev := ""
		for _, r := range recs {
			pr := toRecord(r)
			body = AppendRecord(body, prev, &pr)
			prev = r.Topic
		}
		return body
	}
	frame := func(t, flags byte, id uint32, body []byte) []byte { return AppendFrame(nil, t, flags, id, body) }
	return []struct {
		name string
		v    vector
		raw  []byte
	}{
		valid("preamble", "the 4 bytes that open a binary connection: FRY and the version", vframe{Type: "preamble", Bytes: "FRY\u0001"}),
		valid("hello", "a client's first frame: version 1, its name, a token, lz4 and zstd asked for",
			vframe{Type: "hello", Version: 1, ClientName: "vector-client/1.0", Token: "AQAB-example-token", Features: FeatureLZ4 | FeatureZstd}),
		valid("hello_ok", "the agent's answer: version, features granted, its limits, its name",
			vframe{Type: "hello_ok", Version: 1, Features: FeatureLZ4 | FeatureZstd, MaxFrameBytes: 8 << 20, MaxRecords: 100000, MaxInflightBytes: 16 << 20, Server: "ferry/1"}),
		valid("produce", "three records: a key, a missing key and an empty key; the second names no topic (the previous one's); headers; a timestamp of 0 means the agent's time",
			vframe{Type: "produce", RequestID: 7, Records: sample}),
		valid("produce_lz4", "the same records, the body compressed with LZ4 (frame format); flags = 1",
			vframe{Type: "produce", Flags: CompressLZ4, RequestID: 8, Records: sample}),
		valid("produce_zstd", "the same records, the body compressed with zstd; flags = 2",
			vframe{Type: "produce", Flags: CompressZstd, RequestID: 9, Records: sample}),
		valid("pipelined", "two produce frames sent back to back before any answer, and their results answered out of order",
			vframe{Type: "produce", RequestID: 10, Records: sample[:1]}, vframe{Type: "produce", RequestID: 11, Records: sample[2:]},
			vframe{Type: "result", RequestID: 11, Ranges: []vrange{{Count: 1, Status: "ok"}}},
			vframe{Type: "result", RequestID: 10, Ranges: []vrange{{Count: 1, Status: "ok"}}}),
		valid("result", "the answer to a produce of 5 records: 2 accepted, 1 to retry after 1 s (buffer full), 2 refused for good (too large)",
			vframe{Type: "result", RequestID: 7, Ranges: []vrange{{Count: 2, Status: "ok"},
				{Count: 1, Status: "retryable", Reason: "queue_full", RetryAfterMS: 1000, Message: "ferry's buffer is full; retry later"},
				{Count: 2, Status: "permanent", Reason: "record_too_large", Message: "record of 9000000 bytes exceeds max_batch_bytes (1000000)"}}}),
		valid("result_whole_frame", "a produce refused before it was decoded (no room to read it): one range of count 0 covers every record of the frame",
			vframe{Type: "result", RequestID: 13, Ranges: []vrange{{Count: 0, Status: "retryable", Reason: "queue_full", RetryAfterMS: 1000, Message: "ferry's buffer is full; retry later"}}}),
		valid("error", "the agent's last frame on a connection it closes",
			vframe{Type: "error", RequestID: 12, Reason: "malformed_frame", Message: "malformed frame: bytes after the last record"}),

		// Version 2: receipts and request ids.
		valid("v2_preamble", "version 2's preamble: FRY and 2", vframe{Type: "preamble", Bytes: "FRY\u0002"}),
		valid("v2_handshake", "a version 2 hello and the agent's hello_ok of version 2",
			vframe{Type: "preamble", Bytes: "FRY\u0002"},
			vframe{Type: "hello", Version: 2, ClientName: "vector-client/2.0", Token: "", Features: FeatureZstd},
			vframe{Type: "hello_ok", Version: 2, Features: FeatureZstd, MaxFrameBytes: 8 << 20, MaxRecords: 100000, MaxInflightBytes: 16 << 20, Server: "ferry/1"}),
		valid("v2_produce_receipt", "version 2: a produce asking for a receipt (flags = 4); the body is version 1's",
			vframe{Type: "produce", Flags: FlagReceipt, RequestID: 21, Records: sample}),
		valid("v2_produce_request_id", "version 2: a produce with a client request id (flags = 8) and a receipt asked for (4): the body starts with the id",
			vframe{Type: "produce", Flags: FlagReceipt | FlagRequestID, RequestID: 22, ClientRequestID: "req-7f3a.checkout", Records: sample}),
		valid("v2_produce_request_id_zstd", "the same, the body (request id included) compressed with zstd: flags = 2 | 4 | 8",
			vframe{Type: "produce", Flags: CompressZstd | FlagReceipt | FlagRequestID, RequestID: 23, ClientRequestID: "req-7f3a.checkout", Records: sample}),
		valid("v2_result_receipt", "version 2: the answer to v2_produce_receipt in delivery mode kafka: all 3 accepted (flags = 4); the receipt's placements say where, the second elides its topic (the previous one's)",
			vframe{Type: "result", Flags: FlagReceipt, RequestID: 21, Ranges: []vrange{{Count: 3, Status: "ok"}},
				Receipt: &vreceipt{Placements: []vplacement{{"app-logs", 2, 1041, 1}, {"app-logs", 0, 77, 1}, {"billing", 5, 300000000000, 1}}}}),
		valid("v2_result_receipt_ranges", "version 2: 6 records, the 4th refused: the placements cover the 5 accepted ones in record order, consecutive offsets merged",
			vframe{Type: "result", Flags: FlagReceipt, RequestID: 24, Ranges: []vrange{{Count: 3, Status: "ok"},
				{Count: 1, Status: "permanent", Reason: "record_too_large", Message: "too large"}, {Count: 2, Status: "ok"}},
				Receipt: &vreceipt{Placements: []vplacement{{"t", 1, 10, 3}, {"t", 1, 14, 2}}}}),
		valid("v2_result_receipt_spool", "version 2 in delivery mode spool: accepted at the spool's fsync, before Kafka; the receipt is the spool id to look up (GET /receipts/{id}), no placements yet",
			vframe{Type: "result", Flags: FlagReceipt, RequestID: 25, Ranges: []vrange{{Count: 3, Status: "ok"}},
				Receipt: &vreceipt{SpoolID: "7-1234-9f86d081884c7d65", Placements: []vplacement{}}}),
		invalid("v2_placement_count_zero", "a receipt's placement of 0 records", "malformed", nil,
			frame(TypeResult, FlagReceipt, 1, []byte{1, 1, 0, 0, 0, 0, 0, 1, 1, 't', 0, 0, 0})),
		invalid("v2_placement_first_without_topic", "a receipt's first placement elides its topic", "malformed", nil,
			frame(TypeResult, FlagReceipt, 1, []byte{1, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1})),
		invalid("v2_request_id_too_long", "a produce's request id over 128 bytes: the frame reads, the id is refused (the agent answers the frame permanent invalid_request_id and the connection goes on)", "invalid_request_id", nil,
			frame(TypeProduce, FlagRequestID, 1, append(AppendRequestID(nil, string(bytes.Repeat([]byte("r"), 129))), produce(sample[0])...))),
		invalid("v2_request_id_empty", "a produce's request id of 0 bytes with flag 8 (an id is 1 to 128): refused like a long one", "invalid_request_id", nil,
			frame(TypeProduce, FlagRequestID, 1, append(AppendRequestID(nil, ""), produce(sample[0])...))),
		invalid("v2_request_id_bad_character", "a produce's request id with a space: refused like a long one", "invalid_request_id", nil,
			frame(TypeProduce, FlagRequestID, 1, append(AppendRequestID(nil, "req 1"), produce(sample[0])...))),
		invalid("v2_request_id_overruns", "a produce's request id whose length runs past the body: malformed", "malformed", nil,
			frame(TypeProduce, FlagRequestID, 1, []byte{50, 'r', 'r'})),
		invalid("v2_result_receipt_truncated", "a result whose flags promise a receipt that is not there", "malformed", nil,
			frame(TypeResult, FlagReceipt, 1, []byte{1, 1, 0, 0, 0, 0})),

		// Version 3: producer ids and sequence numbers (idempotence).
		valid("v3_preamble", "version 3's preamble: FRY and 3", vframe{Type: "preamble", Bytes: "FRY\u0003"}),
		valid("v3_handshake", "a version 3 hello with a producer id (16 bytes, hex here) asking for lz4 and idempotence (1 | 4), and the agent granting both",
			vframe{Type: "preamble", Bytes: "FRY\u0003"},
			vframe{Type: "hello", Version: 3, ClientName: "vector-client/3.0", Token: "", Features: FeatureLZ4 | FeatureIdempotence, ProducerID: "0f1e2d3c4b5a69788796a5b4c3d2e1f0"},
			vframe{Type: "hello_ok", Version: 3, Features: FeatureLZ4 | FeatureIdempotence, MaxFrameBytes: 8 << 20, MaxRecords: 100000, MaxInflightBytes: 16 << 20, Server: "ferry/1"}),
		valid("v3_hello_no_producer", "a version 3 hello without a producer id (its length 0): the agent grants no idempotence",
			vframe{Type: "hello", Version: 3, ClientName: "c", Token: "tok", Features: FeatureZstd}),
		valid("v3_produce_sequence", "version 3: a produce with its sequence number (flags = 16): the body starts with the varint 300 (ac 02)",
			vframe{Type: "produce", Flags: FlagSequence, RequestID: 31, Sequence: 300, Records: sample}),
		valid("v3_produce_request_id_sequence_lz4", "version 3: request id, then sequence, then the records, compressed together with LZ4: flags = 1 | 4 | 8 | 16",
			vframe{Type: "produce", Flags: CompressLZ4 | FlagReceipt | FlagRequestID | FlagSequence, RequestID: 32, ClientRequestID: "req-7f3a.checkout", Sequence: 1 << 40, Records: sample}),
		invalid("v3_producer_id_short", "a version 3 hello whose producer id is 5 bytes (0 or 16): malformed", "malformed", nil,
			AppendHello(nil, Hello{Version: 3, ClientName: "c", ProducerID: []byte("short")})),
		invalid("v3_sequence_truncated", "a produce with flag 16 whose sequence varint runs past the body: malformed", "malformed", nil,
			frame(TypeProduce, FlagSequence, 1, []byte{0x80, 0x80})),

		invalid("bad_length", "a length shorter than the frame header", "malformed", nil, []byte{0, 0, 0, 3, 3, 0, 0}),
		invalid("too_large", "a frame longer than max_frame_bytes: refused from its length alone, before its body is read", "too_large",
			&vectorLimits{MaxFrameBytes: 1024, MaxRecords: 100}, frame(TypeProduce, 0, 1, bytes.Repeat([]byte{0}, 2000))),
		invalid("unknown_type", "frame type 9", "malformed", nil, frame(9, 0, 1, nil)),
		invalid("unknown_compression", "compression flag 3", "malformed", nil, frame(TypeProduce, 3, 1, produce(sample[0]))),
		invalid("no_records", "a produce frame with a count of 0", "malformed", nil, frame(TypeProduce, 0, 1, []byte{0})),
		invalid("too_many_records", "more records than max_records", "too_large", &vectorLimits{MaxFrameBytes: 1 << 20, MaxRecords: 2},
			frame(TypeProduce, 0, 1, produce(sample...))),
		invalid("count_lies", "a count of 50,000 records (within max_records) in a 20-byte body", "malformed", nil,
			frame(TypeProduce, 0, 1, append(appendCount(nil, 50_000), produce(sample[0])[1:]...))),
		invalid("first_without_topic", "the first record elides its topic", "malformed", nil,
			frame(TypeProduce, 0, 1, []byte{1, 0, 0, 1, 'v', 0, 0})),
		invalid("value_overruns", "a value length past the end of the body", "malformed", nil,
			frame(TypeProduce, 0, 1, []byte{1, 1, 't', 0, 100, 'v'})),
		invalid("truncated_varint", "a varint cut off by the end of the body", "malformed", nil,
			frame(TypeProduce, 0, 1, []byte{1, 1, 't', 0, 0x80})),
		invalid("trailing_bytes", "bytes after the last record", "malformed", nil,
			frame(TypeProduce, 0, 1, append(produce(sample[0]), 0xFF))),
		invalid("lz4_bomb", "an LZ4 body that inflates past max_frame_bytes", "too_large", &vectorLimits{MaxFrameBytes: 64 << 10, MaxRecords: 100},
			frame(TypeProduce, CompressLZ4, 1, mustCompress(produce(vrecord{Topic: "t", Value: string(bytes.Repeat([]byte("a"), 1<<20))}), CompressLZ4))),
	}
}

func appendCount(dst []byte, n int) []byte { return appendUvarint(dst, uint64(n)) }

func mustCompress(b []byte, c byte) []byte {
	out, err := Compress(nil, b, c)
	if err != nil {
		panic(err)
	}
	return out
}

func toRecord(r vrecord) Record {
	pr := Record{Topic: []byte(r.Topic), Value: []byte(r.Value), Timestamp: r.Timestamp}
	if r.Key != nil {
		pr.Key = []byte(*r.Key)
	}
	for _, h := range r.Headers {
		pr.Headers = append(pr.Headers, Header{Key: []byte(h[0]), Value: []byte(h[1])})
	}
	return pr
}

// encode writes a valid vector's frames. Compressed bodies are compressed
// here; other implementations compare the decompressed body instead.
func encode(t *testing.T, v vector) []byte {
	t.Helper()
	var out []byte
	for _, f := range v.Frames {
		switch f.Type {
		case "preamble":
			out = append(out, f.Bytes...)
		case "hello":
			pid, err := hex.DecodeString(f.ProducerID)
			if err != nil {
				t.Fatal(err)
			}
			if len(pid) == 0 {
				pid = nil
			}
			out = AppendHello(out, Hello{Version: f.Version, ClientName: f.ClientName, Token: f.Token, Features: f.Features, ProducerID: pid})
		case "hello_ok":
			out = AppendHelloOK(out, HelloOK{Version: f.Version, Features: f.Features, MaxFrameBytes: f.MaxFrameBytes,
				MaxRecords: f.MaxRecords, MaxInflightBytes: f.MaxInflightBytes, Server: f.Server})
		case "produce":
			var body []byte
			if f.Flags&FlagRequestID != 0 {
				body = AppendRequestID(body, f.ClientRequestID)
			}
			if f.Flags&FlagSequence != 0 {
				body = AppendSequence(body, f.Sequence)
			}
			body = appendCount(body, len(f.Records))
			prev := ""
			for _, r := range f.Records {
				pr := toRecord(r)
				body = AppendRecord(body, prev, &pr)
				prev = r.Topic
			}
			if c := f.Flags & compressMask; c != 0 {
				body = mustCompress(body, c)
			}
			out = AppendFrame(out, TypeProduce, f.Flags, f.RequestID, body)
		case "result":
			var rs []Range
			for _, r := range f.Ranges {
				st := map[string]byte{"ok": StatusOK, "retryable": StatusRetryable, "permanent": StatusPermanent}[r.Status]
				rs = append(rs, Range{Count: r.Count, Status: st, Reason: r.Reason, RetryAfter: time.Duration(r.RetryAfterMS) * time.Millisecond, Message: r.Message})
			}
			if f.Receipt != nil {
				rc := &Receipt{SpoolID: f.Receipt.SpoolID}
				for _, p := range f.Receipt.Placements {
					rc.Placements = append(rc.Placements, Placement(p))
				}
				out = AppendResultReceipt(out, f.RequestID, rs, rc)
				break
			}
			out = AppendResult(out, f.RequestID, rs)
		case "error":
			out = AppendError(out, f.RequestID, f.Reason, f.Message)
		default:
			t.Fatalf("unknown frame type %q", f.Type)
		}
	}
	return out
}

// decodeAll reads every frame of b the way the agent (or a client) does and
// describes them as the JSON does.
func decodeAll(b []byte, l Limits) ([]vframe, error) {
	var out []vframe
	if bytes.HasPrefix(b, []byte("FRY")) {
		if len(b) < 4 || !Spoken(b[3]) {
			return nil, ErrMalformed
		}
		out = append(out, vframe{Type: "preamble", Bytes: string(b[:4])})
		b = b[4:]
	}
	for len(b) > 0 {
		if len(b) < 10 {
			return out, ErrMalformed
		}
		h, err := ParseHeader([10]byte(b[:10]), l.MaxFrameBytes)
		if err != nil {
			return out, err
		}
		if len(b) < 4+int(h.Length) {
			return out, ErrMalformed
		}
		body := b[10 : 4+h.Length]
		b = b[4+h.Length:]
		f := vframe{Flags: h.Flags, RequestID: h.RequestID}
		switch h.Type {
		case TypeHello:
			hl, err := DecodeHello(body, l)
			if err != nil {
				return out, err
			}
			f.Type, f.Version, f.ClientName, f.Token, f.Features = "hello", hl.Version, hl.ClientName, hl.Token, hl.Features
			f.ProducerID = hex.EncodeToString(hl.ProducerID)
		case TypeHelloOK:
			ok, err := DecodeHelloOK(body, l)
			if err != nil {
				return out, err
			}
			f.Type, f.Version, f.Features, f.MaxFrameBytes, f.MaxRecords, f.MaxInflightBytes, f.Server = "hello_ok", ok.Version, ok.Features, ok.MaxFrameBytes, ok.MaxRecords, ok.MaxInflightBytes, ok.Server
		case TypeProduce:
			f.Type = "produce"
			plain, err := Decompress(nil, body, h.Compression(), l.MaxFrameBytes)
			if err != nil {
				return out, err
			}
			if h.Flags&FlagRequestID != 0 {
				id, rest, err := SplitRequestID(plain)
				if err != nil {
					return out, err
				}
				f.ClientRequestID, plain = string(id), rest
			}
			if h.Flags&FlagSequence != 0 {
				seq, rest, err := SplitSequence(plain)
				if err != nil {
					return out, err
				}
				f.Sequence, plain = seq, rest
			}
			rs, err := NewRecords(plain, l)
			if err != nil {
				return out, err
			}
			var r Record
			for rs.Next(&r) {
				vr := vrecord{Topic: string(r.Topic), Value: string(r.Value), Timestamp: r.Timestamp, Headers: [][2]string{}}
				if r.Key != nil {
					vr.Key = str(string(r.Key))
				}
				for _, hd := range r.Headers {
					vr.Headers = append(vr.Headers, [2]string{string(hd.Key), string(hd.Value)})
				}
				f.Records = append(f.Records, vr)
			}
			if err := rs.Err(); err != nil {
				return out, err
			}
		case TypeResult:
			var rc Receipt
			rs, err := DecodeResultReceipt(nil, &rc, h.Flags, body, l)
			if err != nil {
				return out, err
			}
			if h.Flags&FlagReceipt != 0 {
				f.Receipt = &vreceipt{SpoolID: rc.SpoolID, Placements: []vplacement{}}
				for _, p := range rc.Placements {
					f.Receipt.Placements = append(f.Receipt.Placements, vplacement(p))
				}
			}
			f.Type = "result"
			for _, r := range rs {
				f.Ranges = append(f.Ranges, vrange{Count: r.Count, Status: statusNames[r.Status], Reason: r.Reason, RetryAfterMS: r.RetryAfter.Milliseconds(), Message: r.Message})
			}
		case TypeError:
			reason, msg, err := DecodeError(body, l)
			if err != nil {
				return out, err
			}
			f.Type, f.Reason, f.Message = "error", reason, msg
		}
		out = append(out, f)
	}
	return out, nil
}

func normalize(fs []vframe) []byte {
	for i := range fs {
		for j := range fs[i].Records {
			if fs[i].Records[j].Headers == nil {
				fs[i].Records[j].Headers = [][2]string{}
			}
		}
		if rc := fs[i].Receipt; rc != nil && rc.Placements == nil {
			rc.Placements = []vplacement{}
		}
	}
	b, _ := json.Marshal(fs)
	return b
}

// TestVectors: every vector on disk decodes to its description (or fails
// with the error it names), and every valid one is re-encoded to the same
// bytes (compressed bodies: the same records after decompression).
func TestVectors(t *testing.T) {
	if *update {
		if err := os.MkdirAll(vectorDir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, c := range cases() {
			raw := c.raw
			if c.v.Valid {
				raw = encode(t, c.v)
			}
			js, _ := json.MarshalIndent(c.v, "", "  ")
			if err := os.WriteFile(filepath.Join(vectorDir, c.name+".json"), append(js, '\n'), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(vectorDir, c.name+".bin"), raw, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	files, _ := filepath.Glob(filepath.Join(vectorDir, "*.json"))
	if len(files) < len(cases()) {
		t.Fatalf("%d vectors on disk, %d cases: run go test ./protocol -run TestVectors -update", len(files), len(cases()))
	}
	for _, jf := range files {
		var v vector
		b, err := os.ReadFile(jf)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, &v); err != nil {
			t.Fatalf("%s: %v", jf, err)
		}
		raw, err := os.ReadFile(filepath.Join(vectorDir, v.File))
		if err != nil {
			t.Fatal(err)
		}
		l := DefaultLimits
		if v.Limits != nil {
			l.MaxFrameBytes, l.MaxRecords = v.Limits.MaxFrameBytes, v.Limits.MaxRecords
		}
		t.Run(filepath.Base(jf), func(t *testing.T) {
			got, err := decodeAll(raw, l)
			if !v.Valid {
				var tl *TooLargeError
				switch {
				case err == nil:
					t.Fatalf("decoded an invalid vector: %s", normalize(got))
				case v.Error == "too_large" && !errors.As(err, &tl):
					t.Fatalf("error %v, want too_large", err)
				case v.Error == "malformed" && !errors.Is(err, ErrMalformed):
					t.Fatalf("error %v, want malformed", err)
				case v.Error == "invalid_request_id" && !errors.Is(err, ErrInvalidRequestID):
					t.Fatalf("error %v, want invalid_request_id", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if g, w := normalize(got), normalize(v.Frames); !bytes.Equal(g, w) {
				t.Fatalf("decoded\n%s\nwant\n%s", g, w)
			}
			compressed := false
			for _, f := range v.Frames {
				compressed = compressed || f.Type == "produce" && f.Flags&compressMask != 0
			}
			if !compressed {
				if enc := encode(t, v); !bytes.Equal(enc, raw) {
					t.Fatalf("re-encoded bytes differ:\n%x\n%x", enc, raw)
				}
			}
		})
	}
}
