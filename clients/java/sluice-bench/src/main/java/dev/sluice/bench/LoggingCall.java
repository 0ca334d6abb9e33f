package dev.sluice.bench;

import dev.sluice.client.Stats;
import java.io.IOException;
import java.io.OutputStream;
import java.lang.management.GarbageCollectorMXBean;
import java.lang.management.ManagementFactory;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.HashMap;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.LockSupport;
import org.openjdk.jmh.annotations.Benchmark;
import org.openjdk.jmh.annotations.BenchmarkMode;
import org.openjdk.jmh.annotations.Fork;
import org.openjdk.jmh.annotations.Level;
import org.openjdk.jmh.annotations.Mode;
import org.openjdk.jmh.annotations.OutputTimeUnit;
import org.openjdk.jmh.annotations.Param;
import org.openjdk.jmh.annotations.Scope;
import org.openjdk.jmh.annotations.Setup;
import org.openjdk.jmh.annotations.State;
import org.openjdk.jmh.annotations.TearDown;
import org.openjdk.jmh.annotations.Threads;
import org.openjdk.jmh.infra.IterationParams;
import org.openjdk.jmh.runner.IterationType;
import org.openjdk.jmh.util.SampleBuffer;

/**
 * The logging call an access log makes, {@code log.info("handled request {}", i)} with {@code
 * request_id} in the MDC / ThreadContext, timed one call at a time ({@link Mode#SampleTime}) on
 * one thread, paced to {@code rate} calls a second.
 *
 * <p>Pacing: as the Python and Go benchmarks do, the calls go in groups of {@value #GROUP}, one
 * group every {@code GROUP / rate} seconds on a fixed schedule: before the first call of a group
 * the thread parks until that group's start. The parking is in a {@code Level.Invocation} setup,
 * which JMH runs outside the timed region, so it is never part of a call's time. A group that
 * falls behind (a stall) is followed by groups without a pause until the schedule is caught up,
 * so the offered load stays {@code rate} a second and a stall is not hidden by the pause after it.
 *
 * <p>An iteration makes exactly as many groups as fit in its time ({@link Main} gives the
 * measurement {@code ceil(calls / GROUP)} group intervals), then waits for JMH to end it: JMH's
 * loop makes one call after each setup, so the last call of the last group is made after that
 * wait, once JMH's timer has run out. That keeps the calls at most 20 per millisecond of the
 * iteration, the most JMH's SampleTime times one by one (above that it keeps a sample and halves
 * its histogram's counts), whatever the timer's lateness: at up to 20,000 calls a second every
 * call is timed.
 *
 * <p>Besides JMH's histogram, each fork writes what JMH does not measure to {@code
 * $sluice.bench.report/<variant>.properties} for {@link Main}: the calls made and the time they
 * took (the rate reached, counting the pause after the last group as the Python benchmark does),
 * the bytes allocated by the calling thread and by every thread of the JVM (the frameworks' and
 * appenders' own threads too) between the measurement's first call and its last ({@code
 * ThreadMXBean}'s allocated-bytes counters; the pacing allocates nothing, and JMH's own
 * allocations on the calling thread, its histogram, are measured here and taken off by {@link
 * Main}), the garbage collections in that window, and, for the Sluice appenders, the drops during
 * the measurement ({@code stats().droppedTotal()}), the records sent and whether it was connected.
 */
@State(Scope.Thread)
@BenchmarkMode(Mode.SampleTime)
@OutputTimeUnit(TimeUnit.NANOSECONDS)
@Threads(1)
@Fork(1)
public class LoggingCall {
    /** Calls per group of the pacing (the Python and Go benchmarks' too). */
    static final int GROUP = 100;
    /** The system property naming the folder the forks write their reports to. */
    static final String REPORT_DIR = "sluice.bench.report";
    /** How long the end of the measurement waits for a Sluice appender to write what it holds (as the Python one). */
    static final long FLUSH_MILLIS = 2000;
    /** How long past the iteration's time the last call waits for JMH's timer (again, if it is later still). */
    static final long TAIL_NANOS = TimeUnit.MILLISECONDS.toNanos(100);

    private static final com.sun.management.ThreadMXBean THREADS =
            (com.sun.management.ThreadMXBean) ManagementFactory.getThreadMXBean();
    /** Where the allocation probes go, so that they are made. */
    static volatile Object sink;

    @Param({"LOGBACK_SLUICE", "LOG4J2_SLUICE", "LOGBACK_ASYNC_FILE", "LOG4J2_ASYNC_FILE"})
    public Variant variant;

    /** Calls a second. */
    @Param("20000")
    public int rate;

    private Variant.Target target;
    /** The anchors' log file (deleted at the end). */
    private Path file;
    private long groupNanos;

    /** The argument of the next call (counts on across iterations, as a server's requests would). */
    private int request;
    /** Calls made in this iteration. */
    private long calls;
    /** The calls made before the last one waits for the end of the iteration. */
    private long quota;
    private long iterationStarted;
    private long iterationNanos;
    /** When the next group may start. */
    private long nextGroup;
    /** When this iteration's calls were done (0 until then): the end of the last group's interval, or later. */
    private long finished;

    private boolean measuring;
    private long allocatedBefore;
    private Map<Long, Long> allThreadsBefore;
    private long collectionsBefore;
    private Stats statsBefore;

    // What the measurement iterations add up to.
    private long measuredCalls;
    private long measuredNanos;
    private long callerBytes;
    private long allThreadsBytes;
    private long collections;
    private long dropped;
    private long sent;
    private boolean connected;

    /** The interval between two groups' starts at {@code rate} calls a second. */
    static long groupNanos(int rate) {
        return GROUP * TimeUnit.SECONDS.toNanos(1) / rate;
    }

