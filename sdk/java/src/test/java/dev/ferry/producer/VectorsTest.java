package dev.ferry.producer;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.stream.Stream;

import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.TestFactory;

/**
 * The shared protocol vectors (testdata/protocol, written from the Go
 * implementation): every valid one decodes to its description and, but for
 * compressed bodies, encodes back to the same bytes; every invalid one fails
 * with the error it names. And the vectors assembled by hand from
 * docs/protocol.md (testdata/protocol/spec, annotated hex; see its
 * README.md), which the Go encoder did not write: decoded, and encoded back
 * to the same bytes unless the spec leaves the encoder a choice.
 */
class VectorsTest {
    static Path dir() {
        return Path.of(System.getProperty("ferry.repo", "../.."), "testdata", "protocol");
    }

    @TestFactory
    Stream<DynamicTest> vectors() throws IOException {
        List<Path> files = new ArrayList<>();
        try (Stream<Path> s = Files.list(dir())) {
            s.filter(p -> p.toString().endsWith(".json")).sorted().forEach(files::add);
        }
        assertTrue(files.size() >= 20, "vectors found: " + files.size());
        return files.stream().map(f -> DynamicTest.dynamicTest(f.getFileName().toString(), () -> check(f)));
    }

    @SuppressWarnings("unchecked")
    static void check(Path jf) throws IOException {
        Map<String, Object> v = (Map<String, Object>) Json.parse(Files.readString(jf));
        byte[] raw = Files.readAllBytes(dir().resolve((String) v.get("file")));
        Protocol.Limits l = Protocol.Limits.DEFAULT;
        if (v.get("limits") != null) {
            Map<String, Object> lm = (Map<String, Object>) v.get("limits");
            l = new Protocol.Limits(((Long) lm.get("max_frame_bytes")).intValue(), ((Long) lm.get("max_records")).intValue());
        }
        boolean valid = (Boolean) v.get("valid");
        List<Map<String, Object>> got;
        try {
            got = decodeAll(raw, l);
        } catch (Protocol.ProtocolException e) {
            if (valid) {
                fail("a valid vector failed: " + e.getMessage());
            }
            String want = (String) v.get("error");
            assertEquals(want, e.kind(), e.getMessage());
            return;
        }
        if (!valid) {
            fail("an invalid vector decoded: " + got);
        }
        List<Object> frames = (List<Object>) v.get("frames");
        assertEquals(frames.size(), got.size());
        boolean compressed = false;
        for (int i = 0; i < frames.size(); i++) {
            Map<String, Object> want = (Map<String, Object>) frames.get(i);
            Map<String, Object> have = got.get(i);
            for (Map.Entry<String, Object> e : want.entrySet()) {
                assertEquals(norm(e.getValue()), norm(have.get(e.getKey())), jf.getFileName() + " frame " + i + " field " + e.getKey());
            }
            compressed |= "produce".equals(want.get("type")) && (((Long) want.getOrDefault("flags", 0L)) & 3) != 0;
        }
        if (!compressed) {
            assertArrayEquals(raw, encode(frames), "re-encoded bytes");
            return;
        }
        // Compressed bodies differ by compressor: frame by frame, the same header (but for the compression bits)
        // and, decompressed, the same body as the producer's encoder writes (a request id included).
        int off = raw.length >= 4 && raw[0] == 'F' ? 4 : 0;
        byte[] enc = encode(frames);
        List<RawFrame> ours = split(java.util.Arrays.copyOfRange(raw, off, raw.length)), plain = split(java.util.Arrays.copyOfRange(enc, off, enc.length));
        assertEquals(ours.size(), plain.size(), "frames encoded");
        for (int i = 0; i < ours.size(); i++) {
            RawFrame f = ours.get(i), e = plain.get(i);
            int codec = f.h.type == Protocol.PRODUCE ? f.h.flags & 3 : 0;
            assertEquals(f.h.type, e.h.type, "frame " + i + " type");
            assertEquals(f.h.flags & ~codec, e.h.flags, "frame " + i + " flags but compression");
            assertEquals(f.h.requestId, e.h.requestId, "frame " + i + " request id");
            assertArrayEquals(Protocol.decompress(f.body, codec, l.maxFrameBytes), e.body, "frame " + i + " body, decompressed");
        }
    }

    @TestFactory
    Stream<DynamicTest> specVectors() throws IOException {
        List<Path> files = new ArrayList<>();
        try (Stream<Path> s = Files.list(dir().resolve("spec"))) {
            s.filter(p -> p.toString().endsWith(".json")).sorted().forEach(files::add);
        }
        assertTrue(files.size() >= 8, "hand-assembled vectors found: " + files.size());
        return files.stream().map(f -> DynamicTest.dynamicTest("spec/" + f.getFileName(), () -> checkSpec(f)));
    }

