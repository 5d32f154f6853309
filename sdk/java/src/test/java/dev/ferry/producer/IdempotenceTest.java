package dev.ferry.producer;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
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
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.TimeUnit;

import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * What the producer puts on the wire for protocol version 3 (producer id,
 * sequences), read by a peer that speaks the protocol with the SDK's own
 * decoder and answers as it is told frame by frame: a resend of the same
 * records keeps its sequence, any other set of records takes a new one; an
 * agent that refuses version 3 is asked again with version 1 or 2, and not
 * asked for 3 again. AgentTest proves the effect against the real agent
 * (spool mode: a frame whose answer was lost stored once in Kafka).
 */
class IdempotenceTest {
    /** A produce frame as the peer read it. */
    static final class Frame {
        final int conn, flags;
        final long seq; // 0: flag 16 not set
        final List<String> values = new ArrayList<>();

        Frame(int conn, int flags, long seq) {
            this.conn = conn;
            this.flags = flags;
            this.seq = seq;
        }

        @Override
        public String toString() {
            return "c" + conn + ":" + seq + "=" + values;
        }
    }

    /** What the peer does with a frame. */
    enum Act { OK, SILENT, DROP, IN_FLIGHT, HALF_RETRYABLE, REUSED }

    /** A hello as the peer read it. */
    static final class Hello {
        final int preamble;
        final Protocol.Hello h;

        Hello(int preamble, Protocol.Hello h) {
            this.preamble = preamble;
            this.h = h;
        }
    }

    /** A protocol peer on 127.0.0.1: it grants idempotence to a version 3 hello that asks, unless grant is off. */
    static final class Peer implements AutoCloseable {
        final ServerSocket ss = new ServerSocket(0, 50, InetAddress.getLoopbackAddress());
        final List<Frame> frames = Collections.synchronizedList(new ArrayList<>());
        final List<Hello> hellos = Collections.synchronizedList(new ArrayList<>());
        /** Acts on the next frames, in order; OK when empty. */
        final ConcurrentLinkedQueue<Act> acts = new ConcurrentLinkedQueue<>();
        volatile boolean old; // answer version 3 as an agent older than it: unsupported_version, close
        volatile boolean grant = true;
        volatile long maxFrame = 8 << 20;
        final Thread t;

