package dev.sluice.client;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.IdentityHashMap;
import java.util.List;
import java.util.Set;

/**
 * A throwable rendered as the text of one {@code stack_trace} field, line by line, and written
 * into a byte budget.
 *
 * <p>Root cause first: the cause chain is printed from its root outwards, each wrapper as {@code
 * Wrapped by: …} (logback's {@code %rootException} order) with the frames it shares with its
 * cause omitted; suppressed exceptions follow the exception that suppressed them, indented, in
 * the JDK's own form (with their causes as {@code Caused by:}). A cycle prints as {@code
 * [CIRCULAR REFERENCE: …]}. The root cause first means that when the text must be cut, what is
 * kept is where the failure started.
 *
 * <p>Cutting ({@link #write}): frames are removed from the middle outwards (the root cause's
 * first frames and the outermost wrapper's last frames stay, and every header line stays), a
 * {@code [… N frames elided …]} line standing for each run removed; only if the headers alone do
 * not fit is the text cut at its end.
 *
 * <p>Must not: throw (a {@code toString()} that throws is described instead), or recurse without
 * bound (cycles are detected as the JDK detects them). One instance per encoder, reused.
 */
final class StackTrace {
    final StringBuilder text = new StringBuilder(4096);
    private int[] starts = new int[64];
    private int[] ends = new int[64];
    private boolean[] frame = new boolean[64];
    private int lines;
    private final Set<Throwable> seen = Collections.newSetFromMap(new IdentityHashMap<>());

    void clear() {
        if (text.capacity() > 64 * 1024) {
            text.setLength(0);
            text.trimToSize();
        }
        text.setLength(0);
        lines = 0;
        seen.clear();
    }

    boolean isEmpty() {
        return lines == 0;
    }

    /** Renders {@code top} and everything it holds (see the class comment). */
    void render(Throwable top) {
        clear();
        List<Throwable> chain = new ArrayList<>();
        Throwable t = top;
        while (t != null && seen.add(t)) {
            chain.add(t);
            t = causeOf(t);
        }
        Throwable circular = t;
        StackTraceElement[][] frames = new StackTraceElement[chain.size()][];
        for (int i = 0; i < chain.size(); i++) {
            frames[i] = framesOf(chain.get(i));
        }
        int root = chain.size() - 1;
        for (int i = root; i >= 0; i--) {
            Throwable ex = chain.get(i);
            StackTraceElement[] own = frames[i];
            int common = i < root ? inCommon(own, frames[i + 1]) : 0;
            beginLine(false);
            if (i < root) {
                text.append("Wrapped by: ");
            }
            text.append(describe(ex));
            endLine();
            for (int f = 0; f < own.length - common; f++) {
                beginLine(true);
                text.append("\tat ").append(own[f]);
                endLine();
            }
            if (common > 0) {
                beginLine(false);
                text.append("\t... ").append(common).append(" common frames omitted");
                endLine();
            }
            for (Throwable suppressed : suppressedOf(ex)) {
                enclosed(suppressed, own, "\t", "Suppressed: ");
            }
            if (i == root && circular != null) {
                beginLine(false);
                text.append("\tCaused by: [CIRCULAR REFERENCE: ").append(describe(circular)).append(']');
                endLine();
            }
        }
    }

    /** The JDK's rendering of an enclosed trace (a suppressed exception, a cause inside one). */
    private void enclosed(Throwable t, StackTraceElement[] enclosing, String prefix, String caption) {
        if (!seen.add(t)) {
            beginLine(false);
            text.append(prefix).append(caption).append("[CIRCULAR REFERENCE: ").append(describe(t)).append(']');
            endLine();
            return;
        }
        StackTraceElement[] own = framesOf(t);
        int common = inCommon(own, enclosing);
        beginLine(false);
        text.append(prefix).append(caption).append(describe(t));
        endLine();
        for (int f = 0; f < own.length - common; f++) {
            beginLine(true);
            text.append(prefix).append("\tat ").append(own[f]);
            endLine();
        }
        if (common > 0) {
            beginLine(false);
            text.append(prefix).append("\t... ").append(common).append(" more");
            endLine();
        }
        for (Throwable suppressed : suppressedOf(t)) {
            enclosed(suppressed, own, prefix + "\t", "Suppressed: ");
        }
        Throwable cause = causeOf(t);
        if (cause != null) {
            enclosed(cause, own, prefix, "Caused by: ");
        }
    }

    /** Takes text already rendered (a framework's): its lines, those starting {@code <space>at } as frames. */
    void renderText(String rendered) {
        clear();
        int n = rendered.length();
        while (n > 0 && (rendered.charAt(n - 1) == '\n' || rendered.charAt(n - 1) == '\r')) {
            n--;
        }
        int at = 0;
        while (at <= n) {
            int end = rendered.indexOf('\n', at);
            if (end < 0 || end > n) {
                end = n;
            }
            int stop = end > at && rendered.charAt(end - 1) == '\r' ? end - 1 : end;
            int first = at;
            while (first < stop && (rendered.charAt(first) == ' ' || rendered.charAt(first) == '\t')) {
                first++;
            }
            boolean isFrame = first > at && rendered.startsWith("at ", first);
            beginLine(isFrame);
            text.append(rendered, at, stop);
            endLine();
            at = end + 1;
        }
    }

    private void beginLine(boolean isFrame) {
        if (lines == starts.length) {
            starts = Arrays.copyOf(starts, lines * 2);
            ends = Arrays.copyOf(ends, lines * 2);
            frame = Arrays.copyOf(frame, lines * 2);
        }
        if (lines > 0) {
            text.append('\n');
        }
        starts[lines] = text.length();
        frame[lines] = isFrame;
    }

