package dev.sluice.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.sluice.client.testing.FakeAgent;
import dev.sluice.client.testing.Json;
import java.math.BigDecimal;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

class RecordEncoderTest {
    private static final long TIME = 1_796_007_845_123_456L; // 2026-11-30T03:04:05.123456Z

    private final RecordEncoder encoder = new RecordEncoder(SluiceConfig.DEFAULT_MAX_RECORD_SIZE);

    private static LogRecord record(String message) {
        return new LogRecord().epochMicros(TIME).severity(Severity.INFO).logger("shop").thread("main").message(message);
    }

    /** The line without its newline, checked as the agent checks it, then parsed. */
    private static Map<String, Object> parse(byte[] line, int maxRecordSize) {
        assertEquals('\n', line[line.length - 1], "one line, newline-terminated");
        byte[] body = Arrays.copyOf(line, line.length - 1);
        for (byte b : body) {
            assertTrue(b != '\n', "no newline inside the record");
        }
        assertNull(FakeAgent.check(body, maxRecordSize), "the agent would refuse it");
        return Json.object(new String(body, StandardCharsets.UTF_8));
    }

    private Map<String, Object> encode(LogRecord record) {
        return parse(encoder.encode(record), SluiceConfig.DEFAULT_MAX_RECORD_SIZE);
    }

    @Test
    void aRecordHasTheCoreFieldsThenItsFieldsInOrder() {
        Map<String, Object> json = encode(record("paid order 17").traceId("4bf92f3577b34da6a3ce929d0e0e4736")
                .spanId("00f067aa0ba902b7").field("order_id", 17).field("customer", "ada"));

        assertEquals(List.of("time", "level", "logger", "message", "thread", "process", "trace_id", "span_id",
                "order_id", "customer"), new ArrayList<>(json.keySet()));
        assertEquals("2026-11-30T03:04:05.123456Z", json.get("time"));
        assertEquals("info", json.get("level"));
        assertEquals("shop", json.get("logger"));
        assertEquals("paid order 17", json.get("message"));
        assertEquals("main", json.get("thread"));
        assertEquals(ProcessHandle.current().pid(), json.get("process"));
        assertEquals(17L, json.get("order_id"));
        assertFalse(encoder.truncated || encoder.replaced);
    }

    @Test
    void aFieldNamedLikeACoreFieldOrAddedTwiceIsKeptAsExtra() {
        Map<String, Object> json = encode(record("m").field("level", "x").field("user", "a").field("user", "b"));

        assertEquals("info", json.get("level"));
        assertEquals("x", json.get("extra.level"));
        assertEquals("a", json.get("user"));
        assertEquals("b", json.get("extra.user"));
    }

    @Test
    void valuesBecomeJsonNumbersBooleansObjectsArraysOrTheirText() {
        Map<String, Object> nested = new LinkedHashMap<>();
        nested.put("a", List.of(1, 2.5, true));
        Object deep = "bottom";
        for (int i = 0; i < 40; i++) {
            deep = List.of(deep);
        }
        Map<String, Object> json = encode(record("m").field("n", 3L).field("f", 1.5).field("nan", Double.NaN)
                .field("big", new BigDecimal("12.50")).field("flag", false).field("none", null).field("map", nested)
                .field("ints", new int[] {1, 2}).field("deep", deep).field("object", new StringBuilder("sb")));

        assertEquals(3L, json.get("n"));
        assertEquals(1.5, json.get("f"));
        assertEquals("NaN", json.get("nan"));
        assertEquals(12.5, json.get("big"));
        assertEquals(false, json.get("flag"));
        assertTrue(json.containsKey("none") && json.get("none") == null);
        assertEquals(Map.of("a", List.of(1L, 2.5, true)), json.get("map"));
        assertEquals(List.of(1L, 2L), json.get("ints"));
        assertEquals("sb", json.get("object"));
        // Nesting stops at 16 levels: what is deeper is text, so the agent's depth limit is never met.
        Object level = json.get("deep");
        int depth = 0;
        while (level instanceof List) {
            level = ((List<?>) level).get(0);
            depth++;
        }
        assertEquals(RecordEncoder.MAX_VALUE_DEPTH, depth);
        assertTrue(level instanceof String);
    }

    @Test
    void aValueWhoseToStringThrowsIsNamedNotFatal() {
        Object odd = new Object() {
            @Override
            public String toString() {
                throw new IllegalStateException("no");
            }
        };

        Map<String, Object> json = encode(record("m").field("odd", odd));

        assertTrue(((String) json.get("odd")).startsWith("<unprintable "));
    }

    @Test
    void nulAndLoneSurrogatesAreReplacedAndTheRecordCountedAsReplaced() {
        Map<String, Object> json = encode(record("a NUL \0 and a lone surrogate \uD83D and a pair \uD83D\uDE00")
                .field("raw", "\uDE00 low first"));

        assertEquals("a NUL \uFFFD and a lone surrogate \uFFFD and a pair \uD83D\uDE00", json.get("message"));
        assertEquals("\uFFFD low first", json.get("raw"));
        assertTrue(encoder.replaced);
    }

