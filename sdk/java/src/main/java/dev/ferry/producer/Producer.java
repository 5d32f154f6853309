package dev.ferry.producer;

import java.io.BufferedInputStream;
import java.io.BufferedOutputStream;
import java.io.Closeable;
import java.io.DataInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.net.StandardProtocolFamily;
import java.net.StandardSocketOptions;
import java.net.UnixDomainSocketAddress;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;

/**
 * Sends records to the local ferry agent over its local record protocol
 * (docs/protocol.md). Thread-safe.
 *
 * <p>{@code send} queues the record into the batch being filled and returns
 * at once (it waits only while {@code totalSizeInBytes} is full, up to
 * {@code maxBlockMs}, then throws {@link BufferFullException}). Batches go
 * out on {@code sendThreads} connections, pipelined; the agent answers each
 * when its records are durable. A record refused for a passing reason, or
 * unanswered when a connection breaks, is sent again after a backoff, up to
 * {@code retries} times. Every record's callback runs, and its future
 * completes, exactly once, on one callback thread; {@code close} completes
 * what it could not deliver with error code {@code closed}.
 *
 * <p>Idempotence ({@link ProducerConfig#setIdempotence}, on by default):
 * a Producer makes a random 16-byte producer id and speaks protocol version
 * 3, asking the agent to recognise its resends. When the agent grants it
 * (delivery mode spool), every frame carries a sequence number, given once
 * per exact set of records: a frame sent again because its fate is unknown
 * (its connection broke before the answer, {@code ack_timeout}, or the
 * whole frame answered retryable, {@code in_flight} included) goes again
 * with the same records and the same number, on whatever connection, and
 * the agent stores it once, answering the resend as it answered the first;
 * other sets of records (half of a frame too large for the agent, the part
 * of a frame answered retryable when the rest was not) take new numbers.
 * An agent that does not grant it gets no numbers (resends are at least
 * once); one that does not speak version 3 answers
 * {@code unsupported_version}, and the producer connects again, and from
 * then on, with the version it needs without idempotence (2 for receipts or
 * request ids, else 1). A record whose resend the agent recognised has no
 * receipt (the first answer's placements are not kept). The sequence is a
 * frame's, not a record's: nothing more is held or allocated per record.
 *
 * <p>Request ids ({@link ProducerConfig#setRequestIds}): a record sent with a
 * request id carries it to Kafka as the header {@code ferry.request_id}. A
 * frame carries one id for all its records, so the batch being filled is
 * sent when a record with another id (or none) comes: records keep their
 * order, and a program that sends a request's records together fills frames
 * as before, while one that alternates ids record by record sends a frame
 * per record.
 *
 * <p>Memory ({@link ProducerConfig#setTotalSizeInBytes totalSizeInBytes}):
 * what send waits for room in is every byte the producer holds for records
 * not yet completed, not only their own bytes: each record's bytes plus an
 * estimate of its JVM objects, the capacity of every frame buffer not yet
 * written, a frame's fixed objects, and each connection's own buffers
 * (stream buffers, the compression output, the buffer that re-encodes a
 * resend). A frame buffer starts at the size the previous frame needed and
 * grows by doubling up to batchSizeInBytes + 64 KiB, so a program that
 * changes request id every record holds a small buffer per frame, charged
 * as it grows, and send blocks, then throws BufferFullException, once they
 * fill totalSizeInBytes, instead of running the JVM out of memory. A
 * frame's buffer is freed as soon as the frame is written; its records stay
 * charged until they complete. What can pass the bound, none of it by more
 * than a frame: a connection's buffers growing for a frame it must send and
 * the objects of a frame sent again (neither can wait for room their own
 * records hold), and one record larger than totalSizeInBytes, accepted when
 * nothing else is held.
 */
public final class Producer implements Closeable {
    private final ProducerConfig cfg;
    private final byte codec;
    private final Object lock = new Object();

    // Guarded by lock.
    private Batch cur;
    private final ArrayDeque<Send> ready = new ArrayDeque<>();
    private long buffered; // bytes held (see the class doc): records, unwritten frames, connections' buffers
    private long working; // the connections' buffers, part of buffered
    private int lastFrameBytes, lastFrameRecords; // the last sealed frame's size: where the next one's buffer starts
    private long pending; // sent and not yet completed: the callback has not yet returned
    private boolean closed;
    private boolean stopped;

    private final List<Sender> senders = new ArrayList<>();
    private final ExecutorService callbacks;
    private volatile Thread callbackThread;
    private final java.util.concurrent.atomic.LongAdder sentFrames = new java.util.concurrent.atomic.LongAdder();
    private final java.util.concurrent.atomic.LongAdder sentBytes = new java.util.concurrent.atomic.LongAdder();
    private final java.util.concurrent.atomic.LongAdder sentRecordBytes = new java.util.concurrent.atomic.LongAdder();

    /**
     * What a record holds beyond its bytes (size): its Pending, future, attempt list and the byte arrays' headers,
     * about 180 bytes on a 64-bit JVM with compressed references. Charged so that small records cannot hold many
     * times totalSizeInBytes.
     */
    static final int RECORD_OVERHEAD = 176;
    /** A frame's fixed objects (Batch, Send, their lists and Buf), charged with its buffer. */
    static final int FRAME_OVERHEAD = 256;
    /** A frame buffer's first capacity when nothing says more: the records of a small frame and its prefix room. */
    static final int MIN_FRAME_CAP = Protocol.PRODUCE_PREFIX_MAX + 512;
    /** A connection's stream buffers: 64 KiB in, 256 KiB out. */
    static final int SESSION_STREAMS = (64 << 10) + (256 << 10);
    /** A connection's scratch and compression buffers start at this and grow with its frames. */
    static final int SESSION_BUF = 4096;
    /**
     * What each connection holds at least, charged from the start (sendThreads times), not when it connects:
     * a connection made while records fill the total must not push the count past it.
     */
    static final int SESSION_BASE = SESSION_STREAMS + 2 * SESSION_BUF;

