import java.time.Duration;
import java.util.*;
import java.util.concurrent.*;
import java.util.concurrent.atomic.*;
import org.apache.kafka.clients.admin.*;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.clients.producer.*;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.serialization.*;

/** KIP-932 share consumers (Kafka's KafkaShareConsumer) against one broker: each scenario
 * prints one JSON line {"scenario": name, "result": {...}} or {"scenario": name, "error": ...}.
 * Args: bootstrap suffix scenario... */
public class ShareConsumerCheck {
    static String bootstrap;
    static String suffix;

    public static void main(String[] args) throws Exception {
        bootstrap = args[0];
        suffix = args[1];
        for (int i = 2; i < args.length; i++) {
            String name = args[i];
            try {
                Map<String, Object> result = switch (name) {
                    case "share-many" -> shareMany(3, 30);
                    case "share-poison" -> poison();
                    case "share-hold" -> hold();
                    case "share-drain" -> drain();
                    case "share-accept-half" -> acceptHalf();
                    case "share-rest" -> rest();
                    default -> throw new IllegalArgumentException(name);
                };
                System.out.println("{\"scenario\":\"" + name + "\",\"result\":" + json(result) + "}");
            } catch (Throwable t) {
                String msg = String.valueOf(t).replace("\\", "/").replace("\"", "'");
                System.out.println("{\"scenario\":\"" + name + "\",\"error\":\"" + msg + "\"}");
            }
            System.out.flush();
        }
    }

    static String json(Map<String, Object> m) {
        StringBuilder b = new StringBuilder("{");
        for (var e : new TreeMap<>(m).entrySet()) {
            if (b.length() > 1) b.append(',');
            b.append('"').append(e.getKey()).append("\":");
            Object v = e.getValue();
            b.append(v instanceof String ? "\"" + v + "\"" : String.valueOf(v));
        }
        return b.append('}').toString();
    }

    static Admin admin() {
        return Admin.create(Map.of(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap));
    }

    static void setup(String topic, String group, int records) throws Exception {
        try (Admin a = admin()) {
            a.createTopics(List.of(new NewTopic(topic, 1, (short) 1))).all().get();
            ConfigResource g = new ConfigResource(ConfigResource.Type.GROUP, group);
            a.incrementalAlterConfigs(Map.of(g, List.of(new AlterConfigOp(
                new org.apache.kafka.clients.admin.ConfigEntry("share.auto.offset.reset", "earliest"),
                AlterConfigOp.OpType.SET)))).all().get();
        }
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("key.serializer", StringSerializer.class.getName());
        p.put("value.serializer", StringSerializer.class.getName());
        try (var prod = new KafkaProducer<String, String>(p)) {
            for (int i = 0; i < records; i++) prod.send(new ProducerRecord<>(topic, "k" + i, "v" + i));
            prod.flush();
        }
    }

    static KafkaShareConsumer<String, String> consumer(String group, boolean explicit) {
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("group.id", group);
        p.put("key.deserializer", StringDeserializer.class.getName());
        p.put("value.deserializer", StringDeserializer.class.getName());
        if (explicit) p.put("share.acknowledgement.mode", "explicit");
        return new KafkaShareConsumer<>(p);
    }

    /** n share consumers on one partition: every record consumed, none twice. */
    static Map<String, Object> shareMany(int n, int records) throws Exception {
        String topic = "share-many-" + suffix, group = "sg-many-" + suffix;
        setup(topic, group, records);
        Set<String> seen = ConcurrentHashMap.newKeySet();
        AtomicInteger dup = new AtomicInteger();
        AtomicInteger consumersWithRecords = new AtomicInteger();
        ExecutorService pool = Executors.newFixedThreadPool(n);
        List<Future<?>> fs = new ArrayList<>();
        long deadline = System.currentTimeMillis() + 30_000;
        for (int c = 0; c < n; c++) {
            fs.add(pool.submit(() -> {
                try (var cons = consumer(group, false)) {
                    cons.subscribe(List.of(topic));
                    boolean got = false;
                    while (seen.size() < records && System.currentTimeMillis() < deadline) {
                        for (var r : cons.poll(Duration.ofMillis(200))) {
                            got = true;
                            if (!seen.add(r.value())) dup.incrementAndGet();
                        }
                    }
                    cons.commitSync();
                    if (got) consumersWithRecords.incrementAndGet();
                }
                return null;
            }));
        }
        for (var f : fs) f.get();
        pool.shutdown();
        return Map.of("consumed", seen.size(), "duplicates", dup.get());
    }

