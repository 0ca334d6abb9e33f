package dev.sluice.client;

import java.nio.file.Path;
import java.time.Duration;
import java.util.Objects;
import java.util.function.Consumer;

/**
 * A client's options, validated once by {@link Builder#build()}. Each default is the one
 * docs/CLIENTS.md promises and the other clients share.
 */
public final class SluiceConfig {
    /** Where the agent listens in the pod (the Helm chart's shared {@code emptyDir}). */
    public static final String DEFAULT_SOCKET_PATH = "/run/sluice/sluice.sock";
    /** The variable the chart and {@code sluice inject} set in the app's container to the socket. */
    public static final String SOCKET_ENV = "SLUICE_SOCKET";
    /** Records held at most: queued, plus (acknowledged mode) sent and not yet acknowledged. */
    public static final int DEFAULT_MAX_QUEUE_RECORDS = 8192;
    /** Bytes held at most, counted the same way. */
    public static final long DEFAULT_MAX_QUEUE_BYTES = 8L * 1024 * 1024;
    /** The agent's default {@code max_record_size} for a listener. */
    public static final int DEFAULT_MAX_RECORD_SIZE = 1024 * 1024;
    /** Above this fraction of either bound, records below WARN are dropped. */
    public static final double DEFAULT_DROP_BELOW_WARN_AT = 0.8;
    /** How long {@code flush()} and {@code close()} wait by default. */
    public static final Duration DEFAULT_TIMEOUT = Duration.ofSeconds(2);
    /** The agent refuses nothing smaller as a record limit; the cutter needs room to work. */
    public static final int MIN_RECORD_SIZE = 256;
    /** The agent's largest {@code max_record_size}. */
    public static final int MAX_RECORD_SIZE = 64 * 1024 * 1024;

    private final Path socketPath;
    private final int maxQueueRecords;
    private final long maxQueueBytes;
    private final double dropBelowWarnAt;
    private final int maxRecordSize;
    private final boolean acknowledged;
    private final Duration flushTimeout;
    private final Duration closeTimeout;
    private final String name;
    private final Consumer<String> notices;

    private SluiceConfig(Builder b) {
        this.socketPath = b.socketPath;
        this.maxQueueRecords = b.maxQueueRecords;
        this.maxQueueBytes = b.maxQueueBytes;
        this.dropBelowWarnAt = b.dropBelowWarnAt;
        this.maxRecordSize = b.maxRecordSize;
        this.acknowledged = b.acknowledged;
        this.flushTimeout = b.flushTimeout;
        this.closeTimeout = b.closeTimeout;
        this.name = b.name;
        this.notices = b.notices;
    }

    public static Builder builder() {
        return new Builder();
    }

    public Path socketPath() {
        return socketPath;
    }

    public int maxQueueRecords() {
        return maxQueueRecords;
    }

    public long maxQueueBytes() {
        return maxQueueBytes;
    }

    public double dropBelowWarnAt() {
        return dropBelowWarnAt;
    }

    public int maxRecordSize() {
        return maxRecordSize;
    }

    public boolean acknowledged() {
        return acknowledged;
    }

    public Duration flushTimeout() {
        return flushTimeout;
    }

    public Duration closeTimeout() {
        return closeTimeout;
    }

    /** The appender's name: the MBean's {@code name=} and the sender thread's suffix; may be null. */
    public String name() {
        return name;
    }

    Consumer<String> notices() {
        return notices;
    }

    /** {@code $SLUICE_SOCKET} when it is set, else {@link #DEFAULT_SOCKET_PATH}. */
    public static String defaultSocketPath() {
        String fromEnv = System.getenv(SOCKET_ENV);
        return fromEnv == null || fromEnv.isEmpty() ? DEFAULT_SOCKET_PATH : fromEnv;
    }

