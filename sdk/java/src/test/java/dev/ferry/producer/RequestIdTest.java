package dev.ferry.producer;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.DataInputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;

import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * What the producer puts on the wire for request ids, read by a peer that
 * speaks the protocol with the SDK's own decoder and answers every frame ok
 * (AgentTest checks the same against the real agent and Kafka): one id per
 * frame, frames cut where the id changes, records in order, and a bad id
 * never sent.
 */
class RequestIdTest {
    /** A produce frame as the peer read it. */
    static final class Frame {
        final int flags;
        final String requestId; // null: flag 8 not set
        final List<String> values = new ArrayList<>();

        Frame(int flags, String requestId) {
            this.flags = flags;
            this.requestId = requestId;
        }

        @Override
        public String toString() {
            return requestId + "=" + values;
        }
    }

    /**
     * A protocol peer on 127.0.0.1. Connections before answerFrom read frames until they hold dropAt records, then
     * close, none answered.
     */
    static final class Peer implements AutoCloseable {
        final ServerSocket ss = new ServerSocket(0, 50, InetAddress.getLoopbackAddress());
        final List<Frame> frames = Collections.synchronizedList(new ArrayList<>());
        final List<Integer> versions = Collections.synchronizedList(new ArrayList<>());
        final int answerFrom, dropAt;
        final Thread t;

        Peer(int answerFrom, int dropAt) throws IOException {
            this.answerFrom = answerFrom;
            this.dropAt = dropAt;
            t = new Thread(this::serve, "peer");
            t.setDaemon(true);
            t.start();
        }

        String address() {
            return "tcp:127.0.0.1:" + ss.getLocalPort();
        }

        private void serve() {
            for (int conn = 0; ; conn++) {
                try (Socket s = ss.accept()) {
                    DataInputStream in = new DataInputStream(s.getInputStream());
                    OutputStream out = s.getOutputStream();
                    byte[] pre = new byte[4];
                    in.readFully(pre);
                    byte[] body = frame(in, null);
                    int version = new Protocol.Reader(body).u16();
                    versions.add(version);
                    Protocol.Buf b = new Protocol.Buf(64);
                    int at = Protocol.beginFrame(b, Protocol.HELLO_OK, 0, 0);
                    b.u16(version).uvarint(Protocol.FEATURE_LZ4 | Protocol.FEATURE_ZSTD).u32(8 << 20).u32(100_000).u32(64 << 20).string("peer");
                    Protocol.endFrame(b, at);
                    out.write(b.b, 0, b.len);
                    out.flush();
                    int unanswered = 0;
                    while (true) {
                        Protocol.Header h = new Protocol.Header();
                        body = frame(in, h);
                        byte[] plain = Protocol.decompress(body, h.flags & 3, 8 << 20);
                        Protocol.Reader r = new Protocol.Reader(plain);
                        Frame f = new Frame(h.flags & ~3, (h.flags & Protocol.FLAG_REQUEST_ID) != 0 ? Protocol.requestId(r) : null);
                        for (Protocol.Rec rec : Protocol.decodeRecords(plain, r.off, Protocol.Limits.DEFAULT)) {
                            f.values.add(new String(rec.value, StandardCharsets.UTF_8));
                        }
                        if (conn < answerFrom) {
                            unanswered += f.values.size();
                            if (unanswered >= dropAt) {
                                break; // the connection breaks before any answer: the producer sends again
                            }
                            continue;
                        }
                        frames.add(f);
                        b.reset();
                        at = Protocol.beginFrame(b, Protocol.RESULT, 0, h.requestId);
                        b.uvarint(1).uvarint(0).u8(Protocol.STATUS_OK).string("").uvarint(0).string("");
                        Protocol.endFrame(b, at);
                        out.write(b.b, 0, b.len);
                        out.flush();
                    }
                } catch (IOException e) {
                    if (ss.isClosed()) {
                        return;
                    }
                }
            }
        }

        static byte[] frame(DataInputStream in, Protocol.Header into) throws IOException {
            byte[] h = new byte[10];
            in.readFully(h);
            Protocol.Header fh = Protocol.parseHeader(h, 16 << 20);
            if (into != null) {
                into.flags = fh.flags;
                into.requestId = fh.requestId;
            }
            byte[] body = new byte[fh.bodyLen()];
            in.readFully(body);
            return body;
        }

        @Override
        public void close() throws IOException {
            ss.close();
        }
    }

    Peer peer;

    @AfterEach
    void tearDown() throws IOException {
        if (peer != null) {
            peer.close();
        }
    }

    ProducerConfig cfg(boolean requestIds) {
        // A long linger: only a change of id, or flush, ends a frame.
        return new ProducerConfig().setAddresses(List.of(peer.address())).setRequestIds(requestIds).setLingerMs(5_000)
                .setBaseRetryBackoffMs(10).setMaxRetryBackoffMs(50);
    }

    static CompletableFuture<Result> send(Producer p, String value, String id) {
        return p.send("t", null, value.getBytes(StandardCharsets.UTF_8), null, id, null);
    }

