package dev.sluice.bench;

import java.nio.file.Path;

/**
 * The four ways of logging compared, each in a JVM of its own (a JMH fork): the two Sluice
 * appenders on the agent's socket ({@code $SLUICE_SOCKET}), and, as anchors, the asynchronous
 * file logging each framework ships, with its defaults.
 */
public enum Variant {
    /** logback + {@code dev.sluice.logback.SluiceAppender}, plain mode, its defaults. */
    LOGBACK_SLUICE("logback + SluiceAppender", true) {
        @Override
        Target start(Path file) throws Exception {
            return new LogbackTarget("bench-logback-sluice.xml", null);
        }
    },
    /** log4j2 + the {@code <Sluice>} appender, plain mode, its defaults. */
    LOG4J2_SLUICE("log4j2 + Sluice appender", true) {
        @Override
        Target start(Path file) {
            return new Log4j2Target("bench-log4j2-sluice.xml", false, null);
        }
    },
    /** logback's {@code AsyncAppender} (queueSize 256, default discardingThreshold, neverBlock false) over a {@code FileAppender}. */
    LOGBACK_ASYNC_FILE("logback AsyncAppender -> file (anchor)", false) {
        @Override
        Target start(Path file) throws Exception {
            return new LogbackTarget("bench-logback-async-file.xml", file);
        }
    },
    /** log4j2's async loggers ({@code AsyncLoggerContextSelector}, LMAX Disruptor) over a {@code File} appender. */
    LOG4J2_ASYNC_FILE("log4j2 async logger -> file (anchor)", false) {
        @Override
        Target start(Path file) {
            return new Log4j2Target("bench-log4j2-async-file.xml", true, file);
        }
    };

    /** The name in the JSON line ({@code "variant"}). */
    final String label;
    /** A Sluice appender: its drops are reported. */
    final boolean sluice;

    Variant(String label, boolean sluice) {
        this.label = label;
        this.sluice = sluice;
    }

    /** Configures the framework (once per JVM: a fork runs one variant) and returns the call. */
    abstract Target start(Path file) throws Exception;

    /** The logging call and what is needed around it. */
    interface Target {
        /** {@code log.info("handled request {}", i)}: the call measured. */
        void call(int i);

        /** Puts {@code request_id} in the calling thread's MDC / ThreadContext. */
        void bindRequest(String requestId);

        /** The Sluice appender's counters; null for an anchor. */
        dev.sluice.client.Stats stats();

        /** Waits at most {@code millis} for the Sluice appender to write what it holds; no-op for an anchor. */
        void flush(long millis);

        /** Stops the framework (its appenders drain as they do at an application's exit). */
        void stop();
    }
}
