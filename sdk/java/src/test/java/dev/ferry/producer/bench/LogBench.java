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
 * <pre>
 * java -cp ... dev.ferry.producer.bench.LogBench --address unix:ferry-data/ferry.sock --topic T
 *      [--threads 10] [--records 200000] [--send-threads 16] [--total-size 104857600]
 *      [--batch-size 2097152] [--batch-count 32768] [--linger-ms 2000] [--compression lz4]
 * </pre>
 */
public final class LogBench {
    public static void main(String[] args) throws Exception {
        String address = "unix:ferry-data/ferry.sock", topic = "java-bench", compression = "lz4";
        int threads = 10, sendThreads = 16, batchCount = 32768, linger = 2000;
        long records = 200_000, totalSize = 104_857_600L;
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
                default: throw new IllegalArgumentException("unknown flag " + args[i]);
            }
        }
        ProducerConfig cfg = new ProducerConfig().setAddresses(List.of(address)).setSendThreads(sendThreads).setTotalSizeInBytes(totalSize)
                .setBatchSizeInBytes(batchSize).setBatchCountThreshold(batchCount).setLingerMs(linger).setCompression(compression)
                .setMaxBlockMs(60_000).setClientName("ferry-java-bench");
        Producer p = new Producer(cfg);
        AtomicLong ok = new AtomicLong(), failed = new AtomicLong(), raw = new AtomicLong();
        long perThread = records / threads;
        CountDownLatch done = new CountDownLatch(threads);
        var os = (com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean();
        long cpu0 = os.getProcessCpuTime();
        long t0 = System.nanoTime();
        final String tp = topic;
        for (int t = 0; t < threads; t++) {
            final int th = t;
            Thread w = new Thread(() -> {
                try {
                    for (long i = 0; i < perThread; i++) {
                        String seq = "_" + (th * perThread + i);
                        LogItem item = sample(seq);
                        byte[] v = item.toJson();
                        raw.addAndGet(v.length);
                        try {
                            p.send(tp, null, v, null, r -> {
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
        long t1 = System.nanoTime();
        long cpu1 = os.getProcessCpuTime();
        p.close(Duration.ofSeconds(30));
        double sec = (t1 - t0) / 1e9;
        System.out.printf("records=%d acked=%d failed=%d seconds=%.3f raw_mb_s=%.3f compressed_mb_s=%.3f jvm_cpu=%.1f frames=%d%n",
                perThread * threads, ok.get(), failed.get(), sec, raw.get() / sec / (1 << 20), p.getSentBytes() / sec / (1 << 20),
                (cpu1 - cpu0) / 1e9 / sec * 100, p.getSentFrames());
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
