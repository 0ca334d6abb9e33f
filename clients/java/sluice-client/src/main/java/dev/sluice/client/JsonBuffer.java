package dev.sluice.client;

import java.nio.charset.StandardCharsets;
import java.util.Arrays;

/**
 * A growable byte buffer that JSON is written into as UTF-8, with the repairs the agent needs:
 * U+0000 and lone surrogates become U+FFFD (counted in {@link #replaced}) because the agent
 * refuses them raw and as <code>&#92;u0000</code> and unpaired <code>&#92;uD8xx</code> escapes; control characters
 * are escaped; strings can be cut to a byte budget without splitting a character.
 *
 * <p>Must not: allocate per character or per value on the common path (one buffer per encoder,
 * reused), or keep a large buffer after a large record (it shrinks back on {@link #reset()}).
 */
final class JsonBuffer {
    /** What ends a string that was cut; the other clients end theirs the same way. */
    static final String CUT_MARKER = "…[truncated]";
    static final int CUT_MARKER_BYTES = CUT_MARKER.getBytes(StandardCharsets.UTF_8).length;

    private static final int INITIAL = 1024;
    /** A buffer grown past this by a large record is dropped at the next reset. */
    private static final int RETAIN = 64 * 1024;
    /** Characters encoded per capacity check: each takes at most 6 bytes (<code>&#92;u001f</code>). */
    private static final int BLOCK = 1024;
    private static final byte[] HEX = "0123456789abcdef".getBytes(StandardCharsets.US_ASCII);

    byte[] bytes = new byte[INITIAL];
    int length;
    /** Characters replaced by U+FFFD since the last reset. */
    int replaced;

    private long cachedSecond = Long.MIN_VALUE;
    private final byte[] cachedTime = new byte[19];

    void reset() {
        if (bytes.length > RETAIN) {
            bytes = new byte[INITIAL];
        }
        length = 0;
        replaced = 0;
    }

    private void ensure(int more) {
        int needed = length + more;
        if (needed > bytes.length) {
            bytes = Arrays.copyOf(bytes, Math.max(needed, bytes.length * 2));
        }
    }

    void raw(char ascii) {
        ensure(1);
        bytes[length++] = (byte) ascii;
    }

    void raw(byte[] ascii) {
        ensure(ascii.length);
        System.arraycopy(ascii, 0, bytes, length, ascii.length);
        length += ascii.length;
    }

    void raw(byte[] source, int from, int count) {
        ensure(count);
        System.arraycopy(source, from, bytes, length, count);
        length += count;
    }

    /** A string known to need no escaping (field names of this library). */
    void ascii(String text) {
        int n = text.length();
        ensure(n);
        for (int i = 0; i < n; i++) {
            bytes[length++] = (byte) text.charAt(i);
        }
    }

    /** {@code text} as a JSON string, quotes included. */
    void string(CharSequence text) {
        raw('"');
        body(text, 0, text.length());
        raw('"');
    }

    /** The characters {@code text[from, to)} as the inside of a JSON string. */
    void body(CharSequence text, int from, int to) {
        int i = from;
        while (i < to) {
            int blockEnd = Math.min(to, i + BLOCK);
            ensure((blockEnd - i) * 6 + 4);
            byte[] b = bytes;
            int n = length;
            while (i < blockEnd) {
                char c = text.charAt(i++);
                if (c < 0x80) {
                    if (c >= 0x20 && c != '"' && c != '\\') {
                        b[n++] = (byte) c;
                    } else {
                        n = escape(b, n, c);
                    }
                } else if (c < 0x800) {
                    b[n++] = (byte) (0xC0 | (c >> 6));
                    b[n++] = (byte) (0x80 | (c & 0x3F));
                } else if (Character.isSurrogate(c)) {
                    if (Character.isHighSurrogate(c) && i < to && Character.isLowSurrogate(text.charAt(i))) {
                        int cp = Character.toCodePoint(c, text.charAt(i++));
                        b[n++] = (byte) (0xF0 | (cp >> 18));
                        b[n++] = (byte) (0x80 | ((cp >> 12) & 0x3F));
                        b[n++] = (byte) (0x80 | ((cp >> 6) & 0x3F));
                        b[n++] = (byte) (0x80 | (cp & 0x3F));
                    } else {
                        n = replacement(b, n);
                    }
                } else {
                    b[n++] = (byte) (0xE0 | (c >> 12));
                    b[n++] = (byte) (0x80 | ((c >> 6) & 0x3F));
                    b[n++] = (byte) (0x80 | (c & 0x3F));
                }
            }
            length = n;
        }
    }