    static final Set<String> SPEC_FIELDS = Set.of("description", "clauses", "encoder_differs", "hex", "decompressed_body", "frames");

    /** Joins annotated hex ([hex, comment] pairs), refusing a group without its comment. */
    @SuppressWarnings("unchecked")
    static byte[] assemble(Object groups) {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        for (Object o : (List<Object>) groups) {
            List<Object> g = (List<Object>) o;
            assertEquals(2, g.size(), "a byte group is [hex, comment]: " + g);
            String hex = ((String) g.get(0)).replaceAll("\\s+", "");
            assertTrue(!((String) g.get(1)).isBlank(), "byte group " + g.get(0) + " has no comment naming its clause");
            assertTrue(!hex.isEmpty() && hex.length() % 2 == 0, "not hex bytes: " + g.get(0));
            for (int i = 0; i < hex.length(); i += 2) {
                out.write(Integer.parseInt(hex.substring(i, i + 2), 16));
            }
        }
        return out.toByteArray();
    }

    /** A frame as it is on the wire. */
    static final class RawFrame {
        final Protocol.Header h;
        final byte[] body;

        RawFrame(Protocol.Header h, byte[] body) {
            this.h = h;
            this.body = body;
        }
    }

    /** Cuts b (after an optional preamble) into frames. */
    static List<RawFrame> split(byte[] b) throws IOException {
        int off = b.length >= 4 && b[0] == 'F' && b[1] == 'R' && b[2] == 'Y' && b[3] >= 1 && b[3] <= 3 ? 4 : 0;
        List<RawFrame> out = new ArrayList<>();
        while (off < b.length) {
            assertTrue(b.length - off >= 10, "a truncated frame header");
            byte[] h = java.util.Arrays.copyOfRange(b, off, off + 10);
            Protocol.Header fh = Protocol.parseHeader(h, Protocol.Limits.DEFAULT.maxFrameBytes);
            assertTrue(b.length - off >= 4 + fh.length, "a truncated frame");
            out.add(new RawFrame(fh, java.util.Arrays.copyOfRange(b, off + 10, off + 4 + (int) fh.length)));
            off += 4 + (int) fh.length;
        }
        return out;
    }

    static void compareFrames(String what, List<Object> frames, List<Map<String, Object>> got) {
        assertEquals(frames.size(), got.size(), what + ": frames");
        for (int i = 0; i < frames.size(); i++) {
            @SuppressWarnings("unchecked")
            Map<String, Object> want = (Map<String, Object>) frames.get(i);
            for (Map.Entry<String, Object> e : want.entrySet()) {
                assertEquals(norm(e.getValue()), norm(got.get(i).get(e.getKey())), what + " frame " + i + " field " + e.getKey());
            }
        }
    }

    @SuppressWarnings("unchecked")
    static void checkSpec(Path jf) throws IOException {
        Map<String, Object> v = (Map<String, Object>) Json.parse(Files.readString(jf));
        assertTrue(SPEC_FIELDS.containsAll(v.keySet()), "unknown fields in " + jf.getFileName() + ": " + v.keySet());
        byte[] raw = assemble(v.get("hex"));
        List<Object> frames = (List<Object>) v.get("frames");
        List<Map<String, Object>> got;
        try {
            got = decodeAll(raw, Protocol.Limits.DEFAULT);
        } catch (Protocol.ProtocolException e) {
            throw new AssertionError("decoding the hand-assembled bytes: " + e.getMessage(), e);
        }
        compareFrames("decoded", frames, got);
        // Encoded uncompressed (encode ignores flags): the bytes of a vector
        // without a choice, the bodies before compression of one with.
        byte[] enc = encode(frames);
        String differs = (String) v.get("encoder_differs");
        if (differs == null) {
            assertArrayEquals(raw, enc, "the encoder's bytes differ from the hand-assembled ones");
            assertTrue(v.get("decompressed_body") == null, "decompressed_body given for a vector the encoder must match");
            return;
        }
        // The spec leaves the encoder a choice: its bytes, compressed as the
        // producer compresses, must decode to the same frames, and the
        // vector's compressed bodies must decompress to the annotated body,
        // which is the encoder's body before compression.
        List<RawFrame> plain = split(enc), ours = split(raw);
        assertEquals(ours.size(), plain.size(), "frames encoded");
        Protocol.Buf again = new Protocol.Buf(256);
        if (raw.length >= 4 && raw[0] == 'F') {
            again.raw(raw, 0, 4);
        }
        int compressed = 0;
        for (int i = 0; i < ours.size(); i++) {
            RawFrame f = ours.get(i);
            byte[] body = plain.get(i).body;
            int codec = f.h.type == Protocol.PRODUCE ? f.h.flags & 3 : 0;
            if (codec != 0) {
                compressed++;
                byte[] dec = Protocol.decompress(f.body, codec, Protocol.Limits.DEFAULT.maxFrameBytes);
                assertArrayEquals(assemble(v.get("decompressed_body")), dec, "frame " + i + ": the vector's body decompressed vs the annotated body");
                assertArrayEquals(body, dec, "frame " + i + ": the encoder's uncompressed body vs the vector's, decompressed");
                body = Protocol.compress(body, 0, body.length, (byte) codec);
            }
            Protocol.Header ph = plain.get(i).h;
            int at = Protocol.beginFrame(again, (byte) ph.type, ph.flags | codec, ph.requestId);
            again.raw(body, 0, body.length);
            Protocol.endFrame(again, at);
        }
        assertEquals(compressed > 0, v.get("decompressed_body") != null, "decompressed_body is given for compressed frames, and only for them");
        compareFrames("the encoder's bytes (" + differs + ")", frames, decodeAll(again.toArray(), Protocol.Limits.DEFAULT));
    }

