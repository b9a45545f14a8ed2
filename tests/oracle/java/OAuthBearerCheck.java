// Apache Kafka's Java client over SASL/OAUTHBEARER against one broker, for
// tests/oracle/test_differential_oauthbearer.py. Each case prints one JSON line,
// {"case", "result"} or {"case", "error"}; the test runs it against samsa and a Kafka node and
// compares the lines. Run: java -cp <kafka classpath> OAuthBearerCheck.java <unsecured bootstrap>
// <signed bootstrap> <good token file> <badly signed token file> <suffix>
//
// "unsecured": the default login handler (OAuthBearerUnsecuredLoginCallbackHandler) makes an
// unsigned JWT from the JAAS options. "signed"/"signed-bad-signature": OAuthBearerLoginCallbackHandler with
// FileJwtRetriever reads a signed JWT from a file (sasl.oauthbearer.token.endpoint.url=file://).

import com.fasterxml.jackson.databind.ObjectMapper;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public class OAuthBearerCheck {
    static final String MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule";

    static Properties unsecured(String bootstrap) {
        Properties p = base(bootstrap);
        p.put("sasl.jaas.config", MODULE + " required unsecuredLoginStringClaim_sub=\"alice\""
                + " unsecuredLoginListClaim_scope=\",kafka\";");
        return p;
    }

    static Properties fromFile(String bootstrap, String tokenFile) {
        Properties p = base(bootstrap);
        p.put("sasl.jaas.config", MODULE + " required;");
        p.put("sasl.login.callback.handler.class",
                "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler");
        p.put("sasl.oauthbearer.jwt.retriever.class",
                "org.apache.kafka.common.security.oauthbearer.FileJwtRetriever");
        p.put("sasl.oauthbearer.token.endpoint.url", "file://" + tokenFile);
        return p;
    }

    static Properties base(String bootstrap) {
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("security.protocol", "SASL_PLAINTEXT");
        p.put("sasl.mechanism", "OAUTHBEARER");
        p.put("request.timeout.ms", "10000");
        p.put("default.api.timeout.ms", "15000");
        return p;
    }

    // Create a topic, produce one record, read it back: what both brokers must agree on.
    static Map<String, Object> roundTrip(Properties p, String topic) throws Exception {
        Map<String, Object> out = new TreeMap<>();
        try (Admin admin = Admin.create(p)) {
            admin.createTopics(List.of(new NewTopic(topic, 1, (short) 1))).all().get();
            out.put("brokers", admin.describeCluster().nodes().get().size());
        }
        Properties pp = new Properties();
        pp.putAll(p);
        pp.put("key.serializer", StringSerializer.class.getName());
        pp.put("value.serializer", StringSerializer.class.getName());
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(pp)) {
            out.put("offset", producer.send(new ProducerRecord<>(topic, "k", "v")).get().offset());
        }
        Properties cp = new Properties();
        cp.putAll(p);
        cp.put("key.deserializer", StringDeserializer.class.getName());
        cp.put("value.deserializer", StringDeserializer.class.getName());
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(cp)) {
            TopicPartition tp = new TopicPartition(topic, 0);
            consumer.assign(List.of(tp));
            consumer.seekToBeginning(List.of(tp));
            long deadline = System.currentTimeMillis() + 15000;
            while (System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(200))) {
                    out.put("read", r.value());
                    return out;
                }
            }
        }
        return out;
    }

    public static void main(String[] args) throws Exception {
        String unsecuredBootstrap = args[0], signedBootstrap = args[1];
        String goodToken = args[2], badToken = args[3], suffix = args[4];
        Map<String, Properties> cases = new TreeMap<>();
        cases.put("unsecured", unsecured(unsecuredBootstrap));
        cases.put("signed", fromFile(signedBootstrap, goodToken));
        cases.put("signed-bad-signature", fromFile(signedBootstrap, badToken));
        cases.put("unsecured-on-signed-listener", unsecured(signedBootstrap));
        ObjectMapper json = new ObjectMapper();
        for (Map.Entry<String, Properties> c : cases.entrySet()) {
            Map<String, Object> line = new TreeMap<>();
            line.put("case", c.getKey());
            try {
                line.put("result", roundTrip(c.getValue(), "oauth-" + c.getKey() + "-" + suffix));
            } catch (Exception e) {
                Throwable t = e.getCause() != null ? e.getCause() : e;
                line.put("error", t.getClass().getSimpleName() + ": " + t.getMessage());
            }
            System.out.println(json.writeValueAsString(line));
        }
    }
}
