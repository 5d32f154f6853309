package dev.ferry.producer;

import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;

import com.github.luben.zstd.Zstd;
import com.github.luben.zstd.ZstdInputStream;
import net.jpountz.lz4.LZ4Compressor;
import net.jpountz.lz4.LZ4Factory;
import net.jpountz.lz4.LZ4FrameInputStream;
import net.jpountz.xxhash.XXHashFactory;

/**
 * ferry's local record protocol, versions 1, 2 and 3 (docs/protocol.md):
 * frame encoding and bounded decoding. Every size is checked before memory
 * is spent on it. Version 2 adds a produce's receipt flag (4) and request id
 * flag (8, the body starts with the id) and a result's receipt after its
 * ranges (flag 4). Version 3 adds a producer id (16 bytes, or none) after
 * the hello's features, the idempotence feature (4) and a produce's sequence
 * flag (16: the body holds the frame's sequence number after the request id,
 * before the record count); bits 5-7 stay reserved.
 */
final class Protocol {
    private Protocol() {}

    static final byte[] PREAMBLE = {'F', 'R', 'Y', 1};
    static final int VERSION = 1, VERSION2 = 2, VERSION3 = 3;
    static final int FLAG_RECEIPT = 4, FLAG_REQUEST_ID = 8, FLAG_SEQUENCE = 16;
    static final int MAX_REQUEST_ID_BYTES = 128;
    /** A version 3 hello's producer id: this many bytes, or none. */
    static final int PRODUCER_ID_BYTES = 16;

    /** The preamble of version v. */
    static byte[] preamble(int v) {
        return new byte[] {'F', 'R', 'Y', (byte) v};
    }
    static final int HEADER_LEN = 6;

    static final byte HELLO = 1, HELLO_OK = 2, PRODUCE = 3, RESULT = 4, ERROR = 5;
    static final byte COMPRESS_NONE = 0, COMPRESS_LZ4 = 1, COMPRESS_ZSTD = 2;
    static final long FEATURE_LZ4 = 1, FEATURE_ZSTD = 2, FEATURE_IDEMPOTENCE = 4;
    static final byte STATUS_OK = 0, STATUS_RETRYABLE = 1, STATUS_PERMANENT = 2;

    /** A frame or body that breaks the protocol, or exceeds a limit. */
    static final class ProtocolException extends IOException {
        final boolean tooLarge;
        /**
         * The frame reads but its request id is not valid: the frame alone is refused (invalid_request_id),
         * not the stream.
         */
        final boolean invalidRequestId;

        ProtocolException(String msg, boolean tooLarge) {
            this(msg, tooLarge, false);
        }

        ProtocolException(String msg, boolean tooLarge, boolean invalidRequestId) {
            super(msg);
            this.tooLarge = tooLarge;
            this.invalidRequestId = invalidRequestId;
        }

        /** The vectors' name of the error: malformed, too_large or invalid_request_id. */
        String kind() {
            return tooLarge ? "too_large" : invalidRequestId ? "invalid_request_id" : "malformed";
        }
    }

    static ProtocolException malformed(String msg) {
        return new ProtocolException("malformed frame: " + msg, false);
    }

    /** Limits a decoder applies. */
    static final class Limits {
        final int maxFrameBytes, maxRecords, maxStringBytes = 4096, maxHeaders = 256, maxTopicBytes = 249;

        Limits(int maxFrameBytes, int maxRecords) {
            this.maxFrameBytes = maxFrameBytes;
            this.maxRecords = maxRecords;
        }

        static final Limits DEFAULT = new Limits(8 << 20, 100_000);
    }

    /**
     * A growable byte buffer written front to back. It doubles as it grows,
     * but not past soft unless one write needs more: a producer's frame
     * buffer stops near its batch size instead of doubling past it, and its
     * capacity is what the producer charges against totalSizeInBytes.
     */
    static final class Buf {
        byte[] b;
        int len;
        int soft = Integer.MAX_VALUE;

