// Apache Kafka's Java client (kafka-clients, on the pinned Kafka's classpath) run against one
// broker through named scenarios. Each scenario prints one JSON line, {"scenario", "result"} or
// {"scenario", "error"}; tests/oracle/test_java_client.py runs this against samsa and a Kafka
// node and compares the lines. Results hold only what both brokers must agree on (no ids, no
// times). Run: java -cp <kafka classpath> JavaClientCheck.java <bootstrap> <suffix> <scenario>...

import com.fasterxml.jackson.databind.ObjectMapper;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.ExecutionException;
import java.util.function.Function;
import java.util.stream.Collectors;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.ConsumerGroupDescription;
import org.apache.kafka.clients.admin.FeatureMetadata;
import org.apache.kafka.clients.admin.NewPartitions;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.ProducerState;
import org.apache.kafka.clients.admin.RecordsToDelete;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.admin.TransactionDescription;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerGroupMetadata;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.consumer.OffsetAndTimestamp;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public class JavaClientCheck {
    static String bootstrap;
    static String suffix;

    interface Scenario {
        Map<String, Object> run() throws Exception;
    }

    public static void main(String[] args) throws Exception {
        bootstrap = args[0];
        suffix = args[1];
        Map<String, Scenario> scenarios = new TreeMap<>();
        scenarios.put("admin", JavaClientCheck::adminScenario);
        scenarios.put("idempotent", JavaClientCheck::idempotent);
        scenarios.put("transactions", JavaClientCheck::transactions);
        scenarios.put("group-classic", () -> group("classic"));
        scenarios.put("group-consumer", () -> group("consumer"));
        scenarios.put("validate-position", JavaClientCheck::validatePosition);
        scenarios.put("offsets-for-times", JavaClientCheck::offsetsForTimes);
        ObjectMapper json = new ObjectMapper();
        for (int i = 2; i < args.length; i++) {
            Map<String, Object> line = new TreeMap<>();
            line.put("scenario", args[i]);
            try {
                line.put("result", scenarios.get(args[i]).run());
            } catch (Throwable t) {
                line.put("error", cause(t).toString());
            }
            System.out.println(json.writeValueAsString(line));
            System.out.flush();
        }
        System.exit(0);
    }

    // -- clients ----------------------------------------------------------------------------

    static Properties common() {
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("request.timeout.ms", "10000");
        p.put("default.api.timeout.ms", "20000");
        return p;
    }

    static Admin admin() {
        Properties p = common();
        p.put(AdminClientConfig.RETRIES_CONFIG, "5");
        return Admin.create(p);
    }

    static KafkaProducer<String, String> producer(String transactionalId) {
        Properties p = common();
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, "20000");
        p.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "20000");
        p.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        if (transactionalId != null) {
            p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, transactionalId);
        }
        return new KafkaProducer<>(p, new StringSerializer(), new StringSerializer());
    }

    static KafkaConsumer<String, String> consumer(String group, Map<String, String> extra) {
        Properties p = common();
        if (group != null) {
            p.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        }
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        p.putAll(extra);
        return new KafkaConsumer<>(p, new StringDeserializer(), new StringDeserializer());
    }

    static String topic(String name, int partitions) throws Exception {
        String t = name + "-" + suffix;
        try (Admin a = admin()) {
            a.createTopics(List.of(new NewTopic(t, partitions, (short) 1))).all().get();
        }
        return t;
    }

    static List<Long> send(KafkaProducer<String, String> p, List<ProducerRecord<String, String>> rs)
            throws Exception {
        List<java.util.concurrent.Future<RecordMetadata>> fs = new ArrayList<>();
        for (ProducerRecord<String, String> r : rs) {
            fs.add(p.send(r));
        }
        List<Long> offsets = new ArrayList<>();
        for (java.util.concurrent.Future<RecordMetadata> f : fs) {
            offsets.add(f.get().offset());
        }
        return offsets;
    }

    static List<ProducerRecord<String, String>> values(String topic, int partition, int n, String prefix) {
        List<ProducerRecord<String, String>> rs = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            rs.add(new ProducerRecord<>(topic, partition, "k" + i, prefix + i));
        }
        return rs;
    }

    /** Poll until ``count`` records arrived (or 20 s passed), then once more for stragglers. */
    static List<ConsumerRecord<String, String>> poll(KafkaConsumer<String, String> c, int count) {
        List<ConsumerRecord<String, String>> out = new ArrayList<>();
        long deadline = System.currentTimeMillis() + 20000;
        while (out.size() < count && System.currentTimeMillis() < deadline) {
            c.poll(Duration.ofMillis(200)).forEach(out::add);
        }
        c.poll(Duration.ofMillis(300)).forEach(out::add);
        return out;
    }

    interface Call {
        void run() throws Exception;
    }

    /** The exception a call ends with, unwrapped from its future ("none" if it returns). */
    static String failureOf(Call c) {
        try {
            c.run();
            return "none";
        } catch (Throwable t) {
            return cause(t).getClass().getSimpleName();
        }
    }

    static Throwable cause(Throwable t) {
        while (t.getCause() != null && (t instanceof ExecutionException
                || t.getClass() == RuntimeException.class
                || t.getClass() == org.apache.kafka.common.KafkaException.class)) {
            t = t.getCause();
        }
        return t;
    }
    /** Sleeps a little between polls; true so it can end a loop condition. */
    static boolean pause() throws InterruptedException {
        Thread.sleep(50);
        return true;
    }

    // -- scenarios --------------------------------------------------------------------------

    static Map<String, Object> adminScenario() throws Exception {
        Map<String, Object> r = new TreeMap<>();
        String t = "java-admin-" + suffix;
        try (Admin a = admin(); KafkaProducer<String, String> p = producer(null)) {
            a.createTopics(List.of(new NewTopic(t, 3, (short) 1)
                    .configs(Map.of("retention.ms", "3600000")))).all().get();
            r.put("create_again", failureOf(() ->
                    a.createTopics(List.of(new NewTopic(t, 3, (short) 1))).all().get()));
            TopicDescription d = a.describeTopics(List.of(t)).allTopicNames().get().get(t);
            r.put("partitions", d.partitions().size());
            r.put("replicas", d.partitions().stream().map(x -> x.replicas().size()).collect(Collectors.toList()));
            r.put("internal", d.isInternal());
            ConfigResource res = new ConfigResource(ConfigResource.Type.TOPIC, t);
            a.incrementalAlterConfigs(Map.of(res, List.of(new AlterConfigOp(
                    new ConfigEntry("segment.ms", "7200000"), AlterConfigOp.OpType.SET)))).all().get();
            // Kafka applies an alteration through its controller and each broker learns it
            // from the metadata log a moment later: a Kafka user polls until it shows.
            Map<String, Object> configs = new TreeMap<>();
            long deadline = System.currentTimeMillis() + 20_000;
            do {
                configs.clear();
                for (ConfigEntry e : a.describeConfigs(List.of(res)).all().get().get(res).entries()) {
                    if (Set.of("retention.ms", "segment.ms", "cleanup.policy", "max.message.bytes")
                            .contains(e.name())) {
                        configs.put(e.name(), e.value() + " " + e.source());
                    }
                }
            } while (!String.valueOf(configs.get("segment.ms")).startsWith("7200000 ")
                    && System.currentTimeMillis() < deadline && pause());
            r.put("configs", configs);
            a.createPartitions(Map.of(t, NewPartitions.increaseTo(4))).all().get();
            int after;
            deadline = System.currentTimeMillis() + 20_000;
            do {
                after = a.describeTopics(List.of(t)).allTopicNames().get().get(t).partitions().size();
            } while (after != 4 && System.currentTimeMillis() < deadline && pause());
            r.put("partitions_after", after);
            r.put("shrink", failureOf(() ->
                    a.createPartitions(Map.of(t, NewPartitions.increaseTo(2))).all().get()));
            TopicPartition tp = new TopicPartition(t, 0);
            send(p, values(t, 0, 10, "v"));
            r.put("low_watermark", a.deleteRecords(Map.of(tp, RecordsToDelete.beforeOffset(3)))
                    .lowWatermarks().get(tp).get().lowWatermark());
            Map<String, Object> offsets = new TreeMap<>();
            offsets.put("earliest", a.listOffsets(Map.of(tp, OffsetSpec.earliest())).partitionResult(tp).get().offset());
            offsets.put("latest", a.listOffsets(Map.of(tp, OffsetSpec.latest())).partitionResult(tp).get().offset());
            r.put("list_offsets", offsets);
            r.put("cluster_nodes", a.describeCluster().nodes().get().size());
            FeatureMetadata f = a.describeFeatures().featureMetadata().get();
            Map<String, Object> finalized = new TreeMap<>();
            for (String name : List.of("transaction.version", "group.version")) {
                var level = f.finalizedFeatures().get(name);
                finalized.put(name, level == null ? null : level.maxVersionLevel());
            }
            r.put("features", finalized);
            a.deleteTopics(List.of(t)).all().get();
            r.put("describe_deleted", failureOf(() ->
                    a.describeTopics(List.of(t)).allTopicNames().get()));
        }
        return r;
    }

    static Map<String, Object> idempotent() throws Exception {
        Map<String, Object> r = new TreeMap<>();
        String t = topic("java-idem", 1);
        try (KafkaProducer<String, String> p = producer(null);
             KafkaConsumer<String, String> c = consumer(null, Map.of())) {
            List<Long> offsets = send(p, values(t, 0, 100, "v"));
            r.put("offsets_contiguous", offsets.equals(
                    java.util.stream.LongStream.range(0, 100).boxed().collect(Collectors.toList())));
            TopicPartition tp = new TopicPartition(t, 0);
            c.assign(List.of(tp));
            List<ConsumerRecord<String, String>> got = poll(c, 100);
            r.put("values_in_order", got.stream().map(ConsumerRecord::value).collect(Collectors.toList())
                    .equals(values(t, 0, 100, "v").stream().map(ProducerRecord::value).collect(Collectors.toList())));
            r.put("leader_epochs", got.stream().map(x -> x.leaderEpoch().map(String::valueOf).orElse("none"))
                    .distinct().collect(Collectors.toList()));
            r.put("position", c.position(tp));
        }
        try (Admin a = admin()) {
            TopicPartition tp = new TopicPartition(t, 0);
            List<ProducerState> ps = a.describeProducers(List.of(tp)).partitionResult(tp).get().activeProducers();
            r.put("producers", ps.size());
            r.put("last_sequence", ps.isEmpty() ? null : ps.get(0).lastSequence());
        }
        return r;
    }

    static Map<String, Object> transactions() throws Exception {
        Map<String, Object> r = new TreeMap<>();
        String t = topic("java-txn", 1);
        String group = "java-txn-group-" + suffix;
        String txnId = "java-txn-" + suffix;
        TopicPartition tp = new TopicPartition(t, 0);
        try (KafkaProducer<String, String> p = producer(txnId)) {
            p.initTransactions();
            p.beginTransaction();
            send(p, values(t, 0, 5, "a"));
            p.commitTransaction();
            p.beginTransaction();
            send(p, values(t, 0, 5, "b"));
            p.abortTransaction();
            p.beginTransaction();
            send(p, values(t, 0, 5, "c"));
            p.sendOffsetsToTransaction(Map.of(tp, new OffsetAndMetadata(42, "m")),
                    new ConsumerGroupMetadata(group));
            p.commitTransaction();
        }
        for (String iso : List.of("read_committed", "read_uncommitted")) {
            try (KafkaConsumer<String, String> c = consumer(null, Map.of("isolation.level", iso))) {
                c.assign(List.of(tp));
                List<ConsumerRecord<String, String>> got = poll(c, iso.equals("read_committed") ? 10 : 15);
                r.put(iso, got.stream().map(ConsumerRecord::value).collect(Collectors.toList()));
                r.put(iso + "_end", c.endOffsets(List.of(tp)).get(tp));
                r.put(iso + "_position", c.position(tp));
            }
        }
        try (Admin a = admin()) {
            Map<TopicPartition, OffsetAndMetadata> committed =
                    a.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get();
            r.put("txn_offsets", committed.get(tp).offset() + " " + committed.get(tp).metadata());
            r.put("listed", a.listTransactions().all().get().stream()
                    .filter(x -> x.transactionalId().equals(txnId))
                    .map(x -> x.state().toString()).collect(Collectors.toList()));
            TransactionDescription d = a.describeTransactions(List.of(txnId)).all().get().get(txnId);
            r.put("described", d.state() + " " + d.topicPartitions().size());
            List<ProducerState> ps = a.describeProducers(List.of(tp)).partitionResult(tp).get().activeProducers();
            r.put("producer_open_txn", ps.stream().map(x -> x.currentTransactionStartOffset().isPresent())
                    .collect(Collectors.toList()));
        }
        return r;
    }

    static Map<String, Object> group(String protocol) throws Exception {
        Map<String, Object> r = new TreeMap<>();
        String t = topic("java-group-" + protocol, 2);
        String group = "java-group-" + protocol + "-" + suffix;
        TopicPartition p0 = new TopicPartition(t, 0), p1 = new TopicPartition(t, 1);
        Map<String, String> cfg = Map.of("group.protocol", protocol);
        try (KafkaProducer<String, String> p = producer(null)) {
            send(p, values(t, 0, 10, "x"));
            send(p, values(t, 1, 10, "y"));
        }
        try (Admin a = admin()) {
            try (KafkaConsumer<String, String> c = consumer(group, cfg)) {
                c.subscribe(List.of(t));
                List<ConsumerRecord<String, String>> got = poll(c, 20);
                r.put("consumed", got.size());
                c.commitSync();
                Map<TopicPartition, OffsetAndMetadata> committed = c.committed(Set.of(p0, p1));
                r.put("committed", committed.get(p0).offset() + " " + committed.get(p1).offset());
                r.put("committed_epoch_present", committed.get(p0).leaderEpoch().isPresent());
                r.put("assignment", c.assignment().size());
                ConsumerGroupDescription d = a.describeConsumerGroups(List.of(group)).all().get().get(group);
                r.put("described", d.groupState() + " " + d.type() + " " + d.members().size() + " "
                        + d.members().stream().mapToInt(m -> m.assignment().topicPartitions().size()).sum());
            }
            ConsumerGroupDescription d = a.describeConsumerGroups(List.of(group)).all().get().get(group);
            r.put("described_after_close", d.groupState() + " " + d.type() + " " + d.members().size());
            try (KafkaProducer<String, String> p = producer(null)) {
                send(p, values(t, 0, 1, "z"));
            }
            try (KafkaConsumer<String, String> c = consumer(group, cfg)) {
                c.subscribe(List.of(t));
                r.put("resumed", poll(c, 1).stream().map(ConsumerRecord::value).collect(Collectors.toList()));
            }
            a.alterConsumerGroupOffsets(group, Map.of(p0, new OffsetAndMetadata(0))).all().get();
            a.deleteConsumerGroupOffsets(group, Set.of(p1)).all().get();
            r.put("offsets_after_admin", new TreeMap<>(a.listConsumerGroupOffsets(group)
                    .partitionsToOffsetAndMetadata().get().entrySet().stream().collect(Collectors.toMap(
                            e -> e.getKey().toString(), e -> e.getValue().offset()))));
            a.deleteConsumerGroups(List.of(group)).all().get();
            r.put("listed_after_delete", a.listGroups().all().get().stream()
                    .anyMatch(g -> g.groupId().equals(group)));
        }
        return r;
    }

    /** A position whose epoch ended before it (a truncated log): a consumer validates it with
     * OffsetForLeaderEpoch and resets to where the epoch ended; with no reset policy it fails. */
    static Map<String, Object> validatePosition() throws Exception {
        Map<String, Object> r = new TreeMap<>();
        String t = topic("java-validate", 1);
        TopicPartition tp = new TopicPartition(t, 0);
        try (KafkaProducer<String, String> p = producer(null)) {
            send(p, values(t, 0, 10, "v"));
        }
        int epoch;
        try (KafkaConsumer<String, String> c = consumer(null, Map.of())) {
            c.assign(List.of(tp));
            List<ConsumerRecord<String, String>> got = poll(c, 10);
            epoch = got.get(got.size() - 1).leaderEpoch().orElse(0);
        }
        for (String reset : List.of("earliest", "none")) {
            try (KafkaConsumer<String, String> c = consumer(null, Map.of("auto.offset.reset", reset))) {
                c.assign(List.of(tp));
                c.seek(tp, new OffsetAndMetadata(15, Optional.of(epoch), ""));
                r.put(reset + "_error", failureOf(() -> {
                    long deadline = System.currentTimeMillis() + 5000;
                    while (System.currentTimeMillis() < deadline) {
                        c.poll(Duration.ofMillis(200));
                    }
                }));
                r.put(reset + "_position", failureOf(() -> c.position(tp, Duration.ofSeconds(2))).equals("none")
                        ? c.position(tp) : -1L);
            }
        }
        try (KafkaConsumer<String, String> c = consumer(null, Map.of())) {
            c.assign(List.of(tp));
            c.seek(tp, new OffsetAndMetadata(4, Optional.of(epoch), ""));
            List<ConsumerRecord<String, String>> got = poll(c, 6);
            r.put("valid_seek_first", got.isEmpty() ? null : got.get(0).offset());
        }
        return r;
    }

    /** Timestamps 1000, 3000, 3000, 2000: in one batch and in a batch each. */
    static Map<String, Object> offsetsForTimes() throws Exception {
        Map<String, Object> r = new TreeMap<>();
        long[] stamps = {1000, 3000, 3000, 2000};
        for (String layout : List.of("one_batch", "batch_each")) {
            String t = topic("java-times-" + layout.replace('_', '-'), 1);
            TopicPartition tp = new TopicPartition(t, 0);
            try (KafkaProducer<String, String> p = producer(null)) {
                List<ProducerRecord<String, String>> rs = new ArrayList<>();
                for (int i = 0; i < stamps.length; i++) {
                    rs.add(new ProducerRecord<>(t, 0, stamps[i], "k", "v" + i));
                }
                if (layout.equals("one_batch")) {
                    send(p, rs);
                } else {
                    for (ProducerRecord<String, String> x : rs) {
                        send(p, List.of(x));
                    }
                }
            }
            try (KafkaConsumer<String, String> c = consumer(null, Map.of()); Admin a = admin()) {
                Function<Long, String> at = ts -> {
                    OffsetAndTimestamp o = c.offsetsForTimes(Map.of(tp, ts)).get(tp);
                    return o == null ? "null" : o.offset() + " " + o.timestamp();
                };
                Map<String, Object> x = new TreeMap<>();
                x.put("t0", at.apply(0L));
                x.put("t1500", at.apply(1500L));
                x.put("t3000", at.apply(3000L));
                x.put("t5000", at.apply(5000L));
                x.put("beginning", c.beginningOffsets(List.of(tp)).get(tp));
                x.put("end", c.endOffsets(List.of(tp)).get(tp));
                var max = a.listOffsets(Map.of(tp, OffsetSpec.maxTimestamp())).partitionResult(tp).get();
                x.put("max_timestamp", max.offset() + " " + max.timestamp());
                r.put(layout, x);
            }
        }
        return r;
    }
}
