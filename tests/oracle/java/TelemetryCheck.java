// KIP-714 from Kafka's Java client: a producer (enable.metrics.push is true by default)
// fetches its subscription, prints its client instance id as JSON, and sends records for up
// to the given seconds, pushing its metrics meanwhile, then closes (its last, terminating
// push). Arguments: bootstrap servers, client id, topic, seconds.
import java.time.Duration;
import java.util.Properties;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.StringSerializer;

public class TelemetryCheck {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put("bootstrap.servers", args[0]);
        props.put("client.id", args[1]);
        props.put("key.serializer", StringSerializer.class.getName());
        props.put("value.serializer", StringSerializer.class.getName());
        long until = System.currentTimeMillis() + 1000L * Integer.parseInt(args[3]);
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(props)) {
            String id = String.valueOf(producer.clientInstanceId(Duration.ofSeconds(30)));
            System.out.println("{\"client_instance_id\": \"" + id + "\"}");
            System.out.flush();
            while (System.currentTimeMillis() < until) {
                producer.send(new ProducerRecord<>(args[2], "k", "v")).get();
                Thread.sleep(100);
            }
        }
    }
}