    /** Empty lists and missing headers compare equal. */
    static Object norm(Object o) {
        if (o instanceof List && ((List<?>) o).isEmpty()) {
            return null;
        }
        if (o instanceof List) {
            List<Object> out = new ArrayList<>();
            for (Object x : (List<?>) o) {
                out.add(norm(x));
            }
            return out;
        }
        if (o instanceof Map) {
            Map<String, Object> out = new java.util.TreeMap<>();
            for (Map.Entry<?, ?> e : ((Map<?, ?>) o).entrySet()) {
                if (e.getKey().equals("key")) {
                    // An empty key is not a missing one.
                    if (e.getValue() != null) {
                        out.put("key", e.getValue());
                    }
                    continue;
                }
                Object v = norm(e.getValue());
                if (v != null && !(v instanceof Long && (Long) v == 0 && !e.getKey().equals("timestamp")) && !"".equals(v)) {
                    out.put((String) e.getKey(), v);
                }
            }
            return out;
        }
        if (o instanceof Long && (Long) o == 0) {
            return null;
        }
        if ("".equals(o)) {
            return null;
        }
        return o;
    }

    static String hex(byte[] b) {
        StringBuilder sb = new StringBuilder();
        for (byte x : b) {
            sb.append(String.format("%02x", x & 0xFF));
        }
        return sb.toString();
    }

    /** A vector's hex field as bytes; null (the field missing) is none. */
    static byte[] unhex(String s) {
        if (s == null) {
            return null;
        }
        byte[] out = new byte[s.length() / 2];
        for (int i = 0; i < out.length; i++) {
            out[i] = (byte) Integer.parseInt(s.substring(2 * i, 2 * i + 2), 16);
        }
        return out;
    }

    static String str(byte[] b) {
        return new String(b, StandardCharsets.UTF_8);
    }

