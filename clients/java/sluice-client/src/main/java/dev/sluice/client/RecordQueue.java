package dev.sluice.client;

import java.util.Arrays;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.ReentrantLock;
import java.util.function.LongSupplier;

/**
 * The bounded queue between the logging calls (many producers) and the sender thread (one
 * consumer), and every counter.
 *
 * <p>Owns the records not yet settled, in one ring in the order they were logged: at its front,
 * in acknowledged mode, those sent on the current connection and awaiting the agent's answer
 * ({@code inFlight}); behind them those waiting to be sent. Each record's number in the client
 * session is its position: the front's number ({@code headSeq}) plus its offset, assigned once
 * at enqueue and kept across resends, so a record sent again is the same record. Owns the bound
 * on both parts together, in records and in bytes; the drop policy; the counters {@link
 * SluiceClient#stats()} reports (drops through {@link Drops}).
 *
 * <p>Must not: block the caller beyond taking its one lock for a few array operations; evict a
 * record once queued (only the incoming record is dropped, so a record awaiting its {@code ACK}
 * is never lost to make room); touch a socket. A {@code NAK}ed record keeps its place until an
 * {@code ACK} covers it, so the numbers sent after a reconnect stay consecutive.
 *
 * <p>One lock guards everything here: the callers' {@link #offer}, the sender's {@link #peek} /
 * {@link #commit} / {@link #take}, the ACK reader's {@link #ack} / {@link #nak}, and {@link
 * #waitDrained}. Callers append at the back only; the sender and the ACK reader remove from the
 * front only.
 */
final class RecordQueue {
    private static final byte REPORT = 1;
    private static final byte REFUSED = 2;
    private static final byte SENT_BEFORE = 4;
    /** An earlier send's connection broke before it was settled: that send may have been stored. */
    private static final byte MAYBE_STORED = 8;

    private final ReentrantLock lock = new ReentrantLock();
    private final Condition changed = lock.newCondition();

    private final int maxRecords;
    private final long maxBytes;
    private final int highRecords;
    private final long highBytes;
    private final int maxCapacity;
    private final LongSupplier wallMicros;
    /** This client's session ({@code SLUICE/2}): one per client, kept across reconnects. */
    final String session = SessionId.next();

    // The ring: parallel arrays, a power of two long, grown up to the bound.
    private byte[][] data;
    private long[] times;
    private byte[] levels;
    private byte[] flags;
    /**
     * The reason of the agent's {@code NAK} for a record's last send (null if none): counted when
     * the {@code ACK} that follows settles it, so a record is counted by the last answer it got.
     */
    private String[] refusals;
    private int mask;
    private int head;
    private int count;
    private int inFlight;
    private long headSeq = 1;
    private long bytes;
    private long inFlightBytes;

    private long gen;
    private boolean closed;
    private boolean stopping;
    private boolean senderWaiting;
    /** The sender lingers ({@link #linger}) until this many records or bytes wait. */
    private boolean lingering;
    private int lingerRecords;
    private long lingerBytes;
    /** Callers in {@link #waitDrained}: the sender does not linger while someone waits for it. */
    private int flushers;
    private boolean connected;
    private String ackPoint;
    private String lastError;

    // Counters.
    private long sent;
    private long resent;
    private long acknowledged;
    private long replaced;
    private long truncated;
    private long reconnects;
    private long unconfirmed;
    private long reportsSent;
    private long progress;
    private final Map<String, Long> nak = new TreeMap<>();
    private final Drops drops;

    RecordQueue(int maxRecords, long maxBytes, double dropBelowWarnAt) {
        this(maxRecords, maxBytes, dropBelowWarnAt, System::nanoTime, RecordQueue::nowMicros);
    }

    RecordQueue(int maxRecords, long maxBytes, double dropBelowWarnAt, LongSupplier nanoClock, LongSupplier wallMicros) {
        this.maxRecords = maxRecords;
        this.maxBytes = maxBytes;
        this.highRecords = (int) (maxRecords * dropBelowWarnAt);
        this.highBytes = (long) (maxBytes * dropBelowWarnAt);
        this.maxCapacity = Integer.highestOneBit(Math.max(1, maxRecords - 1)) << 1;
        this.wallMicros = wallMicros;
        this.drops = new Drops(nanoClock, wallMicros);
        allocate(Math.min(maxCapacity, 1024));
    }

