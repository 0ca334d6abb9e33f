package dev.sluice.client;

/**
 * Why the client dropped a record: the words {@link Stats#dropped()}, the MBean, the stderr notice
 * and the in-band {@code "sluice.client":"dropped"} record use.
 */
public enum DropReason {
    /** The queue held {@code maxQueueRecords} records or {@code maxQueueBytes} bytes. */
    FULL("full"),
    /** A record below WARN arrived while the queue was above {@code dropBelowWarnAt}. */
    HIGH_WATER("high_water"),
    /** Logged after {@code close()}, or still queued when {@code close()} gave up waiting. */
    CLOSED("closed"),
    /** Encoding the record threw (a bug here, or a value whose {@code toString()} overflowed the stack). */
    FORMAT_ERROR("format_error");

    static final int COUNT = values().length;

    private final String label;

    DropReason(String label) {
        this.label = label;
    }

    /** The word counters use: {@code "full"}, {@code "high_water"}… */
    public String label() {
        return label;
    }
}