    static List<Map<String, Object>> decodeAll(byte[] b, Protocol.Limits l) throws IOException {
        List<Map<String, Object>> out = new ArrayList<>();
        int off = 0;
        if (b.length >= 3 && b[0] == 'F' && b[1] == 'R' && b[2] == 'Y') {
            if (b.length < 4 || b[3] < 1 || b[3] > 3) {
                throw Protocol.malformed("version");
            }
            out.add(new java.util.LinkedHashMap<>(Map.of("type", "preamble", "bytes", "FRY" + (char) b[3])));
            off = 4;
        }
        while (off < b.length) {
            if (b.length - off < 10) {
                throw Protocol.malformed("truncated header");
            }
            byte[] h = new byte[10];
            System.arraycopy(b, off, h, 0, 10);
            Protocol.Header fh = Protocol.parseHeader(h, l.maxFrameBytes);
            if (b.length - off < 4 + fh.length) {
                throw Protocol.malformed("truncated body");
            }
            byte[] body = new byte[fh.bodyLen()];
            System.arraycopy(b, off + 10, body, 0, body.length);
            off += 4 + (int) fh.length;
            Map<String, Object> f = new java.util.LinkedHashMap<>();
            f.put("flags", (long) fh.flags);
            f.put("request_id", fh.requestId);
            switch (fh.type) {
                case Protocol.HELLO: {
                    Protocol.Hello hl = Protocol.decodeHello(body);
                    f.put("type", "hello");
                    f.put("version", (long) hl.version);
                    f.put("client_name", hl.clientName);
                    f.put("token", hl.token);
                    f.put("features", hl.features);
                    f.put("producer_id", hex(hl.producerId)); // "" (none) compares equal to a missing field
                    break;
                }
                case Protocol.HELLO_OK: {
                    Protocol.HelloOk ok = Protocol.decodeHelloOk(body);
                    f.put("type", "hello_ok");
                    f.put("version", (long) ok.version);
                    f.put("features", ok.features);
                    f.put("max_frame_bytes", ok.maxFrameBytes);
                    f.put("max_records", ok.maxRecords);
                    f.put("max_inflight_bytes", ok.maxInflightBytes);
                    f.put("server", ok.server);
                    break;
                }
                case Protocol.PRODUCE: {
                    f.put("type", "produce");
                    byte[] plain = Protocol.decompress(body, fh.flags & 3, l.maxFrameBytes);
                    if ((fh.flags & 3) == 3) {
                        throw Protocol.malformed("compression 3");
                    }
                    Protocol.Reader rr = new Protocol.Reader(plain);
                    if ((fh.flags & Protocol.FLAG_REQUEST_ID) != 0) {
                        f.put("client_request_id", Protocol.requestId(rr));
                    }
                    if ((fh.flags & Protocol.FLAG_SEQUENCE) != 0) {
                        f.put("sequence", Protocol.sequence(rr));
                    }
                    int start = rr.off;
                    List<Object> recs = new ArrayList<>();
                    for (Protocol.Rec rec : Protocol.decodeRecords(plain, start, l)) {
                        Map<String, Object> m = new java.util.LinkedHashMap<>();
                        m.put("topic", str(rec.topic));
                        m.put("key", rec.key == null ? null : str(rec.key));
                        m.put("value", str(rec.value));
                        m.put("timestamp", rec.timestamp);
                        List<Object> hs = new ArrayList<>();
                        for (byte[][] hd : rec.headers) {
                            hs.add(List.of(str(hd[0]), str(hd[1])));
                        }
                        m.put("headers", hs);
                        recs.add(m);
                    }
                    f.put("records", recs);
                    break;
                }
                case Protocol.RESULT: {
                    f.put("type", "result");
                    List<Object> rs = new ArrayList<>();
                    Protocol.Receipt rc = new Protocol.Receipt();
                    for (Protocol.Range g : Protocol.decodeResult(body, l.maxRecords, fh.flags, rc)) {
                        Map<String, Object> m = new java.util.LinkedHashMap<>();
                        m.put("count", g.count);
                        m.put("status", new String[] {"ok", "retryable", "permanent"}[g.status]);
                        m.put("reason", g.reason);
                        m.put("retry_after_ms", g.retryAfterMs);
                        m.put("message", g.message);
                        rs.add(m);
                    }
                    f.put("ranges", rs);
                    if ((fh.flags & Protocol.FLAG_RECEIPT) != 0) {
                        List<Object> ps = new ArrayList<>();
                        for (Protocol.Placement p : rc.placements) {
                            Map<String, Object> m = new java.util.LinkedHashMap<>();
                            m.put("topic", p.topic);
                            m.put("partition", (long) p.partition);
                            m.put("offset", p.offset);
                            m.put("count", p.count);
                            ps.add(m);
                        }
                        Map<String, Object> m = new java.util.LinkedHashMap<>();
                        m.put("spool_id", rc.spoolId);
                        m.put("placements", ps);
                        f.put("receipt", m);
                    }
                    break;
                }
                case Protocol.ERROR: {
                    String[] e = Protocol.decodeError(body);
                    f.put("type", "error");
                    f.put("reason", e[0]);
                    f.put("message", e[1]);
                    break;
                }
                default:
                    throw Protocol.malformed("type");
            }
            out.add(f);
        }
        return out;
    }

