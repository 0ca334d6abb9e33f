package dev.sluice.client;

import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import java.util.function.LongSupplier;

/**
 * Every drop the client counted, and the two ways it tells of them besides the counters: the
 * in-band {@code "sluice.client":"dropped"} record (drops not yet reported) and the notice line
 * (drops not yet noticed, at most one line per {@link #NOTICE_INTERVAL_NANOS}).
 *
 * <p>Must not: be used without the {@link RecordQueue}'s lock, which guards it; format anything
 * on the logging path (a drop only adds to two arrays).
 */
final class Drops {
    /** How often, at most, a line about drops is written. */
    static final long NOTICE_INTERVAL_NANOS = TimeUnit.MINUTES.toNanos(1);
    /** The logger name of the in-band report. */
    static final String REPORT_LOGGER = "dev.sluice.client";
    private static final long PID = ProcessHandle.current().pid();

    private final LongSupplier nanoClock;
    private final LongSupplier wallMicros;
    private final long[][] counted = new long[DropReason.COUNT][Severity.COUNT];
    private final long[][] unreported = new long[DropReason.COUNT][Severity.COUNT];
    private long unreportedTotal;
    private long unreportedSince;
    private long unnoticed;
    private long noticeAt;
    private final JsonBuffer report = new JsonBuffer();

    Drops(LongSupplier nanoClock, LongSupplier wallMicros) {
        this.nanoClock = nanoClock;
        this.wallMicros = wallMicros;
        this.noticeAt = nanoClock.getAsLong();
    }

    /** Counts {@code n} drops, to be reported and noticed; true if they are the first not yet noticed. */
    boolean count(DropReason reason, int level, long n) {
        counted[reason.ordinal()][level] += n;
        unreported[reason.ordinal()][level] += n;
        if (unreportedTotal == 0) {
            unreportedSince = wallMicros.getAsLong();
        }
        unreportedTotal += n;
        boolean first = unnoticed == 0;
        unnoticed += n;
        return first;
    }

    /** Counts a drop that is neither reported nor noticed (at stop: the summary tells of it). */
    void countQuietly(DropReason reason, int level) {
        counted[reason.ordinal()][level]++;
    }

    boolean unreported() {
        return unreportedTotal > 0;
    }

    /**
     * The in-band report of the drops not yet reported, as a line; {@link #reported()} once it is
     * queued.
     */
    byte[] reportLine(long nowMicros) {
        JsonBuffer o = report;
        o.reset();
        o.ascii("{\"time\":");
        o.time(nowMicros);
        o.ascii(",\"level\":\"warn\",\"logger\":\"" + REPORT_LOGGER + "\",\"message\":\"sluice client dropped ");
        o.number(unreportedTotal);
        o.ascii(" log records\",\"process\":");
        o.number(PID);
        o.ascii(",\"sluice.client\":\"dropped\",\"count\":");
        o.number(unreportedTotal);
        o.ascii(",\"since\":");
        o.time(unreportedSince);
        o.ascii(",\"by_reason\":{");
        boolean first = true;
        for (DropReason reason : DropReason.values()) {
            long n = Arrays.stream(unreported[reason.ordinal()]).sum();
            if (n > 0) {
                o.ascii((first ? "\"" : ",\"") + reason.label() + "\":");
                o.number(n);
                first = false;
            }
        }
        o.ascii("},\"by_level\":{");
        first = true;
        for (int level = 0; level < Severity.COUNT; level++) {
            long n = 0;
            for (long[] byLevel : unreported) {
                n += byLevel[level];
            }
            if (n > 0) {
                o.ascii((first ? "\"" : ",\"") + Severity.of(level).label() + "\":");
                o.number(n);
                first = false;
            }
        }
        o.ascii("}}");
        return o.toLine();
    }

    void reported() {
        for (long[] byLevel : unreported) {
            Arrays.fill(byLevel, 0);
        }
        unreportedTotal = 0;
    }

    boolean noticeDue() {
        return unnoticed > 0 && nanoClock.getAsLong() - noticeAt >= 0;
    }

    /** Nanoseconds until a pending notice may be written; -1 if there is none. */
    long noticeDueInNanos() {
        return unnoticed == 0 ? -1 : Math.max(0, noticeAt - nanoClock.getAsLong());
    }

    /** The notice line, if one is due; {@code agent} says where the agent is and how it is. */
    String takeNotice(String agent) {
        if (!noticeDue()) {
            return null;
        }
        long n = unnoticed;
        unnoticed = 0;
        noticeAt = nanoClock.getAsLong() + NOTICE_INTERVAL_NANOS;
        return "sluice client: dropped " + n + " log record(s) since the last notice (total by reason: "
                + words(byReason()) + "); agent " + agent;
    }

    /** Drops by reason, only the reasons that have any, in {@link DropReason} order. */
    Map<String, Long> byReason() {
        Map<String, Long> byReason = new LinkedHashMap<>();
        for (DropReason reason : DropReason.values()) {
            long n = Arrays.stream(counted[reason.ordinal()]).sum();
            if (n > 0) {
                byReason.put(reason.label(), n);
            }
        }
        return byReason;
    }

    /** {@code {reason: {level: n}}}, only what is not zero. */
    Map<String, Map<String, Long>> byReasonAndLevel() {
        Map<String, Map<String, Long>> all = new LinkedHashMap<>();
        for (DropReason reason : DropReason.values()) {
            Map<String, Long> byLevel = new LinkedHashMap<>();
            for (int level = 0; level < Severity.COUNT; level++) {
                long n = counted[reason.ordinal()][level];
                if (n > 0) {
                    byLevel.put(Severity.of(level).label(), n);
                }
            }
            if (!byLevel.isEmpty()) {
                all.put(reason.label(), Map.copyOf(byLevel));
            }
        }
        return all;
    }

    /** {@code full=3, closed=2}. */
    static String words(Map<String, Long> counts) {
        StringBuilder out = new StringBuilder();
        counts.forEach((word, n) -> out.append(out.length() > 0 ? ", " : "").append(word).append('=').append(n));
        return out.toString();
    }
}
