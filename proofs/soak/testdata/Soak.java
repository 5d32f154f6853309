// Soak is the soak's Java load: ferry's Java SDK (the local protocol) and
// Apache Kafka's own Java producer (idempotent, acks=all, through ferry's
// Kafka front) sending sequence-id records at a fixed rate, each with the
// application token read from a file (a new token there, after a key
// rotation, makes a new producer, as an operator's rollout would).
//
// Protocol with the Go test: it prints "A <src> <seq>" for every record the
// agent acknowledged (the callback succeeded), "O <src> <n>" once at the end
// with the number of ids it offered, then "done". It stops producing when
// its standard input has a line (or closes), and gives its producers 20 s to
// finish.
import dev.ferry.producer.Producer;
import dev.ferry.producer.ProducerConfig;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.io.BufferedOutputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class Soak {
    static final PrintStream out = new PrintStream(new BufferedOutputStream(System.out, 1 << 16), false, StandardCharsets.UTF_8);
    static final AtomicBoolean stop = new AtomicBoolean();

    static synchronized void emit(String line) {
        out.println(line);
    }

    public static void main(String[] args) throws Exception {
        String sdkAddr = null, kafkaAddr = null, topic = null, tokenFile = null;
        int rate = 200, sdkSrc = 2, kafkaSrc = 3, size = 100;
        for (int i = 0; i < args.length; i += 2) {
            switch (args[i]) {
                case "--sdk": sdkAddr = args[i + 1]; break;
                case "--kafka": kafkaAddr = args[i + 1]; break;
                case "--topic": topic = args[i + 1]; break;
                case "--token-file": tokenFile = args[i + 1]; break;
                case "--rate": rate = Integer.parseInt(args[i + 1]); break;
                case "--size": size = Integer.parseInt(args[i + 1]); break;
                case "--sdk-src": sdkSrc = Integer.parseInt(args[i + 1]); break;
                case "--kafka-src": kafkaSrc = Integer.parseInt(args[i + 1]); break;
                default: throw new IllegalArgumentException("unknown argument " + args[i]);
            }
        }
        Thread flusher = new Thread(() -> {
            while (true) {
                try { Thread.sleep(100); } catch (InterruptedException e) { return; }
                synchronized (Soak.class) { out.flush(); }
            }
        });
        flusher.setDaemon(true);
        flusher.start();
        Thread stdin = new Thread(() -> {
            try {
                new BufferedReader(new InputStreamReader(System.in)).readLine();
            } catch (Exception e) {
                // closed: stop all the same
            }
            stop.set(true);
        });
        stdin.setDaemon(true);
        stdin.start();

        Path tf = Path.of(tokenFile);
        Loop sdk = new SdkLoop(sdkAddr, topic, tf, rate, sdkSrc, size);
        Loop kafka = new KafkaLoop(kafkaAddr, topic, tf, rate, kafkaSrc, size);
        Thread a = new Thread(sdk::run, "soak-sdk"), b = new Thread(kafka::run, "soak-kafka");
        a.start();
        b.start();
        a.join();
        b.join();
        emit("O " + sdkSrc + " " + sdk.seq);
        emit("O " + kafkaSrc + " " + kafka.seq);
        emit("done");
        synchronized (Soak.class) { out.flush(); }
        System.exit(0);
    }

    static String readToken(Path f) {
        try {
            return Files.readString(f).trim();
        } catch (Exception e) {
            return "";
        }
    }

    /** One producer kind: records at rate per second, the producer made anew when the token changes. */
    abstract static class Loop {
        final String topic;
        final Path tokenFile;
        final int rate, src;
        final String pad;
        long seq;

        Loop(String topic, Path tokenFile, int rate, int src, int size) {
            this.topic = topic;
            this.tokenFile = tokenFile;
            this.rate = rate;
            this.src = src;
            this.pad = "x".repeat(Math.max(0, size - 16));
        }

        abstract void open(String token);
        abstract void send(long seq, byte[] value) throws Exception;
        abstract void close(Duration d);

        void run() {
            String token = readToken(tokenFile);
            open(token);
            long start = System.nanoTime();
            long lastCheck = 0;
            while (!stop.get()) {
                long now = System.nanoTime();
                if (now - lastCheck > 500_000_000L) {
                    lastCheck = now;
                    String t = readToken(tokenFile);
                    if (!t.isEmpty() && !t.equals(token)) {
                        // The old producer finishes what it holds while the new one starts.
                        close(Duration.ofSeconds(10));
                        token = t;
                        open(token);
                    }
                }
                long due = (now - start) * rate / 1_000_000_000L;
                if (seq >= due) {
                    try { Thread.sleep(5); } catch (InterruptedException e) { break; }
                    continue;
                }
                long s = seq++;
                byte[] v = (src + ":" + s + ":" + pad).getBytes(StandardCharsets.UTF_8);
                try {
                    send(s, v);
                } catch (Exception e) {
                    // Refused before it was sent (buffer full, closed): not acknowledged.
                }
            }
            close(Duration.ofSeconds(20));
        }
    }

    static final class SdkLoop extends Loop {
        final String addr;
        Producer p;

        SdkLoop(String addr, String topic, Path tf, int rate, int src, int size) {
            super(topic, tf, rate, src, size);
            this.addr = addr;
        }

        void open(String token) {
            p = new Producer(new ProducerConfig().setAddresses(List.of(addr)).setToken(token).setClientName("soak-java")
                    .setRequestIds(true).setMaxBlockMs(2000).setLingerMs(5));
        }

        void send(long s, byte[] v) {
            // One request id per 100 records: the SDK makes a frame per
            // request id, each with a buffer of batchSizeInBytes.
            p.send(topic, null, v, null, "soak-" + src + "-b" + (s / 100), r -> {
                if (r.isSuccessful()) emit("A " + src + " " + s);
            });
        }

        void close(Duration d) {
            p.close(d);
        }
    }

    static final class KafkaLoop extends Loop {
        final String addr;
        KafkaProducer<byte[], byte[]> p;

        KafkaLoop(String addr, String topic, Path tf, int rate, int src, int size) {
            super(topic, tf, rate, src, size);
            this.addr = addr;
        }

        void open(String token) {
            Properties c = new Properties();
            c.put("bootstrap.servers", addr);
            c.put("enable.idempotence", "true");
            c.put("acks", "all");
            c.put("linger.ms", "5");
            c.put("max.block.ms", "2000");
            c.put("request.timeout.ms", "30000");
            c.put("delivery.timeout.ms", "120000");
            c.put("reconnect.backoff.max.ms", "1000");
            c.put("security.protocol", "SASL_PLAINTEXT");
            c.put("sasl.mechanism", "PLAIN");
            c.put("sasl.jaas.config", "org.apache.kafka.common.security.plain.PlainLoginModule required username=\"soak\" password=\"" + token + "\";");
            p = new KafkaProducer<>(c, new ByteArraySerializer(), new ByteArraySerializer());
        }

        void send(long s, byte[] v) {
            p.send(new ProducerRecord<>(topic, v), (md, e) -> {
                if (e == null) emit("A " + src + " " + s);
            });
        }

        void close(Duration d) {
            p.close(d);
        }
    }
}
