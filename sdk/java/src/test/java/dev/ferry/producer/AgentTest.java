package dev.ferry.producer;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;
import static org.junit.jupiter.api.Assumptions.assumeFalse;

import java.io.File;
import java.io.IOException;
import java.net.HttpURLConnection;
import java.net.ServerSocket;
import java.net.URL;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * The producer against the real ferry binary and real Kafka, both started
 * by make test (scripts/test.sh sets FERRY_BIN, FERRY_BENCH_BIN and
 * FERRY_TEST_KAFKA); what reached Kafka is checked by ferry-bench consume
 * --verify: none lost, and no more duplicated or out-of-order records than
 * the producer's own resends can explain. Without that environment these
 * tests fail, rather than pass having run nothing, unless they are skipped
 * on purpose: -Dferry.agentTests=skip (or FERRY_AGENT_TESTS=skip).
 */
class AgentTest {
    static final String BROKERS = System.getenv("FERRY_TEST_KAFKA");
    static final String FERRY = System.getenv("FERRY_BIN");
    static final String BENCH = System.getenv("FERRY_BENCH_BIN");

    /** The opt-out: this system property or environment variable set to "skip". */
    static final String OPT_OUT_PROPERTY = "ferry.agentTests", OPT_OUT_ENV = "FERRY_AGENT_TESTS";

    Path dir;
    Process agent;
    String socket;
    int httpPort, adminPort, localPort;

    /** Whether the tests are skipped on purpose (and reported skipped, each). */
    static boolean optedOut() {
        String optOut = System.getProperty(OPT_OUT_PROPERTY, System.getenv(OPT_OUT_ENV));
        if (optOut == null || optOut.isEmpty()) {
            return false;
        }
        if (!optOut.equals("skip")) {
            fail(OPT_OUT_PROPERTY + " / " + OPT_OUT_ENV + " = \"" + optOut + "\": the only value is skip");
        }
        return true;
    }

    @BeforeAll
    static void environment() {
        if (optedOut()) {
            return;
        }
        List<String> missing = new ArrayList<>();
        if (BROKERS == null || BROKERS.isEmpty()) {
            missing.add("FERRY_TEST_KAFKA (a Kafka bootstrap address)");
        }
        if (FERRY == null || !new File(FERRY).canExecute()) {
            missing.add("FERRY_BIN (the ferry binary: go build -o bin/ferry ./cmd/ferry)" + (FERRY == null ? "" : ", not an executable: " + FERRY));
        }
        if (BENCH == null || !new File(BENCH).canExecute()) {
            missing.add("FERRY_BENCH_BIN (go build -o bin/ferry-bench ./cmd/ferry-bench)" + (BENCH == null ? "" : ", not an executable: " + BENCH));
        }
        if (!missing.isEmpty()) {
            fail("AgentTest runs the producer against the real agent and Kafka, and needs " + String.join("; ", missing)
                    + ". make test (scripts/test.sh) sets them. To run the other tests without them, skip these on purpose: mvn verify -D"
                    + OPT_OUT_PROPERTY + "=skip (or " + OPT_OUT_ENV + "=skip), or -Dtest='!AgentTest'.");
        }
    }

    @BeforeEach
    void setUp() throws IOException {
        assumeFalse(optedOut(), "skipped on purpose (" + OPT_OUT_PROPERTY + " / " + OPT_OUT_ENV + " = skip)");
        dir = Files.createTempDirectory("fj");
        socket = dir.resolve("f.sock").toString();
    }

    @AfterEach
    void tearDown() throws Exception {
        if (agent != null) {
            agent.destroyForcibly().waitFor(10, TimeUnit.SECONDS);
        }
        if (dir != null) {
            try (var s = Files.walk(dir)) {
                s.sorted(java.util.Comparator.reverseOrder()).map(Path::toFile).forEach(File::delete);
            }
        }
    }

    static int freePort() throws IOException {
        try (ServerSocket s = new ServerSocket(0)) {
            return s.getLocalPort();
        }
    }

