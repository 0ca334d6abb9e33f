package dev.sluice.log4j2;

import dev.sluice.client.LogRecord;
import dev.sluice.client.Severity;
import dev.sluice.client.SluiceClient;
import dev.sluice.client.SluiceConfig;
import dev.sluice.client.Stats;
import java.time.Duration;
import java.util.concurrent.TimeUnit;
import org.apache.logging.log4j.Level;
import org.apache.logging.log4j.core.Appender;
import org.apache.logging.log4j.core.Core;
import org.apache.logging.log4j.core.Filter;
import org.apache.logging.log4j.core.LogEvent;
import org.apache.logging.log4j.core.appender.AbstractAppender;
import org.apache.logging.log4j.core.appender.rolling.FileSize;
import org.apache.logging.log4j.core.config.Property;
import org.apache.logging.log4j.core.config.plugins.Plugin;
import org.apache.logging.log4j.core.config.plugins.PluginBuilderAttribute;
import org.apache.logging.log4j.core.config.plugins.PluginBuilderFactory;
import org.apache.logging.log4j.core.time.Instant;
import org.apache.logging.log4j.message.Message;
import org.apache.logging.log4j.util.ReadOnlyStringMap;
import org.apache.logging.log4j.util.TriConsumer;

/**
 * Sends each event to the Sluice agent as one JSON line, without ever making the logging call
 * wait for it.
 *
 * <pre>{@code
 * <Appenders>
 *   <Sluice name="SLUICE" socketPath="/run/sluice/sluice.sock" acknowledged="true">
 *     <Property name="service" value="checkout"/>
 *   </Sluice>
 * </Appenders>
 * }</pre>
 *
 * <p>{@code append} encodes the event and offers it to a bounded queue; a daemon thread writes
 * the queue to the socket. When the queue is full the event is dropped and counted ({@link
 * #stats()}, the MBean {@code dev.sluice:type=SluiceClient,name=<appender name>}), never the
 * caller blocked. {@link #stop(long, TimeUnit)} drains for at most the smaller of its timeout and
 * {@code flushTimeoutMillis}.
 */
@Plugin(name = "Sluice", category = Core.CATEGORY_NAME, elementType = Appender.ELEMENT_TYPE, printObject = true)
public final class SluiceAppender extends AbstractAppender {
    /** The context map's entries, without a capturing lambda per event. */
    private static final TriConsumer<String, Object, LogRecord> CONTEXT = SluiceAppender::addContext;

    private final SluiceClient client;
    private final Property[] fields;
    private final boolean registerMBean;
    /** One record per logging thread, refilled for each event (log4j's recursion guard keeps it to one at a time). */
    private final ThreadLocal<LogRecord> records = ThreadLocal.withInitial(LogRecord::new);

    private SluiceAppender(String name, Filter filter, boolean ignoreExceptions, Property[] fields, SluiceClient client,
            boolean registerMBean) {
        super(name, filter, null, ignoreExceptions, fields);
        this.client = client;
        this.fields = fields == null ? new Property[0] : fields.clone();
        this.registerMBean = registerMBean;
    }

    @PluginBuilderFactory
    public static Builder newBuilder() {
        return new Builder();
    }

    /** The attributes of {@code <Sluice …>}; each default is the core's. */
    public static final class Builder extends AbstractAppender.Builder<Builder>
            implements org.apache.logging.log4j.core.util.Builder<SluiceAppender> {
        @PluginBuilderAttribute
        private String socketPath = SluiceConfig.defaultSocketPath();

        @PluginBuilderAttribute
        private boolean acknowledged;

        @PluginBuilderAttribute
        private int maxQueueRecords = SluiceConfig.DEFAULT_MAX_QUEUE_RECORDS;

        @PluginBuilderAttribute
        private String maxQueueBytes = "8 MB";

        @PluginBuilderAttribute
        private String maxRecordSize = "1 MB";

        @PluginBuilderAttribute
        private double dropBelowWarnAt = SluiceConfig.DEFAULT_DROP_BELOW_WARN_AT;

        @PluginBuilderAttribute
        private long flushTimeoutMillis = SluiceConfig.DEFAULT_TIMEOUT.toMillis();

        @PluginBuilderAttribute
        private boolean registerMBean = true;

        public Builder setSocketPath(String socketPath) {
            this.socketPath = socketPath;
            return this;
        }

        public Builder setAcknowledged(boolean acknowledged) {
            this.acknowledged = acknowledged;
            return this;
        }

        public Builder setMaxQueueRecords(int maxQueueRecords) {
            this.maxQueueRecords = maxQueueRecords;
            return this;
        }

        /** {@code "8 MB"}, {@code "512 KB"}… */
        public Builder setMaxQueueBytes(String maxQueueBytes) {
            this.maxQueueBytes = maxQueueBytes;
            return this;
        }

        public Builder setMaxRecordSize(String maxRecordSize) {
            this.maxRecordSize = maxRecordSize;
            return this;
        }

        public Builder setDropBelowWarnAt(double dropBelowWarnAt) {
            this.dropBelowWarnAt = dropBelowWarnAt;
            return this;
        }

        public Builder setFlushTimeoutMillis(long flushTimeoutMillis) {
            this.flushTimeoutMillis = flushTimeoutMillis;
            return this;
        }

        public Builder setRegisterMBean(boolean registerMBean) {
            this.registerMBean = registerMBean;
            return this;
        }

        /** The appender, or null (with the reason on the status logger) if an option is wrong. */
        @Override
        public SluiceAppender build() {
            String name = getName();
            SluiceConfig config;
            try {
                config = SluiceConfig.builder()
                        .socketPath(socketPath)
                        .acknowledged(acknowledged)
                        .maxQueueRecords(maxQueueRecords)
                        .maxQueueBytes(size("maxQueueBytes", maxQueueBytes))
                        .maxRecordSize((int) Math.min(Integer.MAX_VALUE, size("maxRecordSize", maxRecordSize)))
                        .dropBelowWarnAt(dropBelowWarnAt)
                        .flushTimeout(Duration.ofMillis(flushTimeoutMillis))
                        .closeTimeout(Duration.ofMillis(flushTimeoutMillis))
                        .name(name)
                        .notices(SluiceAppender::notice)
                        .build();
            } catch (IllegalArgumentException e) {
                LOGGER.error("Sluice appender \"{}\" not created: {}", name, e.getMessage());
                return null;
            }
            if (getPropertyArray() != null) {
                for (Property field : getPropertyArray()) {
                    if (field.getName() == null || field.getName().isEmpty()) {
                        LOGGER.error("Sluice appender \"{}\" not created: a <Property> without a name", name);
                        return null;
                    }
                }
            }
            return new SluiceAppender(name, getFilter(), isIgnoreExceptions(), getPropertyArray(),
                    SluiceClient.create(config), registerMBean);
        }

        private static long size(String option, String text) {
            long size = FileSize.parse(text, -1);
            if (size < 0) {
                throw new IllegalArgumentException(option + " is not a size: \"" + text + "\"");
            }
            return size;
        }
    }

