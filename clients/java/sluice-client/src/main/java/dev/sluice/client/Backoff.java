package dev.sluice.client;

import java.util.concurrent.ThreadLocalRandom;

/**
 * Jittered exponential backoff between connection attempts: from the first delay to the largest,
 * doubling, each drawn uniformly from the upper half of its step. Used by the sender thread only.
 */
final class Backoff {
    /** The first delay: a restarting agent is back within a few of these. */
    static final long FIRST_NANOS = 20_000_000L;
    /** The largest delay: a missing agent costs one attempt every one to two seconds, forever. */
    static final long LARGEST_NANOS = 2_000_000_000L;

    private final long first;
    private final long largest;
    private long next;

    Backoff() {
        this(FIRST_NANOS, LARGEST_NANOS);
    }

    Backoff(long firstNanos, long largestNanos) {
        this.first = firstNanos;
        this.largest = largestNanos;
        this.next = firstNanos;
    }

    /** The next delay, in nanoseconds. */
    long next() {
        long delay = next;
        next = Math.min(next * 2, largest);
        return ThreadLocalRandom.current().nextLong(delay / 2, delay + 1);
    }

    /** After a connection succeeded: start from the first delay again. */
    void reset() {
        next = first;
    }
}