    /** Starts the agent on the test's socket and waits until it serves. */
    Process startAgent(String brokers, String... sets) throws Exception {
        int admin = adminPort = freePort();
        httpPort = freePort();
        localPort = freePort();
        List<String> cmd = new ArrayList<>(List.of(FERRY, "run", "--set", "exporter.kafka.brokers=[" + brokers + "]",
                "--set", "receivers.local.socket=" + socket, "--set", "receivers.local.listen=127.0.0.1:" + localPort,
                "--set", "receivers.http.listen=127.0.0.1:" + httpPort, "--set", "telemetry.admin.listen=127.0.0.1:" + admin,
                "--set", "receivers.otlp.enabled=false", "--set", "telemetry.report_interval=0s"));
        for (String s : sets) {
            cmd.add("--set");
            cmd.add(s);
        }
        Process p = new ProcessBuilder(cmd).redirectErrorStream(true).redirectOutput(dir.resolve("agent-" + System.nanoTime() + ".log").toFile()).start();
        long deadline = System.currentTimeMillis() + 20_000;
        while (System.currentTimeMillis() < deadline) {
            try {
                // The admin port answers before the receivers listen: /readyz
                // names the pipeline ("starting") until every one does.
                HttpURLConnection c = (HttpURLConnection) new URL("http://127.0.0.1:" + admin + "/readyz").openConnection();
                c.setConnectTimeout(200);
                int code = c.getResponseCode();
                java.io.InputStream in = code == 200 ? c.getInputStream() : c.getErrorStream();
                String body = in == null ? "" : new String(in.readAllBytes(), StandardCharsets.UTF_8);
                if ((code == 200 || code == 503) && body.contains("not_ready") && !body.contains("\"pipeline\"")) {
                    return p;
                }
            } catch (IOException e) {
                // not yet
            }
            Thread.sleep(50);
        }
        throw new IllegalStateException("ferry did not start");
    }

    static String run(String... cmd) throws Exception {
        Process p = new ProcessBuilder(cmd).redirectErrorStream(true).start();
        String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
        if (!p.waitFor(5, TimeUnit.MINUTES) || p.exitValue() != 0) {
            throw new AssertionError(String.join(" ", cmd) + " failed:\n" + out);
        }
        return out;
    }

    String topic(String prefix) throws Exception {
        String t = prefix + "-" + System.nanoTime();
        run(BENCH, "topic", "create", "--bootstrap-server", BROKERS, "--topic", t, "--partitions", "3");
        return t;
    }

    /** A value with the sequence id ferry-bench consume --verify reads: #producer.stream.seq. */
    static byte[] seqValue(String producer, long seq, LogItem item) {
        String prefix = "#" + producer + ".0." + Long.toString(seq, 36) + ".";
        byte[] json = item.toJson();
        byte[] out = new byte[prefix.length() + json.length];
        System.arraycopy(prefix.getBytes(StandardCharsets.UTF_8), 0, out, 0, prefix.length());
        System.arraycopy(json, 0, out, prefix.length(), json.length);
        return out;
    }

    /**
     * How often the producer sent records, from their results' attempts:
     * each attempt but the last failed (a retryable answer, or a connection
     * lost before its answer) and the record was sent again. Callbacks run
     * on one thread, futures are read on the test's: synchronized.
     */
    static final class Sends {
        private long records, retried, extraWrites, retriedWrites;

        synchronized void add(Result r) {
            add(r, Long.MIN_VALUE);
        }

        /**
         * As add(r), but a send whose attempt ended before sinceMs went to an
         * agent that could not write to Kafka: it cannot have been read.
         */
        synchronized void add(Result r, long sinceMs) {
            int sends = r.getAttempts().size(), writable = 0;
            for (Attempt a : r.getAttempts()) {
                writable += a.getTimestampMs() >= sinceMs ? 1 : 0;
            }
            records++;
            extraWrites += Math.max(writable - 1, 0);
            if (sends > 1) {
                retried++;
                retriedWrites += writable;
            }
        }

        /**
         * Duplicates only come from sending again: the agent writes a frame
         * to Kafka once (its producer is idempotent), so a record sent k
         * times (to agents that can write) is read at most k times.
         */
        synchronized long maxDuplicated() {
            return extraWrites;
        }