    private void endLine() {
        ends[lines] = text.length();
        lines++;
    }

    /** Bytes the whole text takes as a JSON string, quotes included. */
    long wholeBytes() {
        return JsonBuffer.stringBytes(text);
    }

    /**
     * Writes the text as a JSON string of at most {@code budget} bytes (quotes included): whole
     * if it fits, else with the fewest frames removed from the middle that makes it fit, else
     * without frames and cut at its end.
     */
    void write(JsonBuffer out, int budget) {
        if (text.length() + 2 <= budget && wholeBytes() <= budget) {
            out.string(text);
            return;
        }
        int[] frames = new int[lines];
        int frameCount = 0;
        for (int i = 0; i < lines; i++) {
            if (frame[i]) {
                frames[frameCount++] = i;
            }
        }
        // Removal order: nearest the middle frame first (ties: the earlier frame).
        Integer[] order = new Integer[frameCount];
        for (int j = 0; j < frameCount; j++) {
            order[j] = j;
        }
        double middle = (frameCount - 1) / 2.0;
        Arrays.sort(order, (a, b) -> Double.compare(Math.abs(a - middle), Math.abs(b - middle)));
        long[] lineBytes = new long[lines];
        for (int i = 0; i < lines; i++) {
            lineBytes[i] = JsonBuffer.bodyBytes(text, starts[i], ends[i]);
        }
        boolean[] removed = new boolean[lines];
        if (sizeWithout(frameCount, frames, order, removed, lineBytes) <= budget) {
            int low = 0;
            int high = frameCount;
            while (low < high) { // the fewest frames removed that fit
                int mid = (low + high) >>> 1;
                if (sizeWithout(mid, frames, order, removed, lineBytes) <= budget) {
                    high = mid;
                } else {
                    low = mid + 1;
                }
            }
            mark(high, frames, order, removed);
            out.raw('"');
            writeKept(out, removed);
            out.raw('"');
            return;
        }
        mark(frameCount, frames, order, removed);
        // The headers alone are too long: the text without frames, cut at its end.
        StringBuilder plain = new StringBuilder();
        appendKept(plain, removed);
        out.stringCut(plain, budget);
    }

    private void mark(int k, int[] frames, Integer[] order, boolean[] removed) {
        Arrays.fill(removed, false);
        for (int j = 0; j < k; j++) {
            removed[frames[order[j]]] = true;
        }
    }

    private long sizeWithout(int k, int[] frames, Integer[] order, boolean[] removed, long[] lineBytes) {
        mark(k, frames, order, removed);
        long size = 2;
        int outputLines = 0;
        int run = 0;
        for (int i = 0; i <= lines; i++) {
            if (i < lines && removed[i]) {
                run++;
                continue;
            }
            if (run > 0) {
                size += JsonBuffer.bodyBytes(elided(run), 0, elided(run).length());
                outputLines++;
                run = 0;
            }
            if (i < lines) {
                size += lineBytes[i];
                outputLines++;
            }
        }
        return size + 2L * Math.max(0, outputLines - 1);
    }

    private void writeKept(JsonBuffer out, boolean[] removed) {
        int run = 0;
        boolean first = true;
        for (int i = 0; i <= lines; i++) {
            if (i < lines && removed[i]) {
                run++;
                continue;
            }
            if (run > 0) {
                if (!first) {
                    out.body("\n", 0, 1);
                }
                String marker = elided(run);
                out.body(marker, 0, marker.length());
                first = false;
                run = 0;
            }
            if (i < lines) {
                if (!first) {
                    out.body("\n", 0, 1);
                }
                out.body(text, starts[i], ends[i]);
                first = false;
            }
        }
    }

    private void appendKept(StringBuilder out, boolean[] removed) {
        int run = 0;
        for (int i = 0; i <= lines; i++) {
            if (i < lines && removed[i]) {
                run++;
                continue;
            }
            if (run > 0) {
                out.append(out.length() > 0 ? "\n" : "").append(elided(run));
                run = 0;
            }
            if (i < lines) {
                if (out.length() > 0) {
                    out.append('\n');
                }
                out.append(text, starts[i], ends[i]);
            }
        }
    }

    private static String elided(int run) {
        return "\t[… " + run + (run == 1 ? " frame" : " frames") + " elided …]";
    }

    /** Trailing frames {@code own} shares with {@code other} (the JDK's "... n more"). */
    private static int inCommon(StackTraceElement[] own, StackTraceElement[] other) {
        int m = own.length - 1;
        int n = other.length - 1;
        while (m >= 0 && n >= 0 && own[m].equals(other[n])) {
            m--;
            n--;
        }
        return own.length - 1 - m;
    }

    /** {@code t.toString()}, or what it is if that throws (a user's exception may). */
    static String describe(Throwable t) {
        try {
            String s = t.toString();
            return s != null ? s : t.getClass().getName();
        } catch (RuntimeException | StackOverflowError e) {
            return t.getClass().getName() + ": <toString() threw " + e.getClass().getName() + ">";
        }
    }

    private static StackTraceElement[] framesOf(Throwable t) {
        try {
            StackTraceElement[] frames = t.getStackTrace();
            return frames != null ? frames : new StackTraceElement[0];
        } catch (RuntimeException e) {
            return new StackTraceElement[0];
        }
    }

    private static Throwable causeOf(Throwable t) {
        try {
            return t.getCause();
        } catch (RuntimeException e) {
            return null;
        }
    }

    private static Throwable[] suppressedOf(Throwable t) {
        try {
            return t.getSuppressed();
        } catch (RuntimeException e) {
            return new Throwable[0];
        }
    }
}
