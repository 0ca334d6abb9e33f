package dev.sluice.example.orders;

import java.util.Locale;

/** How {@link RequestLogAspect} logs a request: the value of {@code logging.mode}. */
public enum LoggingMode {
    /** No logging at all: the best case. */
    NONE,
    /** The seed's anti-pattern: a synchronized drain of a queue through synchronous JDBC inserts. */
    SYNC_JDBC,
    /** One SLF4J call; logback's Sluice appender hands the record to the agent. */
    SLUICE;

    static LoggingMode parse(String value) {
        String normalized = value.trim().toUpperCase(Locale.ROOT).replace('-', '_');
        try {
            return valueOf(normalized);
        } catch (IllegalArgumentException e) {
            throw new IllegalArgumentException(
                    "logging.mode must be none, sync-jdbc or sluice, not '" + value + "'", e);
        }
    }
}