    @SuppressWarnings("unchecked")
    static byte[] encode(List<Object> frames) {
        Protocol.Buf out = new Protocol.Buf(256);
        for (Object o : frames) {
            Map<String, Object> f = (Map<String, Object>) o;
            long id = (Long) f.getOrDefault("request_id", 0L);
            switch ((String) f.get("type")) {
                case "preamble": {
                    byte[] pre = ((String) f.get("bytes")).getBytes(StandardCharsets.ISO_8859_1);
                    out.raw(pre, 0, pre.length);
                    break;
                }
                case "hello":
                    Protocol.hello(out, ((Long) f.get("version")).intValue(), (String) f.get("client_name"), (String) f.get("token"),
                            (Long) f.get("features"), unhex((String) f.get("producer_id")));
                    break;
                case "hello_ok": {
                    int at = Protocol.beginFrame(out, Protocol.HELLO_OK, 0, 0);
                    out.u16(((Long) f.get("version")).intValue()).uvarint((Long) f.get("features")).u32((Long) f.get("max_frame_bytes"))
                            .u32((Long) f.get("max_records")).u32((Long) f.get("max_inflight_bytes")).string((String) f.get("server"));
                    Protocol.endFrame(out, at);
                    break;
                }
                case "produce": {
                    // Uncompressed: the compression bits are dropped, the others kept. The flags and the body come
                    // from the producer's own encoder (Protocol.produceFlags, produceBody, record), the request id
                    // included, so the vectors check what a Producer puts on the wire.
                    int flags = ((Long) f.getOrDefault("flags", 0L)).intValue() & ~3;
                    String rid = (flags & Protocol.FLAG_REQUEST_ID) != 0 ? (String) f.get("client_request_id") : null;
                    long seq = (flags & Protocol.FLAG_SEQUENCE) != 0 ? (Long) f.get("sequence") : 0;
                    assertEquals(flags, Protocol.produceFlags((flags & Protocol.FLAG_RECEIPT) != 0, rid, seq), "the producer's flags for " + f);
                    List<Object> recs = (List<Object>) f.get("records");
                    Protocol.Buf records = new Protocol.Buf(256);
                    byte[] prev = null;
                    for (Object ro : recs) {
                        Map<String, Object> r = (Map<String, Object>) ro;
                        byte[] topic = ((String) r.get("topic")).getBytes(StandardCharsets.UTF_8);
                        String key = (String) r.get("key");
                        List<byte[][]> hs = new ArrayList<>();
                        if (r.get("headers") != null) {
                            for (Object ho : (List<Object>) r.get("headers")) {
                                List<String> h = (List<String>) ho;
                                hs.add(new byte[][] {h.get(0).getBytes(StandardCharsets.UTF_8), h.get(1).getBytes(StandardCharsets.UTF_8)});
                            }
                        }
                        Protocol.record(records, prev, topic, key == null ? null : key.getBytes(StandardCharsets.UTF_8),
                                ((String) r.get("value")).getBytes(StandardCharsets.UTF_8), (Long) r.get("timestamp"), hs);
                        prev = topic;
                    }
                    int at = Protocol.beginFrame(out, Protocol.PRODUCE, flags, id);
                    Protocol.produceBody(out, rid, seq, recs.size(), records.b, 0, records.len);
                    Protocol.endFrame(out, at);
                    break;
                }
                case "result": {
                    int flags = ((Long) f.getOrDefault("flags", 0L)).intValue() & Protocol.FLAG_RECEIPT;
                    int at = Protocol.beginFrame(out, Protocol.RESULT, flags, id);
                    List<Object> rs = (List<Object>) f.get("ranges");
                    out.uvarint(rs.size());
                    for (Object go : rs) {
                        Map<String, Object> g = (Map<String, Object>) go;
                        int st = List.of("ok", "retryable", "permanent").indexOf(g.get("status"));
                        out.uvarint((Long) g.get("count")).u8(st).string((String) g.get("reason")).uvarint((Long) g.get("retry_after_ms"))
                                .string((String) g.get("message"));
                    }
                    if (flags != 0) {
                        Map<String, Object> rc = (Map<String, Object>) f.get("receipt");
                        out.string((String) rc.get("spool_id"));
                        List<Object> ps = (List<Object>) rc.get("placements");
                        out.uvarint(ps.size());
                        String prev = null;
                        for (Object po : ps) {
                            Map<String, Object> p = (Map<String, Object>) po;
                            String topic = (String) p.get("topic");
                            if (topic.equals(prev)) {
                                out.u8(0);
                            } else {
                                out.string(topic);
                            }
                            prev = topic;
                            out.uvarint((Long) p.get("partition")).uvarint((Long) p.get("offset")).uvarint((Long) p.get("count"));
                        }
                    }
                    Protocol.endFrame(out, at);
                    break;
                }
                case "error": {
                    int at = Protocol.beginFrame(out, Protocol.ERROR, 0, id);
                    out.string((String) f.get("reason")).string((String) f.get("message"));
                    Protocol.endFrame(out, at);
                    break;
                }
                default:
                    fail("unknown frame type " + f.get("type"));
            }
        }
        assertNotNull(out);
        return out.toArray();
    }
}