    @Setup(Level.Trial)
    public void start() throws Exception {
        if (rate <= 0) {
            throw new IllegalArgumentException("rate must be positive: " + rate);
        }
        if (!variant.sluice) {
            file = Files.createTempFile("sluice-bench-", ".log");
        }
        target = variant.start(file);
        groupNanos = groupNanos(rate);
    }

    @Setup(Level.Iteration)
    public void beginIteration(IterationParams params) {
        target.bindRequest("r-5f2c9e1a"); // on the thread that logs
        measuring = params.getType() == IterationType.MEASUREMENT;
        statsBefore = measuring ? target.stats() : null;
        iterationNanos = params.getTime().convertTo(TimeUnit.NANOSECONDS);
        quota = Math.max(1, iterationNanos / groupNanos) * GROUP - 1;
        calls = 0;
        finished = 0;
        iterationStarted = System.nanoTime();
        nextGroup = iterationStarted;
        if (measuring) {
            collectionsBefore = collections();
            allThreadsBefore = allocatedByThread();
            allocatedBefore = THREADS.getCurrentThreadAllocatedBytes();
        }
    }

    /** The pacing, outside the timed call. */
    @Setup(Level.Invocation)
    public void pace() {
        if (calls >= quota) {
            if (finished == 0) {
                finished = Math.max(System.nanoTime(), nextGroup);
            }
            // Until JMH's timer has ended the loop: this call is the iteration's last.
            parkUntil(iterationStarted + iterationNanos + (calls - quota + 1) * TAIL_NANOS);
        } else if (calls % GROUP == 0) {
            parkUntil(nextGroup);
            nextGroup += groupNanos;
        }
        calls++;
        request++;
    }

    private static void parkUntil(long deadline) {
        for (long wait = deadline - System.nanoTime(); wait > 0; wait = deadline - System.nanoTime()) {
            LockSupport.parkNanos(wait);
        }
    }

    @Benchmark
    public void call() {
        target.call(request);
    }

    @TearDown(Level.Iteration)
    public void endIteration() {
        if (!measuring) {
            return;
        }
        long allocated = THREADS.getCurrentThreadAllocatedBytes() - allocatedBefore;
        Map<Long, Long> allThreadsAfter = allocatedByThread();
        collections += collections() - collectionsBefore;
        // Calls that fell behind the schedule so far that the quota was not made: until now.
        measuredNanos += (finished != 0 ? finished : System.nanoTime()) - iterationStarted;
        measuredCalls += calls;
        callerBytes += allocated;
        for (Map.Entry<Long, Long> thread : allThreadsAfter.entrySet()) { // a thread that ended meanwhile is missed
            allThreadsBytes += thread.getValue() - allThreadsBefore.getOrDefault(thread.getKey(), 0L);
        }
        if (statsBefore != null) {
            target.flush(FLUSH_MILLIS);
            Stats after = target.stats();
            dropped += after.droppedTotal() - statsBefore.droppedTotal();
            sent += after.sent() - statsBefore.sent();
            connected = after.connected();
        }
    }

    @TearDown(Level.Trial)
    public void stop() throws IOException {
        target.stop();
        if (file != null) {
            Files.deleteIfExists(file);
        }
        String folder = System.getProperty(REPORT_DIR);
        if (folder == null) {
            return;
        }
        Properties report = new Properties();
        report.setProperty("calls", Long.toString(measuredCalls));
        report.setProperty("nanos", Long.toString(measuredNanos));
        report.setProperty("caller_bytes", Long.toString(callerBytes));
        report.setProperty("all_threads_bytes", Long.toString(allThreadsBytes));
        report.setProperty("gc_count", Long.toString(collections));
        // What JMH allocates on the measuring thread, in the same window: a SampleBuffer per
        // iteration, and an int[1024] for each power-of-two range of call times it meets.
        report.setProperty("sample_buffer_bytes", Long.toString(allocation(SampleBuffer::new)));
        report.setProperty("histogram_bucket_bytes", Long.toString(allocation(() -> new int[1 << 10])));
        if (variant.sluice) {
            report.setProperty("dropped", Long.toString(dropped));
            report.setProperty("sent", Long.toString(sent));
            report.setProperty("connected", Boolean.toString(connected));
        }
        try (OutputStream out = Files.newOutputStream(Path.of(folder, variant.name() + ".properties"))) {
            report.store(out, null);
        }
    }

    /** The bytes each live thread has allocated so far, by thread id. */
    private static Map<Long, Long> allocatedByThread() {
        long[] ids = THREADS.getAllThreadIds();
        long[] bytes = THREADS.getThreadAllocatedBytes(ids);
        Map<Long, Long> byThread = new HashMap<>();
        for (int i = 0; i < ids.length; i++) {
            if (bytes[i] >= 0) { // -1: ended since
                byThread.put(ids[i], bytes[i]);
            }
        }
        return byThread;
    }

    /** Garbage collections so far, all collectors. */
    private static long collections() {
        long count = 0;
        for (GarbageCollectorMXBean collector : ManagementFactory.getGarbageCollectorMXBeans()) {
            count += Math.max(0, collector.getCollectionCount());
        }
        return count;
    }

    /** The bytes the calling thread allocates to make one {@code object}. */
    private static long allocation(java.util.function.Supplier<Object> object) {
        sink = object.get(); // the lambda's and the class's first use out of the way
        long before = THREADS.getCurrentThreadAllocatedBytes();
        sink = object.get();
        long bytes = THREADS.getCurrentThreadAllocatedBytes() - before;
        sink = null;
        return bytes;
    }
}