    static long nowMicros() {
        java.time.Instant now = java.time.Instant.now();
        return now.getEpochSecond() * 1_000_000L + now.getNano() / 1_000;
    }

    private void allocate(int capacity) {
        data = new byte[capacity][];
        times = new long[capacity];
        levels = new byte[capacity];
        flags = new byte[capacity];
        refusals = new String[capacity];
        mask = capacity - 1;
    }

    /**
     * Doubles the ring. Every new array is allocated before any is swapped in: an
     * OutOfMemoryError half way leaves the ring as it was (the record is then not queued).
     */
    private void grow() {
        int capacity = Math.min(maxCapacity, data.length * 2);
        byte[][] newData = new byte[capacity][];
        long[] newTimes = new long[capacity];
        byte[] newLevels = new byte[capacity];
        byte[] newFlags = new byte[capacity];
        String[] newRefusals = new String[capacity];
        for (int k = 0; k < count; k++) {
            int from = (head + k) & mask;
            newData[k] = data[from];
            newTimes[k] = times[from];
            newLevels[k] = levels[from];
            newFlags[k] = flags[from];
            newRefusals[k] = refusals[from];
        }
        data = newData;
        times = newTimes;
        levels = newLevels;
        flags = newFlags;
        refusals = newRefusals;
        mask = capacity - 1;
        head = 0;
    }

    private void append(byte[] line, int level, long timeMicros, byte flag) {
        if (count == data.length) {
            grow();
        }
        int i = (head + count) & mask;
        data[i] = line;
        times[i] = timeMicros;
        levels[i] = (byte) level;
        flags[i] = flag;
        count++;
        bytes += line.length;
    }

    /** Removes the front record; returns its flags. */
    private byte pop() {
        int i = head;
        byte flag = flags[i];
        bytes -= data[i].length;
        data[i] = null;
        refusals[i] = null;
        head = (head + 1) & mask;
        count--;
        headSeq++;
        progress++;
        return flag;
    }

    // The callers' side. ------------------------------------------------------------------------

    /** Enqueues one line, or drops it and counts why; never waits beyond the lock. */
    boolean offer(byte[] line, Severity level, boolean wasReplaced, boolean wasTruncated, long timeMicros) {
        lock.lock();
        try {
            if (wasReplaced) {
                replaced++;
            }
            if (wasTruncated) {
                truncated++;
            }
            if (closed) {
                drop(DropReason.CLOSED, level.ordinal(), 1);
                return false;
            }
            int records = count + 1;
            long total = bytes + line.length;
            if (records > maxRecords || total > maxBytes) {
                drop(DropReason.FULL, level.ordinal(), 1);
                return false;
            }
            if (level.belowWarn() && (records > highRecords || total > highBytes)) {
                drop(DropReason.HIGH_WATER, level.ordinal(), 1);
                return false;
            }
            append(line, level.ordinal(), timeMicros, (byte) 0);
            if (senderWaiting) {
                changed.signalAll();
            } else if (lingering && (count - inFlight >= lingerRecords || bytes - inFlightBytes >= lingerBytes)) {
                lingering = false; // one signal ends it
                changed.signalAll();
            }
            return true;
        } finally {
            lock.unlock();
        }
    }

    /** Counts a record dropped before it could be offered. */
    void drop(DropReason reason, Severity level) {
        lock.lock();
        try {
            drop(reason, level.ordinal(), 1);
        } finally {
            lock.unlock();
        }
    }

    private void drop(DropReason reason, int level, long n) {
        if (drops.count(reason, level, n) && senderWaiting) {
            changed.signalAll(); // the sender writes the notice
        }
    }

    // The sender's side. -------------------------------------------------------------------------

    /** Records the sender copies out of the queue to write them without holding its lock. */
    static final class Batch {
        final byte[][] data;
        final long[] times;
        long firstSeq;
        int size;

        Batch(int capacity) {
            data = new byte[capacity][];
            times = new long[capacity];
        }

        void clear() {
            Arrays.fill(data, 0, size, null);
            size = 0;
        }
    }

