import java.time.Duration;
import java.util.*;
import java.util.concurrent.*;
import java.util.concurrent.atomic.*;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.common.serialization.*;

/** benchmarks/share.py's Java row: n KafkaShareConsumers (one thread each, implicit
 * acknowledgement) read a one-partition topic through a share group the script made, until
 * every offset is seen or the timeout. Prints one JSON line: distinct records, seconds from
 * the first record to the last new one, seconds from the subscriptions to the first record,
 * and redeliveries. Args: bootstrap topic group records consumers timeoutSeconds */
public class ShareConsumerBench {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], topic = args[1], group = args[2];
        int records = Integer.parseInt(args[3]), n = Integer.parseInt(args[4]);
        long deadline = System.nanoTime() + Long.parseLong(args[5]) * 1_000_000_000L;
        Set<Long> seen = ConcurrentHashMap.newKeySet();
        AtomicLong first = new AtomicLong(), last = new AtomicLong(), redelivered = new AtomicLong();
        ExecutorService pool = Executors.newFixedThreadPool(n);
        long start = System.nanoTime();
        List<Future<?>> running = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            running.add(pool.submit(() -> {
                Properties p = new Properties();
                p.put("bootstrap.servers", bootstrap);
                p.put("group.id", group);
                p.put("key.deserializer", ByteArrayDeserializer.class.getName());
                p.put("value.deserializer", ByteArrayDeserializer.class.getName());
                try (var c = new KafkaShareConsumer<byte[], byte[]>(p)) {
                    c.subscribe(List.of(topic));
                    while (seen.size() < records && System.nanoTime() < deadline) {
                        for (var r : c.poll(Duration.ofMillis(200))) {
                            long now = System.nanoTime();
                            first.compareAndSet(0, now);
                            if (seen.add(r.offset())) last.accumulateAndGet(now, Math::max);
                            else redelivered.incrementAndGet();
                        }
                    }
                    c.commitSync();
                }
                return null;
            }));
        }
        for (var f : running) f.get();
        pool.shutdown();
        double seconds = (last.get() - first.get()) / 1e9, join = (first.get() - start) / 1e9;
        System.out.printf(Locale.ROOT,
            "{\"records\":%d,\"seconds\":%.3f,\"join\":%.3f,\"redelivered\":%d}%n",
            seen.size(), seconds, join, redelivered.get());
    }
}
