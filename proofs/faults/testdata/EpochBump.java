// The Java producer through ferry's Kafka front, driven line by line on
// stdin so a test can stall the cluster behind ferry at the right moment:
//
//   send <value>   send one record; prints "ACK <value>" when the front
//                  answered it written, "ERR <value> <exception>" if not
//   close          flush, close, print "DONE"
//
// With the cluster stalled, batches expire at the client
// (delivery.timeout.ms), and the idempotent producer bumps its epoch and
// starts every sequence at 0 again (TransactionManager's
// bumpIdempotentEpochAndResetIdIfNeeded; it logs "ProducerId set to ...
// with epoch 1").
//
// Run as a source file: java -cp <kafka classpath> EpochBump.java <bootstrap> <topic>
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.Properties;

import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.StringSerializer;

public class EpochBump {
    public static void main(String[] args) throws Exception {
        Properties p = new Properties();
        p.put("bootstrap.servers", args[0]);
        p.put("key.serializer", StringSerializer.class.getName());
        p.put("value.serializer", StringSerializer.class.getName());
        p.put("enable.idempotence", "true");
        p.put("acks", "all");
        p.put("linger.ms", "0");
        p.put("max.in.flight.requests.per.connection", "2");
        p.put("request.timeout.ms", "1500");
        p.put("delivery.timeout.ms", "3000");
        p.put("retry.backoff.ms", "100");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(p)) {
            for (String line; (line = in.readLine()) != null; ) {
                if (line.equals("close")) {
                    break;
                }
                String v = line.substring("send ".length());
                producer.send(new ProducerRecord<>(args[1], v), (md, e) -> {
                    synchronized (System.out) {
                        System.out.println(e == null ? "ACK " + v : "ERR " + v + " " + e.getClass().getSimpleName());
                        System.out.flush();
                    }
                });
            }
            producer.flush();
        }
        System.out.println("DONE");
    }
}
