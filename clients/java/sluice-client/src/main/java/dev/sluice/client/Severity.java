package dev.sluice.client;

/**
 * A record's level, as the record's {@code "level"} field names it and as drops are counted
 * ({@code by_level}). Each framework's levels map onto these; below {@link #WARN} is what the
 * high-water mark drops first.
 */
public enum Severity {
    TRACE("trace"),
    DEBUG("debug"),
    INFO("info"),
    WARN("warn"),
    ERROR("error"),
    FATAL("fatal");

    /** How many there are: the size of per-level counter arrays. */
    static final int COUNT = values().length;

    private static final Severity[] ALL = values();

    private final String label;
    private final byte[] json;

    Severity(String label) {
        this.label = label;
        this.json = ("\"" + label + "\"").getBytes(java.nio.charset.StandardCharsets.US_ASCII);
    }

    /** The lower-case word used in records and counters: {@code "info"}, {@code "warn"}… */
    public String label() {
        return label;
    }

    /** True for the levels the high-water mark drops: trace, debug and info. */
    public boolean belowWarn() {
        return this.compareTo(WARN) < 0;
    }

    byte[] json() {
        return json;
    }

    static Severity of(int ordinal) {
        return ALL[ordinal];
    }
}