    /** Where a frame buffer stops doubling: a batch's size plus room for the record that crosses it. */
    private final int frameCap;
    /** Where a connection's compression output stops doubling: a full frame compressed, at the codecs' worst. */
    private final int zoutCap;
    private boolean sessionsReleased; // close gave back the connections' SESSION_BASE

    /** This producer's id (protocol version 3), random, made once: null with idempotence off. */
    private final byte[] producerId;
    /** The last sequence number given to a frame; the first is 1. */
    private final java.util.concurrent.atomic.AtomicLong lastSeq = new java.util.concurrent.atomic.AtomicLong();
    /** An agent answered version 3 with unsupported_version: later connections ask for the version the config needs. */
    private volatile boolean noV3;

    public Producer(ProducerConfig cfg) {
        this.cfg = cfg;
        this.frameCap = (int) Math.min((long) cfg.getBatchSizeInBytes() + (64 << 10) + Protocol.PRODUCE_PREFIX_MAX, Integer.MAX_VALUE - 8);
        // LZ4's bound is n + n/255 + 16 a block, zstd's under n + n/256 + 64: n/128 + 4 KiB covers both and the framing.
        this.zoutCap = (int) Math.min((long) frameCap + (frameCap >> 7) + 4096, Integer.MAX_VALUE - 8);
        switch (cfg.getCompression()) {
            case "lz4": codec = Protocol.COMPRESS_LZ4; break;
            case "zstd": codec = Protocol.COMPRESS_ZSTD; break;
            default: codec = Protocol.COMPRESS_NONE;
        }
        if (cfg.isIdempotence()) {
            producerId = new byte[Protocol.PRODUCER_ID_BYTES];
            new java.security.SecureRandom().nextBytes(producerId);
        } else {
            producerId = null;
        }
        callbacks = Executors.newSingleThreadExecutor(r -> {
            Thread t = new Thread(r, "ferry-producer-callbacks");
            t.setDaemon(true);
            callbackThread = t;
            return t;
        });
        working = buffered = (long) SESSION_BASE * cfg.getSendThreads();
        for (int i = 0; i < cfg.getSendThreads(); i++) {
            Sender s = new Sender(i);
            senders.add(s);
            s.thread.start();
        }
    }

    // ---- sending ----

    public CompletableFuture<Result> send(String topic, String value) {
        return send(topic, null, value.getBytes(StandardCharsets.UTF_8), null, null);
    }

    public CompletableFuture<Result> send(String topic, String key, String value, Callback callback) {
        return send(topic, key == null ? null : key.getBytes(StandardCharsets.UTF_8), value.getBytes(StandardCharsets.UTF_8), null, callback);
    }

    /** A LogItem, as one JSON object. */
    public CompletableFuture<Result> send(String topic, String key, LogItem item, Callback callback) {
        return send(topic, key == null ? null : key.getBytes(StandardCharsets.UTF_8), item.toJson(), null, callback);
    }

    public CompletableFuture<Result> send(String topic, byte[] key, byte[] value, Callback callback) {
        return send(topic, key, value, null, callback);
    }

    /**
     * Queues a record. key may be null (no key); headers (may be null) keep
     * their iteration order. The returned future and the callback (may be
     * null) complete once, with the record's fate.
     *
     * @throws BufferFullException totalSizeInBytes stayed full for maxBlockMs
     * @throws ProducerClosedException after close
     */
    public CompletableFuture<Result> send(String topic, byte[] key, byte[] value, Map<String, byte[]> headers, Callback callback) {
        return send(topic, key, value, headers, null, callback);
    }

    /**
     * Queues a record named by the request that sends it: with
     * {@link ProducerConfig#setRequestIds requestIds} on, the agent writes
     * requestId on the record in Kafka as the header {@code ferry.request_id}
     * (off: requestId is ignored). null or "" is no id. An id the agent
     * would refuse (it must be 1 to 128 of {@code A-Z a-z 0-9 . _ : -}) is
     * never sent: the record's future and callback complete at once, failed
     * with error code {@code invalid_request_id}, which no retry can fix.
     * Otherwise as {@link #send(String, byte[], byte[], Map, Callback)}.
     *
     * @throws BufferFullException totalSizeInBytes stayed full for maxBlockMs
     * @throws ProducerClosedException after close
     */
    public CompletableFuture<Result> send(String topic, byte[] key, byte[] value, Map<String, byte[]> headers, String requestId, Callback callback) {
        if (!cfg.isRequestIds() || requestId != null && requestId.isEmpty()) {
            requestId = null;
        }
        byte[] t = topic.getBytes(StandardCharsets.UTF_8);
        List<byte[][]> hs = null;
        int size = t.length + (key == null ? 0 : key.length) + value.length + 16;
        if (headers != null && !headers.isEmpty()) {
            hs = new ArrayList<>(headers.size());
            for (Map.Entry<String, byte[]> e : headers.entrySet()) {
                byte[] k = e.getKey().getBytes(StandardCharsets.UTF_8);
                hs.add(new byte[][] {k, e.getValue()});
                size += k.length + e.getValue().length + 4;
            }
        }
        Pending p = new Pending(t, key, value, System.currentTimeMillis(), hs, size, callback, requestId);
        if (requestId != null && !Protocol.validRequestId(requestId)) {
            synchronized (lock) {
                if (closed) {
                    throw new ProducerClosedException();
                }
                // Counted as if queued, so that its completion, like any, frees it and flush sees it done.
                buffered += size + RECORD_OVERHEAD;
                pending++;
            }
            // The agent would refuse the frame for good: fail the record here, at once, rather than send it.
            complete(p, false, "invalid_request_id", "the request id must be 1 to " + Protocol.MAX_REQUEST_ID_BYTES
                    + " of A-Z a-z 0-9 . _ : -");
            return p.future;
        }
        synchronized (lock) {
            if (closed) {
                throw new ProducerClosedException();
            }
            int bound = Batch.bound(p);
            long total = cfg.getTotalSizeInBytes();
            // buffered > working: records are held, whose completion frees room. With none, a record goes even if
            // it alone (with the connections' buffers) is over the total, or it could never go.
            if (buffered + need(p, bound) > total && buffered > working) {
                long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(cfg.getMaxBlockMs());
                seal(); // what is being filled may go and free room
                while (buffered + need(p, bound) > total && buffered > working) {
                    long left = deadline - System.nanoTime();
                    if (left <= 0 || closed) {
                        throw closed ? new ProducerClosedException()
                                : new BufferFullException("totalSizeInBytes (" + cfg.getTotalSizeInBytes() + ") full for maxBlockMs (" + cfg.getMaxBlockMs() + " ms)");
                    }
                    try {
                        lock.wait(Math.max(1, TimeUnit.NANOSECONDS.toMillis(left)));
                    } catch (InterruptedException e) {
                        Thread.currentThread().interrupt();
                        throw new ProducerException("interrupted while waiting for room");
                    }
                }
            }
            if (cur != null && !java.util.Objects.equals(cur.requestId, requestId)) {
                seal(); // a frame carries one request id: another one starts a frame
            }
            if (cur == null) {
                // Sized as the last frame was: full batches start full size, one record a frame starts small.
                int cap = Math.min(Math.max(MIN_FRAME_CAP, lastFrameBytes + lastFrameBytes / 8), frameCap);
                cur = new Batch(cap, frameCap, Math.min(Math.max(lastFrameRecords, 10), Math.min(cfg.getBatchCountThreshold(), 8192)));
                cur.charge = FRAME_OVERHEAD + cur.body.b.length;
                buffered += cur.charge;
            }
            int cap0 = cur.body.b.length;
            cur.add(p, bound);
            int grew = cur.body.b.length - cap0;
            cur.charge += grew;
            buffered += grew + size + RECORD_OVERHEAD;
            pending++;
            if (cur.body.len >= cfg.getBatchSizeInBytes() || cur.recs.size() >= cfg.getBatchCountThreshold()) {
                seal();
            }
        }
        return p.future;
    }