        Buf(int cap) {
            b = new byte[Math.max(cap, 16)];
        }

        void reset() {
            len = 0;
        }

        void ensure(int n) {
            if (len + n > b.length) {
                byte[] nb = new byte[grown(b.length, len + n, soft)];
                System.arraycopy(b, 0, nb, 0, len);
                b = nb;
            }
        }

        /** The capacity a Buf of capacity cap grows to to hold need bytes (cap itself when they fit). */
        static int grown(int cap, int need, int soft) {
            if (need <= cap) {
                return cap;
            }
            long d = Math.max(2L * cap, need);
            if (d > soft) {
                d = Math.max(soft, need);
            }
            return (int) Math.min(d, Integer.MAX_VALUE - 8);
        }

        Buf u8(int v) {
            ensure(1);
            b[len++] = (byte) v;
            return this;
        }

        Buf u16(int v) {
            ensure(2);
            b[len++] = (byte) (v >>> 8);
            b[len++] = (byte) v;
            return this;
        }

        Buf u32(long v) {
            ensure(4);
            b[len++] = (byte) (v >>> 24);
            b[len++] = (byte) (v >>> 16);
            b[len++] = (byte) (v >>> 8);
            b[len++] = (byte) v;
            return this;
        }

        void putU32At(int at, long v) {
            b[at] = (byte) (v >>> 24);
            b[at + 1] = (byte) (v >>> 16);
            b[at + 2] = (byte) (v >>> 8);
            b[at + 3] = (byte) v;
        }

        Buf uvarint(long v) {
            ensure(10);
            while ((v & ~0x7FL) != 0) {
                b[len++] = (byte) ((v & 0x7F) | 0x80);
                v >>>= 7;
            }
            b[len++] = (byte) v;
            return this;
        }

        Buf raw(byte[] src, int off, int n) {
            ensure(n);
            System.arraycopy(src, off, b, len, n);
            len += n;
            return this;
        }

        Buf bytes(byte[] v) {
            uvarint(v.length);
            return raw(v, 0, v.length);
        }

        Buf string(String s) {
            return bytes(s.getBytes(StandardCharsets.UTF_8));
        }

        byte[] toArray() {
            byte[] out = new byte[len];
            System.arraycopy(b, 0, out, 0, len);
            return out;
        }
    }

    /** Starts a frame; endFrame fills in its length. Returns the header's offset. */
    static int beginFrame(Buf out, byte type, int flags, long requestId) {
        int at = out.len;
        out.u32(0).u8(type).u8(flags).u32(requestId);
        return at;
    }

    static void endFrame(Buf out, int at) {
        out.putU32At(at, out.len - at - 4);
    }

    static void hello(Buf out, String clientName, String token, long features) {
        hello(out, VERSION, clientName, token, features);
    }

    static void hello(Buf out, int version, String clientName, String token, long features) {
        hello(out, version, clientName, token, features, null);
    }

    /**
     * A hello; from version 3 on it carries producerId (null or empty: none) after the features. Earlier versions
     * have no such field: producerId is then ignored.
     */
    static void hello(Buf out, int version, String clientName, String token, long features, byte[] producerId) {
        int at = beginFrame(out, HELLO, 0, 0);
        out.u16(version).string(clientName).string(token == null ? "" : token).uvarint(features);
        if (version >= VERSION3) {
            out.bytes(producerId == null ? new byte[0] : producerId);
        }
        endFrame(out, at);
    }

    /** A hello's fields (the agent's side; for conformance tests and tools). */
    static final class Hello {
        int version;
        String clientName, token;
        long features;
        byte[] producerId = new byte[0];
    }

