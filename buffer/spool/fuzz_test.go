package spool

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/ferryhq/ferry/record"
)

// FuzzFrames: a record survives the frame round trip exactly, and scanning
// arbitrary bytes (a damaged segment) never panics, never reports more
// frames than the bytes can hold, and accounts for every byte it passes.
func FuzzFrames(f *testing.F) {
	f.Add([]byte("topic"), []byte("key"), []byte("value"), []byte("h"), []byte{1, 2, 3}, int32(-1))
	fm := &segFormat{maxFrame: 1 << 20, tag: 0x01020304, seed: 77}
	f.Add([]byte{}, []byte(nil), []byte{}, []byte{}, appendFrame(nil, &record.Record{Topic: "t", Value: []byte("v")}, fm), int32(7))
	f.Fuzz(func(t *testing.T, topic, key, value, hdr, junk []byte, part int32) {
		in := record.Record{Topic: string(topic), Key: key, Value: value}
		in.SetPartition(part)
		if len(hdr) > 0 {
			in.Headers = []record.Header{{Key: string(hdr), Value: hdr}}
		}
		frame := appendFrame(nil, &in, fm)
		var d decoder
		var out record.Record
		stop, need, skipped, _ := scan(frame, true, fm, func(_ int, p []byte) bool {
			if err := d.decode(p, &out, nil); err != nil {
				t.Fatalf("decode of a fresh frame: %v", err)
			}
			return true
		})
		if stop != len(frame) || need != 0 || skipped != 0 {
			t.Fatalf("scan of one frame: stop %d need %d skipped %d of %d", stop, need, skipped, len(frame))
		}
		if out.Topic != in.Topic || !bytes.Equal(out.Key, in.Key) || (out.Key == nil) != (in.Key == nil) ||
			!bytes.Equal(out.Value, in.Value) || len(out.Headers) != len(in.Headers) {
			t.Fatalf("round trip: %+v != %+v", out, in)
		}
		if p, ok := out.Partition(); ok != (part >= 0) || ok && p != part {
			t.Fatalf("round trip: %+v != %+v", out, in)
		}
		// The same frame again after it: the second record's headers are
		// the first's, exactly, whether shared or its own.
		var again record.Record
		if err := d.decode(frame[frameHeader:], &again, &out); err != nil {
			t.Fatalf("decode after a record: %v", err)
		}
		if len(again.Headers) != len(in.Headers) || len(in.Headers) > 0 &&
			(again.Headers[0].Key != in.Headers[0].Key || !bytes.Equal(again.Headers[0].Value, in.Headers[0].Value)) {
			t.Fatalf("headers after a record: %+v != %+v", again.Headers, in.Headers)
		}

		// Damage: junk, then the frame; the frame must still be found.
		buf := append(append([]byte{}, junk...), frame...)
		var frames, valid int
		stop, _, skipped, _ = scan(buf, true, fm, func(_ int, p []byte) bool {
			frames++
			if d.decode(p, &out, nil) == nil {
				valid++
			}
			return true
		})
		if stop != len(buf) {
			t.Fatalf("scan stopped at %d of %d at the end of data", stop, len(buf))
		}
		if int64(frames)*frameHeader+skipped > int64(len(buf)) {
			t.Fatalf("%d frames and %d skipped bytes in %d bytes", frames, skipped, len(buf))
		}
		if frames == 0 {
			t.Fatalf("the intact frame after %d junk bytes was not found", len(junk))
		}
	})
}