    /**
     * Sends what is buffered and waits until every record sent before has
     * completed: its callback has returned and its future is done. Calling
     * it from a callback would wait for itself, so that throws
     * IllegalStateException.
     */
    public void flush() throws InterruptedException {
        flush(Long.MAX_VALUE);
    }

    private boolean flush(long timeoutMs) throws InterruptedException {
        if (Thread.currentThread() == callbackThread) {
            throw new IllegalStateException("flush or close from a callback would wait for that callback to return");
        }
        long deadline = timeoutMs == Long.MAX_VALUE ? Long.MAX_VALUE : System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(timeoutMs);
        synchronized (lock) {
            seal();
            while (pending > 0) {
                long left = deadline == Long.MAX_VALUE ? 100 : TimeUnit.NANOSECONDS.toMillis(deadline - System.nanoTime());
                if (left <= 0) {
                    return false;
                }
                lock.wait(Math.min(left, 100));
            }
        }
        return true;
    }

    /** close(Duration.ofSeconds(60)). */
    @Override
    public void close() {
        close(Duration.ofSeconds(60));
    }

    /**
     * Flushes within timeout, then completes every record not yet delivered
     * with error code "closed", and stops. Later sends throw
     * ProducerClosedException.
     */
    public void close(Duration timeout) {
        try {
            flush(timeout.toMillis());
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        List<Pending> left = new ArrayList<>();
        synchronized (lock) {
            closed = true;
            stopped = true;
            seal();
            for (Send s : ready) {
                left.addAll(s.recs);
                release(s);
            }
            ready.clear();
            for (Sender s : senders) {
                for (Send sd : s.abandon()) {
                    left.addAll(sd.recs);
                }
            }
            lock.notifyAll();
        }
        List<Object[]> closing = new ArrayList<>(left.size());
        for (Pending p : left) {
            closing.add(new Object[] {p, false, "closed", "the producer closed before the record was delivered"});
        }
        completeAll(closing);
        for (Sender s : senders) {
            s.stop();
        }
        synchronized (lock) {
            // The connections are gone: their charge too (a sender still in its last session gives back its own part).
            if (!sessionsReleased) {
                sessionsReleased = true;
                buffered -= (long) SESSION_BASE * senders.size();
                working -= (long) SESSION_BASE * senders.size();
            }
        }
        callbacks.shutdown();
        try {
            callbacks.awaitTermination(timeout.toMillis() + 1000, TimeUnit.MILLISECONDS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    /**
     * What send would add to buffered for p: its bytes and objects, and the growth of the frame buffer it goes in
     * (or a new frame's buffer and objects). At least what it adds: the frame buffer grows as Batch.add makes it.
     * Lock held.
     */
    private long need(Pending p, int bound) {
        long n = p.size + RECORD_OVERHEAD;
        if (cur != null && java.util.Objects.equals(cur.requestId, p.requestId)) {
            return n + Protocol.Buf.grown(cur.body.b.length, cur.body.len + bound, frameCap) - cur.body.b.length;
        }
        int cap = Math.min(Math.max(MIN_FRAME_CAP, lastFrameBytes + lastFrameBytes / 8), frameCap);
        return n + FRAME_OVERHEAD + Protocol.Buf.grown(cap, Protocol.PRODUCE_PREFIX_MAX + bound, frameCap);
    }

    /** The bytes the producer holds, as charged against totalSizeInBytes (see the class doc). For tests. */
    long heldBytes() {
        synchronized (lock) {
            return buffered;
        }
    }

    /** Bytes written to the agent: frames as sent (after compression), and the records' own bytes before it. */
    public long getSentBytes() { return sentBytes.sum(); }

    public long getSentRecordBytes() { return sentRecordBytes.sum(); }

    public long getSentFrames() { return sentFrames.sum(); }

    // ---- internals ----

    /** The send buffer asked for on a Unix socket: two frames of the default batchSizeInBytes. */
    static final int UNIX_SEND_BUFFER = 1 << 20;

    /**
     * A Unix socket holds what the sender's buffer allows, 208 KiB by default on Linux: less than one full
     * frame, so the sender stalls mid-frame while the agent, busy with the frame before, does not read (the Go
     * client: 32 B records from one thread, 2.0-2.6M records/s against 2.6-2.9M with 1 MiB; issue 37). The
     * kernel caps the request at net.core.wmem_max (doubled); best effort.
     */
    static void tuneUnix(SocketChannel ch) {
        try {
            ch.setOption(StandardSocketOptions.SO_SNDBUF, UNIX_SEND_BUFFER);
        } catch (IOException | UnsupportedOperationException e) {
            // the platform's default then
        }
    }

    /** One record until its completion. */
    static final class Pending {
        final byte[] topic, key, value;
        final long timestamp;
        final List<byte[][]> headers;
        final int size;
        final Callback callback;
        final String requestId; // null: none; else valid
        final CompletableFuture<Result> future = new CompletableFuture<>();
        final List<Attempt> attempts = new ArrayList<>(1);
        int tries;
        boolean done;

        Pending(byte[] topic, byte[] key, byte[] value, long timestamp, List<byte[][]> headers, int size, Callback callback, String requestId) {
            this.topic = topic;
            this.key = key;
            this.value = value;
            this.timestamp = timestamp;
            this.headers = headers;
            this.size = size;
            this.callback = callback;
            this.requestId = requestId;
        }
    }

    /**
     * The batch being filled: its records, already encoded, all with the same request id. The encoding starts
     * after Protocol.PRODUCE_PREFIX_MAX bytes of room, where the sender writes the frame's header, request id and
     * count, so that the frame goes out from this buffer as it is.
     */
    static final class Batch {
        final List<Pending> recs;
        final Protocol.Buf body;
        byte[] prevTopic;
        String requestId;
        long charge; // bytes charged to buffered for this frame: its objects and its buffer's capacity
        final long firstAt = System.nanoTime();

        Batch(int cap, int soft, int records) {
            body = new Protocol.Buf(Math.max(cap, Protocol.PRODUCE_PREFIX_MAX));
            body.soft = soft;
            body.len = Protocol.PRODUCE_PREFIX_MAX;
            recs = new ArrayList<>(records);
        }

        /** At least the bytes Protocol.record writes for p. */
        static int bound(Pending p) {
            return p.size + 16 + 8 * (p.headers == null ? 0 : p.headers.size());
        }

        /** Encodes p; the buffer grows at most once, to Buf.grown(capacity, len + bound, soft), as need counts. */
        void add(Pending p, int bound) {
            if (recs.isEmpty()) {
                requestId = p.requestId;
            }
            body.ensure(bound);
            Protocol.record(body, prevTopic, p.topic, p.key, p.value, 0, p.headers);
            prevTopic = p.topic;
            recs.add(p);
        }
    }

    /**
     * Records to send in one frame, all with the same request id; body is their encoding after the prefix room
     * (null: encode again).
     */
    static final class Send {
        final List<Pending> recs;
        Protocol.Buf body; // dropped once written
        final long notBefore;
        long charge; // bytes charged to buffered until it is written or dropped
        long sentBytes; // counted in flight on its connection
        /**
         * The frame's sequence number once it went out on a connection granted idempotence (0: not yet). It names
         * these exact records (and their request id): a Send made to send them again keeps it, one of any other
         * set of records starts at 0 and takes a new one.
         */
        long seq;

        Send(List<Pending> recs, Protocol.Buf body, long notBefore, long charge) {
            this.recs = recs;
            this.body = body;
            this.notBefore = notBefore;
            this.charge = charge;
        }
    }

    /** Moves the batch being filled to the send queue; lock held. */
    private void seal() {
        if (cur != null) {
            if (cur.recs.isEmpty()) {
                buffered -= cur.charge;
            } else {
                lastFrameBytes = cur.body.len;
                lastFrameRecords = cur.recs.size();
                ready.addLast(new Send(cur.recs, cur.body, 0, cur.charge));
                lock.notifyAll();
            }
        }
        cur = null;
    }

    /** A frame to send again, or half of one: its objects are charged (it cannot wait: its records are held). Lock held. */
    private Send resend(List<Pending> recs, long notBefore) {
        return resend(recs, notBefore, 0);
    }

    /** resend of a frame's exact records under their sequence seq (0: a new set of records, numbered when sent). */
    private Send resend(List<Pending> recs, long notBefore, long seq) {
        buffered += FRAME_OVERHEAD;
        Send sd = new Send(recs, null, notBefore, FRAME_OVERHEAD);
        sd.seq = seq;
        return sd;
    }

    /** Frees what sd holds beyond its records: written, or dropped with them. Lock held. */
    private void release(Send sd) {
        buffered -= sd.charge;
        sd.charge = 0;
        sd.body = null;
        lock.notifyAll();
    }

    private long backoffMs(int tries) {
        long d = Math.min(cfg.getBaseRetryBackoffMs() << Math.min(tries - 1, 20), cfg.getMaxRetryBackoffMs());
        return d / 2 + ThreadLocalRandom.current().nextLong(d / 2 + 1);
    }

    /** Completes p once; lock must not be held. */
    private void complete(Pending p, boolean ok, String code, String msg) {
        List<Object[]> one = new ArrayList<>(1);
        one.add(new Object[] {p, ok, code, msg});
        completeAll(one);
    }

    /**
     * Completes records (each {Pending, ok, code, message}) once each: one
     * lock hold and one callback task for a whole frame's answer, not one
     * per record. Lock must not be held.
     */
    private void completeAll(List<Object[]> outs) {
        List<Object[]> run = new ArrayList<>(outs.size());
        long now = System.currentTimeMillis();
        synchronized (lock) {
            for (Object[] o : outs) {
                Pending p = (Pending) o[0];
                if (p.done) {
                    continue;
                }
                boolean ok = (Boolean) o[1];
                p.done = true;
                buffered -= p.size + RECORD_OVERHEAD; // the memory is free now; pending drops once the callback returned
                p.attempts.add(new Attempt(ok, ok ? "" : (String) o[2], ok ? "" : (String) o[3], now));
                Result r = o.length > 4
                        ? new Result(ok, p.attempts, (String) o[4], (Integer) o[5], (Long) o[6], (String) o[7])
                        : new Result(ok, p.attempts);
                run.add(new Object[] {p, r});
            }
            lock.notifyAll();
        }
        if (run.isEmpty()) {
            return;
        }
        Runnable task = () -> {
            try {
                runCallbacks(run);
            } finally {
                // Even if a callback threw an Error: flush must not wait forever.
                synchronized (lock) {
                    pending -= run.size();
                    lock.notifyAll();
                }
            }
        };
        try {
            callbacks.execute(task);
        } catch (java.util.concurrent.RejectedExecutionException e) {
            task.run(); // closing: run here, still exactly once
        }
    }

    /** Runs a frame's callbacks and completes their futures, each once. */
    private static void runCallbacks(List<Object[]> run) {
        for (Object[] o : run) {
            Pending p = (Pending) o[0];
            Result r = (Result) o[1];
            try {
                if (p.callback != null) {
                    p.callback.onCompletion(r);
                }
            } catch (RuntimeException e) {
                // A callback's own failure must not cost the others theirs.
            } finally {
                p.future.complete(r);
            }
        }
    }

    /** Outcomes of one frame's records. Retryable ones are sent again. */
    private void apply(Send s, List<Protocol.Range> ranges, Protocol.Receipt rc) {
        List<Pending> again = new ArrayList<>();
        long after = 0;
        int k = 0;
        // The receipt's placements cover the accepted records in record order.
        int pl = 0;
        long used = 0;
        List<Object[]> done = new ArrayList<>();
        for (Protocol.Range g : ranges) {
            long n = g.count == 0 ? s.recs.size() : g.count;
            for (long j = 0; j < n && k < s.recs.size(); j++, k++) {
                Pending p = s.recs.get(k);
                if (g.status == Protocol.STATUS_OK) {
                    if (rc == null) {
                        done.add(new Object[] {p, true, "", ""});
                        continue;
                    }
                    String topic = "";
                    int part = -1;
                    long off = -1;
                    if (pl < rc.placements.size()) {
                        Protocol.Placement pc = rc.placements.get(pl);
                        topic = pc.topic;
                        part = pc.partition;
                        off = pc.offset + used;
                        if (++used >= pc.count) {
                            pl++;
                            used = 0;
                        }
                    }
                    done.add(new Object[] {p, true, "", "", topic, part, off, rc.spoolId});
                } else if (g.status == Protocol.STATUS_PERMANENT) {
                    done.add(new Object[] {p, false, g.reason, g.message});
                } else {
                    synchronized (lock) {
                        p.tries++;
                        if (p.tries > cfg.getRetries() || closed) {
                            done.add(new Object[] {p, false, g.reason, g.message});
                        } else {
                            p.attempts.add(new Attempt(false, g.reason, g.message, System.currentTimeMillis()));
                            again.add(p);
                            after = Math.max(after, g.retryAfterMs);
                        }
                    }
                }
            }
        }
        for (; k < s.recs.size(); k++) {
            done.add(new Object[] {s.recs.get(k), false, "protocol_error", "the agent's answer did not cover this record"});
        }
        completeAll(done);
        if (!again.isEmpty()) {
            // The whole frame again: the same records, so the same sequence (an in_flight or ack_timeout answer: the
            // first copy may be stored, and the agent must know this for its retry). Part of it: a new one.
            retry(again, after, again.size() == s.recs.size() ? s.seq : 0);
        }
    }

    /**
     * Queues records of one frame (so of one request id) to send again as one frame after a backoff (at least half
     * of afterMs). seq not 0: they are the exact records of the frame with that sequence, sent again as it.
     */
    private void retry(List<Pending> recs, long afterMs, long seq) {
        long when = retryAt(maxTries(recs, 0), afterMs);
        synchronized (lock) {
            ready.addLast(resend(recs, when, seq));
            lock.notifyAll();
        }
    }

    private static int maxTries(List<Pending> recs, int tries) {
        for (Pending p : recs) {
            tries = Math.max(tries, p.tries);
        }
        return tries;
    }

    /** When records tried that many times go again: after a backoff with jitter, at least half of afterMs. */
    private long retryAt(int tries, long afterMs) {
        return System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(Math.max(afterMs / 2, backoffMs(Math.max(tries, 1))));
    }

    /** One connection: a sending thread (this) and a reading thread per session. */
    final class Sender implements Runnable {
        final Thread thread;
        // Guarded by lock.
        private Session session;

        Sender(int i) {
            thread = new Thread(this, "ferry-producer-send-" + i);
            thread.setDaemon(true);
        }

        /** The frames in flight on this sender's connection, in the order they were written; lock held. */
        List<Send> abandon() {
            List<Send> out = new ArrayList<>();
            if (session != null) {
                out.addAll(session.inflight.values());
                session.inflight.clear();
            }
            return out;
        }

        void stop() {
            Session s;
            synchronized (lock) {
                s = session;
            }
            if (s != null) {
                s.close();
            }
            thread.interrupt();
            try {
                thread.join(5000);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }

        @Override
        public void run() {
            int attempt = 0;
            while (true) {
                synchronized (lock) {
                    if (stopped) {
                        return;
                    }
                }
                Session s;
                try {
                    s = connect();
                } catch (RefusedException e) {
                    // The agent refused this producer, not the moment: what
                    // waits fails with its reason instead of waiting forever.
                    failWaiting(e.reason, e.getMessage());
                    attempt++;
                    if (!sleep(backoffMs(attempt))) {
                        return;
                    }
                    continue;
                } catch (IOException e) {
                    attempt++;
                    if (!sleep(backoffMs(attempt))) {
                        return;
                    }
                    continue;
                }
                attempt = 0;
                synchronized (lock) {
                    if (stopped) {
                        s.close();
                        return;
                    }
                    session = s;
                    chargeSession(s);
                }
                Thread reader = new Thread(() -> read(s), thread.getName() + "-read");
                reader.setDaemon(true);
                reader.start();
                try {
                    serve(s);
                } catch (IOException | InterruptedException e) {
                    // The connection broke or we stop: below.
                }
                s.close();
                try {
                    reader.join(5000);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
                List<Send> lost;
                synchronized (lock) {
                    lost = abandon();
                    session = null;
                    buffered -= s.charged;
                    working -= s.charged;
                    s.charged = 0;
                    lock.notifyAll();
                }
                requeueLost(lost);
            }
        }

        private boolean sleep(long ms) {
            synchronized (lock) {
                long end = System.currentTimeMillis() + ms;
                while (!stopped) {
                    long left = end - System.currentTimeMillis();
                    if (left <= 0) {
                        return true;
                    }
                    try {
                        lock.wait(left);
                    } catch (InterruptedException e) {
                        return false;
                    }
                }
                return false;
            }
        }

        /**
         * Unanswered on a broken connection: their fate is unknown, so they go again, frame by frame in the order
         * they were written, each with its records and sequence as they were (the agent may have stored it), or,
         * when some of its records are given up, the rest as new frames.
         */
        private void requeueLost(List<Send> lost) {
            List<Send> again = new ArrayList<>(lost.size());
            int tries = 0;
            for (Send sd : lost) {
                List<Pending> recs = new ArrayList<>(sd.recs.size());
                for (Pending p : sd.recs) {
                    boolean give;
                    synchronized (lock) {
                        p.tries++;
                        give = p.tries > cfg.getRetries() || closed;
                        if (!give) {
                            p.attempts.add(new Attempt(false, "connection_lost", "the connection to the agent broke before its answer", System.currentTimeMillis()));
                        }
                    }
                    if (give) {
                        complete(p, false, "connection_lost", "the connection to the agent broke before its answer");
                    } else {
                        recs.add(p);
                    }
                }
                if (!recs.isEmpty()) {
                    tries = maxTries(recs, tries);
                    Send re = new Send(recs, null, 0, 0);
                    re.seq = recs.size() == sd.recs.size() ? sd.seq : 0;
                    again.add(re);
                }
            }
            if (again.isEmpty()) {
                return;
            }
            // One time for them all: a jitter each could send a later frame before an earlier one.
            long when = retryAt(tries, 0);
            synchronized (lock) {
                for (Send re : again) {
                    ready.addLast(resend(re.recs, when, re.seq));
                }
                lock.notifyAll();
            }
        }

        private Session connect() throws IOException {
            IOException last = new IOException("no address");
            for (String a : cfg.getAddresses()) {
                Session s;
                try {
                    s = open(a);
                } catch (IOException e) {
                    last = e;
                    continue;
                }
                try {
                    s.handshake(); // a refusal is the agent's word: not tried elsewhere
                } catch (RefusedException e) {
                    if (!"unsupported_version".equals(e.reason) || s.version < Protocol.VERSION3) {
                        throw e;
                    }
                    // An agent older than version 3 (it closed after saying so): ask again, now and from now on, for
                    // the version the config needs, without idempotence.
                    noV3 = true;
                    s = open(a);
                    s.handshake();
                }
                return s;
            }
            throw last;
        }

        private Session open(String addr) throws IOException {
            if (addr.startsWith("unix:")) {
                SocketChannel ch = SocketChannel.open(StandardProtocolFamily.UNIX);
                try {
                    tuneUnix(ch);
                    ch.connect(UnixDomainSocketAddress.of(addr.substring(5)));
                } catch (IOException e) {
                    ch.close();
                    throw e;
                }
                return new Session(ch, new ChannelIn(ch), new ChannelOut(ch));
            }
            String hp = addr.substring(4);
            int colon = hp.lastIndexOf(':');
            Socket sock = new Socket();
            try {
                sock.connect(new InetSocketAddress(hp.substring(0, colon), Integer.parseInt(hp.substring(colon + 1))), cfg.getConnectTimeoutMs());
                sock.setTcpNoDelay(true);
            } catch (IOException e) {
                sock.close();
                throw e;
            }
            return new Session(sock, sock.getInputStream(), sock.getOutputStream());
        }

        /** Sends frames while there is something to send and room in flight. */
        private void serve(Session s) throws IOException, InterruptedException {
            while (true) {
                Send sd = null;
                boolean flush = false;
                synchronized (lock) {
                    while (true) {
                        if (stopped || s.broken) {
                            return;
                        }
                        if (cur != null && ready.isEmpty() && System.nanoTime() - cur.firstAt >= TimeUnit.MILLISECONDS.toNanos(cfg.getLingerMs())) {
                            seal();
                        }
                        if (s.inflight.size() < cfg.getMaxInFlight() && (s.inflightBytes < s.maxInflight || s.inflight.isEmpty())) {
                            sd = takeReady();
                        }
                        if (sd != null || s.unflushed) {
                            // Never write or flush under the lock: a socket that
                            // blocks would stop the reader applying answers.
                            flush = sd == null;
                            break;
                        }
                        lock.wait(Math.max(1, cfg.getLingerMs() / 2));
                    }
                }
                if (flush) {
                    s.out.flush();
                    s.unflushed = false;
                    continue;
                }
                write(s, sd);
                s.unflushed = true;
            }
        }

        /** The first send due now; lock held. */
        private Send takeReady() {
            long now = System.nanoTime();
            for (java.util.Iterator<Send> it = ready.iterator(); it.hasNext(); ) {
                Send sd = it.next();
                if (sd.notBefore <= now) {
                    it.remove();
                    return sd;
                }
            }
            return null;
        }

        /**
         * Writes sd as one frame, from its buffer as it is when it has one (its prefix room takes the header,
         * request id and count), else re-encoded into the connection's scratch buffer; compressed into the
         * connection's output buffer. Its buffer is freed, in the count too, once written or dropped.
         */
        private void write(Session s, Send sd) throws IOException {
            try {
                writeFrame(s, sd);
            } finally {
                synchronized (lock) {
                    release(sd);
                    // An oversized record's frame must not pin its size for the connection's life.
                    if (s.scratch.b.length > frameCap) {
                        s.scratch = sessionBuf(frameCap);
                    }
                    if (s.zout.b.length > zoutCap) {
                        s.zout = sessionBuf(zoutCap);
                    }
                    chargeSession(s);
                }
            }
        }

        private void writeFrame(Session s, Send sd) throws IOException {
            Protocol.Buf records = sd.body;
            if (records == null) {
                records = s.scratch;
                records.reset();
                records.ensure(Protocol.PRODUCE_PREFIX_MAX);
                records.len = Protocol.PRODUCE_PREFIX_MAX;
                byte[] prev = null;
                for (Pending p : sd.recs) {
                    Protocol.record(records, prev, p.topic, p.key, p.value, 0, p.headers);
                    prev = p.topic;
                }
            }
            String requestId = sd.recs.get(0).requestId;
            long seq = 0;
            if (s.idem) {
                // Numbered once: a frame sent again with the same records keeps its number (see Send.seq). A frame
                // split below for size leaves a gap, which the agent does not mind.
                if (sd.seq == 0) {
                    sd.seq = lastSeq.incrementAndGet();
                }
                seq = sd.seq;
            }
            // The request id, sequence and count go right before the records, in the room kept for them.
            Protocol.Buf pre = s.pre;
            pre.reset();
            Protocol.producePrefix(pre, requestId, seq, sd.recs.size());
            int start = Protocol.PRODUCE_PREFIX_MAX - pre.len;
            System.arraycopy(pre.b, 0, records.b, start, pre.len);
            int bodyLen = records.len - start;
            byte[] payload = records.b;
            int off = start, len = bodyLen;
            int flags = Protocol.produceFlags(cfg.isReceipts(), requestId, seq);
            if (codec != Protocol.COMPRESS_NONE && (s.features & (codec == Protocol.COMPRESS_LZ4 ? Protocol.FEATURE_LZ4 : Protocol.FEATURE_ZSTD)) != 0) {
                Protocol.compress(records.b, start, bodyLen, codec, s.zout);
                payload = s.zout.b;
                off = 0;
                len = s.zout.len;
                flags |= codec;
            }
            if (len + Protocol.HEADER_LEN > s.maxFrame || sd.recs.size() > s.maxRecords) {
                if (sd.recs.size() == 1) {
                    complete(sd.recs.get(0), false, "record_too_large", "the record does not fit in the agent's frame limit (" + s.maxFrame + " bytes)");
                    return;
                }
                int half = sd.recs.size() / 2;
                synchronized (lock) {
                    ready.addFirst(resend(new ArrayList<>(sd.recs.subList(half, sd.recs.size())), 0));
                    ready.addFirst(resend(new ArrayList<>(sd.recs.subList(0, half)), 0));
                }
                return;
            }
            long id;
            synchronized (lock) {
                id = ++s.nextId & 0xFFFFFFFFL;
                s.inflight.put(id, sd);
                sd.sentBytes = len + 10;
                s.inflightBytes += sd.sentBytes;
            }
            Protocol.Buf hdr = s.hdr;
            hdr.reset();
            hdr.u32(len + Protocol.HEADER_LEN).u8(Protocol.PRODUCE).u8(flags).u32(id);
            if (payload == records.b) {
                // Uncompressed: the header goes in the room before the body, and the frame out in one write.
                System.arraycopy(hdr.b, 0, records.b, start - 10, 10);
                s.out.write(records.b, start - 10, len + 10);
            } else {
                s.out.write(hdr.b, 0, hdr.len);
                s.out.write(payload, off, len);
            }
            sentFrames.increment();
            sentBytes.add(len + 10);
            sentRecordBytes.add(bodyLen);
        }

        /** Reads the agent's answers on s. */
        private void read(Session s) {
            try {
                while (true) {
                    byte[] h = new byte[10];
                    s.in.readFully(h);
                    Protocol.Header fh = Protocol.parseHeader(h, 64 << 20);
                    byte[] body = new byte[fh.bodyLen()];
                    s.in.readFully(body);
                    if (fh.type == Protocol.RESULT) {
                        Protocol.Receipt rc = null;
                        if (s.version >= Protocol.VERSION2 && (fh.flags & Protocol.FLAG_RECEIPT) != 0) {
                            rc = new Protocol.Receipt();
                        }
                        List<Protocol.Range> ranges = Protocol.decodeResult(body, 1 << 24, rc == null ? 0 : fh.flags, rc);
                        Send sd;
                        synchronized (lock) {
                            sd = s.inflight.remove(fh.requestId);
                            if (sd != null) {
                                s.inflightBytes -= frameBytes(sd);
                            }
                            lock.notifyAll();
                        }
                        if (sd != null) {
                            apply(sd, ranges, rc);
                        }
                    } else {
                        break; // an Error frame, or one a client does not expect: the connection ends
                    }
                }
            } catch (IOException e) {
                // The connection broke.
            }
            synchronized (lock) {
                s.broken = true;
                lock.notifyAll();
            }
            s.close();
        }

        private long frameBytes(Send sd) {
            return sd.sentBytes;
        }
    }

    /**
     * Streams over a blocking SocketChannel that read and write at once:
     * Channels.newInputStream and newOutputStream share the channel's
     * blocking lock, so a read waiting for an answer would stop every write.
     */
    static final class ChannelIn extends InputStream {
        private final SocketChannel ch;

        ChannelIn(SocketChannel ch) { this.ch = ch; }

        @Override
        public int read() throws IOException {
            byte[] one = new byte[1];
            return read(one, 0, 1) < 0 ? -1 : one[0] & 0xFF;
        }

        @Override
        public int read(byte[] b, int off, int len) throws IOException {
            return ch.read(java.nio.ByteBuffer.wrap(b, off, len));
        }
    }

    static final class ChannelOut extends OutputStream {
        private final SocketChannel ch;

        ChannelOut(SocketChannel ch) { this.ch = ch; }

        @Override
        public void write(int b) throws IOException {
            write(new byte[] {(byte) b}, 0, 1);
        }

        @Override
        public void write(byte[] b, int off, int len) throws IOException {
            java.nio.ByteBuffer buf = java.nio.ByteBuffer.wrap(b, off, len);
            while (buf.hasRemaining()) {
                ch.write(buf);
            }
        }
    }

    /** The agent's Error frame in the handshake. */
    static final class RefusedException extends IOException {
        final String reason;

        RefusedException(String reason, String msg) {
            super(msg);
            this.reason = reason;
        }
    }

    /** A connection's scratch or compression buffer: it doubles up to soft, what a full frame needs. */
    private static Protocol.Buf sessionBuf(int soft) {
        Protocol.Buf b = new Protocol.Buf(SESSION_BUF);
        b.soft = soft;
        return b;
    }

    /** Charges s's buffers' growth past SESSION_BASE as they are now (they grow with the frames it sends); lock held. */
    private void chargeSession(Session s) {
        long now = s.scratch.b.length + s.zout.b.length - 2 * SESSION_BUF;
        long d = now - s.charged;
        if (d != 0) {
            buffered += d;
            working += d;
            s.charged = now;
            if (d < 0) {
                lock.notifyAll();
            }
        }
    }

    /** Fails every record not on the wire. */
    private void failWaiting(String code, String msg) {
        List<Pending> left = new ArrayList<>();
        synchronized (lock) {
            seal();
            for (Send s : ready) {
                left.addAll(s.recs);
                release(s);
            }
            ready.clear();
        }
        for (Pending p : left) {
            complete(p, false, code, msg);
        }
    }

    /** One connection's state. */
    final class Session {
        final Closeable conn;
        final DataInputStream in;
        final OutputStream out;
        // In the order written: frames lost with the connection go again in that order.
        final Map<Long, Send> inflight = new LinkedHashMap<>();
        long inflightBytes, nextId, features, maxFrame, maxRecords, maxInflight;
        int version;
        boolean idem; // version 3 and the agent granted idempotence: frames carry sequences
        boolean broken;
        boolean unflushed; // written and not yet flushed (the sender's own)
        final Protocol.Buf hdr = new Protocol.Buf(16), pre = new Protocol.Buf(Protocol.PRODUCE_PREFIX_MAX);
        // The sender's own: records re-encoded for a resend, and the compressed frame. Charged (chargeSession).
        Protocol.Buf scratch = sessionBuf(frameCap), zout = sessionBuf(zoutCap);
        long charged; // bytes this connection's buffers grew past SESSION_BASE, added to buffered and working

        Session(Closeable conn, InputStream in, OutputStream out) {
            this.conn = conn;
            this.in = new DataInputStream(new BufferedInputStream(in, 64 << 10));
            this.out = new BufferedOutputStream(out, 256 << 10);
        }

        void handshake() throws IOException {
            Protocol.Buf b = new Protocol.Buf(128);
            // Version 3 for idempotence, unless an agent refused it; else version 2 only for receipts or request ids,
            // otherwise exactly version 1, which every agent speaks.
            version = producerId != null && !noV3 ? Protocol.VERSION3
                    : cfg.isReceipts() || cfg.isRequestIds() ? Protocol.VERSION2 : Protocol.VERSION;
            b.raw(Protocol.preamble(version), 0, 4);
            long feats = codec == Protocol.COMPRESS_LZ4 ? Protocol.FEATURE_LZ4 : codec == Protocol.COMPRESS_ZSTD ? Protocol.FEATURE_ZSTD : 0;
            if (version >= Protocol.VERSION3) {
                feats |= Protocol.FEATURE_IDEMPOTENCE;
            }
            Protocol.hello(b, version, cfg.getClientName(), cfg.getToken(), feats, version >= Protocol.VERSION3 ? producerId : null);
            out.write(b.b, 0, b.len);
            out.flush();
            byte[] h = new byte[10];
            in.readFully(h);
            Protocol.Header fh = Protocol.parseHeader(h, 1 << 16);
            byte[] body = new byte[fh.bodyLen()];
            in.readFully(body);
            if (fh.type == Protocol.ERROR) {
                String[] e = Protocol.decodeError(body);
                close();
                throw new RefusedException(e[0], e[1]);
            }
            if (fh.type != Protocol.HELLO_OK) {
                close();
                throw new IOException("unexpected frame type " + fh.type + " in the handshake");
            }
            Protocol.HelloOk ok = Protocol.decodeHelloOk(body);
            if (ok.version != version) {
                close();
                throw new IOException("the agent answered protocol version " + ok.version + " to a hello of version " + version);
            }
            features = ok.features;
            idem = version >= Protocol.VERSION3 && (ok.features & Protocol.FEATURE_IDEMPOTENCE) != 0;
            maxFrame = ok.maxFrameBytes;
            maxRecords = ok.maxRecords;
            maxInflight = ok.maxInflightBytes;
        }

        void close() {
            try {
                conn.close();
            } catch (IOException e) {
                // already closed
            }
        }
    }
}