    /** Waits until there is something to send, a notice is due, or the client is stopping. */
    void waitForWork(long timeoutNanos) {
        lock.lock();
        try {
            addReport();
            if (count > inFlight || stopping || drops.noticeDue()) {
                return;
            }
            senderWaiting = true;
            try {
                changed.awaitNanos(timeoutNanos);
            } catch (InterruptedException e) {
                // Nothing here interrupts the sender; whoever did, it carries on.
            } finally {
                senderWaiting = false;
            }
        } finally {
            lock.unlock();
        }
    }

    /**
     * The sender's pause once it has something to send: up to {@code nanos}, so the records a
     * burst logs meanwhile go in the same write and wake the agent once, not once each (with the
     * agent on the same cores, a wake-up per record took CPU from the logging threads: their
     * p99.9). Ends early once {@code records} or {@code bytes} wait to be sent (the call that
     * crosses the mark signals it; the calls before signal nobody), while a {@link #waitDrained}
     * waits, or at {@link #stop()}.
     */
    void linger(long nanos, int records, long bytes) {
        lock.lock();
        try {
            lingerRecords = records;
            lingerBytes = bytes;
            lingering = true;
            long remaining = nanos;
            while (remaining > 0 && lingering && !stopping && flushers == 0
                    && count - inFlight < records && this.bytes - inFlightBytes < bytes) {
                remaining = changed.awaitNanos(remaining);
            }
        } catch (InterruptedException e) {
            // As in waitForWork.
        } finally {
            lingering = false;
            lock.unlock();
        }
    }

    /** The sender's backoff: a wait that {@link #stop()} cuts short. */
    void sleep(long nanos) {
        lock.lock();
        try {
            if (!stopping) {
                changed.awaitNanos(nanos);
            }
        } catch (InterruptedException e) {
            // As above.
        } finally {
            lock.unlock();
        }
    }

    boolean stopping() {
        lock.lock();
        try {
            return stopping;
        } finally {
            lock.unlock();
        }
    }

    boolean hasPending() {
        lock.lock();
        try {
            return count > inFlight;
        } finally {
            lock.unlock();
        }
    }

    /** A connection is up; returns its generation (answers of another are stale). */
    long connectionOpened(String point, boolean reconnect) {
        lock.lock();
        try {
            gen++;
            connected = true;
            ackPoint = point;
            lastError = null;
            if (reconnect) {
                reconnects++;
            }
            return gen;
        } finally {
            lock.unlock();
        }
    }

    /**
     * Connection {@code generation} is gone: what it had not settled is pending again, in place
     * and in order, to be sent again on the next one. Idempotent.
     */
    void connectionLost(long generation, String error) {
        lock.lock();
        try {
            if (error != null) {
                lastError = error;
            }
            if (generation != gen) {
                return;
            }
            gen++;
            connected = false;
            for (int k = 0; k < inFlight; k++) {
                // Sent again: the next connection's answer decides how it is counted.
                int i = (head + k) & mask;
                if ((flags[i] & REFUSED) == 0) {
                    flags[i] |= MAYBE_STORED;
                }
                flags[i] &= ~REFUSED;
                refusals[i] = null;
            }
            inFlight = 0;
            inFlightBytes = 0;
            changed.signalAll();
        } finally {
            lock.unlock();
        }
    }

    void connectFailed(String error) {
        lock.lock();
        try {
            lastError = error;
        } finally {
            lock.unlock();
        }
    }

    /**
     * Queues the in-band "dropped" record if drops are unreported, the sender is connected (an
     * outage makes one report, not one per attempt) and there is room; it takes a number like
     * any record.
     */
    private void addReport() {
        if (!drops.unreported() || !connected || closed) {
            return; // closed: the summary line at close() tells what was dropped
        }
        long now = wallMicros.getAsLong();
        byte[] line = drops.reportLine(now);
        if (count + 1 > maxRecords || bytes + line.length > maxBytes) {
            return; // no room yet: it waits, and keeps counting
        }
        append(line, Severity.WARN.ordinal(), now, REPORT);
        drops.reported();
    }

    /**
     * Plain mode: copies the first records to write into {@code batch}; they stay queued (and in
     * the bound) until {@link #commit} says they were written.
     */
    void peek(Batch batch, long maxBatchBytes) {
        lock.lock();
        try {
            addReport();
            fill(batch, 0, maxBatchBytes);
        } finally {
            lock.unlock();
        }
    }