    /** Collects options; {@link #build()} checks them and says which one is wrong. */
    public static final class Builder {
        private Path socketPath = Path.of(defaultSocketPath());
        private int maxQueueRecords = DEFAULT_MAX_QUEUE_RECORDS;
        private long maxQueueBytes = DEFAULT_MAX_QUEUE_BYTES;
        private double dropBelowWarnAt = DEFAULT_DROP_BELOW_WARN_AT;
        private int maxRecordSize = DEFAULT_MAX_RECORD_SIZE;
        private boolean acknowledged;
        private Duration flushTimeout = DEFAULT_TIMEOUT;
        private Duration closeTimeout = DEFAULT_TIMEOUT;
        private String name;
        private Consumer<String> notices = Builder::toStderr;

        private Builder() {}

        /** The agent's {@code lines} listener. */
        public Builder socketPath(Path path) {
            this.socketPath = Objects.requireNonNull(path, "socketPath");
            return this;
        }

        public Builder socketPath(String path) {
            return socketPath(Path.of(Objects.requireNonNull(path, "socketPath")));
        }

        public Builder maxQueueRecords(int records) {
            this.maxQueueRecords = records;
            return this;
        }

        public Builder maxQueueBytes(long bytes) {
            this.maxQueueBytes = bytes;
            return this;
        }

        /**
         * Above this fraction of either bound, records below WARN are dropped, keeping the rest
         * of the room for warnings and errors; {@code 1.0} turns the tier off.
         */
        public Builder dropBelowWarnAt(double fraction) {
            this.dropBelowWarnAt = fraction;
            return this;
        }

        /** The listener's {@code max_record_size}: longer records are cut to it, never refused. */
        public Builder maxRecordSize(int bytes) {
            this.maxRecordSize = bytes;
            return this;
        }

        /**
         * Open a client session ({@code SLUICE/2}): records stay in the bound until the agent's
         * {@code ACK}, and are sent again after a reconnect as the same records (one row each).
         */
        public Builder acknowledged(boolean acknowledged) {
            this.acknowledged = acknowledged;
            return this;
        }

        public Builder flushTimeout(Duration timeout) {
            this.flushTimeout = Objects.requireNonNull(timeout, "flushTimeout");
            return this;
        }

        public Builder closeTimeout(Duration timeout) {
            this.closeTimeout = Objects.requireNonNull(timeout, "closeTimeout");
            return this;
        }

        public Builder name(String name) {
            this.name = name;
            return this;
        }

        /**
         * Where the client's own lines go (drops, at most one a minute, and the summary at
         * close): stderr unless an appender routes them to its framework's status API too. Called
         * on the sender thread or the closing thread, never on a logging call.
         */
        public Builder notices(Consumer<String> notices) {
            this.notices = Objects.requireNonNull(notices, "notices");
            return this;
        }

        public SluiceConfig build() {
            if (maxQueueRecords < 1) {
                throw new IllegalArgumentException("maxQueueRecords must be at least 1, not " + maxQueueRecords);
            }
            if (maxQueueBytes < 1) {
                throw new IllegalArgumentException("maxQueueBytes must be at least 1, not " + maxQueueBytes);
            }
            if (!(dropBelowWarnAt > 0.0 && dropBelowWarnAt <= 1.0)) {
                throw new IllegalArgumentException("dropBelowWarnAt must be in (0, 1], not " + dropBelowWarnAt);
            }
            if (maxRecordSize < MIN_RECORD_SIZE || maxRecordSize > MAX_RECORD_SIZE) {
                throw new IllegalArgumentException(
                        "maxRecordSize must be between 256 B and 64 MiB, not " + maxRecordSize);
            }
            if (flushTimeout.isNegative() || closeTimeout.isNegative()) {
                throw new IllegalArgumentException("flushTimeout and closeTimeout must not be negative");
            }
            return new SluiceConfig(this);
        }

        private static void toStderr(String line) {
            System.err.println(line);
            System.err.flush();
        }
    }
}