    /** Decodes a hello: a version 3 one's producer id must be empty or exactly 16 bytes. */
    static Hello decodeHello(byte[] body) throws ProtocolException {
        Reader r = new Reader(body);
        Hello h = new Hello();
        h.version = r.u16();
        h.clientName = r.string(4096, "client name");
        h.token = r.string(4096, "token");
        h.features = r.uvarint();
        if (h.version >= VERSION3) {
            h.producerId = r.bytes(PRODUCER_ID_BYTES, "producer id");
            if (h.producerId.length != 0 && h.producerId.length != PRODUCER_ID_BYTES) {
                throw malformed("a producer id of " + h.producerId.length + " bytes (0 or " + PRODUCER_ID_BYTES + ")");
            }
        }
        r.end();
        return h;
    }

    /** Where a result's accepted records went (version 2): placements, or the spool's id. */
    static final class Receipt {
        String spoolId = "";
        final List<Placement> placements = new ArrayList<>();
    }

    /** Accepted records, in record order, at offsets offset .. offset+count-1 of topic/partition. */
    static final class Placement {
        String topic;
        int partition;
        long offset, count;
    }

    /** A valid request id: 1-128 of A-Z a-z 0-9 . _ : - (the agent refuses others). */
    static boolean validRequestId(String s) {
        if (s == null || s.isEmpty() || s.length() > MAX_REQUEST_ID_BYTES) {
            return false;
        }
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            if (!(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == ':' || c == '-')) {
                return false;
            }
        }
        return true;
    }

    /**
     * A produce frame's flags beyond compression: receipt (4) when asked, request id (8) when the frame carries one
     * (requestId non-null: the body then starts with it, see {@link #produceBody}).
     */
    static int produceFlags(boolean receipt, String requestId) {
        return produceFlags(receipt, requestId, 0);
    }

    /** produceFlags, and sequence (16, version 3) when seq is not 0: the body holds it after the request id. */
    static int produceFlags(boolean receipt, String requestId, long seq) {
        return (receipt ? FLAG_RECEIPT : 0) | (requestId != null ? FLAG_REQUEST_ID : 0) | (seq != 0 ? FLAG_SEQUENCE : 0);
    }

    /**
     * Appends a produce body before compression: the request id first when there is one (version 2, flag 8: the id
     * is compressed with the records), then the record count and the records already encoded by {@link #record}.
     * The id must be valid ({@link #validRequestId}): the producer refuses others at send, so none reaches the wire.
     */
    static Buf produceBody(Buf out, String requestId, int count, byte[] records, int off, int len) {
        return produceBody(out, requestId, 0, count, records, off, len);
    }

    /** produceBody with the frame's sequence number after the request id (version 3, flag 16) when seq is not 0. */
    static Buf produceBody(Buf out, String requestId, long seq, int count, byte[] records, int off, int len) {
        return producePrefix(out, requestId, seq, count).raw(records, off, len);
    }

    /**
     * The most bytes {@link #producePrefix} writes, plus a frame header: the room a producer's frame buffer keeps
     * before its records so that the frame goes out from it without a copy. The request id (its length and up to
     * 128 bytes), the sequence (a varint, up to 10 bytes) and the count (up to 5).
     */
    static final int PRODUCE_PREFIX_MAX = HEADER_LEN + 4 + 2 + MAX_REQUEST_ID_BYTES + 10 + 5;

    /** A produce body's start, before its records: the request id (when there is one), then the record count. */
    static Buf producePrefix(Buf out, String requestId, int count) {
        return producePrefix(out, requestId, 0, count);
    }

    /**
     * A produce body's start, before its records: the request id (when there is one), the sequence (version 3,
     * when seq is not 0: a producer numbers its frames from 1, so 0 is never one), then the record count.
     */
    static Buf producePrefix(Buf out, String requestId, long seq, int count) {
        if (requestId != null) {
            assert validRequestId(requestId) : requestId;
            // Valid ids are ASCII: a char is a byte.
            out.uvarint(requestId.length());
            out.ensure(requestId.length());
            for (int i = 0; i < requestId.length(); i++) {
                out.b[out.len++] = (byte) requestId.charAt(i);
            }
        }
        if (seq != 0) {
            out.uvarint(seq);
        }
        return out.uvarint(count);
    }

    /** A record as produce frames carry it; key null = no key. */
    static final class Rec {
        final byte[] topic, key, value;
        final long timestamp;
        final List<byte[][]> headers;

        Rec(byte[] topic, byte[] key, byte[] value, long timestamp, List<byte[][]> headers) {
            this.topic = topic;
            this.key = key;
            this.value = value;
            this.timestamp = timestamp;
            this.headers = headers;
        }
    }

    /** Appends one record of a produce body; prevTopic is the previous record's (or null). */
    static void record(Buf out, byte[] prevTopic, byte[] topic, byte[] key, byte[] value, long timestamp, List<byte[][]> headers) {
        if (prevTopic != null && topic.length > 0 && java.util.Arrays.equals(prevTopic, topic)) {
            out.u8(0);
        } else {
            out.bytes(topic);
        }
        if (key == null) {
            out.u8(0);
        } else {
            out.uvarint(key.length + 1L).raw(key, 0, key.length);
        }
        out.bytes(value);
        out.uvarint(Math.max(timestamp, 0));
        int nh = headers == null ? 0 : headers.size();
        out.uvarint(nh);
        for (int i = 0; i < nh; i++) {
            out.bytes(headers.get(i)[0]).bytes(headers.get(i)[1]);
        }
    }

    static byte[] compress(byte[] src, int off, int len, byte codec) throws IOException {
        Buf out = new Buf(0);
        compress(src, off, len, codec, out);
        return out.toArray();
    }

    /**
     * Compresses src[off, off+len) into out (reset first), which grows to the codec's bound for len and is kept
     * by the caller: a producer's connection compresses every frame into the same buffer instead of allocating
     * the codec's buffers per frame.
     */
    static void compress(byte[] src, int off, int len, byte codec, Buf out) throws IOException {
        out.reset();
        switch (codec) {
            case COMPRESS_ZSTD: {
                int bound = (int) Math.min(Zstd.compressBound(len), Integer.MAX_VALUE - 8);
                out.ensure(bound);
                long n = Zstd.compressByteArray(out.b, 0, bound, src, off, len, 1);
                if (Zstd.isError(n)) {
                    throw new IOException("zstd: " + Zstd.getErrorName(n));
                }
                out.len = (int) n;
                return;
            }
            case COMPRESS_LZ4:
                lz4Frame(src, off, len, out);
                return;
            default:
                throw new IllegalArgumentException("compression " + codec);
        }
    }

    private static final LZ4Compressor LZ4 = LZ4Factory.fastestInstance().fastCompressor();
    /** LZ4 frame blocks of at most 4 MiB (descriptor BD 7), independent (FLG 0x60), no checksums. */
    static final int LZ4_BLOCK = 4 << 20;
    private static final byte LZ4_FLG = 0x60, LZ4_BD = 0x70;
    private static final byte LZ4_HC = (byte) (XXHashFactory.fastestInstance().hash32().hash(new byte[] {LZ4_FLG, LZ4_BD}, 0, 2, 0) >> 8);

    /**
     * One LZ4 frame (docs/protocol.md: the LZ4 frame format) of src: the bytes lz4-java's LZ4FrameOutputStream
     * writes with its defaults (ProtocolTest checks they are the same), without its 4 MiB block buffers per frame.
     */
    static void lz4Frame(byte[] src, int off, int len, Buf out) {
        out.ensure(7 + 4 + LZ4.maxCompressedLength(Math.min(len, LZ4_BLOCK)) + 4 * (len / LZ4_BLOCK + 1) + 4);
        out.u8(0x04).u8(0x22).u8(0x4D).u8(0x18); // magic 0x184D2204, little-endian
        out.u8(LZ4_FLG).u8(LZ4_BD).u8(LZ4_HC);
        for (int at = off, end = off + len; at < end; ) {
            int n = Math.min(LZ4_BLOCK, end - at);
            out.ensure(4 + LZ4.maxCompressedLength(n) + 4);
            int c = LZ4.compress(src, at, n, out.b, out.len + 4, LZ4.maxCompressedLength(n));
            if (c >= n) {
                le32(out, n | 0x80000000); // stored: compression would not make it smaller
                out.raw(src, at, n);
            } else {
                le32(out, c);
                out.len += c;
            }
            at += n;
        }
        le32(out, 0); // end mark
    }

    private static void le32(Buf out, int v) {
        out.ensure(4);
        out.b[out.len++] = (byte) v;
        out.b[out.len++] = (byte) (v >>> 8);
        out.b[out.len++] = (byte) (v >>> 16);
        out.b[out.len++] = (byte) (v >>> 24);
    }

    /** Decompresses a produce body, refusing more than max bytes of output. */
    static byte[] decompress(byte[] body, int codec, int max) throws IOException {
        if (codec == COMPRESS_NONE) {
            if (body.length > max) {
                throw new ProtocolException("produce body of " + body.length + " bytes exceeds the limit (" + max + ")", true);
            }
            return body;
        }
        InputStream in;
        if (codec == COMPRESS_LZ4) {
            in = new LZ4FrameInputStream(new ByteArrayInputStream(body));
        } else if (codec == COMPRESS_ZSTD) {
            in = new ZstdInputStream(new ByteArrayInputStream(body));
        } else {
            throw malformed("unknown compression " + codec);
        }
        try (InputStream r = in) {
            ByteArrayOutputStream out = new ByteArrayOutputStream();
            byte[] chunk = new byte[64 << 10];
            int n;
            while ((n = r.read(chunk)) > 0) {
                out.write(chunk, 0, n);
                if (out.size() > max) {
                    throw new ProtocolException("decompressed produce body exceeds the limit (" + max + ")", true);
                }
            }
            return out.toByteArray();
        } catch (ProtocolException e) {
            throw e;
        } catch (IOException | RuntimeException e) {
            throw malformed("decompressing: " + e.getMessage());
        }
    }

    /** A frame's fixed part. */
    static final class Header {
        long length;
        int type, flags;
        long requestId;

        int bodyLen() {
            return (int) (length - HEADER_LEN);
        }
    }

    static Header parseHeader(byte[] h, int max) throws ProtocolException {
        Header out = new Header();
        out.length = u32(h, 0);
        out.type = h[4] & 0xFF;
        out.flags = h[5] & 0xFF;
        out.requestId = u32(h, 6);
        if (out.length < HEADER_LEN) {
            throw malformed("length " + out.length + " is shorter than the frame header");
        }
        if (out.length > max) {
            throw new ProtocolException("frame of " + out.length + " bytes exceeds the limit (" + max + ")", true);
        }
        if (out.type < HELLO || out.type > ERROR) {
            throw malformed("unknown frame type " + out.type);
        }
        return out;
    }

    static long u32(byte[] b, int at) {
        return ((b[at] & 0xFFL) << 24) | ((b[at + 1] & 0xFFL) << 16) | ((b[at + 2] & 0xFFL) << 8) | (b[at + 3] & 0xFFL);
    }

    /** Reads a body; the first error is thrown. */
    static final class Reader {
        final byte[] b;
        int off;

        Reader(byte[] b) {
            this.b = b;
        }

        long uvarint() throws ProtocolException {
            long v = 0;
            for (int shift = 0; shift < 70; shift += 7) {
                if (off >= b.length) {
                    throw malformed("bad or truncated varint");
                }
                int c = b[off++] & 0xFF;
                if (shift == 63 && c > 1) {
                    throw malformed("bad or truncated varint");
                }
                v |= (long) (c & 0x7F) << shift;
                if ((c & 0x80) == 0) {
                    return v;
                }
            }
            throw malformed("bad or truncated varint");
        }

        int u8() throws ProtocolException {
            if (off >= b.length) {
                throw malformed("truncated");
            }
            return b[off++] & 0xFF;
        }

        int u16() throws ProtocolException {
            if (b.length - off < 2) {
                throw malformed("truncated");
            }
            int v = ((b[off] & 0xFF) << 8) | (b[off + 1] & 0xFF);
            off += 2;
            return v;
        }

        long u32() throws ProtocolException {
            if (b.length - off < 4) {
                throw malformed("truncated");
            }
            long v = Protocol.u32(b, off);
            off += 4;
            return v;
        }

        byte[] bytes(long max, String what) throws ProtocolException {
            long n = uvarint();
            if (Long.compareUnsigned(n, b.length - off) > 0) {
                throw malformed(what + " longer than the frame");
            }
            if (n > max) {
                throw malformed(what + " of " + n + " bytes exceeds the limit (" + max + ")");
            }
            byte[] v = new byte[(int) n];
            System.arraycopy(b, off, v, 0, (int) n);
            off += (int) n;
            return v;
        }

        String string(int max, String what) throws ProtocolException {
            return new String(bytes(max, what), StandardCharsets.UTF_8);
        }

        void end() throws ProtocolException {
            if (off != b.length) {
                throw malformed("bytes after the end of the body");
            }
        }
    }

    /** HelloOK's fields. */
    static final class HelloOk {
        int version;
        long features, maxFrameBytes, maxRecords, maxInflightBytes;
        String server;
    }

    static HelloOk decodeHelloOk(byte[] body) throws ProtocolException {
        Reader r = new Reader(body);
        HelloOk h = new HelloOk();
        h.version = r.u16();
        h.features = r.uvarint();
        h.maxFrameBytes = r.u32();
        h.maxRecords = r.u32();
        h.maxInflightBytes = r.u32();
        h.server = r.string(4096, "server");
        r.end();
        return h;
    }

    /** A run of records with one outcome; count 0 = the whole frame. */
    static final class Range {
        long count;
        int status;
        String reason, message;
        long retryAfterMs;
    }

    static List<Range> decodeResult(byte[] body, int maxRecords) throws ProtocolException {
        return decodeResult(body, maxRecords, 0, null);
    }

    /** Decodes a result of either version; with flags bit 4 the receipt after the ranges goes to rc. */
    static List<Range> decodeResult(byte[] body, int maxRecords, int flags, Receipt rc) throws ProtocolException {
        Reader r = new Reader(body);
        List<Range> out = ranges(r, body, maxRecords);
        if ((flags & FLAG_RECEIPT) != 0) {
            if (rc == null) {
                rc = new Receipt();
            }
            rc.spoolId = r.string(4096, "spool id");
            long n = r.uvarint();
            if (n > maxRecords || n > body.length) {
                throw malformed(n + " placements");
            }
            String prev = null;
            long total = 0;
            for (long i = 0; i < n; i++) {
                Placement p = new Placement();
                byte[] t = r.bytes(249, "topic");
                if (t.length > 0) {
                    p.topic = new String(t, StandardCharsets.UTF_8);
                } else if (prev == null) {
                    throw malformed("the first placement names no topic");
                } else {
                    p.topic = prev;
                }
                prev = p.topic;
                long part = r.uvarint(), off = r.uvarint(), c = r.uvarint();
                total += c;
                if (part > Integer.MAX_VALUE || off < 0 || c == 0 || c > maxRecords || total > maxRecords) {
                    throw malformed("a placement's partition, offset or count out of range");
                }
                p.partition = (int) part;
                p.offset = off;
                p.count = c;
                rc.placements.add(p);
            }
        }
        r.end();
        return out;
    }

    /**
     * Reads the request id that starts a (decompressed) produce body with flag 8; returns it, r positioned after it.
     * A length past the body is malformed; a field that reads but holds no valid id (empty, over 128 bytes, other
     * characters) is refused for that frame alone ({@link ProtocolException#invalidRequestId}), as the agent does.
     */
    static String requestId(Reader r) throws ProtocolException {
        String id = r.string(r.b.length, "request id");
        if (!validRequestId(id)) {
            throw new ProtocolException("invalid request id: it must be 1 to " + MAX_REQUEST_ID_BYTES
                    + " of A-Z a-z 0-9 . _ : -", false, true);
        }
        return id;
    }

    /**
     * Reads the sequence number of a (decompressed) produce body with flag 16, after its request id if any; r is
     * positioned after it. A varint past the body is malformed.
     */
    static long sequence(Reader r) throws ProtocolException {
        return r.uvarint();
    }

    private static List<Range> ranges(Reader r, byte[] body, int maxRecords) throws ProtocolException {
        long n = r.uvarint();
        if (n > maxRecords || n > body.length) {
            throw malformed(n + " ranges");
        }
        List<Range> out = new ArrayList<>((int) n);
        for (long i = 0; i < n; i++) {
            Range g = new Range();
            g.count = r.uvarint();
            if (g.count == 0 && n != 1 || g.count > maxRecords) {
                throw malformed("a range of 0 records beside others, or of too many records");
            }
            g.status = r.u8();
            if (g.status > STATUS_PERMANENT) {
                throw malformed("unknown status " + g.status);
            }
            g.reason = r.string(4096, "reason");
            g.retryAfterMs = Math.min(r.uvarint(), 3_600_000L);
            g.message = r.string(4096, "message");
            out.add(g);
        }
        return out;
    }

    static String[] decodeError(byte[] body) throws ProtocolException {
        Reader r = new Reader(body);
        String reason = r.string(4096, "reason"), msg = r.string(4096, "message");
        r.end();
        return new String[] {reason, msg};
    }

    /** Decodes a produce body (decompressed) into records, for conformance tests and tools. */
    static List<Rec> decodeRecords(byte[] body, Limits l) throws ProtocolException {
        return decodeRecords(body, 0, l);
    }

    /** decodeRecords of the body from offset start (after a version 2 request id). */
    static List<Rec> decodeRecords(byte[] body, int start, Limits l) throws ProtocolException {
        Reader r = new Reader(body);
        r.off = start;
        long n = r.uvarint();
        if (n == 0) {
            throw malformed("a produce frame with no records");
        }
        if (n > l.maxRecords) {
            throw new ProtocolException(n + " records in one frame exceed the limit (" + l.maxRecords + ")", true);
        }
        if (n > body.length / 5 + 1) {
            throw malformed(n + " records cannot fit in " + body.length + " bytes");
        }
        List<Rec> out = new ArrayList<>((int) n);
        byte[] prev = null;
        for (long i = 0; i < n; i++) {
            byte[] topic = r.bytes(l.maxTopicBytes, "topic");
            if (topic.length == 0) {
                if (prev == null) {
                    throw malformed("the first record names no topic");
                }
                topic = prev;
            }
            prev = topic;
            long kl = r.uvarint();
            byte[] key = null;
            if (kl > 0) {
                if (kl - 1 > body.length - r.off) {
                    throw malformed("key longer than the frame");
                }
                key = new byte[(int) (kl - 1)];
                System.arraycopy(body, r.off, key, 0, key.length);
                r.off += key.length;
            }
            byte[] value = r.bytes(body.length, "value");
            long ts = r.uvarint();
            if (ts > (1L << 53)) {
                throw malformed("timestamp out of range");
            }
            long nh = r.uvarint();
            if (nh > l.maxHeaders) {
                throw malformed(nh + " headers exceed the limit (" + l.maxHeaders + ")");
            }
            List<byte[][]> headers = new ArrayList<>();
            for (long j = 0; j < nh; j++) {
                headers.add(new byte[][] {r.bytes(l.maxStringBytes, "header key"), r.bytes(body.length, "header value")});
            }
            out.add(new Rec(topic, key, value, ts, headers));
        }
        if (r.off != body.length) {
            throw malformed("bytes after the last record");
        }
        return out;
    }
}