    /** Plain mode: the first {@code written} records of the last {@link #peek} are in the socket. */
    void commit(Batch batch, int written) {
        lock.lock();
        try {
            if (headSeq != batch.firstSeq) {
                return; // stop() cleared them meanwhile (and counted them)
            }
            for (int k = 0; k < written && count > 0; k++) {
                if ((pop() & REPORT) != 0) {
                    reportsSent++;
                } else {
                    sent++;
                }
            }
            changed.signalAll();
        } finally {
            lock.unlock();
        }
    }

    /**
     * Acknowledged mode: copies the next records to send into {@code batch} and counts them in
     * flight on connection {@code generation} (nothing if that connection is gone already).
     */
    void take(long generation, Batch batch, long maxBatchBytes) {
        lock.lock();
        try {
            batch.size = 0;
            if (generation != gen) {
                return;
            }
            addReport();
            fill(batch, inFlight, maxBatchBytes);
            for (int k = 0; k < batch.size; k++) {
                int i = (head + inFlight + k) & mask;
                boolean again = (flags[i] & SENT_BEFORE) != 0;
                flags[i] |= SENT_BEFORE;
                if ((flags[i] & REPORT) != 0) {
                    reportsSent += again ? 0 : 1;
                } else {
                    sent++;
                    resent += again ? 1 : 0;
                }
                inFlightBytes += data[i].length;
            }
            inFlight += batch.size;
        } finally {
            lock.unlock();
        }
    }

    private void fill(Batch batch, int offset, long maxBatchBytes) {
        batch.size = 0;
        batch.firstSeq = headSeq + offset;
        long size = 0;
        int capacity = batch.data.length;
        for (int k = offset; k < count && batch.size < capacity; k++) {
            int i = (head + k) & mask;
            int length = data[i].length;
            if (batch.size > 0 && size + length > maxBatchBytes) {
                break;
            }
            batch.data[batch.size] = data[i];
            batch.times[batch.size] = times[i];
            batch.size++;
            size += length;
        }
    }

    /**
     * The number a new connection starts at ({@code SLUICE/2 ACK … first=}): the first record not
     * acknowledged, or the next one to be queued.
     */
    long firstUnsettled() {
        lock.lock();
        try {
            return headSeq;
        } finally {
            lock.unlock();
        }
    }

    // The ACK reader's side. --------------------------------------------------------------------

    /** {@code ACK n}: every record up to {@code n} on connection {@code generation} is settled. */
    void ack(long generation, long n) {
        lock.lock();
        try {
            if (generation != gen) {
                return;
            }
            while (inFlight > 0 && headSeq <= n) {
                int length = data[head].length;
                String refusal = refusals[head];
                byte flag = pop();
                inFlight--;
                inFlightBytes -= length;
                if ((flag & REPORT) != 0) {
                    continue;
                }
                if ((flag & REFUSED) == 0) {
                    acknowledged++;
                } else {
                    countRefused(flag, refusal);
                }
            }
            changed.signalAll();
        } finally {
            lock.unlock();
        }
    }

    /**
     * A record whose last send was refused: a {@code nak} by its reason, or {@code unconfirmed} if
     * an earlier send's connection broke unsettled (that send may have been stored).
     */
    private void countRefused(byte flag, String reason) {
        if ((flag & MAYBE_STORED) != 0) {
            unconfirmed++;
        } else {
            nak.merge(reason, 1L, Long::sum);
        }
    }

    /**
     * {@code NAK n reason}: that record was refused; it is never sent again on its own account,
     * and counted when the {@code ACK} that follows settles it (or the sender stops).
     */
    void nak(long generation, long n, String reason) {
        lock.lock();
        try {
            if (generation != gen) {
                return;
            }
            long offset = n - headSeq;
            if (offset >= 0 && offset < inFlight) {
                int i = (head + (int) offset) & mask;
                if ((flags[i] & REFUSED) == 0) {
                    flags[i] |= REFUSED;
                    refusals[i] = reason;
                }
            }
        } finally {
            lock.unlock();
        }
    }

    /** Records the agent refused whose covering {@code ACK} has not come yet (not counted yet). */
    int refusedAwaitingAck() {
        lock.lock();
        try {
            int refused = 0;
            for (int k = 0; k < inFlight; k++) {
                refused += (flags[(head + k) & mask] & REFUSED) != 0 ? 1 : 0;
            }
            return refused;
        } finally {
            lock.unlock();
        }
    }