    /** Acquire records and die holding them (no acknowledgement, no session close). */
    static Map<String, Object> hold() throws Exception {
        String topic = "share-kill-" + suffix, group = "sg-kill-" + suffix;
        setup(topic, group, 10);
        var cons = consumer(group, true);
        cons.subscribe(List.of(topic));
        int held = 0;
        long deadline = System.currentTimeMillis() + 20_000;
        while (held == 0 && System.currentTimeMillis() < deadline) held += cons.poll(Duration.ofMillis(200)).count();
        System.out.println("{\"scenario\":\"share-hold\",\"result\":{\"held\":" + (held > 0) + "}}");
        System.out.flush();
        Runtime.getRuntime().halt(0);
        return Map.of();
    }

    /** After share-hold died: every record is consumed, the held ones redelivered once their
     * acquisition lock expired (delivery count 2). */
    static Map<String, Object> drain() throws Exception {
        String topic = "share-kill-" + suffix, group = "sg-kill-" + suffix;
        Set<String> seen = new HashSet<>();
        int redelivered = 0;
        long deadline = System.currentTimeMillis() + 60_000;
        try (var cons = consumer(group, false)) {
            cons.subscribe(List.of(topic));
            while (seen.size() < 10 && System.currentTimeMillis() < deadline) {
                for (var r : cons.poll(Duration.ofMillis(200))) {
                    seen.add(r.value());
                    if (r.deliveryCount().orElse((short) 1) > 1) redelivered++;
                }
            }
            cons.commitSync();
        }
        return Map.of("consumed", seen.size(), "some_redelivered", redelivered > 0);
    }

    /** Accept five of ten records (acknowledged and committed), hold the others, and die. */
    static Map<String, Object> acceptHalf() throws Exception {
        String topic = "share-crash-" + suffix, group = "sg-crash-" + suffix;
        setup(topic, group, 10);
        var cons = consumer(group, true);
        cons.subscribe(List.of(topic));
        List<String> accepted = new ArrayList<>();
        long deadline = System.currentTimeMillis() + 20_000;
        while (accepted.size() < 5 && System.currentTimeMillis() < deadline) {
            for (var r : cons.poll(Duration.ofMillis(200))) {
                if (accepted.size() < 5 && r.offset() < 5) {
                    accepted.add(r.value());
                    cons.acknowledge(r, AcknowledgeType.ACCEPT);
                }
            }
            cons.commitSync();
        }
        System.out.println("{\"scenario\":\"share-accept-half\",\"result\":{\"accepted\":" + accepted.size() + "}}");
        System.out.flush();
        Runtime.getRuntime().halt(0);
        return Map.of();
    }

    /** After share-accept-half (and a broker crash): the other five records, and never an
     * accepted one. */
    static Map<String, Object> rest() throws Exception {
        String topic = "share-crash-" + suffix, group = "sg-crash-" + suffix;
        Set<String> seen = new TreeSet<>();
        long deadline = System.currentTimeMillis() + 60_000;
        try (var cons = consumer(group, false)) {
            cons.subscribe(List.of(topic));
            while (seen.size() < 5 && System.currentTimeMillis() < deadline) {
                for (var r : cons.poll(Duration.ofMillis(200))) seen.add(r.value());
            }
            long until = System.currentTimeMillis() + 1000;  // nothing more comes
            while (System.currentTimeMillis() < until) {
                for (var r : cons.poll(Duration.ofMillis(200))) seen.add(r.value());
            }
            cons.commitSync();
        }
        return Map.of("values", String.join("+", seen));
    }

    /** A record released every time is archived after share.delivery.count.limit (5). */
    static Map<String, Object> poison() throws Exception {
        String topic = "share-poison-" + suffix, group = "sg-poison-" + suffix;
        setup(topic, group, 2);
        int poisonDeliveries = 0;
        Set<String> accepted = new HashSet<>();
        long deadline = System.currentTimeMillis() + 20_000;
        try (var cons = consumer(group, true)) {
            cons.subscribe(List.of(topic));
            while (System.currentTimeMillis() < deadline && (accepted.size() < 1 || poisonDeliveries < 5)) {
                for (var r : cons.poll(Duration.ofMillis(200))) {
                    if (r.value().equals("v0")) {
                        poisonDeliveries++;
                        cons.acknowledge(r, AcknowledgeType.RELEASE);
                    } else {
                        accepted.add(r.value());
                        cons.acknowledge(r, AcknowledgeType.ACCEPT);
                    }
                }
                cons.commitSync();
            }
            // once archived it never comes back
            long until = System.currentTimeMillis() + 1500;
            while (System.currentTimeMillis() < until) {
                for (var r : cons.poll(Duration.ofMillis(200))) {
                    if (r.value().equals("v0")) poisonDeliveries++;
                    cons.acknowledge(r, AcknowledgeType.ACCEPT);
                }
                cons.commitSync();
            }
        }
        return Map.of("poison_deliveries", poisonDeliveries, "accepted", accepted.size());
    }
}
