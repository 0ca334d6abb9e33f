package dev.sluice.client;

import java.lang.management.ManagementFactory;
import java.time.Duration;
import java.util.Map;
import java.util.concurrent.atomic.AtomicInteger;
import javax.management.InstanceAlreadyExistsException;
import javax.management.JMException;
import javax.management.MBeanServer;
import javax.management.ObjectName;

/**
 * Ships log records to the Sluice agent over its Unix socket, one JSON line each: what the
 * appenders are made of, and usable on its own.
 *
 * <pre>{@code
 * SluiceClient client = SluiceClient.create(SluiceConfig.builder().socketPath("/run/sluice/sluice.sock").build());
 * client.log(new LogRecord().epochMicros(now).severity(Severity.INFO).logger("shop").message("paid"));
 * client.close();
 * }</pre>
 *
 * <p>Owns: the lifecycle (the sender thread starts with the first record, not before; {@link
 * #close} stops it), {@link #flush} and {@link #close} with bounded waits, one encoder per
 * logging thread, the MBean's registration.
 *
 * <p>Must not: wait in {@link #log}. It encodes the record and offers it to a bounded queue that
 * drops rather than blocks; no socket call, no connect and no stderr write happens on the
 * caller's thread. Nor may {@link #flush} or {@link #close} wait longer than their timeouts, so
 * a stalled agent never holds the application's exit.
 */
public final class SluiceClient implements AutoCloseable {
    /** How long close() waits for the sender thread after telling it to stop. */
    private static final long SENDER_JOIN_MILLIS = 300;
    private static final AtomicInteger INSTANCES = new AtomicInteger();

    private final SluiceConfig config;
    private final RecordQueue queue;
    private final ThreadLocal<RecordEncoder> encoders;
    private final Object lifecycle = new Object();
    private volatile Sender sender;
    private volatile boolean closed;
    private ObjectName registered;
    /** The queue's progress when a flush last gave up: close() then does not wait again for nothing. */
    private long stalledAt = -1;

    private SluiceClient(SluiceConfig config) {
        this.config = config;
        this.queue = new RecordQueue(config.maxQueueRecords(), config.maxQueueBytes(), config.dropBelowWarnAt());
        int maxRecordSize = config.maxRecordSize();
        this.encoders = ThreadLocal.withInitial(() -> new RecordEncoder(maxRecordSize));
    }

    /** A client for {@code config}; nothing connects until the first record. */
    public static SluiceClient create(SluiceConfig config) {
        return new SluiceClient(config);
    }

    public SluiceConfig config() {
        return config;
    }

    /**
     * Encodes {@code record} and enqueues it; returns false if it was dropped (and counted). Never
     * blocks on the agent and never throws for the record's content. The record may be reused as
     * soon as this returns.
     */
    public boolean log(LogRecord record) {
        Severity level = record.severity;
        if (closed) {
            queue.drop(DropReason.CLOSED, level);
            return false;
        }
        if (record.epochMicros == 0) {
            // No time given: now (a record at 1970 would be ACKed, then a dead letter).
            record.epochMicros = RecordQueue.nowMicros();
        }
        RecordEncoder encoder = encoders.get();
        if (encoder.busy) { // a value's toString() logged through us again: its own encoder
            encoder = new RecordEncoder(config.maxRecordSize());
        }
        byte[] line;
        boolean replaced;
        boolean truncated;
        encoder.busy = true;
        try {
            line = encoder.encode(record);
            replaced = encoder.replaced;
            truncated = encoder.truncated;
        } catch (VirtualMachineError e) {
            if (!(e instanceof StackOverflowError) && !(e instanceof OutOfMemoryError)) {
                throw e;
            }
            queue.drop(DropReason.FORMAT_ERROR, level);
            return false;
        } catch (RuntimeException | Error e) { // a value's toString() throwing AssertionError, say
            queue.drop(DropReason.FORMAT_ERROR, level);
            return false;
        } finally {
            encoder.busy = false;
            try {
                encoder.release();
            } catch (OutOfMemoryError e) {
                // Shrinking a buffer allocates a small one: with the heap full, it stays grown
                // this time; the record made is still offered.
            }
        }
        if (sender == null) {
            try {
                startSender();
            } catch (Throwable e) {
                // No thread could be made (an OutOfMemoryError): the record is queued all the
                // same, and the next one tries again.
            }
        }
        return queue.offer(line, level, replaced, truncated, record.epochMicros);
    }

    private void startSender() {
        synchronized (lifecycle) {
            if (sender == null && !closed) {
                Sender started = new Sender(queue, config);
                started.start();
                sender = started;
            }
        }
    }

    /** Waits until every record is written (acknowledged mode: acknowledged), at most {@code flushTimeout}. */
    public boolean flush() {
        return flush(config.flushTimeout());
    }

    /**
     * Waits until every record is written (acknowledged mode: acknowledged), at most {@code
     * timeout}; true if everything went. An interrupt ends the wait (the flag stays set).
     */
    public boolean flush(Duration timeout) {
        boolean drained = queue.waitDrained(timeout.toNanos());
        synchronized (lifecycle) {
            stalledAt = drained ? -1 : queue.progress();
        }
        return drained;
    }

    /** {@link #close(Duration)} with {@code closeTimeout}. */
    @Override
    public void close() {
        close(config.closeTimeout());
    }

