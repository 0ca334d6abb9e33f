package dev.sluice.client;

import java.lang.reflect.Array;
import java.math.BigDecimal;
import java.math.BigInteger;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;

/**
 * From a {@link LogRecord} to one line the agent accepts: a JSON object of at most {@code
 * maxRecordSize} bytes, plus its newline.
 *
 * <p>Owns the record's shape ({@code time}, {@code level}, {@code logger}, {@code message},
 * {@code thread}, {@code process}, {@code trace_id}, {@code span_id}, {@code stack_trace}, then
 * the fields; {@code truncated} and {@code elided_fields} when cut), the same as the Python
 * client's, and the cutting of a record that is too long: fields first (the largest shortened,
 * then left out and named in {@code elided_fields}) when they take more than a quarter of the
 * limit, then the message and the stack trace share what is left (small needs in full, large
 * ones equally), the stack trace losing frames from its middle ({@link StackTrace#write}).
 *
 * <p>Must not: do I/O or take a lock (it runs on the application's thread, inside the logging
 * call), or be shared between threads: {@link SluiceClient} keeps one per thread and reuses its
 * buffers, so the common path allocates only the line it returns.
 */
final class RecordEncoder {
    /** Deepest nesting kept in field values; deeper values become their {@code toString()}. */
    static final int MAX_VALUE_DEPTH = 16;
    /** The names this encoder writes; a field with one of them is written as {@code extra.<name>}. */
    static final Set<String> CORE_FIELDS = Set.of(
            "time", "level", "logger", "message", "thread", "process", "trace_id", "span_id",
            "stack_trace", "truncated", "elided_fields", "sluice.client");
    /** Trace and span ids are short; an app's odd value is cut to this. */
    private static final int MAX_ID_BYTES = 256;
    private static final int MAX_ELIDED_FIELDS_BYTES = 1024;
    private static final long PID = ProcessHandle.current().pid();

    private static final byte[] TIME = ascii("{\"time\":");
    private static final byte[] LEVEL = ascii(",\"level\":");
    private static final byte[] LOGGER = ascii(",\"logger\":");
    private static final byte[] MESSAGE = ascii(",\"message\":");
    private static final byte[] THREAD = ascii(",\"thread\":");
    private static final byte[] PROCESS = ascii(",\"process\":");
    private static final byte[] TRACE_ID = ascii(",\"trace_id\":");
    private static final byte[] SPAN_ID = ascii(",\"span_id\":");
    private static final byte[] STACK_TRACE = ascii(",\"stack_trace\":");
    private static final byte[] TRUNCATED = ascii(",\"truncated\":true");
    private static final byte[] ELIDED_FIELDS = ascii(",\"elided_fields\":");
    private static final byte[] NULL = ascii("null");
    private static final byte[] TRUE = ascii("true");
    private static final byte[] FALSE = ascii("false");

    private static final byte WHOLE = 0;
    private static final byte CUT = 1;
    private static final byte ELIDED = 2;
    /** A budget meaning "the whole text". */
    private static final int UNLIMITED = -1;

    private final int maxRecordSize;
    final JsonBuffer out = new JsonBuffer();
    private final JsonBuffer scratch = new JsonBuffer();
    private final StackTrace stack = new StackTrace();
    private boolean hasStack;
    private String[] keys = new String[8];
    private byte[] mode = new byte[8];

    // The plan of the current write: whole unless fit() set budgets.
    private int messageBudget;
    private int stackBudget;
    private int fieldCap;
    private boolean markTruncated;
    private String elidedFields;

    /** Set while this encoder is in use on its thread (a value's toString() may log again). */
    boolean busy;
    /** Whether the last record had characters replaced by U+FFFD; whether it was cut. */
    boolean replaced;
    boolean truncated;

    RecordEncoder(int maxRecordSize) {
        this.maxRecordSize = maxRecordSize;
    }

