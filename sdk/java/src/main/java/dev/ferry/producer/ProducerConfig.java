package dev.ferry.producer;

import java.util.ArrayList;
import java.util.List;

/** A Producer's settings; the defaults suit most programs. Setters return this. */
public final class ProducerConfig {
    private List<String> addresses = new ArrayList<>(List.of("unix:ferry-data/ferry.sock", "tcp:127.0.0.1:8090"));
    private String token = "";
    private String clientName = "ferry-java";
    private long totalSizeInBytes = 100L << 20;
    private long maxBlockMs = 60_000;
    private int batchSizeInBytes = 512 << 10;
    private int batchCountThreshold = 4096;
    private int lingerMs = 20;
    private int sendThreads = 1;
    private int maxInFlight = 8;
    private String compression = "lz4";
    private int retries = 10;
    private long baseRetryBackoffMs = 100;
    private long maxRetryBackoffMs = 5_000;
    private int connectTimeoutMs = 2_000;
    private boolean receipts;
    private boolean requestIds;
    private boolean idempotence = true;

    /** Addresses tried in order at every connect: "unix:PATH" (Linux) or "tcp:HOST:PORT". Default: the agent's socket, then 127.0.0.1:8090. */
    public List<String> getAddresses() { return addresses; }

    public ProducerConfig setAddresses(List<String> a) {
        for (String s : a) {
            if (!s.startsWith("unix:") && !s.startsWith("tcp:")) {
                throw new IllegalArgumentException("address " + s + ": want unix:PATH or tcp:HOST:PORT");
            }
        }
        this.addresses = new ArrayList<>(a);
        return this;
    }

    /** Whether every frame asks the agent where its records went (protocol version 2; see {@link Result#getOffset}). */
    public boolean isReceipts() { return receipts; }

    /** Ask for delivery receipts: needs an agent that speaks protocol version 2. Off: version 1, as before. */
    public ProducerConfig setReceipts(boolean on) { this.receipts = on; return this; }

    /**
     * Whether records' request ids are sent (protocol version 2): the agent writes a record's id on it in Kafka as
     * the header {@code ferry.request_id}. See {@link Producer#send(String, byte[], byte[], java.util.Map, String, Callback)}.
     */
    public boolean isRequestIds() { return requestIds; }

    /**
     * Send records' request ids: needs an agent that speaks protocol version 2. Off (the default): ids given to send
     * are ignored, and without receipts the producer speaks version 1, as before, which every agent does.
     */
    public ProducerConfig setRequestIds(boolean on) { this.requestIds = on; return this; }

    /**
     * Whether the producer numbers its frames so that the agent stores a resent frame once (protocol version 3: a
     * random producer id per Producer and a sequence number per frame; see {@link Producer}). Default on.
     */
    public boolean isIdempotence() { return idempotence; }

    /**
     * Idempotence on (the default): a frame sent again because its fate is unknown (the connection broke before
     * its answer, ack_timeout, or the whole frame answered retryable) keeps its sequence number, and an agent in
     * delivery mode spool stores it once, across reconnects and its own restarts, answering the resend with the
     * first answer. An agent that does not keep sequences (other delivery modes) or does not speak version 3
     * (an older agent: detected, and not asked again) is served without them: resends are then at least once.
     * Off: the producer speaks version 1, or 2 for receipts or request ids, as before, and never numbers frames.
     */
    public ProducerConfig setIdempotence(boolean on) { this.idempotence = on; return this; }

    /** The application token sent in the hello. */
    public String getToken() { return token; }

    public ProducerConfig setToken(String t) { this.token = t == null ? "" : t; return this; }

    public String getClientName() { return clientName; }

    public ProducerConfig setClientName(String n) { this.clientName = n; return this; }

    /**
     * The memory the producer holds for records sent and not yet completed, in bytes: each record's bytes (UTF-8
     * for strings) plus about 180 bytes of its JVM objects, the capacity of every frame buffer not yet written
     * (each starts at the size the last frame needed and grows up to batchSizeInBytes + 64 KiB) with a frame's
     * objects, and each connection's buffers (320 KiB of stream buffers, its compression output and resend
     * buffer, which grow to a frame). A program that changes request id every record makes a frame per record:
     * this counts each one's buffer, so send waits for room (maxBlockMs) instead of running the JVM out of
     * memory. Keep it well above sendThreads * (320 KiB + 2 * batchSizeInBytes): below that the connections'
     * own buffers leave room for little else. Default 100 MiB.
     */
    public long getTotalSizeInBytes() { return totalSizeInBytes; }

    public ProducerConfig setTotalSizeInBytes(long n) { this.totalSizeInBytes = positive(n, "totalSizeInBytes"); return this; }

    /** How long send waits for room in totalSizeInBytes before it throws BufferFullException (0: at once). */
    public long getMaxBlockMs() { return maxBlockMs; }

    public ProducerConfig setMaxBlockMs(long ms) { this.maxBlockMs = Math.max(ms, 0); return this; }

    /** A batch is sent at this many bytes, this many records, or lingerMs after its first record. */
    public int getBatchSizeInBytes() { return batchSizeInBytes; }

    public ProducerConfig setBatchSizeInBytes(int n) { this.batchSizeInBytes = (int) positive(n, "batchSizeInBytes"); return this; }

    public int getBatchCountThreshold() { return batchCountThreshold; }

    public ProducerConfig setBatchCountThreshold(int n) { this.batchCountThreshold = (int) positive(n, "batchCountThreshold"); return this; }

    public int getLingerMs() { return lingerMs; }

    public ProducerConfig setLingerMs(int ms) { this.lingerMs = (int) positive(ms, "lingerMs"); return this; }

    /** Connections to the agent, each with its sending and receiving thread. */
    public int getSendThreads() { return sendThreads; }

    public ProducerConfig setSendThreads(int n) { this.sendThreads = (int) positive(n, "sendThreads"); return this; }

    /** Batches on the wire at once per connection. */
    public int getMaxInFlight() { return maxInFlight; }

    public ProducerConfig setMaxInFlight(int n) { this.maxInFlight = (int) positive(n, "maxInFlight"); return this; }

    /** "none", "lz4" or "zstd". */
    public String getCompression() { return compression; }

    public ProducerConfig setCompression(String c) {
        if (!c.equals("none") && !c.equals("lz4") && !c.equals("zstd")) {
            throw new IllegalArgumentException("compression " + c + ": want none, lz4 or zstd");
        }
        this.compression = c;
        return this;
    }

    /** Times a record refused for a passing reason is sent again (the connection lost counts too). */
    public int getRetries() { return retries; }

    public ProducerConfig setRetries(int n) { this.retries = Math.max(n, 0); return this; }

    public long getBaseRetryBackoffMs() { return baseRetryBackoffMs; }

    public ProducerConfig setBaseRetryBackoffMs(long ms) { this.baseRetryBackoffMs = positive(ms, "baseRetryBackoffMs"); return this; }

    public long getMaxRetryBackoffMs() { return maxRetryBackoffMs; }

    public ProducerConfig setMaxRetryBackoffMs(long ms) { this.maxRetryBackoffMs = positive(ms, "maxRetryBackoffMs"); return this; }

    public int getConnectTimeoutMs() { return connectTimeoutMs; }

    public ProducerConfig setConnectTimeoutMs(int ms) { this.connectTimeoutMs = (int) positive(ms, "connectTimeoutMs"); return this; }

    private static long positive(long v, String name) {
        if (v <= 0) {
            throw new IllegalArgumentException(name + " must be positive");
        }
        return v;
    }
}