        /**
         * Records are first sent in sequence order, on one connection at a
         * time (one send thread), and the agent produces a connection's
         * frames in the order it reads them, a record answered before the
         * connection breaks being in Kafka already: only a record sent again
         * can be read after a later one of its partition. ferry-bench counts
         * every such read, a duplicate's too: at most the retried records'
         * writes.
         */
        synchronized long maxOutOfOrder() {
            return retriedWrites;
        }

        @Override
        public synchronized String toString() {
            return records + " records, " + retried + " sent more than once; at most " + extraWrites + " extra writes, "
                    + retriedWrites + " writes of records sent more than once";
        }
    }

    /** The line ferry-bench consume --verify prints (tools/bench/verify's Summary); nothing else may follow on it. */
    static final Pattern SUMMARY = Pattern.compile("^verify: (\\d+) distinct, (\\d+) lost, (\\d+) duplicated, (\\d+) out of order"
            + "(?:, (\\d+) present though their request failed)?(?:, (\\d+) without this run's ids)?$", Pattern.MULTILINE);

    /** ferry-bench consume --verify's counts. */
    static final class Verified {
        final long distinct, lost, duplicated, outOfOrder, presentThoughFailed, foreign;

        Verified(String out) {
            Matcher m = SUMMARY.matcher(out);
            if (!m.find()) {
                throw new AssertionError("no verify line in ferry-bench consume's output (has its format changed?):\n" + out);
            }
            distinct = Long.parseLong(m.group(1));
            lost = Long.parseLong(m.group(2));
            duplicated = Long.parseLong(m.group(3));
            outOfOrder = Long.parseLong(m.group(4));
            presentThoughFailed = m.group(5) == null ? 0 : Long.parseLong(m.group(5));
            foreign = m.group(6) == null ? 0 : Long.parseLong(m.group(6));
            if (m.find()) {
                throw new AssertionError("more than one verify line:\n" + out);
            }
        }
    }

    /**
     * Checks what Kafka holds of the ids below n: every one that did not
     * fail, read once unless the producer sent it again, and in order
     * unless the producer sent it again; nothing from another run.
     */
    Verified verify(String topic, String producer, long n, List<Long> failed, Sends sends) throws Exception {
        StringBuilder f = new StringBuilder();
        for (Long id : failed) {
            f.append(f.length() == 0 ? "" : ",").append("[").append(id).append(",").append(id + 1).append("]");
        }
        Path rep = dir.resolve("produced.json");
        Files.writeString(rep, "{\"seq\":{\"producer\":\"" + producer + "\",\"issued\":" + n + ",\"failed\":[" + f + "]}}");
        String out = run(BENCH, "consume", "--bootstrap-server", BROKERS, "--topic", topic, "--verify", "--produced", rep.toString(), "--timeout", "30000");
        Verified v = new Verified(out);
        String ctx = "(producer: " + sends + ")\n" + out;
        assertEquals(0, v.lost, "lost " + ctx);
        assertEquals(n - failed.size() + v.presentThoughFailed, v.distinct, "distinct ids read " + ctx);
        assertEquals(0, v.foreign, "records without this run's ids " + ctx);
        assertTrue(v.duplicated <= sends.maxDuplicated(), "duplicated: more than the producer's resends " + ctx);
        assertTrue(v.outOfOrder <= sends.maxOutOfOrder(), "out of order: more than the writes of records sent again " + ctx);
        return v;
    }

