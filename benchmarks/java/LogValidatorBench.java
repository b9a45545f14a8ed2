import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.nio.ByteBuffer;
import java.nio.file.*;
import java.util.*;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.compress.Compression;
import org.apache.kafka.common.record.TimestampType;
import org.apache.kafka.common.record.internal.*;
import org.apache.kafka.common.utils.Time;
import org.apache.kafka.common.utils.internals.BufferSupplier;
import org.apache.kafka.common.utils.internals.PrimitiveRef;
import org.apache.kafka.storage.internals.log.AppendOrigin;
import org.apache.kafka.storage.internals.log.LogValidator;

/** benchmarks/record_check.py's Kafka row: the broker's own check of a client batch
 * (LogValidator.validateMessagesAndAssignOffsets, as UnifiedLog.append calls it for a leader:
 * topic compression "producer", CreateTime, not compacted) timed on one thread in that
 * thread's CPU time (steadier than wall time on a busy machine), the batch read from a file
 * the script wrote. Prints one JSON line: the median and the least milliseconds of the
 * measured runs. Args: batchFile warmupRuns measuredRuns */
public class LogValidatorBench {
    public static void main(String[] args) throws Exception {
        byte[] bytes = Files.readAllBytes(Path.of(args[0]));
        int warmup = Integer.parseInt(args[1]), runs = Integer.parseInt(args[2]);
        BufferSupplier buffers = BufferSupplier.create(); // the request thread's, reused
        LogValidator.MetricsRecorder metrics = new LogValidator.MetricsRecorder() {
            public void recordInvalidMagic() {}
            public void recordInvalidOffset() {}
            public void recordInvalidSequence() {}
            public void recordInvalidChecksums() {}
            public void recordNoKeyCompactedTopic() {}
        };
        ThreadMXBean clock = ManagementFactory.getThreadMXBean();
        double[] ms = new double[runs];
        long records = 0;
        for (int i = -warmup; i < runs; i++) {
            MemoryRecords batch = MemoryRecords.readableRecords(ByteBuffer.wrap(bytes.clone()));
            CompressionType source = batch.batches().iterator().next().compressionType();
            LogValidator validator = new LogValidator(batch, new TopicPartition("t", 0),
                Time.SYSTEM, source, Compression.of(source).build(), false,
                RecordBatch.MAGIC_VALUE_V2, TimestampType.CREATE_TIME, Long.MAX_VALUE,
                Long.MAX_VALUE, 0, AppendOrigin.CLIENT);
            long t0 = clock.getCurrentThreadCpuTime();
            LogValidator.ValidationResult result = validator.validateMessagesAndAssignOffsets(
                PrimitiveRef.ofLong(0), metrics, buffers);
            long t1 = clock.getCurrentThreadCpuTime();
            if (i >= 0) ms[i] = (t1 - t0) / 1e6;
            records = result.validatedRecords().batches().iterator().next().countOrNull();
        }
        Arrays.sort(ms);
        System.out.printf(Locale.ROOT, "{\"median_ms\": %.4f, \"min_ms\": %.4f, \"records\": %d}%n",
            ms[runs / 2], ms[0], records);
    }
}
