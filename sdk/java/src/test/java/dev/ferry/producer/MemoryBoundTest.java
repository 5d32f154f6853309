package dev.ferry.producer;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import java.lang.reflect.Field;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;

import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

/**
 * totalSizeInBytes bounds the memory the producer holds, not only its
 * records' bytes. The soak found a program giving every record its own
 * request id (so every record its own frame) against an agent answering
 * slower than frames were made run a 256 MiB JVM out of memory: each frame
 * allocated batchSizeInBytes + 64 KiB up front, uncounted. Here the agent is
 * a protocol peer that reads every frame and never answers, and the
 * producer's frames and records are measured by walking its own structures.
 */
class MemoryBoundTest {
    RequestIdTest.Peer peer;

    @AfterEach
    void tearDown() throws Exception {
        if (peer != null) {
            peer.close();
        }
    }

    static final long TOTAL = 2 << 20;

    @ParameterizedTest
    @ValueSource(strings = {"none", "lz4", "zstd"})
    void aRequestIdPerRecordStaysWithinTotalSize(String compression) throws Exception {
        peer = new RequestIdTest.Peer(Integer.MAX_VALUE, Integer.MAX_VALUE); // reads every frame, answers none
        // The defaults but for the total: 512 KiB batches, 8 frames in flight.
        ProducerConfig cfg = new ProducerConfig().setAddresses(List.of(peer.address())).setRequestIds(true)
                .setCompression(compression).setTotalSizeInBytes(TOTAL).setMaxBlockMs(200);
        byte[] value = "v".repeat(1000).getBytes(StandardCharsets.UTF_8);
        List<CompletableFuture<Result>> sent = new ArrayList<>();
        Producer p = new Producer(cfg);
        long maxWalked = 0, blockedMs = -1;
        try {
            for (int i = 0; i < 20_000; i++) {
                long t0 = System.nanoTime();
                try {
                    sent.add(p.send("t", null, value, null, "req-" + i, null));
                } catch (BufferFullException e) {
                    blockedMs = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - t0);
                    break;
                }
                if (i % 100 == 0) {
                    maxWalked = Math.max(maxWalked, walk(p));
                }
            }
            long walked = walk(p);
            maxWalked = Math.max(maxWalked, walked);
            // Held: the frames' buffers and the records' bytes, a part of what the producer holds (no JVM objects,
            // no connection buffers): already that must fit in the total.
            assertTrue(maxWalked <= TOTAL, "the producer held " + maxWalked + " bytes of frame buffers and records after "
                    + sent.size() + " sends, over totalSizeInBytes " + TOTAL);
            assertTrue(blockedMs >= 150, "send waited maxBlockMs (200 ms) for room before BufferFullException, not " + blockedMs);
            long held = p.heldBytes();
            assertTrue(walked <= held && held <= TOTAL, "the producer's count " + held + " covers what it holds (" + walked + ") within " + TOTAL);
            // Not refused early: a record and its own frame cost about 3 KiB here, so the total holds hundreds.
            assertTrue(sent.size() >= TOTAL / (4 << 10), sent.size() + " records accepted");
            for (CompletableFuture<Result> f : sent) {
                assertFalse(f.isDone(), "the peer answers nothing");
            }
        } finally {
            p.close(Duration.ofMillis(100));
        }
        for (CompletableFuture<Result> f : sent) {
            Result r = f.get(10, TimeUnit.SECONDS);
            assertFalse(r.isSuccessful());
            assertEquals("closed", r.getErrorCode(), r.toString());
        }
        waitHeld(p, 0, "everything freed after close");
    }

    /** Every charge is given back: once all is answered only the connection's buffers are counted, at close none. */
    @Test
    void theCountReturnsWhenRecordsComplete() throws Exception {
        peer = new RequestIdTest.Peer(0, 0); // answers every frame ok
        ProducerConfig cfg = new ProducerConfig().setAddresses(List.of(peer.address())).setRequestIds(true)
                .setCompression("lz4").setBatchSizeInBytes(64 << 10).setLingerMs(5);
        Producer p = new Producer(cfg);
        List<CompletableFuture<Result>> sent = new ArrayList<>();
        try {
            byte[] small = "s".repeat(100).getBytes(StandardCharsets.UTF_8), big = new byte[300 << 10];
            for (int i = 0; i < 3000; i++) {
                // Runs of one id filling frames, single records with their own, and records larger than a batch.
                String id = i < 1000 ? "run-" + i / 250 : i < 2000 ? "one-" + i : null;
                sent.add(p.send("t", null, i % 500 == 7 ? big : small, null, id, null));
            }
            p.flush();
            for (CompletableFuture<Result> f : sent) {
                assertTrue(f.get(10, TimeUnit.SECONDS).isSuccessful());
            }
            long held = p.heldBytes(), walked = walk(p);
            assertEquals(0, walked, "no frame or record is held once all are answered");
            // What is left is the connection's: its stream buffers and the compression output it keeps.
            assertTrue(held >= Producer.SESSION_STREAMS && held <= Producer.SESSION_STREAMS + (2 << 20), "held " + held);
        } finally {
            p.close(Duration.ofSeconds(5));
        }
        waitHeld(p, 0, "everything freed after close");
    }

    static void waitHeld(Producer p, long want, String what) throws InterruptedException {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (p.heldBytes() != want && System.nanoTime() < deadline) {
            Thread.sleep(10);
        }
        assertEquals(want, p.heldBytes(), what);
    }

    /**
     * The producer's frames, read from its own structures under its lock: for every frame being filled, waiting or
     * in flight, its buffer's capacity and its records' bytes (Pending.size).
     */
    static long walk(Producer p) throws Exception {
        synchronized (get(p, "lock")) {
            long n = frame(get(p, "cur"));
            for (Object s : (Collection<?>) get(p, "ready")) {
                n += frame(s);
            }
            for (Object sender : (List<?>) get(p, "senders")) {
                Object session = get(sender, "session");
                if (session != null) {
                    for (Object s : ((Map<?, ?>) get(session, "inflight")).values()) {
                        n += frame(s);
                    }
                }
            }
            return n;
        }
    }

    private static long frame(Object f) throws Exception {
        if (f == null) {
            return 0;
        }
        Object body = get(f, "body");
        long n = body == null ? 0 : ((byte[]) get(body, "b")).length;
        for (Object rec : (List<?>) get(f, "recs")) {
            n += (Integer) get(rec, "size");
        }
        return n;
    }

    private static Object get(Object o, String name) throws Exception {
        for (Class<?> c = o.getClass(); c != null; c = c.getSuperclass()) {
            try {
                Field f = c.getDeclaredField(name);
                f.setAccessible(true);
                return f.get(o);
            } catch (NoSuchFieldException e) {
                // the superclass's
            }
        }
        fail("no field " + name + " in " + o.getClass());
        return null;
    }
}