    /**
     * Drains for at most {@code timeout}, then stops the sender. What is still queued is counted
     * dropped ({@code closed}); what was sent and not acknowledged, {@code unconfirmed}. Records
     * logged afterwards are dropped ({@code closed}). If anything was lost, one line says so
     * (stderr, or the appender's status API). Idempotent.
     */
    public void close(Duration timeout) {
        long wait;
        synchronized (lifecycle) {
            if (closed) {
                return;
            }
            closed = true;
            wait = stalledAt >= 0 && stalledAt == queue.progress() ? 0 : timeout.toNanos();
        }
        queue.close();
        Sender running = sender;
        if (running != null) {
            queue.waitDrained(wait);
        }
        queue.stop();
        if (running != null) {
            running.shutdown(SENDER_JOIN_MILLIS);
        }
        unregisterMBean();
        String summary = queue.summary(config.socketPath().toString());
        if (summary != null) {
            try {
                config.notices().accept(summary);
            } catch (RuntimeException e) {
                // The counters still say it.
            }
        }
    }

    public boolean isClosed() {
        return closed;
    }

    /** The counters, as one consistent snapshot. */
    /** The queue's refused records awaiting their covering ACK (tests). */
    int refusedAwaitingAck() {
        return queue.refusedAwaitingAck();
    }

    public Stats stats() {
        return queue.stats();
    }

    /** This client's session id ({@code SLUICE/2}), 32 hex digits. */
    public String session() {
        return queue.session;
    }

    // JMX. --------------------------------------------------------------------------------------

    /**
     * Registers the counters as {@code dev.sluice:type=SluiceClient,name=<name>} on the platform
     * MBean server ({@code ,instance=<n>} is added if that name is taken); close() unregisters.
     * Returns the name, or null if JMX refused (the client works the same without it).
     */
    public ObjectName registerMBean(String name) {
        try {
            MBeanServer server = ManagementFactory.getPlatformMBeanServer();
            String base = "dev.sluice:type=SluiceClient,name=" + quoteIfNeeded(name == null ? "sluice" : name);
            ObjectName objectName = new ObjectName(base);
            try {
                server.registerMBean(new MXBean(), objectName);
            } catch (InstanceAlreadyExistsException e) {
                objectName = new ObjectName(base + ",instance=" + INSTANCES.incrementAndGet());
                server.registerMBean(new MXBean(), objectName);
            }
            synchronized (lifecycle) {
                registered = objectName;
            }
            return objectName;
        } catch (JMException | SecurityException e) {
            return null;
        }
    }

    private void unregisterMBean() {
        ObjectName name;
        synchronized (lifecycle) {
            name = registered;
            registered = null;
        }
        if (name != null) {
            try {
                ManagementFactory.getPlatformMBeanServer().unregisterMBean(name);
            } catch (JMException | SecurityException e) {
                // Already gone.
            }
        }
    }

    private static String quoteIfNeeded(String value) {
        for (int i = 0; i < value.length(); i++) {
            if (",=:\"*?\n".indexOf(value.charAt(i)) >= 0) {
                return ObjectName.quote(value);
            }
        }
        return value;
    }

    private final class MXBean implements SluiceClientMXBean {
        @Override
        public String getSocketPath() {
            return config.socketPath().toString();
        }

        @Override
        public boolean isAcknowledged() {
            return config.acknowledged();
        }

        @Override
        public boolean isConnected() {
            return stats().connected();
        }

        @Override
        public String getAckPoint() {
            String point = stats().ackPoint();
            return point == null ? "" : point;
        }

        @Override
        public String getLastError() {
            String error = stats().lastError();
            return error == null ? "" : error;
        }

        @Override
        public long getQueuedRecords() {
            return stats().queuedRecords();
        }

        @Override
        public long getQueuedBytes() {
            return stats().queuedBytes();
        }

        @Override
        public long getUnacknowledgedRecords() {
            return stats().unacknowledgedRecords();
        }

        @Override
        public long getUnacknowledgedBytes() {
            return stats().unacknowledgedBytes();
        }

        @Override
        public long getRecordsSent() {
            return stats().sent();
        }

        @Override
        public long getRecordsResent() {
            return stats().resent();
        }

        @Override
        public long getRecordsAcknowledged() {
            return stats().acknowledged();
        }

        @Override
        public long getRecordsDropped() {
            return stats().droppedTotal();
        }

        @Override
        public long getDroppedFull() {
            return stats().dropped(DropReason.FULL);
        }

        @Override
        public long getDroppedHighWater() {
            return stats().dropped(DropReason.HIGH_WATER);
        }

        @Override
        public long getDroppedClosed() {
            return stats().dropped(DropReason.CLOSED);
        }

        @Override
        public long getDroppedFormatError() {
            return stats().dropped(DropReason.FORMAT_ERROR);
        }

        @Override
        public long getRecordsNaked() {
            return stats().nakTotal();
        }

        @Override
        public Map<String, Long> getNakByReason() {
            return stats().nak();
        }

        @Override
        public long getRecordsReplaced() {
            return stats().replaced();
        }

        @Override
        public long getRecordsTruncated() {
            return stats().truncated();
        }

        @Override
        public long getRecordsUnconfirmed() {
            return stats().unconfirmed();
        }

        @Override
        public long getReconnects() {
            return stats().reconnects();
        }

        @Override
        public long getReportsSent() {
            return stats().reportsSent();
        }
    }
}