    static String describe(List<Frame> frames) {
        synchronized (frames) {
            return frames.toString();
        }
    }

    @Test
    void framesAreCutWhereTheIdChanges() throws Exception {
        peer = new Peer(0, 0);
        List<CompletableFuture<Result>> fs = new ArrayList<>();
        try (Producer p = new Producer(cfg(true).setCompression("lz4"))) {
            fs.add(send(p, "a0", "req-A"));
            fs.add(send(p, "a1", "req-A"));
            fs.add(send(p, "b0", "req.B:2_x"));
            fs.add(send(p, "n0", null));
            fs.add(send(p, "n1", "")); // "" is no id, as null
            fs.add(send(p, "a2", "req-A"));
            p.flush();
            for (var f : fs) {
                assertTrue(f.get(10, TimeUnit.SECONDS).isSuccessful());
            }
        }
        // This peer grants no idempotence: the frames carry no sequence, as version 2's.
        assertEquals(List.of(3), peer.versions, "idempotence (the default) asks for version 3, which carries request ids too");
        assertEquals("[req-A=[a0, a1], req.B:2_x=[b0], null=[n0, n1], req-A=[a2]]", describe(peer.frames));
        assertEquals(Protocol.FLAG_REQUEST_ID, peer.frames.get(0).flags);
        assertEquals(0, peer.frames.get(2).flags, "a frame without an id sets no flag");
    }

    @Test
    void anInvalidIdFailsAtOnceAndIsNeverSent() throws Exception {
        peer = new Peer(0, 0);
        String longest = "x".repeat(128);
        try (Producer p = new Producer(cfg(true).setCompression("none"))) {
            List<Result> byCallback = Collections.synchronizedList(new ArrayList<>());
            for (String bad : new String[] {"has space", "x".repeat(129), "é", "a/b", "tab\t"}) {
                Result r = p.send("t", null, "bad".getBytes(StandardCharsets.UTF_8), null, bad, byCallback::add)
                        .get(1, TimeUnit.SECONDS); // at once: no agent answer, no linger
                assertFalse(r.isSuccessful(), bad);
                assertEquals("invalid_request_id", r.getErrorCode(), bad);
                assertEquals(1, r.getAttempts().size(), "no retry can fix it: " + r);
            }
            CompletableFuture<Result> ok = send(p, "good", longest);
            p.flush();
            assertTrue(ok.get(10, TimeUnit.SECONDS).isSuccessful());
            assertEquals(5, byCallback.size(), "every failed record's callback ran");
        }
        assertEquals("[" + longest + "=[good]]", describe(peer.frames), "no bad id reached the wire");
    }

    @Test
    void idsAreIgnoredWhenOff() throws Exception {
        peer = new Peer(0, 0);
        try (Producer p = new Producer(cfg(false).setIdempotence(false))) {
            CompletableFuture<Result> a = send(p, "a", "req-A"), bad = send(p, "b", "not valid but not sent");
            p.flush();
            assertTrue(a.get(10, TimeUnit.SECONDS).isSuccessful());
            assertTrue(bad.get(10, TimeUnit.SECONDS).isSuccessful());
        }
        assertEquals(List.of(1), peer.versions, "without receipts, request ids or idempotence: version 1, as before");
        assertEquals("[null=[a, b]]", describe(peer.frames));
    }

    @Test
    void resentRecordsKeepTheirIds() throws Exception {
        // The first connection reads every frame and breaks, unanswered: the frames in flight there are sent again,
        // each as it was (its records, its id), in order.
        peer = new Peer(1, 5);
        List<CompletableFuture<Result>> fs = new ArrayList<>();
        // The sender looks for due resends every lingerMs / 2: a shorter linger for a quick retry.
        try (Producer p = new Producer(cfg(true).setMaxInFlight(8).setLingerMs(200))) {
            for (String[] r : new String[][] {{"a0", "A"}, {"a1", "A"}, {"b0", "B"}, {"n0", null}, {"c0", "C"}}) {
                fs.add(send(p, r[0], r[1]));
            }
            p.flush();
            for (var f : fs) {
                Result r = f.get(10, TimeUnit.SECONDS);
                assertTrue(r.isSuccessful(), r.toString());
            }
        }
        List<String> seen = new ArrayList<>();
        synchronized (peer.frames) {
            for (Frame f : peer.frames) {
                for (String v : f.values) {
                    seen.add(f.requestId + ":" + v);
                }
                assertTrue(f.values.stream().allMatch(v -> v.charAt(0) == (f.requestId == null ? 'n' : Character.toLowerCase(f.requestId.charAt(0)))),
                        "a frame mixes ids: " + f);
            }
        }
        assertEquals(List.of("A:a0", "A:a1", "B:b0", "null:n0", "C:c0"), seen, "answered frames: " + describe(peer.frames));
        for (var f : fs) {
            assertEquals(2, f.get().getAttempts().size(), "sent twice: " + f.get());
        }
    }
}