    @Override
    public void start() {
        if (registerMBean) {
            client.registerMBean(getName());
        }
        super.start();
    }

    @Override
    public void append(LogEvent event) {
        LogRecord record = records.get().clear();
        Instant instant = event.getInstant();
        record.time(instant.getEpochSecond(), instant.getNanoOfSecond());
        Message message = event.getMessage();
        record.severity(severity(event.getLevel()))
                .logger(event.getLoggerName())
                .message(message == null ? null : message.getFormattedMessage())
                .thread(event.getThreadName())
                .thrown(event.getThrown());
        ReadOnlyStringMap context = event.getContextData();
        if (context != null && !context.isEmpty()) {
            context.forEach(CONTEXT, record);
        }
        for (Property field : fields) {
            record.field(field.getName(), field.getValue());
        }
        try {
            client.log(record);
        } finally {
            record.clear(); // the thread's record must not keep the event's exception or arguments alive
        }
    }

    /** A context entry: OpenTelemetry's and Micrometer Tracing's ids go to {@code trace_id} / {@code span_id}. */
    private static void addContext(String key, Object value, LogRecord record) {
        switch (key) {
            case "trace_id", "traceId" -> record.traceId(value == null ? null : value.toString());
            case "span_id", "spanId" -> record.spanId(value == null ? null : value.toString());
            default -> record.field(key, value);
        }
    }

    static Severity severity(Level level) {
        int value = level == null ? Level.INFO.intLevel() : level.intLevel();
        if (value <= Level.FATAL.intLevel()) {
            return Severity.FATAL;
        }
        if (value <= Level.ERROR.intLevel()) {
            return Severity.ERROR;
        }
        if (value <= Level.WARN.intLevel()) {
            return Severity.WARN;
        }
        if (value <= Level.INFO.intLevel()) {
            return Severity.INFO;
        }
        if (value <= Level.DEBUG.intLevel()) {
            return Severity.DEBUG;
        }
        return Severity.TRACE;
    }

    /** The client's own lines (drops, at most one a minute; the summary at stop): log4j's status logger and stderr. */
    private static void notice(String line) {
        LOGGER.warn(line);
        System.err.println(line);
    }

    @Override
    public void stop() {
        stop(0, TimeUnit.MILLISECONDS);
    }

    /**
     * Drains for at most {@code flushTimeoutMillis} (or {@code timeout}, if shorter and not 0),
     * then stops the sender; what is left is counted ({@code closed}, {@code unconfirmed}).
     */
    @Override
    public boolean stop(long timeout, TimeUnit unit) {
        setStopping();
        boolean stopped = super.stop(timeout, unit, false);
        Duration wait = client.config().closeTimeout();
        if (timeout > 0) {
            Duration asked = Duration.ofNanos(unit.toNanos(timeout));
            wait = asked.compareTo(wait) < 0 ? asked : wait;
        }
        client.close(wait);
        setStopped();
        return stopped;
    }

    /** The counters (see the core's {@code Stats}). */
    public Stats stats() {
        return client.stats();
    }

    /**
     * Waits until every event so far is written (acknowledged mode: acknowledged), at most
     * {@code timeout}; true if everything went.
     */
    public boolean flush(Duration timeout) {
        return client.flush(timeout);
    }
}