        Peer() throws IOException {
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
                    Protocol.Buf b = new Protocol.Buf(64);
                    if (pre[3] == Protocol.VERSION3 && old) {
                        hellos.add(new Hello(pre[3], null));
                        // As an agent of versions 1 and 2 answers the preamble (docs/protocol.md, Versioning).
                        int at = Protocol.beginFrame(b, Protocol.ERROR, 0, 0);
                        b.string("unsupported_version").string("protocol version 3 is not supported; this agent speaks versions 1 and 2");
                        Protocol.endFrame(b, at);
                        out.write(b.b, 0, b.len);
                        out.flush();
                        continue;
                    }
                    Protocol.Hello hello = Protocol.decodeHello(RequestIdTest.Peer.frame(in, null));
                    hellos.add(new Hello(pre[3], hello));
                    long feats = hello.features & (Protocol.FEATURE_LZ4 | Protocol.FEATURE_ZSTD);
                    boolean idem = grant && hello.version >= Protocol.VERSION3 && hello.producerId.length == Protocol.PRODUCER_ID_BYTES
                            && (hello.features & Protocol.FEATURE_IDEMPOTENCE) != 0;
                    if (idem) {
                        feats |= Protocol.FEATURE_IDEMPOTENCE;
                    }
                    int at = Protocol.beginFrame(b, Protocol.HELLO_OK, 0, 0);
                    b.u16(hello.version).uvarint(feats).u32(maxFrame).u32(100_000).u32(64 << 20).string("peer");
                    Protocol.endFrame(b, at);
                    out.write(b.b, 0, b.len);
                    out.flush();
                    while (true) {
                        Protocol.Header h = new Protocol.Header();
                        byte[] body = RequestIdTest.Peer.frame(in, h);
                        byte[] plain = Protocol.decompress(body, h.flags & 3, 8 << 20);
                        Protocol.Reader r = new Protocol.Reader(plain);
                        if ((h.flags & Protocol.FLAG_REQUEST_ID) != 0) {
                            Protocol.requestId(r);
                        }
                        assertTrue(idem || (h.flags & Protocol.FLAG_SEQUENCE) == 0, "a sequence on a connection not granted idempotence");
                        Frame f = new Frame(conn, h.flags & ~3, (h.flags & Protocol.FLAG_SEQUENCE) != 0 ? Protocol.sequence(r) : 0);
                        for (Protocol.Rec rec : Protocol.decodeRecords(plain, r.off, Protocol.Limits.DEFAULT)) {
                            f.values.add(new String(rec.value, StandardCharsets.UTF_8));
                        }
                        frames.add(f);
                        Act act = acts.poll();
                        if (act == Act.DROP) {
                            break; // read, never answered: the producer does not know its fate
                        }
                        if (act == Act.SILENT) {
                            continue; // read, not answered (yet: the connection will break)
                        }
                        b.reset();
                        at = Protocol.beginFrame(b, Protocol.RESULT, 0, h.requestId);
                        switch (act == null ? Act.OK : act) {
                            case IN_FLIGHT:
                                b.uvarint(1).uvarint(0).u8(Protocol.STATUS_RETRYABLE).string("in_flight").uvarint(20).string("still being stored");
                                break;
                            case REUSED:
                                b.uvarint(1).uvarint(0).u8(Protocol.STATUS_PERMANENT).string("sequence_reused").uvarint(0).string("different records");
                                break;
                            case HALF_RETRYABLE: {
                                int ok = f.values.size() / 2;
                                b.uvarint(2).uvarint(ok).u8(Protocol.STATUS_OK).string("").uvarint(0).string("");
                                b.uvarint(f.values.size() - ok).u8(Protocol.STATUS_RETRYABLE).string("queue_full").uvarint(10).string("full");
                                break;
                            }
                            default:
                                b.uvarint(1).uvarint(0).u8(Protocol.STATUS_OK).string("").uvarint(0).string("");
                        }
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

        List<Integer> preambles() {
            synchronized (hellos) {
                List<Integer> out = new ArrayList<>();
                for (Hello h : hellos) {
                    out.add(h.preamble);
                }
                return out;
            }
        }

        List<Frame> frames() {
            synchronized (frames) {
                return new ArrayList<>(frames);
            }
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

    ProducerConfig cfg() {
        return new ProducerConfig().setAddresses(List.of(peer.address())).setLingerMs(20).setBaseRetryBackoffMs(10).setMaxRetryBackoffMs(50)
                .setCompression("lz4");
    }

    static List<CompletableFuture<Result>> sendAll(Producer p, String... values) {
        List<CompletableFuture<Result>> fs = new ArrayList<>();
        for (String v : values) {
            fs.add(p.send("t", null, v.getBytes(StandardCharsets.UTF_8), null, null));
        }
        return fs;
    }

    static List<Result> results(List<CompletableFuture<Result>> fs) throws Exception {
        List<Result> out = new ArrayList<>();
        for (var f : fs) {
            out.add(f.get(10, TimeUnit.SECONDS));
        }
        return out;
    }

    /** Sends values as one frame (flush ends it) and waits for their results. */
    static List<Result> frame(Producer p, String... values) throws Exception {
        List<CompletableFuture<Result>> fs = sendAll(p, values);
        p.flush();
        return results(fs);
    }

    @Test
    void aFrameResentKeepsItsSequenceAndOtherRecordsTakeNewOnes() throws Exception {
        peer = new Peer();
        // Frame 1: read, the connection breaks, sent again on the next connection. Frame 2: in_flight, then OK.
        // Frame 3: half answered retryable: its other half goes again as a new frame. Frame 4: sequence_reused.
        peer.acts.addAll(List.of(Act.DROP, Act.OK, Act.IN_FLIGHT, Act.OK, Act.HALF_RETRYABLE, Act.OK, Act.REUSED));
        byte[] pid;
        try (Producer p = new Producer(cfg())) {
            for (Result r : frame(p, "a0", "a1", "a2")) {
                assertTrue(r.isSuccessful(), r.toString());
                assertEquals(List.of("connection_lost", ""), codes(r));
            }
            for (Result r : frame(p, "b0", "b1")) {
                assertTrue(r.isSuccessful(), r.toString());
                assertEquals(List.of("in_flight", ""), codes(r));
            }
            List<Result> c = frame(p, "c0", "c1", "c2", "c3");
            for (int i = 0; i < 4; i++) {
                assertTrue(c.get(i).isSuccessful(), c.get(i).toString());
                assertEquals(i < 2 ? 1 : 2, c.get(i).getAttempts().size(), c.get(i).toString());
            }
            for (Result r : frame(p, "d0")) {
                assertFalse(r.isSuccessful(), r.toString());
                assertEquals("sequence_reused", r.getErrorCode(), "a permanent refusal, not retried: " + r);
                assertEquals(1, r.getAttempts().size(), r.toString());
            }
        }
        List<Frame> fs = peer.frames();
        assertEquals("[c0:1=[a0, a1, a2], c1:1=[a0, a1, a2], c1:2=[b0, b1], c1:2=[b0, b1], c1:3=[c0, c1, c2, c3], c1:4=[c2, c3], c1:5=[d0]]",
                fs.toString());
        for (Frame f : fs) {
            assertEquals(Protocol.FLAG_SEQUENCE, f.flags, f.toString());
        }
        assertEquals(List.of(3, 3), peer.preambles());
        pid = peer.hellos.get(0).h.producerId;
        assertEquals(Protocol.PRODUCER_ID_BYTES, pid.length);
        assertArrayEquals(pid, peer.hellos.get(1).h.producerId, "the same producer id on every connection");
        assertEquals(Protocol.FEATURE_LZ4 | Protocol.FEATURE_IDEMPOTENCE, peer.hellos.get(0).h.features);
        // Another producer: another id.
        try (Producer p = new Producer(cfg())) {
            frame(p, "e0");
        }
        assertEquals(3, peer.hellos.size());
        assertFalse(java.util.Arrays.equals(pid, peer.hellos.get(2).h.producerId), "two producers share an id");
        assertEquals("c2:1=[e0]", peer.frames().get(7).toString(), "each producer numbers from 1");
    }

    @Test
    void framesLostTogetherGoAgainEachWithItsOwnSequence() throws Exception {
        peer = new Peer();
        // Three frames in flight on the first connection, read and unanswered; it breaks after the third. They go
        // again in order, each as it was, with its own sequence; the second connection answers them.
        peer.acts.addAll(List.of(Act.SILENT, Act.SILENT, Act.DROP));
        try (Producer p = new Producer(cfg().setMaxInFlight(8).setBatchCountThreshold(2))) {
            for (Result r : frame(p, "a0", "a1", "b0", "b1", "c0")) {
                assertTrue(r.isSuccessful(), r.toString());
                assertEquals(List.of("connection_lost", ""), codes(r));
            }
        }
        assertEquals("[c0:1=[a0, a1], c0:2=[b0, b1], c0:3=[c0], c1:1=[a0, a1], c1:2=[b0, b1], c1:3=[c0]]", peer.frames().toString());
    }

    @Test
    void aFrameTooLargeForTheAgentIsSplitIntoNewSequences() throws Exception {
        peer = new Peer();
        peer.maxFrame = 200;
        String v = "x".repeat(40);
        try (Producer p = new Producer(cfg().setCompression("none"))) {
            for (Result r : frame(p, v + 0, v + 1, v + 2, v + 3, v + 4, v + 5, v + 6, v + 7)) {
                assertTrue(r.isSuccessful(), r.toString());
            }
        }
        List<Frame> fs = peer.frames();
        List<Long> seqs = new ArrayList<>();
        int n = 0;
        for (Frame f : fs) {
            assertTrue(f.seq > 0, f.toString());
            assertFalse(seqs.contains(f.seq), "a sequence used twice: " + fs);
            seqs.add(f.seq);
            n += f.values.size();
        }
        assertEquals(8, n, "every record sent once: " + fs);
        assertTrue(fs.size() >= 2, "not split: " + fs);
    }

    @Test
    void anAgentThatGrantsNoIdempotenceGetsNoSequences() throws Exception {
        peer = new Peer();
        peer.grant = false;
        peer.acts.add(Act.DROP);
        try (Producer p = new Producer(cfg().setReceipts(true))) {
            for (Result r : frame(p, "a0", "a1")) {
                assertTrue(r.isSuccessful(), r.toString());
            }
        }
        assertEquals("[c0:0=[a0, a1], c1:0=[a0, a1]]", peer.frames().toString());
        assertEquals(Protocol.FLAG_RECEIPT, peer.frames().get(0).flags);
        assertEquals(List.of(3, 3), peer.preambles(), "a version 3 agent is asked for version 3 again");
    }

    @Test
    void anAgentOlderThanVersion3IsAskedAgainWithTheVersionNeeded() throws Exception {
        for (boolean ids : new boolean[] {false, true}) {
            peer = new Peer();
            peer.old = true;
            peer.acts.add(Act.DROP); // a second connection: it must not ask for version 3 again
            try (Producer p = new Producer(cfg().setRequestIds(ids))) {
                for (Result r : frame(p, "a0", "a1")) {
                    assertTrue(r.isSuccessful(), r.toString());
                }
                for (Result r : frame(p, "b0")) {
                    assertTrue(r.isSuccessful(), r.toString());
                }
            }
            int v = ids ? 2 : 1;
            assertEquals(List.of(3, v, v), peer.preambles(), "request ids " + ids);
            assertEquals(v, peer.hellos.get(1).h.version);
            assertEquals(0, peer.hellos.get(1).h.producerId.length);
            assertEquals(Protocol.FEATURE_LZ4, peer.hellos.get(1).h.features, "idempotence asked of an agent without it");
            assertEquals("[c1:0=[a0, a1], c2:0=[a0, a1], c2:0=[b0]]", peer.frames().toString());
            peer.close();
        }
    }

    @Test
    void idempotenceOffSpeaksAsBefore() throws Exception {
        peer = new Peer();
        try (Producer p = new Producer(cfg().setIdempotence(false))) {
            frame(p, "a0");
        }
        assertEquals(List.of(1), peer.preambles());
        assertEquals("[c0:0=[a0]]", peer.frames().toString());
        assertNotEquals(Protocol.VERSION3, peer.hellos.get(0).h.version);
    }

    static List<String> codes(Result r) {
        List<String> out = new ArrayList<>();
        for (Attempt a : r.getAttempts()) {
            out.add(a.getErrorCode());
        }
        return out;
    }
}