    private int escape(byte[] b, int n, char c) {
        switch (c) {
            case '"':
                b[n++] = '\\';
                b[n++] = '"';
                return n;
            case '\\':
                b[n++] = '\\';
                b[n++] = '\\';
                return n;
            case '\n':
                b[n++] = '\\';
                b[n++] = 'n';
                return n;
            case '\r':
                b[n++] = '\\';
                b[n++] = 'r';
                return n;
            case '\t':
                b[n++] = '\\';
                b[n++] = 't';
                return n;
            case '\b':
                b[n++] = '\\';
                b[n++] = 'b';
                return n;
            case '\f':
                b[n++] = '\\';
                b[n++] = 'f';
                return n;
            case 0:
                return replacement(b, n);
            default:
                b[n++] = '\\';
                b[n++] = 'u';
                b[n++] = '0';
                b[n++] = '0';
                b[n++] = HEX[c >> 4];
                b[n++] = HEX[c & 0xF];
                return n;
        }
    }

    private int replacement(byte[] b, int n) {
        replaced++;
        b[n++] = (byte) 0xEF;
        b[n++] = (byte) 0xBF;
        b[n++] = (byte) 0xBD;
        return n;
    }

    /** Bytes the character (or pair) at {@code text[i]} takes inside a JSON string. */
    static int unitBytes(CharSequence text, int i, int to) {
        char c = text.charAt(i);
        if (c < 0x80) {
            if (c >= 0x20 && c != '"' && c != '\\') {
                return 1;
            }
            switch (c) {
                case '"', '\\', '\n', '\r', '\t', '\b', '\f':
                    return 2;
                case 0:
                    return 3;
                default:
                    return 6;
            }
        }
        if (c < 0x800) {
            return 2;
        }
        if (Character.isHighSurrogate(c) && i + 1 < to && Character.isLowSurrogate(text.charAt(i + 1))) {
            return 4;
        }
        return 3;
    }

    /** Characters (1, or 2 for a pair) of the unit at {@code text[i]}. */
    static int unitChars(CharSequence text, int i, int to) {
        return Character.isHighSurrogate(text.charAt(i)) && i + 1 < to && Character.isLowSurrogate(text.charAt(i + 1))
                ? 2
                : 1;
    }

    /** Bytes {@code text[from, to)} takes inside a JSON string (quotes not included). */
    static long bodyBytes(CharSequence text, int from, int to) {
        long total = 0;
        int i = from;
        while (i < to) {
            char c = text.charAt(i);
            if (c >= 0x20 && c < 0x80 && c != '"' && c != '\\') {
                total++;
                i++;
            } else {
                total += unitBytes(text, i, to);
                i += unitChars(text, i, to);
            }
        }
        return total;
    }

    /** Bytes {@code text} takes as a JSON string, quotes included. */
    static long stringBytes(CharSequence text) {
        return bodyBytes(text, 0, text.length()) + 2;
    }

    /**
     * {@code text} as a JSON string of at most {@code budget} bytes (quotes included): whole if it
     * fits, else its beginning and {@link #CUT_MARKER} ({@code ""} if not even the marker fits).
     * Returns true if it was cut.
     */
    boolean stringCut(CharSequence text, int budget) {
        int n = text.length();
        // Every character takes at least a byte: a text longer than the budget is cut without
        // measuring all of it (a 100 MB message costs no more than a 1 MB one).
        if (n + 2 <= budget && stringBytes(text) <= budget) {
            string(text);
            return false;
        }
        int room = budget - 2 - CUT_MARKER_BYTES;
        raw('"');
        if (room > 0) {
            int end = prefixEnd(text, 0, n, room);
            body(text, 0, end);
            body(CUT_MARKER, 0, CUT_MARKER.length());
        }
        raw('"');
        return true;
    }

