package dev.sluice.logback;

import ch.qos.logback.classic.Level;
import ch.qos.logback.classic.spi.ILoggingEvent;
import ch.qos.logback.classic.spi.IThrowableProxy;
import ch.qos.logback.classic.spi.ThrowableProxy;
import ch.qos.logback.classic.spi.ThrowableProxyUtil;
import ch.qos.logback.core.UnsynchronizedAppenderBase;
import ch.qos.logback.core.joran.spi.DefaultClass;
import ch.qos.logback.core.util.Duration;
import ch.qos.logback.core.util.FileSize;
import dev.sluice.client.LogRecord;
import dev.sluice.client.Severity;
import dev.sluice.client.SluiceClient;
import dev.sluice.client.SluiceConfig;
import dev.sluice.client.Stats;
import java.time.Instant;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import org.slf4j.event.KeyValuePair;

/**
 * Sends each event to the Sluice agent as one JSON line, without ever making the logging call
 * wait for it.
 *
 * <pre>{@code
 * <appender name="SLUICE" class="dev.sluice.logback.SluiceAppender">
 *   <socketPath>/run/sluice/sluice.sock</socketPath>
 *   <acknowledged>true</acknowledged>
 *   <field><name>service</name><value>checkout</value></field>
 * </appender>
 * }</pre>
 *
 * <p>{@code append} encodes the event and offers it to a bounded queue; a daemon thread writes
 * the queue to the socket. When the queue is full the event is dropped and counted ({@link
 * #stats()}, the MBean {@code dev.sluice:type=SluiceClient,name=<appender name>}), never the
 * caller blocked. {@link #stop()} drains for at most {@code flushTimeout}.
 */
public class SluiceAppender extends UnsynchronizedAppenderBase<ILoggingEvent> {
    private String socketPath = SluiceConfig.defaultSocketPath();
    private boolean acknowledged;
    private int maxQueueRecords = SluiceConfig.DEFAULT_MAX_QUEUE_RECORDS;
    private FileSize maxQueueBytes = new FileSize(SluiceConfig.DEFAULT_MAX_QUEUE_BYTES);
    private FileSize maxRecordSize = new FileSize(SluiceConfig.DEFAULT_MAX_RECORD_SIZE);
    private double dropBelowWarnAt = SluiceConfig.DEFAULT_DROP_BELOW_WARN_AT;
    private Duration flushTimeout = Duration.buildByMilliseconds(SluiceConfig.DEFAULT_TIMEOUT.toMillis());
    private boolean registerMBean = true;
    private final List<Field> fields = new ArrayList<>();

    private volatile SluiceClient client;
    /** One record per logging thread, refilled for each event (logback's re-entrance guard keeps it to one event at a time). */
    private final ThreadLocal<LogRecord> records = ThreadLocal.withInitial(LogRecord::new);

    @Override
    public void start() {
        if (isStarted()) {
            return;
        }
        SluiceConfig config;
        try {
            config = SluiceConfig.builder()
                    .socketPath(socketPath)
                    .acknowledged(acknowledged)
                    .maxQueueRecords(maxQueueRecords)
                    .maxQueueBytes(maxQueueBytes.getSize())
                    .maxRecordSize((int) Math.min(Integer.MAX_VALUE, maxRecordSize.getSize()))
                    .dropBelowWarnAt(dropBelowWarnAt)
                    .flushTimeout(java.time.Duration.ofMillis(flushTimeout.getMilliseconds()))
                    .closeTimeout(java.time.Duration.ofMillis(flushTimeout.getMilliseconds()))
                    .name(getName())
                    .notices(this::notice)
                    .build();
        } catch (IllegalArgumentException e) {
            addError("Sluice appender \"" + getName() + "\" not started: " + e.getMessage());
            return;
        }
        for (Field field : fields) {
            if (field.getName() == null || field.getName().isEmpty()) {
                addError("Sluice appender \"" + getName() + "\" not started: a <field> without a <name>");
                return;
            }
        }
        SluiceClient started = SluiceClient.create(config);
        if (registerMBean) {
            started.registerMBean(getName());
        }
        client = started;
        super.start();
    }

    /**
     * Drains for at most {@code flushTimeout}, then stops the sender. Events logged meanwhile are
     * counted {@code closed}; once stopped, logback itself turns them away.
     */
    @Override
    public void stop() {
        if (!isStarted()) {
            return;
        }
        SluiceClient running = client;
        if (running != null) {
            running.close();
        }
        super.stop();
    }