    /** The record as one line (newline included) of at most {@code maxRecordSize + 1} bytes. */
    byte[] encode(LogRecord r) {
        replaced = false;
        truncated = false;
        prepareKeys(r);
        hasStack = false;
        if (r.thrown != null) {
            try {
                stack.render(r.thrown);
            } catch (RuntimeException | StackOverflowError e) {
                stack.renderText(StackTrace.describe(r.thrown) + "\n\t<the stack trace could not be rendered: "
                        + e.getClass().getName() + ">");
            }
            hasStack = true;
        } else if (r.stackTrace != null) {
            stack.renderText(r.stackTrace);
            hasStack = true;
        }
        messageBudget = UNLIMITED;
        stackBudget = UNLIMITED;
        markTruncated = false;
        elidedFields = null;
        Arrays.fill(mode, 0, r.fieldCount, WHOLE);
        if (!obviouslyTooLong(r)) {
            write(r);
            if (out.length <= maxRecordSize) {
                return line();
            }
        }
        truncated = true;
        fit(r);
        return line();
    }

    /**
     * Lets go of what the last record left here, once its line is made: the exceptions its stack
     * trace walked, and a scratch or stack-trace buffer a large record grew. Without it a thread
     * that logged one large record or exception and then went quiet kept them alive.
     */
    void release() {
        scratch.reset();
        stack.clear();
    }

    /** The line, and the buffer back to its usual size if this record grew it. */
    private byte[] line() {
        byte[] line = out.toLine();
        out.reset();
        return line;
    }

    /** A text with more characters than the limit has bytes to cut: skip writing it whole. */
    private boolean obviouslyTooLong(LogRecord r) {
        if (r.message != null && r.message.length() > maxRecordSize) {
            return true;
        }
        if (hasStack && stack.text.length() > maxRecordSize) {
            return true;
        }
        for (int i = 0; i < r.fieldCount; i++) {
            if (r.values[i] instanceof CharSequence && ((CharSequence) r.values[i]).length() > maxRecordSize) {
                return true;
            }
        }
        return false;
    }

    private void prepareKeys(LogRecord r) {
        int n = r.fieldCount;
        if (keys.length < n) {
            keys = new String[r.names.length];
            mode = new byte[r.names.length];
        }
        for (int i = 0; i < n; i++) {
            String name = r.names[i];
            keys[i] = CORE_FIELDS.contains(name) || namedBefore(r, i, name) ? "extra." + name : name;
        }
    }

    private static boolean namedBefore(LogRecord r, int i, String name) {
        for (int j = 0; j < i; j++) {
            if (r.names[j].equals(name)) {
                return true;
            }
        }
        return false;
    }

    private void write(LogRecord r) {
        JsonBuffer o = out;
        o.reset();
        o.raw(TIME);
        o.time(r.epochMicros);
        o.raw(LEVEL);
        o.raw(r.severity.json());
        o.raw(LOGGER);
        o.string(orEmpty(r.logger));
        o.raw(MESSAGE);
        text(o, orEmpty(r.message), messageBudget);
        o.raw(THREAD);
        o.string(orEmpty(r.thread));
        o.raw(PROCESS);
        o.number(PID);
        if (r.traceId != null) {
            o.raw(TRACE_ID);
            o.stringCut(r.traceId, MAX_ID_BYTES);
        }
        if (r.spanId != null) {
            o.raw(SPAN_ID);
            o.stringCut(r.spanId, MAX_ID_BYTES);
        }
        if (hasStack) {
            o.raw(STACK_TRACE);
            if (stackBudget == UNLIMITED) {
                o.string(stack.text);
            } else if (stackBudget <= 2) {
                o.raw('"');
                o.raw('"');
            } else {
                stack.write(o, stackBudget);
            }
        }
        for (int i = 0; i < r.fieldCount; i++) {
            if (mode[i] == ELIDED) {
                continue;
            }
            o.raw(',');
            o.string(keys[i]);
            o.raw(':');
            if (mode[i] == WHOLE) {
                value(o, r.values[i], 0);
            } else {
                cutValue(r.values[i], fieldCap);
            }
        }
        if (markTruncated) {
            o.raw(TRUNCATED);
        }
        if (elidedFields != null) {
            o.raw(ELIDED_FIELDS);
            o.stringCut(elidedFields, MAX_ELIDED_FIELDS_BYTES);
        }
        o.raw('}');
        replaced |= o.replaced > 0;
    }