// FuzzResync: a segment of honest frames whose values a client chose (here,
// the fuzzer: forged frames, real-looking headers, anything), damaged at
// fuzzer-chosen spots, never yields a record that was not written, and
// costs the scan a bounded amount of work.
func FuzzResync(f *testing.F) {
	fm := &segFormat{maxFrame: 1 << 16, tag: 0xA1B2C3D4, seed: 0x1234}
	forged := appendFrame(nil, &record.Record{Topic: "billing", Value: []byte("x")}, &segFormat{maxFrame: 1 << 16})
	f.Add(forged, []byte{3, 0, 9}, uint16(5))
	f.Add(append([]byte("abc"), forged...), []byte{12, 40}, uint16(0))
	f.Fuzz(func(t *testing.T, value, damage []byte, seed uint16) {
		var buf []byte
		written := map[string]bool{}
		for i := 0; i < 8; i++ {
			v := append([]byte{byte(i), byte(seed)}, value...)
			written[string(v)] = true
			buf = appendFrame(buf, &record.Record{Topic: "app", Value: v}, fm)
		}
		if len(buf) == 0 {
			return
		}
		for i := 0; i+1 < len(damage); i += 2 {
			buf[(int(damage[i])<<8|int(damage[i+1]))%len(buf)] ^= byte(seed) | 1
		}
		var d decoder
		var r record.Record
		scan(buf, true, fm, func(_ int, p []byte) bool {
			if d.decode(p, &r, nil) != nil {
				return true
			}
			if r.Topic != "app" || !written[string(r.Value)] {
				t.Fatalf("scan produced a record that was never written: topic %q value %q", r.Topic, r.Value)
			}
			return true
		})
	})
}