    // flush() and close(). ----------------------------------------------------------------------

    /** Waits until nothing is queued or unsettled; false if the timeout passed first (or the caller was interrupted). */
    boolean waitDrained(long timeoutNanos) {
        lock.lock();
        flushers++;
        try {
            if (lingering) {
                changed.signalAll(); // the sender writes now
            }
            long remaining = timeoutNanos;
            while (count > 0) {
                if (remaining <= 0) {
                    return false;
                }
                try {
                    remaining = changed.awaitNanos(remaining);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    return count == 0;
                }
            }
            return true;
        } finally {
            flushers--;
            lock.unlock();
        }
    }

    /** Records settled so far: lets close() tell an agent that takes nothing from a slow one. */
    long progress() {
        lock.lock();
        try {
            return progress;
        } finally {
            lock.unlock();
        }
    }

    /** Refuse new records from now on (each counted {@code closed}). */
    void close() {
        lock.lock();
        try {
            closed = true;
        } finally {
            lock.unlock();
        }
    }

    /**
     * Stops the sender; what is left is counted: queued as dropped {@code closed}, sent and not
     * settled as {@code unconfirmed} (the agent may have stored it).
     */
    void stop() {
        lock.lock();
        try {
            stopping = true;
            closed = true;
            for (int k = 0; k < count; k++) {
                int i = (head + k) & mask;
                if ((flags[i] & REPORT) == 0) {
                    if (k < inFlight && (flags[i] & REFUSED) != 0) {
                        countRefused(flags[i], refusals[i]);
                    } else if (k < inFlight) {
                        unconfirmed++;
                    } else {
                        // Counted, not announced: close() writes the summary, and no connection is left to report on.
                        drops.countQuietly(DropReason.CLOSED, levels[i]);
                    }
                }
                data[i] = null;
                refusals[i] = null;
            }
            headSeq += count;
            count = 0;
            inFlight = 0;
            bytes = 0;
            inFlightBytes = 0;
            changed.signalAll();
        } finally {
            lock.unlock();
        }
    }

    // Visibility. -------------------------------------------------------------------------------

    /** Nanoseconds until a pending notice may be written; -1 if there is none. */
    long noticeDueInNanos() {
        lock.lock();
        try {
            return drops.noticeDueInNanos();
        } finally {
            lock.unlock();
        }
    }

    /** The line about drops, if one is due (at most one per {@link Drops#NOTICE_INTERVAL_NANOS}). */
    String takeNotice(String socketPath) {
        lock.lock();
        try {
            String state = connected ? "connected" : "not connected (" + (lastError != null ? lastError : "not tried yet") + ")";
            return drops.takeNotice(socketPath + ": " + state);
        } finally {
            lock.unlock();
        }
    }

    /** One line for close(), if anything was lost or left unconfirmed; null otherwise. */
    String summary(String socketPath) {
        lock.lock();
        try {
            Map<String, Long> byReason = drops.byReason();
            long droppedTotal = byReason.values().stream().mapToLong(Long::longValue).sum();
            long nakTotal = nak.values().stream().mapToLong(Long::longValue).sum();
            if (droppedTotal == 0 && nakTotal == 0 && unconfirmed == 0) {
                return null;
            }
            return "sluice client: closed; sent " + sent + ", acknowledged " + acknowledged + ", dropped " + droppedTotal
                    + (droppedTotal > 0 ? " (" + Drops.words(byReason) + ")" : "")
                    + ", refused by the agent " + nakTotal + (nakTotal > 0 ? " (" + Drops.words(nak) + ")" : "")
                    + ", unconfirmed " + unconfirmed + "; agent " + socketPath;
        } finally {
            lock.unlock();
        }
    }

    Stats stats() {
        lock.lock();
        try {
            return new Stats(count - inFlight, bytes - inFlightBytes, inFlight, inFlightBytes, sent, resent,
                    acknowledged, Map.copyOf(drops.byReasonAndLevel()), Map.copyOf(nak), replaced, truncated, reconnects,
                    unconfirmed, reportsSent, connected, ackPoint, lastError);
        } finally {
            lock.unlock();
        }
    }
}
