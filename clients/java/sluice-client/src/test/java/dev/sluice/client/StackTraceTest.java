package dev.sluice.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import org.junit.jupiter.api.Test;

class StackTraceTest {
    private static List<String> lines(Throwable t) {
        StackTrace stack = new StackTrace();
        stack.render(t);
        return List.of(stack.text.toString().split("\n"));
    }

    private static int indexOf(List<String> lines, String prefix) {
        for (int i = 0; i < lines.size(); i++) {
            if (lines.get(i).startsWith(prefix)) {
                return i;
            }
        }
        return -1;
    }

    @Test
    void causesAreRenderedRootFirstThenEachWrapper() {
        IllegalStateException root = new IllegalStateException("the root cause");
        RuntimeException middle = new RuntimeException("while paying", root);
        RuntimeException top = new RuntimeException("request failed", middle);

        List<String> lines = lines(top);

        assertEquals("java.lang.IllegalStateException: the root cause", lines.get(0));
        int wrappedMiddle = indexOf(lines, "Wrapped by: java.lang.RuntimeException: while paying");
        int wrappedTop = indexOf(lines, "Wrapped by: java.lang.RuntimeException: request failed");
        assertTrue(0 < wrappedMiddle && wrappedMiddle < wrappedTop, String.join("\n", lines));
        assertTrue(lines.get(1).startsWith("\tat dev.sluice.client.StackTraceTest."), lines.get(1));
        assertTrue(lines.stream().anyMatch(l -> l.matches("\t\\.\\.\\. \\d+ common frames omitted")), "shared frames once");
    }

    @Test
    void suppressedExceptionsFollowTheExceptionThatSuppressedThemIndented() {
        Exception primary = new Exception("close failed");
        IllegalArgumentException suppressed = new IllegalArgumentException("and so did cleanup",
                new ArithmeticException("inner cause"));
        primary.addSuppressed(suppressed);

        List<String> lines = lines(primary);

        assertEquals("java.lang.Exception: close failed", lines.get(0));
        int at = indexOf(lines, "\tSuppressed: java.lang.IllegalArgumentException: and so did cleanup");
        assertTrue(at > 0, String.join("\n", lines));
        assertTrue(indexOf(lines, "\tCaused by: java.lang.ArithmeticException: inner cause") > at);
    }

    @Test
    void aCycleIsNamedNotFollowed() {
        RuntimeException a = new RuntimeException("a");
        RuntimeException b = new RuntimeException("b", a);
        a.initCause(b);

        List<String> lines = lines(a);

        assertTrue(lines.stream().anyMatch(l -> l.contains("[CIRCULAR REFERENCE: java.lang.RuntimeException: a]")),
                String.join("\n", lines));
    }

    @Test
    void anExceptionWhoseToStringThrowsIsDescribedInstead() {
        RuntimeException odd = new RuntimeException("x") {
            @Override
            public String toString() {
                throw new IllegalStateException("no");
            }
        };

        assertTrue(lines(odd).get(0).contains("<toString() threw java.lang.IllegalStateException>"));
    }

    @Test
    void renderedTextKeepsItsLinesAndKnowsItsFrames() {
        StackTrace stack = new StackTrace();
        stack.renderText("java.lang.Error: boom\n\tat a.B.c(B.java:1)\n\tat a.B.d(B.java:2)\nCaused by: x.Y\n\t... 2 more\n");
        JsonBuffer out = new JsonBuffer();

        stack.write(out, 90); // whole it takes 97 bytes

        String written = out.text();
        assertTrue(out.length <= 90, written);
        assertTrue(written.contains("\\t[… 2 frames elided …]"), written);
        assertTrue(written.startsWith("\"java.lang.Error: boom"), written);
    }
}