    private static void text(JsonBuffer o, String text, int budget) {
        if (budget == UNLIMITED) {
            o.string(text);
        } else {
            o.stringCut(text, budget);
        }
    }

    private static String orEmpty(String s) {
        return s == null ? "" : s;
    }

    /** A field value as JSON (see {@link LogRecord#field}). */
    private void value(JsonBuffer o, Object v, int depth) {
        if (v == null) {
            o.raw(NULL);
        } else if (v instanceof CharSequence) {
            o.string((CharSequence) v);
        } else if (v instanceof Boolean) {
            o.raw((Boolean) v ? TRUE : FALSE);
        } else if (v instanceof Integer || v instanceof Long || v instanceof Short || v instanceof Byte
                || v instanceof AtomicInteger || v instanceof AtomicLong) {
            o.number(((Number) v).longValue());
        } else if (v instanceof Double || v instanceof Float) {
            double d = ((Number) v).doubleValue();
            if (Double.isFinite(d)) {
                o.ascii(v.toString());
            } else {
                o.string(v.toString());
            }
        } else if (v instanceof BigInteger || v instanceof BigDecimal) {
            o.ascii(v.toString());
        } else if (v instanceof Character) {
            o.string(v.toString());
        } else if (depth >= MAX_VALUE_DEPTH) {
            o.string(safeString(v));
        } else {
            int mark = o.length;
            try {
                container(o, v, depth);
            } catch (RuntimeException e) { // a map changed while read, an iterator that throws
                o.length = mark;
                o.string(safeString(v));
            }
        }
    }

    private void container(JsonBuffer o, Object v, int depth) {
        if (v instanceof Map) {
            o.raw('{');
            boolean first = true;
            for (Map.Entry<?, ?> e : ((Map<?, ?>) v).entrySet()) {
                if (!first) {
                    o.raw(',');
                }
                first = false;
                Object key = e.getKey();
                o.string(key instanceof CharSequence ? (CharSequence) key : safeString(key));
                o.raw(':');
                value(o, e.getValue(), depth + 1);
            }
            o.raw('}');
        } else if (v instanceof Iterable) {
            o.raw('[');
            boolean first = true;
            for (Object item : (Iterable<?>) v) {
                if (!first) {
                    o.raw(',');
                }
                first = false;
                value(o, item, depth + 1);
            }
            o.raw(']');
        } else if (v.getClass().isArray()) {
            o.raw('[');
            int n = Array.getLength(v);
            for (int i = 0; i < n; i++) {
                if (i > 0) {
                    o.raw(',');
                }
                value(o, Array.get(v, i), depth + 1);
            }
            o.raw(']');
        } else {
            o.string(safeString(v));
        }
    }

    static String safeString(Object v) {
        try {
            String s = String.valueOf(v);
            return s != null ? s : "null";
        } catch (RuntimeException | StackOverflowError e) {
            return "<unprintable " + v.getClass().getName() + ">";
        }
    }

    /** A field value shortened to {@code cap} bytes: a string cut, anything else its JSON text cut as a string. */
    private void cutValue(Object v, int cap) {
        if (v instanceof CharSequence) {
            out.stringCut((CharSequence) v, cap);
        } else {
            scratch.reset();
            value(scratch, v, 0);
            out.stringCut(scratch.text(), cap);
        }
    }

    private long valueBytes(Object v) {
        if (v instanceof CharSequence) {
            return JsonBuffer.stringBytes((CharSequence) v);
        }
        scratch.reset();
        value(scratch, v, 0);
        return scratch.length;
    }

