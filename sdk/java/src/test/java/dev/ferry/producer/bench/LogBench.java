package dev.ferry.producer.bench;

import java.lang.management.ManagementFactory;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicLong;

import dev.ferry.producer.BufferFullException;
import dev.ferry.producer.LogItem;
import dev.ferry.producer.Producer;
import dev.ferry.producer.ProducerConfig;

/**
 * The Java log producer's benchmark (seed 004) against ferry: 10 threads
 * call send() with its 4-field, ~580-byte log sample (a sequence suffix on
 * every field so compression stays honest), each record a LogItem as one
 * JSON object. Prints one line of key=value figures for make bench.
 *
 * <p>A warm-up of {@code --warmup} records (default a fifth of
 * {@code --records}) goes first and is not counted: the seed's run sent
 * 200 million records, so its figures are the JIT-compiled steady state,
 * which a run of a few seconds only reaches after it. With
 * {@code --agent-pid} the agent's CPU is read from /proc for the measured
 * phase alone.
 *
 * <pre>
 * java -cp ... dev.ferry.producer.bench.LogBench --address unix:ferry-data/ferry.sock --topic T
 *      [--threads 10] [--records 200000] [--send-threads 16] [--total-size 104857600]
 *      [--batch-size 2097152] [--batch-count 32768] [--linger-ms 2000] [--compression lz4]
 *      [--warmup 40000] [--agent-pid PID] [--idempotence true]
 * </pre>
 */
public final class LogBench {
    public static void main(String[] args) throws Exception {
        String address = "unix:ferry-data/ferry.sock", topic = "java-bench", compression = "lz4";
        int threads = 10, sendThreads = 16, batchCount = 32768, linger = 2000;
        long records = 200_000, totalSize = 104_857_600L, warmup = -1;
        int agentPid = 0;
        boolean idempotence = true; // the producer's default; false: what sequences cost (spool mode)
        int batchSize = 2_097_152;
        for (int i = 0; i + 1 < args.length; i += 2) {
            String v = args[i + 1];
            switch (args[i]) {
                case "--address": address = v; break;
                case "--topic": topic = v; break;
                case "--threads": threads = Integer.parseInt(v); break;
                case "--records": records = Long.parseLong(v); break;
                case "--send-threads": sendThreads = Integer.parseInt(v); break;
                case "--total-size": totalSize = Long.parseLong(v); break;
                case "--batch-size": batchSize = Integer.parseInt(v); break;
                case "--batch-count": batchCount = Integer.parseInt(v); break;
                case "--linger-ms": linger = Integer.parseInt(v); break;
                case "--compression": compression = v; break;
                case "--warmup": warmup = Long.parseLong(v); break;
                case "--agent-pid": agentPid = Integer.parseInt(v); break;
                case "--idempotence": idempotence = Boolean.parseBoolean(v); break;
                default: throw new IllegalArgumentException("unknown flag " + args[i]);
            }
        }
        ProducerConfig cfg = new ProducerConfig().setAddresses(List.of(address)).setSendThreads(sendThreads).setTotalSizeInBytes(totalSize)
                .setBatchSizeInBytes(batchSize).setBatchCountThreshold(batchCount).setLingerMs(linger).setCompression(compression)
                .setMaxBlockMs(60_000).setClientName("ferry-java-bench").setIdempotence(idempotence);
        Producer p = new Producer(cfg);
        if (warmup < 0) {
            warmup = records / 5;
        }
        long warmFailed = 0;
        if (warmup > 0) {
            long[] w = phase(p, topic, threads, warmup, 0);
            warmFailed = w[3] - w[0];
        }
        var os = (com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean();
        long cpu0 = os.getProcessCpuTime(), agent0 = agentTicks(agentPid);
        long t0 = System.nanoTime();
        long[] f = phase(p, topic, threads, records, warmup);
        long t1 = System.nanoTime();
        long cpu1 = os.getProcessCpuTime(), agent1 = agentTicks(agentPid);
        p.close(Duration.ofSeconds(30));
        double sec = (t1 - t0) / 1e9;
        System.out.printf("records=%d acked=%d failed=%d seconds=%.3f raw_mb_s=%.3f compressed_mb_s=%.3f jvm_cpu=%.1f agent_cpu=%.1f frames=%d warmup=%d warmup_failed=%d%n",
                f[3], f[0], f[1], sec, f[2] / sec / (1 << 20), f[4] / sec / (1 << 20),
                (cpu1 - cpu0) / 1e9 / sec * 100, agentPid == 0 ? -1 : (agent1 - agent0) / (double) TICKS / sec * 100, f[5], warmup, warmFailed);
    }

    /** Clock ticks per second of /proc/PID/stat's CPU times (USER_HZ, 100 on Linux). */
    private static final long TICKS = 100;

    /** The agent's user + system CPU so far, in clock ticks (0 without a pid). */
    static long agentTicks(int pid) throws java.io.IOException {
        if (pid == 0) {
            return 0;
        }
        String st = java.nio.file.Files.readString(java.nio.file.Path.of("/proc/" + pid + "/stat"));
        String[] f = st.substring(st.lastIndexOf(')') + 2).split(" ");
        return Long.parseLong(f[11]) + Long.parseLong(f[12]); // utime, stime (fields 14 and 15)
    }

    /**
     * Sends records (threads at once, sequence numbers from first) and waits
     * until all are completed. Returns {acked, failed, raw bytes, records,
     * bytes sent to the agent, frames}.
     */
    static long[] phase(Producer p, String topic, int threads, long records, long first) throws InterruptedException {
        AtomicLong ok = new AtomicLong(), failed = new AtomicLong(), raw = new AtomicLong();
        long perThread = records / threads;
        long sent0 = p.getSentBytes(), frames0 = p.getSentFrames();
        CountDownLatch done = new CountDownLatch(threads);
        for (int t = 0; t < threads; t++) {
            final int th = t;
            Thread w = new Thread(() -> {
                try {
                    for (long i = 0; i < perThread; i++) {
                        String seq = "_" + (first + th * perThread + i);
                        LogItem item = sample(seq);
                        byte[] v = item.toJson();
                        raw.addAndGet(v.length);
                        try {
                            p.send(topic, null, v, null, r -> {
                                if (r.isSuccessful()) {
                                    ok.incrementAndGet();
                                } else {
                                    failed.incrementAndGet();
                                }
                            });
                        } catch (BufferFullException e) {
                            failed.incrementAndGet();
                        }
                    }
                } finally {
                    done.countDown();
                }
            });
            w.start();
        }
        done.await();
        p.flush();
        return new long[] {ok.get(), failed.get(), raw.get(), perThread * threads, p.getSentBytes() - sent0, p.getSentFrames() - frames0};
    }

    /** The seed's log sample: 4 fields, each with the sequence suffix. */
    static LogItem sample(String seq) {
        StringBuilder msg = new StringBuilder(480);
        for (int k = 0; k < 6; k++) {
            if (k > 0) {
                msg.append(',');
            }
            msg.append(k).append("测试日志_____abcdefghijklmnopqrstuvwxyz~!@#$%^&*()_0123456789").append(seq);
        }
        return new LogItem().pushBack("level", "INFO" + seq).pushBack("thread", "pool-1-thread-2" + seq)
                .pushBack("location", "com.jdcloud.logs.producer.core.BatchSender.sendBatch(BatchSender.java:117)" + seq)
                .pushBack("message", msg.toString());
    }
}
