package dev.sluice.client;

import java.util.Arrays;
import java.util.Objects;

/**
 * One log event as an appender hands it to {@link SluiceClient#log}: mutable and meant to be
 * reused ({@link #clear()}) by the thread that fills it, so that the logging call allocates
 * nothing for it. The client reads it only during {@code log} and keeps no reference.
 *
 * <p>Fields ({@link #field}) are written after the core fields, in the order added; a name that
 * is a core field's or was added before is written as {@code "extra.<name>"}, so a record never
 * has a name twice.
 */
public final class LogRecord {
    long epochMicros;
    Severity severity = Severity.INFO;
    String logger;
    String message;
    String thread;
    String traceId;
    String spanId;
    Throwable thrown;
    String stackTrace;
    String[] names = new String[8];
    Object[] values = new Object[8];
    int fieldCount;

    /** Empties the record for the next event. */
    public LogRecord clear() {
        epochMicros = 0;
        severity = Severity.INFO;
        logger = null;
        message = null;
        thread = null;
        traceId = null;
        spanId = null;
        thrown = null;
        stackTrace = null;
        Arrays.fill(values, 0, fieldCount, null);
        fieldCount = 0;
        return this;
    }

    /** When the app logged it, in microseconds since 1970 (UTC). */
    public LogRecord epochMicros(long micros) {
        this.epochMicros = micros;
        return this;
    }

    /** When the app logged it, as seconds and nanoseconds (kept to the microsecond). */
    public LogRecord time(long epochSecond, int nanoOfSecond) {
        this.epochMicros = epochSecond * 1_000_000L + nanoOfSecond / 1_000;
        return this;
    }

    public long epochMicros() {
        return epochMicros;
    }

    public LogRecord severity(Severity severity) {
        this.severity = Objects.requireNonNull(severity, "severity");
        return this;
    }

    public Severity severity() {
        return severity;
    }

    public LogRecord logger(String logger) {
        this.logger = logger;
        return this;
    }

    public LogRecord message(String message) {
        this.message = message;
        return this;
    }

    public LogRecord thread(String thread) {
        this.thread = thread;
        return this;
    }

    /** The active trace's id ({@code trace_id}), if the app's context has one. */
    public LogRecord traceId(String traceId) {
        this.traceId = traceId;
        return this;
    }

    /** The active span's id ({@code span_id}). */
    public LogRecord spanId(String spanId) {
        this.spanId = spanId;
        return this;
    }

    /**
     * The exception logged with the event: rendered whole into {@code stack_trace} (causes root
     * first, suppressed exceptions beneath the one that suppressed them) while it is at hand.
     */
    public LogRecord thrown(Throwable thrown) {
        this.thrown = thrown;
        return this;
    }

    /** A stack trace already rendered as text, for a framework that no longer holds the exception. */
    public LogRecord stackTrace(String stackTrace) {
        this.stackTrace = stackTrace;
        return this;
    }

    /**
     * Adds a top-level field. Values: strings, numbers, booleans, null, {@code Map}s, {@code
     * Iterable}s and arrays (nested at most 16 deep); anything else becomes its {@code toString()}.
     * A null name is ignored.
     */
    public LogRecord field(String name, Object value) {
        if (name == null) {
            return this;
        }
        if (fieldCount == names.length) {
            names = Arrays.copyOf(names, fieldCount * 2);
            values = Arrays.copyOf(values, fieldCount * 2);
        }
        names[fieldCount] = name;
        values[fieldCount] = value;
        fieldCount++;
        return this;
    }

    public int fieldCount() {
        return fieldCount;
    }
}