    /** Cut a record that is too long (see the class comment); {@link #out} then holds it. */
    private void fit(LogRecord r) {
        int limit = maxRecordSize;
        markTruncated = true;
        int n = r.fieldCount;
        long[] sizes = new long[n];
        long total = 0;
        for (int i = 0; i < n; i++) {
            sizes[i] = JsonBuffer.stringBytes(keys[i]) + 2 + valueBytes(r.values[i]);
            total += sizes[i];
        }
        long share = limit / 4;
        if (total > share) {
            fieldCap = Math.max(limit / 16, 64);
            Integer[] bySize = largestFirst(sizes);
            for (int i : bySize) {
                if (sizes[i] > fieldCap) {
                    mode[i] = CUT;
                    long cut = JsonBuffer.stringBytes(keys[i]) + 2 + fieldCap;
                    total -= sizes[i] - cut;
                    sizes[i] = cut;
                }
            }
            StringBuilder elided = new StringBuilder();
            for (int i : largestFirst(sizes)) {
                if (total <= share) {
                    break;
                }
                mode[i] = ELIDED;
                total -= sizes[i];
                elided.append(elided.length() > 0 ? "," : "").append(keys[i]);
            }
            if (elided.length() > 0) {
                elidedFields = elided.toString();
            }
        }

        String message = orEmpty(r.message);
        long messageNeed = need(message, 0, limit);
        long stackNeed = hasStack ? need(stack.text, 0, limit) : 0;
        long margin = 0;
        for (int attempt = 0; attempt < 4; attempt++) {
            messageBudget = 2;
            stackBudget = 2;
            write(r);
            long available = limit - out.length - margin;
            long[] budgets = share(new long[] {messageNeed, stackNeed}, available);
            messageBudget = (int) budgets[0] + 2;
            stackBudget = (int) budgets[1] + 2;
            write(r);
            if (out.length <= limit) {
                return;
            }
            margin += out.length - limit + 64;
        }
        minimal(r);
    }

    /** Bytes a text needs inside its quotes; past the limit, any larger number says as much. */
    private static long need(CharSequence text, int from, int limit) {
        return text.length() > limit ? limit + 1L : JsonBuffer.bodyBytes(text, from, text.length());
    }

    private static Integer[] largestFirst(long[] sizes) {
        Integer[] order = new Integer[sizes.length];
        for (int i = 0; i < order.length; i++) {
            order[i] = i;
        }
        Arrays.sort(order, (a, b) -> Long.compare(sizes[b], sizes[a]));
        return order;
    }

    /** Split {@code total} between {@code needs}: small needs in full, large ones equally. */
    static long[] share(long[] needs, long total) {
        long[] alloc = new long[needs.length];
        long remaining = Math.max(total, 0);
        Integer[] order = new Integer[needs.length];
        for (int i = 0; i < order.length; i++) {
            order[i] = i;
        }
        Arrays.sort(order, (a, b) -> Long.compare(needs[a], needs[b]));
        for (int position = 0; position < order.length; position++) {
            int index = order[position];
            alloc[index] = Math.min(needs[index], remaining / (order.length - position));
            remaining -= alloc[index];
        }
        return alloc;
    }

    /** The last resort (a logger name of a megabyte?): the bare minimum, cut to fit. */
    private void minimal(LogRecord r) {
        JsonBuffer o = out;
        o.reset();
        o.raw(TIME);
        o.time(r.epochMicros);
        o.raw(LEVEL);
        o.raw(r.severity.json());
        o.raw(LOGGER);
        o.stringCut(orEmpty(r.logger), 128);
        o.raw(MESSAGE);
        o.stringCut(orEmpty(r.message), Math.max(2, maxRecordSize - o.length - TRUNCATED.length - 8));
        o.raw(TRUNCATED);
        o.raw('}');
        replaced |= o.replaced > 0;
    }

    private static byte[] ascii(String s) {
        return s.getBytes(StandardCharsets.US_ASCII);
    }
}