    /** The end of the longest prefix of {@code text[from, to)} that takes at most {@code room} bytes. */
    static int prefixEnd(CharSequence text, int from, int to, long room) {
        long used = 0;
        int i = from;
        while (i < to) {
            int size = unitBytes(text, i, to);
            if (used + size > room) {
                break;
            }
            used += size;
            i += unitChars(text, i, to);
        }
        return i;
    }

    void number(long value) {
        if (value == Long.MIN_VALUE) {
            ascii("-9223372036854775808");
            return;
        }
        ensure(20);
        if (value < 0) {
            bytes[length++] = '-';
            value = -value;
        }
        int start = length;
        do {
            bytes[length++] = (byte) ('0' + (value % 10));
            value /= 10;
        } while (value != 0);
        for (int i = start, j = length - 1; i < j; i++, j--) {
            byte t = bytes[i];
            bytes[i] = bytes[j];
            bytes[j] = t;
        }
    }

    /** {@code "2026-11-30T03:04:05.123456Z"}: UTC, microseconds, quotes included. */
    void time(long epochMicros) {
        long second = Math.floorDiv(epochMicros, 1_000_000L);
        int micros = (int) Math.floorMod(epochMicros, 1_000_000L);
        if (second != cachedSecond) {
            formatSecond(second, cachedTime);
            cachedSecond = second;
        }
        ensure(29);
        bytes[length++] = '"';
        System.arraycopy(cachedTime, 0, bytes, length, 19);
        length += 19;
        bytes[length++] = '.';
        for (int div = 100_000; div > 0; div /= 10) {
            bytes[length++] = (byte) ('0' + (micros / div) % 10);
        }
        bytes[length++] = 'Z';
        bytes[length++] = '"';
    }

    /** {@code YYYY-MM-DDTHH:MM:SS} of a Unix second (the civil calendar from days, proleptic Gregorian). */
    private static void formatSecond(long epochSecond, byte[] out) {
        long days = Math.floorDiv(epochSecond, 86_400L);
        int secondOfDay = (int) Math.floorMod(epochSecond, 86_400L);
        long z = days + 719_468;
        long era = Math.floorDiv(z, 146_097);
        long dayOfEra = z - era * 146_097;
        long yearOfEra = (dayOfEra - dayOfEra / 1460 + dayOfEra / 36_524 - dayOfEra / 146_096) / 365;
        long dayOfYear = dayOfEra - (365 * yearOfEra + yearOfEra / 4 - yearOfEra / 100);
        long mp = (5 * dayOfYear + 2) / 153;
        int day = (int) (dayOfYear - (153 * mp + 2) / 5 + 1);
        int month = (int) (mp < 10 ? mp + 3 : mp - 9);
        long year = yearOfEra + era * 400 + (month <= 2 ? 1 : 0);
        digits(out, 0, (int) Math.floorMod(year, 10_000L), 4);
        out[4] = '-';
        digits(out, 5, month, 2);
        out[7] = '-';
        digits(out, 8, day, 2);
        out[10] = 'T';
        digits(out, 11, secondOfDay / 3600, 2);
        out[13] = ':';
        digits(out, 14, (secondOfDay / 60) % 60, 2);
        out[16] = ':';
        digits(out, 17, secondOfDay % 60, 2);
    }

    private static void digits(byte[] out, int at, int value, int width) {
        for (int i = at + width - 1; i >= at; i--) {
            out[i] = (byte) ('0' + value % 10);
            value /= 10;
        }
    }

    /** The buffer's bytes and a newline: the line as it goes to the agent. */
    byte[] toLine() {
        byte[] line = Arrays.copyOf(bytes, length + 1);
        line[length] = '\n';
        return line;
    }

    /** The buffer's bytes as text (the JSON of a value that is cut as a string). */
    String text() {
        return new String(bytes, 0, length, StandardCharsets.UTF_8);
    }
}