// TestDecodeHeaders: records decoded one after another keep their own
// headers (exact, and appending to one never reaches the next's), header
// keys are interned, and a record costs no allocation of its own: the
// reader decodes every record it sends (OTLP records carry two headers).
func TestDecodeHeaders(t *testing.T) {
	fm := &segFormat{maxFrame: 1 << 20}
	var payloads [][]byte
	for i := range 1000 {
		r := record.Record{Topic: "otlp_spans", Value: []byte{byte(i)}, Headers: []record.Header{
			{Key: "ferry.signal", Value: []byte("traces")},
			{Key: "ferry.encoding", Value: []byte{byte(i), byte(i >> 8)}},
		}}
		if i%7 == 0 {
			r.Headers = append(r.Headers, record.Header{Key: fmt.Sprintf("k%d", i), Value: nil})
		}
		payloads = append(payloads, appendFrame(nil, &r, fm)[frameHeader:])
	}
	var d decoder
	out := make([]record.Record, len(payloads))
	for i, p := range payloads {
		var prev *record.Record
		if i > 0 {
			prev = &out[i-1]
		}
		if err := d.decode(p, &out[i], prev); err != nil {
			t.Fatal(err)
		}
	}
	for i := range out {
		h := out[i].Headers
		want := 2
		if i%7 == 0 {
			want = 3
		}
		if len(h) != want || h[0].Key != "ferry.signal" || string(h[0].Value) != "traces" ||
			h[1].Key != "ferry.encoding" || !bytes.Equal(h[1].Value, []byte{byte(i), byte(i >> 8)}) {
			t.Fatalf("record %d: headers %+v", i, h)
		}
		if want == 3 && h[2].Key != fmt.Sprintf("k%d", i) {
			t.Fatalf("record %d: third header %+v", i, h[2])
		}
	}
	// A stage that adds a header to one record leaves the next alone.
	before := out[1].Headers[0]
	out[0].Headers = append(out[0].Headers, record.Header{Key: "added"})
	if got := out[1].Headers[0]; got.Key != before.Key || !bytes.Equal(got.Value, before.Value) {
		t.Fatalf("appending to record 0's headers changed record 1's: %+v", out[1].Headers[0])
	}
	if len(d.keys) > maxKeys {
		t.Fatalf("%d interned keys, at most %d", len(d.keys), maxKeys)
	}
	var r record.Record
	allocs := testing.AllocsPerRun(2000, func() {
		if err := d.decode(payloads[1], &r, nil); err != nil {
			t.Fatal(err)
		}
	})
	// One block of headers per slabBlock/2 records of two headers.
	if allocs > 0.05 {
		t.Fatalf("%.3f allocations per record decoded", allocs)
	}
	// Records of one request carry the same headers: each shares the one
	// before it, so a run of them takes no slab memory at all.
	same := appendFrame(nil, &record.Record{Topic: "otlp_spans", Value: []byte("v"), Headers: []record.Header{
		{Key: "ferry.signal", Value: []byte("traces")}, {Key: "ferry.encoding", Value: []byte("otlp_proto")}}}, fm)[frameHeader:]
	run := make([]record.Record, 3)
	for i := range run {
		var prev *record.Record
		if i > 0 {
			prev = &run[i-1]
		}
		if err := d.decode(same, &run[i], prev); err != nil {
			t.Fatal(err)
		}
	}
	if &run[2].Headers[0] != &run[0].Headers[0] || string(run[2].Headers[1].Value) != "otlp_proto" {
		t.Fatalf("a run of records with the same headers: %+v, not shared", run[2].Headers)
	}
	slab := len(d.slab)
	allocs = testing.AllocsPerRun(2000, func() {
		if err := d.decode(same, &r, &run[0]); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 || len(d.slab) != slab {
		t.Fatalf("a record with its predecessor's headers: %.3f allocations, slab %d -> %d", allocs, slab, len(d.slab))
	}
	// Shared, they are still separate to a stage that adds a header.
	run[1].Headers = append(run[1].Headers, record.Header{Key: "added"})
	if len(run[0].Headers) != 2 || len(run[2].Headers) != 2 {
		t.Fatalf("appending to a shared header list changed its neighbours: %d, %d", len(run[0].Headers), len(run[2].Headers))
	}
	// The same count of headers with another value is not shared.
	other := appendFrame(nil, &record.Record{Topic: "otlp_spans", Value: []byte("v"), Headers: []record.Header{
		{Key: "ferry.signal", Value: []byte("traces")}, {Key: "ferry.encoding", Value: []byte("flat_json")}}}, fm)[frameHeader:]
	if err := d.decode(other, &r, &run[0]); err != nil {
		t.Fatal(err)
	}
	if string(r.Headers[1].Value) != "flat_json" || string(run[0].Headers[1].Value) != "otlp_proto" {
		t.Fatalf("different headers after a record: %+v (before it %+v)", r.Headers, run[0].Headers)
	}
}

// FuzzKeyLog: a key-log entry survives its round trip exactly, and
// decoding arbitrary bytes (a damaged or torn key log) never panics,
// never reads past them, and never takes a frame whose checksum fails.
func FuzzKeyLog(f *testing.F) {
	f.Add(int64(1), uint64(2), int64(32), uint32(10), uint32(3), []byte("http/app/key"), []byte{})
	f.Add(int64(0), uint64(0), int64(0), uint32(1), uint32(0), []byte("k"), appendKeyRec(nil, &keyRec{length: 1, key: []byte("x")}))
	f.Fuzz(func(t *testing.T, at int64, seg uint64, off int64, length, records uint32, key, junk []byte) {
		in := keyRec{at: at, seg: seg, off: off, length: length, crc: length * 7, records: records, key: key}
		copy(in.sum[:], key)
		b := appendKeyRec(nil, &in)
		out, n, err := decodeKeyRec(b)
		ok := off >= 0 && length > 0 && len(key) > 0 && len(key) <= 256
		if ok != (err == nil) {
			t.Fatalf("decode of a fresh entry: %v (valid input %v)", err, ok)
		}
		if ok && (n != len(b) || out.at != in.at || out.seg != seg || out.off != off || out.length != length ||
			out.crc != in.crc || out.records != records || out.sum != in.sum || !bytes.Equal(out.key, key)) {
			t.Fatalf("round trip: %+v != %+v", out, in)
		}
		// Junk and a torn copy: decoded or refused, never past the bytes.
		for _, buf := range [][]byte{junk, append(append([]byte{}, junk...), b...), b[:len(b)/2]} {
			for off := 0; off < len(buf); {
				_, n, err := decodeKeyRec(buf[off:])
				if err != nil {
					break
				}
				if n <= 0 || n > len(buf)-off {
					t.Fatalf("decoded %d bytes of %d", n, len(buf)-off)
				}
				off += n
			}
		}
	})
}
