package dev.ferry.producer;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

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

import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * The producer against the real ferry binary and real Kafka, both started
 * by make test (FERRY_BIN, FERRY_BENCH_BIN, FERRY_TEST_KAFKA); what reached
 * Kafka is checked by ferry-bench consume --verify. Skipped without them.
 */
class AgentTest {
    static final String BROKERS = System.getenv("FERRY_TEST_KAFKA");
    static final String FERRY = System.getenv("FERRY_BIN");
    static final String BENCH = System.getenv("FERRY_BENCH_BIN");

    Path dir;
    Process agent;
    String socket;

    @BeforeEach
    void setUp() throws IOException {
        assumeTrue(BROKERS != null && FERRY != null && BENCH != null, "FERRY_TEST_KAFKA, FERRY_BIN and FERRY_BENCH_BIN are set by make test");
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
        int admin = freePort();
        List<String> cmd = new ArrayList<>(List.of(FERRY, "run", "--set", "exporter.kafka.brokers=[" + brokers + "]",
                "--set", "receivers.local.socket=" + socket, "--set", "receivers.local.listen=127.0.0.1:" + freePort(),
                "--set", "receivers.http.listen=127.0.0.1:" + freePort(), "--set", "telemetry.admin.listen=127.0.0.1:" + admin,
                "--set", "receivers.otlp.enabled=false", "--set", "telemetry.report_interval=0s"));
        for (String s : sets) {
            cmd.add("--set");
            cmd.add(s);
        }
        Process p = new ProcessBuilder(cmd).redirectErrorStream(true).redirectOutput(dir.resolve("agent-" + System.nanoTime() + ".log").toFile()).start();
        long deadline = System.currentTimeMillis() + 20_000;
        while (System.currentTimeMillis() < deadline) {
            try {
                HttpURLConnection c = (HttpURLConnection) new URL("http://127.0.0.1:" + admin + "/healthz").openConnection();
                c.setConnectTimeout(200);
                if (c.getResponseCode() == 200) {
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

    /** Checks Kafka holds every id below n that did not fail. */
    void verify(String topic, String producer, long n, List<Long> failed) throws Exception {
        StringBuilder f = new StringBuilder();
        for (Long id : failed) {
            f.append(f.length() == 0 ? "" : ",").append("[").append(id).append(",").append(id + 1).append("]");
        }
        Path rep = dir.resolve("produced.json");
        Files.writeString(rep, "{\"seq\":{\"producer\":\"" + producer + "\",\"issued\":" + n + ",\"failed\":[" + f + "]}}");
        String out = run(BENCH, "consume", "--bootstrap-server", BROKERS, "--topic", topic, "--verify", "--produced", rep.toString(), "--timeout", "30000");
        assertTrue(out.contains(" 0 lost"), out);
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

    @Test
    void deliversEveryRecord() throws Exception {
        agent = startAgent(BROKERS);
        String t = topic("java-all");
        int n = 20_000;
        AtomicInteger ok = new AtomicInteger();
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
                    if (r.isSuccessful()) {
                        ok.incrementAndGet();
                    }
                });
            }
            p.flush();
            assertEquals(n, ok.get(), "flush returned before every callback had");
        }
        assertTrue(fromCallback.get() instanceof IllegalStateException, "flush from a callback: " + fromCallback.get());
        verify(t, "jav", n, List.of());
    }

    @Test
    void agentRestartMidStream() throws Exception {
        agent = startAgent(BROKERS);
        String t = topic("java-restart");
        int n = 60_000;
        ConcurrentHashMap<Long, AtomicInteger> calls = new ConcurrentHashMap<>();
        List<Long> failed = java.util.Collections.synchronizedList(new ArrayList<>());
        ProducerConfig cfg = new ProducerConfig().setAddresses(List.of("unix:" + socket)).setBaseRetryBackoffMs(20).setMaxRetryBackoffMs(300).setRetries(100);
        try (Producer p = new Producer(cfg)) {
            for (long i = 0; i < n; i++) {
                long id = i;
                calls.put(id, new AtomicInteger());
                p.send(t, null, seqValue("jar", i, item(i)), r -> {
                    calls.get(id).incrementAndGet();
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
        verify(t, "jar", n, failed);
    }

    @Test
    void kafkaDownRetriesThenSuccess() throws Exception {
        // Kafka unreachable: the agent answers ack_timeout after 1 s, the
        // producer sends again; the agent comes back with Kafka and the
        // retries succeed.
        agent = startAgent("127.0.0.1:" + freePort(), "receivers.local.ack_timeout=1s");
        String t = topic("java-down");
        ProducerConfig cfg = new ProducerConfig().setAddresses(List.of("unix:" + socket)).setBaseRetryBackoffMs(100).setMaxRetryBackoffMs(500).setRetries(50);
        try (Producer p = new Producer(cfg)) {
            List<java.util.concurrent.CompletableFuture<Result>> fs = new ArrayList<>();
            for (long i = 0; i < 100; i++) {
                fs.add(p.send(t, null, seqValue("jkd", i, item(i)), null));
            }
            Thread.sleep(2500);
            agent.destroyForcibly().waitFor(10, TimeUnit.SECONDS);
            agent = startAgent(BROKERS);
            p.flush();
            for (var f : fs) {
                Result r = f.get();
                assertTrue(r.isSuccessful(), r.toString());
                assertTrue(r.getAttempts().size() > 1, "no retry recorded: " + r);
            }
        }
        verify(t, "jkd", 100, List.of());
    }

    @Test
    void memoryCapBlocksThenFails() throws Exception {
        agent = startAgent("127.0.0.1:" + freePort()); // nothing is ever acknowledged
        ProducerConfig cfg = new ProducerConfig().setAddresses(List.of("unix:" + socket)).setTotalSizeInBytes(64 << 10).setMaxBlockMs(300);
        Producer p = new Producer(cfg);
        byte[] v = new byte[1000];
        long start = System.nanoTime();
        BufferFullException e = assertThrows(BufferFullException.class, () -> {
            for (int i = 0; i < 1000; i++) {
                p.send("t", null, v, null);
            }
        });
        assertTrue(System.nanoTime() - start >= TimeUnit.MILLISECONDS.toNanos(300), "send did not wait maxBlockMs");
        assertTrue(e.getMessage().contains("totalSizeInBytes"), e.getMessage());
        AtomicInteger closed = new AtomicInteger();
        p.send("t", null, new byte[1], r -> {
            if (r.getErrorCode().equals("closed")) {
                closed.incrementAndGet();
            }
        });
        p.close(Duration.ofMillis(200));
        assertEquals(1, closed.get());
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