    static void sleep(long ms) {
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    static LogItem item(long i) {
        return new LogItem().pushBack("level", "INFO").pushBack("thread", "main").pushBack("i", Long.toString(i))
                .pushBack("message", "the quick brown fox jumps over the lazy dog");
    }

    /**
     * Delivery receipts (protocol version 2): every record's Result names
     * where it is in Kafka (delivery mode kafka), or a spool receipt id
     * that GET /receipts/{id} resolves once Kafka has it (spool mode); at
     * each place Kafka holds exactly the record sent, read back with
     * ferry-bench consume --print.
     */
    @Test
    void receiptsPointAtTheRecords() throws Exception {
        receipts(false);
    }

    @Test
    void spoolReceiptsPointAtTheRecords() throws Exception {
        receipts(true);
    }

    @SuppressWarnings("unchecked")
    void receipts(boolean spool) throws Exception {
        agent = spool ? startAgent(BROKERS, "delivery.mode=spool", "delivery.spool.dir=" + dir.resolve("spool"), "delivery.spool.linger=20ms")
                : startAgent(BROKERS);
        String t = topic(spool ? "java-spool-receipts" : "java-receipts");
        int n = 500;
        List<Result> results = new ArrayList<>();
        try (Producer p = new Producer(new ProducerConfig().setAddresses(List.of("unix:" + socket)).setReceipts(true).setCompression("lz4"))) {
            List<java.util.concurrent.Future<Result>> fs = new ArrayList<>();
            for (int i = 0; i < n; i++) {
                fs.add(p.send(t, ("k" + i % 7).getBytes(StandardCharsets.UTF_8), ("receipt-value-" + i).getBytes(StandardCharsets.UTF_8), null));
            }
            p.flush();
            for (var f : fs) {
                results.add(f.get(30, TimeUnit.SECONDS));
            }
        }
        // Where each record is: from its result, or from its spool receipt.
        long[][] at = new long[n][];
        java.util.Map<String, List<Integer>> byId = new java.util.LinkedHashMap<>();
        for (int i = 0; i < n; i++) {
            Result r = results.get(i);
            assertTrue(r.isSuccessful(), "record " + i + ": " + r);
            if (spool) {
                assertTrue(!r.getReceiptId().isEmpty() && r.getOffset() == -1, "record " + i + ": " + r);
                byId.computeIfAbsent(r.getReceiptId(), k -> new ArrayList<>()).add(i);
            } else {
                assertEquals(t, r.getTopic(), "record " + i + ": " + r);
                assertTrue(r.getOffset() >= 0 && r.getReceiptId().isEmpty(), "record " + i + ": " + r);
                at[i] = new long[] {r.getPartition(), r.getOffset()};
            }
        }
        for (var e : byId.entrySet()) {
            List<Object> ranges = pollReceipt(e.getKey());
            int k = 0;
            for (Object o : ranges) {
                java.util.Map<String, Object> g = (java.util.Map<String, Object>) o;
                assertEquals(t, g.get("topic"));
                for (long j = 0; j < (Long) g.get("count"); j++) {
                    assertTrue(k < e.getValue().size(), "receipt " + e.getKey() + " covers more records than it was given for");
                    at[e.getValue().get(k++)] = new long[] {(Long) g.get("partition"), (Long) g.get("offset") + j};
                }
            }
            assertEquals(e.getValue().size(), k, "receipt " + e.getKey() + " covers every record");
        }
        // What Kafka holds at each place.
        java.util.Map<String, String> inKafka = new java.util.HashMap<>();
        String out = run(BENCH, "consume", "--bootstrap-server", BROKERS, "--topic", t, "--print", "--messages", Integer.toString(n), "--timeout", "30000");
        for (String line : out.split("\n")) {
            String[] f = line.split("\t", 5);
            if (f.length == 5 && f[0].equals("record")) {
                inKafka.put(f[1] + "/" + f[2], f[4]);
            }
        }
        for (int i = 0; i < n; i++) {
            String place = at[i][0] + "/" + at[i][1];
            assertEquals("receipt-value-" + i, inKafka.get(place), "record " + i + ": Kafka at its receipt's " + place);
        }
    }

    /**
     * Request ids (protocol version 2, produce flag 8): every record sent
     * with an id carries it in Kafka as the header ferry.request_id, read
     * back with ferry-bench consume --print; records without one carry none;
     * a bad id fails its record at once and nothing of it reaches Kafka.
     * Runs of one id and ids alternating record by record (a frame each).
     */
    @Test
    void requestIdsReachKafka() throws Exception {
        agent = startAgent(BROKERS);
        String t = topic("java-request-ids");
        int n = 600;
        String[] want = new String[n];
        List<java.util.concurrent.CompletableFuture<Result>> fs = new ArrayList<>();
        Result bad;
        try (Producer p = new Producer(new ProducerConfig().setAddresses(List.of("unix:" + socket)).setRequestIds(true).setCompression("zstd"))) {
            for (int i = 0; i < n; i++) {
                // Runs of 100 records per request; then ids that alternate; every 7th record of the runs has none.
                String id = i < 400 ? (i % 7 == 3 ? null : "java-req." + (i / 100)) : "alt:" + (i % 2) + "_x-" + i % 3;
                want[i] = id == null ? "" : id;
                fs.add(p.send(t, ("k" + i % 5).getBytes(StandardCharsets.UTF_8), ("rid-value-" + i).getBytes(StandardCharsets.UTF_8), null, id, null));
                if (i == 200) {
                    bad = p.send(t, null, "never sent".getBytes(StandardCharsets.UTF_8), null, "no spaces allowed", null).get(1, TimeUnit.SECONDS);
                    assertEquals("invalid_request_id", bad.getErrorCode(), bad.toString());
                }
            }
            p.flush();
            for (int i = 0; i < n; i++) {
                Result r = fs.get(i).get(30, TimeUnit.SECONDS);
                assertTrue(r.isSuccessful(), "record " + i + ": " + r);
            }
        }
        java.util.Map<String, String> idOf = new java.util.HashMap<>();
        String out = run(BENCH, "consume", "--bootstrap-server", BROKERS, "--topic", t, "--print", "--messages", Integer.toString(n), "--timeout", "30000");
        for (String line : out.split("\n")) {
            String[] f = line.split("\t", 5);
            if (f.length == 5 && f[0].equals("record")) {
                String before = idOf.put(f[4], f[3]);
                assertTrue(before == null || before.equals(f[3]), "a record read again with another id: " + line);
            }
        }
        for (int i = 0; i < n; i++) {
            assertEquals(want[i], idOf.get("rid-value-" + i), "record " + i + ": its ferry.request_id in Kafka (null: not in Kafka)");
        }
        // Had the record with a bad id reached Kafka, one of the n read would be it and a sent one would be missing.
        assertEquals(null, idOf.get("never sent"), "the record with a bad id is in Kafka");
    }

    /** GET /receipts/{id} until the records are in Kafka; the ranges. */
    @SuppressWarnings("unchecked")
    List<Object> pollReceipt(String id) throws Exception {
        long deadline = System.currentTimeMillis() + 60_000;
        while (true) {
            HttpURLConnection c = (HttpURLConnection) new URL("http://127.0.0.1:" + httpPort + "/receipts/" + id).openConnection();
            assertEquals(200, c.getResponseCode(), "GET /receipts/" + id);
            java.util.Map<String, Object> st;
            try (var in = c.getInputStream()) {
                st = (java.util.Map<String, Object>) Json.parse(new String(in.readAllBytes(), StandardCharsets.UTF_8));
            }
            if ("done".equals(st.get("state"))) {
                return (List<Object>) st.get("receipts");
            }
            assertTrue(System.currentTimeMillis() < deadline, "receipt " + id + " still pending: " + st);
            Thread.sleep(20);
        }
    }

    /** A counter or gauge from the agent's /metrics (0 when it is not there). */
    double metric(String name) throws Exception {
        HttpURLConnection c = (HttpURLConnection) new URL("http://127.0.0.1:" + adminPort + "/metrics").openConnection();
        String text;
        try (var in = c.getInputStream()) {
            text = new String(in.readAllBytes(), StandardCharsets.UTF_8);
        }
        for (String line : text.split("\n")) {
            if (line.startsWith(name + " ")) {
                return Double.parseDouble(line.substring(name.length() + 1).trim());
            }
        }
        return 0;
    }

    /**
     * Sends n records with ferry-bench's ids through proxy, in frames of 50, and waits for every result: each must
     * succeed. Returns what the producer sent, for verify's bounds.
     */
    Sends sendThrough(CutProxy proxy, ProducerConfig cfg, String t, String producer, int n) throws Exception {
        Sends sends = new Sends();
        List<java.util.concurrent.CompletableFuture<Result>> fs = new ArrayList<>();
        try (Producer p = new Producer(cfg.setAddresses(List.of(proxy.address())).setBatchCountThreshold(50)
                .setBaseRetryBackoffMs(10).setMaxRetryBackoffMs(100).setRetries(20))) {
            for (long i = 0; i < n; i++) {
                fs.add(p.send(t, null, seqValue(producer, i, item(i)), null));
            }
            p.flush();
        }
        int lost = 0;
        for (var f : fs) {
            Result r = f.get(30, TimeUnit.SECONDS);
            assertTrue(r.isSuccessful(), r.toString());
            sends.add(r);
            lost += r.getAttempts().get(0).getErrorCode().equals("connection_lost") ? 1 : 0;
        }
        assertTrue(lost > 0, "no record was sent again after a cut answer: the fault did not happen (" + sends + ")");
        return sends;
    }

    /**
     * Exactly once through lost answers (protocol version 3, the producer's
     * default, delivery mode spool): a proxy drops the agent's result of
     * frames the agent had stored and cuts the connection, so the producer
     * sends them again on a new one, with the same sequence. The agent
     * recognises each resend (ferry_idempotency_replayed_total) and answers
     * it as the first time: Kafka holds every record exactly once. The same
     * fault with idempotence off stores the cut frames twice, which shows
     * the fault hit stored frames.
     */
    @Test
    void answersLostInSpoolModeStoreEachRecordOnce() throws Exception {
        agent = startAgent(BROKERS, "delivery.mode=spool", "delivery.spool.dir=" + dir.resolve("spool"), "delivery.spool.linger=20ms");
        int n = 2000;
        String t = topic("java-idem");
        try (CutProxy proxy = new CutProxy(localPort, 9, 4)) {
            Sends sends = sendThrough(proxy, new ProducerConfig(), t, "jid", n);
            assertEquals(4, proxy.cuts.get(), "answers cut");
            assertTrue(proxy.preambles.size() >= 5 && proxy.preambles.stream().allMatch(v -> v == 3), "preambles: " + proxy.preambles);
            assertTrue(proxy.granted.stream().allMatch(f -> (f & Protocol.FEATURE_IDEMPOTENCE) != 0), "spool mode grants idempotence: " + proxy.granted);
            assertEquals(proxy.produces.get(), proxy.sequenced.get(), "every frame carries a sequence");
            double replayed = metric("ferry_idempotency_replayed_total");
            assertTrue(replayed >= proxy.cuts.get(), "the agent recognised " + replayed + " resent frames after " + proxy.cuts.get() + " cut answers");
            Verified v = verify(t, "jid", n, List.of(), sends);
            assertEquals(0, v.duplicated, "records stored twice though every resend carried its sequence (" + sends + ")");
            System.out.println("idempotence on: " + proxy.cuts.get() + " answers cut, " + (long) replayed + " frames replayed, "
                    + v.distinct + " distinct, " + v.duplicated + " duplicated (producer: " + sends + ")");
        }
        // The control: the same fault without idempotence (version 1, no sequences) stores the cut frames twice.
        String t2 = topic("java-idem-off");
        try (CutProxy proxy = new CutProxy(localPort, 9, 4)) {
            Sends sends = sendThrough(proxy, new ProducerConfig().setIdempotence(false), t2, "jio", n);
            assertTrue(proxy.preambles.stream().allMatch(v -> v == 1), "preambles: " + proxy.preambles);
            assertEquals(0, proxy.sequenced.get(), "sequences sent with idempotence off");
            Verified v = verify(t2, "jio", n, List.of(), sends);
            assertTrue(v.duplicated >= proxy.cuts.get(), "with idempotence off the cut frames were not stored twice: "
                    + v.duplicated + " duplicated (" + sends + ")");
            System.out.println("idempotence off: " + proxy.cuts.get() + " answers cut, " + v.distinct + " distinct, " + v.duplicated
                    + " duplicated (producer: " + sends + ")");
        }
    }

    /**
     * An agent that speaks version 3 but grants no idempotence (delivery
     * mode kafka: it does not keep what it accepted): the producer sends no
     * sequence (the agent would refuse such a frame, idempotence_unavailable,
     * and a record would fail), every record is delivered, and a frame
     * whose answer was cut is sent again: at least once, within the bounds
     * of the producer's resends.
     */
    @Test
    void anAgentWithoutIdempotenceGetsNoSequences() throws Exception {
        agent = startAgent(BROKERS);
        int n = 1000;
        String t = topic("java-noidem");
        try (CutProxy proxy = new CutProxy(localPort, 9, 2)) {
            Sends sends = sendThrough(proxy, new ProducerConfig().setCompression("zstd"), t, "jni", n);
            assertTrue(proxy.preambles.stream().allMatch(v -> v == 3), "preambles: " + proxy.preambles);
            assertTrue(!proxy.granted.isEmpty() && proxy.granted.stream().allMatch(f -> (f & Protocol.FEATURE_IDEMPOTENCE) == 0),
                    "delivery mode kafka granted idempotence: " + proxy.granted);
            assertTrue(proxy.produces.get() > 0);
            assertEquals(0, proxy.sequenced.get(), "frames with a sequence on connections not granted idempotence");
            verify(t, "jni", n, List.of(), sends);
        }
    }

    @Test
    void deliversEveryRecord() throws Exception {
        agent = startAgent(BROKERS);
        String t = topic("java-all");
        int n = 20_000;
        AtomicInteger ok = new AtomicInteger();
        Sends sends = new Sends();
        AtomicReference<Throwable> fromCallback = new AtomicReference<>();
        try (Producer p = new Producer(new ProducerConfig().setAddresses(List.of("unix:" + socket)).setCompression("zstd"))) {
            for (int i = 0; i < n; i++) {
                boolean last = i == n - 1;
                p.send(t, ("k" + i % 13).getBytes(StandardCharsets.UTF_8), seqValue("jav", i, item(i)), r -> {
                    if (last) {
                        try {
                            p.flush(); // would wait for itself
                        } catch (Throwable e) {
                            fromCallback.set(e);
                        }
                        sleep(200); // a slow callback: flush must still wait for it
                    }
                    sends.add(r);
                    if (r.isSuccessful()) {
                        ok.incrementAndGet();
                    }
                });
            }
            p.flush();
            assertEquals(n, ok.get(), "flush returned before every callback had");
        }
        assertTrue(fromCallback.get() instanceof IllegalStateException, "flush from a callback: " + fromCallback.get());
        // Nothing disturbed the run: unless the agent asked for resends
        // (the bounds then allow for them), every record is read exactly
        // once, in order: 0 duplicated, 0 out of order.
        verify(t, "jav", n, List.of(), sends);
    }

    @Test
    void agentRestartMidStream() throws Exception {
        agent = startAgent(BROKERS);
        String t = topic("java-restart");
        int n = 60_000;
        ConcurrentHashMap<Long, AtomicInteger> calls = new ConcurrentHashMap<>();
        List<Long> failed = java.util.Collections.synchronizedList(new ArrayList<>());
        Sends sends = new Sends();
        ProducerConfig cfg = new ProducerConfig().setAddresses(List.of("unix:" + socket)).setBaseRetryBackoffMs(20).setMaxRetryBackoffMs(300).setRetries(100);
        try (Producer p = new Producer(cfg)) {
            for (long i = 0; i < n; i++) {
                long id = i;
                calls.put(id, new AtomicInteger());
                p.send(t, null, seqValue("jar", i, item(i)), r -> {
                    calls.get(id).incrementAndGet();
                    sends.add(r);
                    if (!r.isSuccessful()) {
                        failed.add(id);
                    }
                });
                if (i == n / 3) {
                    agent.destroyForcibly().waitFor(10, TimeUnit.SECONDS);
                    agent = startAgent(BROKERS);
                }
                if (i % 1000 == 0) {
                    Thread.sleep(2);
                }
            }
            p.flush();
        }
        for (AtomicInteger c : calls.values()) {
            assertEquals(1, c.get(), "a callback did not run exactly once");
        }
        assertEquals(List.of(), failed, "records failed across the restart");
        // At least once: the records the killed agent held unanswered were
        // sent again, so some may be read twice, or after later ones; only
        // those (verify bounds both by the producer's resends).
        verify(t, "jar", n, failed, sends);
    }

    @Test
    void kafkaDownRetriesThenSuccess() throws Exception {
        // Kafka unreachable: the agent answers ack_timeout after 1 s, the
        // producer sends again; the agent comes back with Kafka and the
        // retries succeed.
        agent = startAgent("127.0.0.1:" + freePort(), "receivers.local.ack_timeout=1s");
        String t = topic("java-down");
        ProducerConfig cfg = new ProducerConfig().setAddresses(List.of("unix:" + socket)).setBaseRetryBackoffMs(100).setMaxRetryBackoffMs(500).setRetries(50);
        Sends sends = new Sends();
        long restarted;
        try (Producer p = new Producer(cfg)) {
            List<java.util.concurrent.CompletableFuture<Result>> fs = new ArrayList<>();
            for (long i = 0; i < 100; i++) {
                fs.add(p.send(t, null, seqValue("jkd", i, item(i)), null));
            }
            Thread.sleep(2500);
            agent.destroyForcibly().waitFor(10, TimeUnit.SECONDS);
            restarted = System.currentTimeMillis();
            agent = startAgent(BROKERS);
            p.flush();
            for (var f : fs) {
                Result r = f.get();
                assertTrue(r.isSuccessful(), r.toString());
                assertTrue(r.getAttempts().size() > 1, "no retry recorded: " + r);
                sends.add(r, restarted);
            }
        }
        // The first agent never reached Kafka: its frames, answered
        // ack_timeout or cut by its end, were never written, so only sends
        // to the second agent count (an attempt that ended after it
        // started; one cut by the first agent's end may be noticed late and
        // counted too, which only loosens the bounds). Normally: every
        // record read once.
        verify(t, "jkd", 100, List.of(), sends);
    }

    @Test
    void memoryCapBlocksThenFails() throws Exception {
        agent = startAgent("127.0.0.1:" + freePort()); // nothing is ever acknowledged
        // totalSizeInBytes counts what the producer holds, its connection's
        // buffers included (about 320 KiB a send thread): 1 MiB leaves room
        // for a few hundred 1 KB records.
        ProducerConfig cfg = new ProducerConfig().setAddresses(List.of("unix:" + socket)).setTotalSizeInBytes(1 << 20).setMaxBlockMs(300);
        Producer p = new Producer(cfg);
        byte[] v = new byte[1000];
        AtomicInteger accepted = new AtomicInteger(), closed = new AtomicInteger();
        long start = System.nanoTime();
        BufferFullException e = assertThrows(BufferFullException.class, () -> {
            for (int i = 0; i < 100_000; i++) {
                p.send("t", null, v, r -> {
                    if (r.getErrorCode().equals("closed")) {
                        closed.incrementAndGet();
                    }
                });
                accepted.incrementAndGet();
            }
        });
        assertTrue(System.nanoTime() - start >= TimeUnit.MILLISECONDS.toNanos(300), "send did not wait maxBlockMs");
        assertTrue(e.getMessage().contains("totalSizeInBytes"), e.getMessage());
        assertTrue(accepted.get() > 10 && accepted.get() < 1100, "accepted " + accepted.get() + " records of 1 KB under a 1 MiB bound");
        // Every accepted record is answered at close: none is dropped silently.
        p.close(Duration.ofMillis(200));
        assertEquals(accepted.get(), closed.get());
    }

    @Test
    void oversizeRecordRefusedWithTheAgentsReason() throws Exception {
        agent = startAgent(BROKERS);
        String t = topic("java-big");
        try (Producer p = new Producer(new ProducerConfig().setAddresses(List.of("unix:" + socket)).setCompression("none"))) {
            Result r = p.send(t, null, new byte[1_500_000], null).get(60, TimeUnit.SECONDS);
            assertEquals("record_too_large", r.getErrorCode(), r.toString());
            Result ok = p.send(t, "small").get(60, TimeUnit.SECONDS);
            assertTrue(ok.isSuccessful(), ok.toString());
        }
    }
}