    @Override
    protected void append(ILoggingEvent event) {
        SluiceClient running = client;
        if (running == null) {
            return;
        }
        LogRecord record = records.get().clear();
        Instant instant = event.getInstant();
        if (instant != null) {
            record.time(instant.getEpochSecond(), instant.getNano());
        } else {
            record.epochMicros(event.getTimeStamp() * 1000);
        }
        record.severity(severity(event.getLevel()))
                .logger(event.getLoggerName())
                .message(event.getFormattedMessage())
                .thread(event.getThreadName());
        IThrowableProxy proxy = event.getThrowableProxy();
        if (proxy instanceof ThrowableProxy) {
            record.thrown(((ThrowableProxy) proxy).getThrowable());
        } else if (proxy != null) { // an event from elsewhere (deserialized): only the proxy is left
            record.stackTrace(ThrowableProxyUtil.asString(proxy));
        }
        List<KeyValuePair> pairs = event.getKeyValuePairs();
        if (pairs != null) {
            for (int i = 0, n = pairs.size(); i < n; i++) {
                KeyValuePair pair = pairs.get(i);
                record.field(pair.key, pair.value);
            }
        }
        Map<String, String> mdc = event.getMDCPropertyMap();
        if (mdc != null && !mdc.isEmpty()) {
            for (Map.Entry<String, String> entry : mdc.entrySet()) {
                addContext(record, entry.getKey(), entry.getValue());
            }
        }
        for (int i = 0, n = fields.size(); i < n; i++) {
            Field field = fields.get(i);
            record.field(field.getName(), field.getValue());
        }
        try {
            running.log(record);
        } finally {
            record.clear(); // the thread's record must not keep the event's exception or arguments alive
        }
    }

    /** An MDC entry: OpenTelemetry's and Micrometer Tracing's ids go to {@code trace_id} / {@code span_id}. */
    static void addContext(LogRecord record, String key, String value) {
        switch (key) {
            case "trace_id", "traceId" -> record.traceId(value);
            case "span_id", "spanId" -> record.spanId(value);
            default -> record.field(key, value);
        }
    }

    static Severity severity(Level level) {
        int value = level == null ? Level.INFO_INT : level.toInt();
        if (value >= Level.ERROR_INT) {
            return Severity.ERROR;
        }
        if (value >= Level.WARN_INT) {
            return Severity.WARN;
        }
        if (value >= Level.INFO_INT) {
            return Severity.INFO;
        }
        if (value >= Level.DEBUG_INT) {
            return Severity.DEBUG;
        }
        return Severity.TRACE;
    }

    /** The client's own lines (drops, at most one a minute; the summary at stop): logback's status API and stderr. */
    private void notice(String line) {
        addWarn(line);
        System.err.println(line);
    }

    /** The counters (see the core's {@code Stats}); null before {@link #start()}. */
    public Stats stats() {
        SluiceClient running = client;
        return running == null ? null : running.stats();
    }

    /**
     * Waits until every event so far is written (acknowledged mode: acknowledged), at most {@code
     * timeout}; true if everything went.
     */
    public boolean flush(java.time.Duration timeout) {
        SluiceClient running = client;
        return running == null || running.flush(timeout);
    }

    // Options (Joran bean properties). ------------------------------------------------------------

    /** The agent's {@code lines} listener; default {@code $SLUICE_SOCKET}, else {@code /run/sluice/sluice.sock}. */
    public void setSocketPath(String socketPath) {
        this.socketPath = socketPath;
    }

    public String getSocketPath() {
        return socketPath;
    }

    /** Use a client session ({@code SLUICE/2}): one row per record, held until the agent's ACK. */
    public void setAcknowledged(boolean acknowledged) {
        this.acknowledged = acknowledged;
    }

    public boolean isAcknowledged() {
        return acknowledged;
    }

    /** Records held at most (queued, and sent awaiting an ACK); default 8192. */
    public void setMaxQueueRecords(int maxQueueRecords) {
        this.maxQueueRecords = maxQueueRecords;
    }

    /** Bytes held at most, counted the same way; default {@code 8MB}. */
    public void setMaxQueueBytes(FileSize maxQueueBytes) {
        this.maxQueueBytes = maxQueueBytes;
    }

    /** The listener's {@code max_record_size}: longer records are cut to it; default {@code 1MB}. */
    public void setMaxRecordSize(FileSize maxRecordSize) {
        this.maxRecordSize = maxRecordSize;
    }

    /** Above this fraction of either bound, events below WARN are dropped; 1.0 turns it off; default 0.8. */
    public void setDropBelowWarnAt(double dropBelowWarnAt) {
        this.dropBelowWarnAt = dropBelowWarnAt;
    }

    /** How long {@link #stop()} drains at most; default {@code 2 seconds}. */
    public void setFlushTimeout(Duration flushTimeout) {
        this.flushTimeout = flushTimeout;
    }

    /** Register the counters as an MBean; default true. */
    public void setRegisterMBean(boolean registerMBean) {
        this.registerMBean = registerMBean;
    }

    /** A field added to every event ({@code <field><name>…</name><value>…</value></field>}). */
    @DefaultClass(Field.class)
    public void addField(Field field) {
        fields.add(field);
    }
}