    @Test
    void controlCharactersQuotesAndBackslashesAreEscaped() {
        String message = "line\nnext\ttab \"quoted\" back\\slash \u0001\u001f\r";

        assertEquals(message, encode(record(message)).get("message"));
        assertFalse(encoder.replaced);
    }

    @Test
    void anOversizedMessageIsCutToTheLimitAndMarkedTruncated() {
        RecordEncoder small = new RecordEncoder(4096);
        String message = "é".repeat(10_000); // two bytes each

        byte[] line = small.encode(record(message).field("order_id", 17));
        Map<String, Object> json = parse(line, 4096);

        assertTrue(line.length - 1 <= 4096 && line.length - 1 > 3500, "cut close to the limit: " + line.length);
        assertEquals(true, json.get("truncated"));
        assertTrue(((String) json.get("message")).endsWith("…[truncated]"));
        assertEquals(17L, json.get("order_id"), "small fields stay whole");
        assertTrue(small.truncated);
    }

    @Test
    void aCutNeverSplitsACharacter() {
        RecordEncoder small = new RecordEncoder(1000);
        for (int extra = 0; extra < 8; extra++) {
            String message = "x".repeat(extra) + "😀".repeat(1000);
            Map<String, Object> json = parse(small.encode(record(message)), 1000);
            String cut = (String) json.get("message");
            assertFalse(cut.contains("\uFFFD"), "no half of a pair");
            assertTrue(cut.endsWith("…[truncated]"));
        }
    }

    @Test
    void anOversizedStackTraceKeepsTheRootCauseFirstAndElidesFramesFromTheMiddle() {
        RecordEncoder small = new RecordEncoder(8192);
        Throwable deep = recurse(300);

        byte[] line = small.encode(record("it failed").thrown(new RuntimeException("outer", deep)));
        Map<String, Object> json = parse(line, 8192);

        String stack = (String) json.get("stack_trace");
        assertEquals(true, json.get("truncated"));
        assertTrue(stack.startsWith("java.lang.IllegalStateException: at the bottom\n\tat dev.sluice.client.RecordEncoderTest.recurse"),
                stack.substring(0, 200));
        assertTrue(stack.contains("frames elided …]"), "frames removed from the middle");
        assertTrue(stack.contains("Wrapped by: java.lang.RuntimeException: outer"), "every exception line stays");
        assertEquals("it failed", json.get("message"));
    }

    private static Throwable recurse(int depth) {
        if (depth == 0) {
            return new IllegalStateException("at the bottom");
        }
        return recurse(depth - 1);
    }

    @Test
    void oversizedFieldsAreShortenedThenLeftOutAndNamed() {
        RecordEncoder small = new RecordEncoder(4096);
        LogRecord record = record("m");
        for (int i = 0; i < 40; i++) {
            record.field("f" + i, "v".repeat(200));
        }
        record.field("huge", "h".repeat(100_000));

        Map<String, Object> json = parse(small.encode(record), 4096);

        assertEquals(true, json.get("truncated"));
        assertEquals("m", json.get("message"));
        String elided = (String) json.get("elided_fields");
        assertTrue(elided != null && !elided.isEmpty(), json.toString());
        for (String name : elided.split(",")) {
            assertFalse(json.containsKey(name), name + " is named as left out, and is");
        }
    }

    @Test
    void aRecordTooLongEvenWithoutItsTextsFallsBackToTheMinimum() {
        RecordEncoder small = new RecordEncoder(256);

        Map<String, Object> json = parse(small.encode(record("hello").logger("l".repeat(5000)).thread("t".repeat(5000))), 256);

        assertEquals(true, json.get("truncated"));
        assertEquals("info", json.get("level"));
        assertTrue(((String) json.get("logger")).endsWith("…[truncated]"));
    }

    @Test
    void theTimeIsUtcWithMicroseconds() {
        assertEquals("1970-01-01T00:00:00.000001Z", encode(record("m").epochMicros(1)).get("time"));
        assertEquals("2000-02-29T23:59:59.999999Z", encode(record("m").epochMicros(951_868_799_999_999L)).get("time"));
        assertEquals("1969-12-31T23:59:59.999999Z", encode(record("m").epochMicros(-1)).get("time"));
    }

    @Test
    void anEncoderIsReusedWithoutCarryingAnythingOver() {
        encoder.encode(record("x".repeat(300_000)).field("a", 1));

        Map<String, Object> json = encode(record("second"));

        assertEquals("second", json.get("message"));
        assertFalse(json.containsKey("a"));
        assertFalse(json.containsKey("truncated"));
    }
}
