package dev.sluice.logback;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import ch.qos.logback.classic.LoggerContext;
import ch.qos.logback.core.status.Status;
import dev.sluice.client.DropReason;
import dev.sluice.client.Severity;
import dev.sluice.client.Stats;
import dev.sluice.client.testing.FakeAgent;
import dev.sluice.client.testing.Waiting;
import java.io.UncheckedIOException;
import java.lang.management.ManagementFactory;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import javax.management.ObjectName;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import org.slf4j.Logger;
import org.slf4j.MDC;

/** The appender configured through Joran, against the fake agent. */
class SluiceAppenderTest {
    @TempDir
    Path dir;

    private Path socket;
    private FakeAgent agent;
    private Contexts contexts;

    @BeforeEach
    void setUp() {
        socket = dir.resolve("agent.sock");
        agent = new FakeAgent(socket);
        contexts = new Contexts();
    }

    @AfterEach
    void tearDown() {
        contexts.close();
        agent.stop();
    }

    private LoggerContext context(String... properties) throws Exception {
        Map<String, String> values = new java.util.HashMap<>();
        values.put("SOCKET", socket.toString());
        for (int i = 0; i < properties.length; i += 2) {
            values.put(properties[i], properties[i + 1]);
        }
        return contexts.configure(values);
    }

    private static Exception paymentFailure() {
        IllegalStateException root = new IllegalStateException("card declined");
        UncheckedIOException middle = new UncheckedIOException("gateway call failed", new java.io.IOException("reset", root));
        RuntimeException top = new RuntimeException("payment failed", middle);
        top.addSuppressed(new IllegalArgumentException("rollback failed too"));
        return top;
    }

    @Test
    void anEventCarriesMdcKeyValuesFieldsAndItsWholeStackTraceAsOneRecord() throws Exception {
        agent.start();
        LoggerContext context = context();
        Logger log = context.getLogger("shop.payments");

        MDC.put("request_id", "req-42");
        MDC.put("trace_id", "4bf92f3577b34da6a3ce929d0e0e4736");
        MDC.put("span_id", "00f067aa0ba902b7");
        try {
            log.atError().addKeyValue("order_id", 17).setCause(paymentFailure()).log("payment for order {} failed", 17);
        } finally {
            MDC.clear();
        }

        Map<String, Object> record = agent.expect(1).get(0);
        assertEquals("error", record.get("level"));
        assertEquals("shop.payments", record.get("logger"));
        assertEquals("payment for order 17 failed", record.get("message"));
        assertEquals(Thread.currentThread().getName(), record.get("thread"));
        assertEquals("req-42", record.get("request_id"));
        assertEquals(17L, record.get("order_id"));
        assertEquals("checkout", record.get("service"));
        assertEquals("test", record.get("env"));
        assertEquals("4bf92f3577b34da6a3ce929d0e0e4736", record.get("trace_id"));
        assertEquals("00f067aa0ba902b7", record.get("span_id"));
        assertFalse(record.containsKey("extra.trace_id"), "the ids are not also fields");
        String stack = (String) record.get("stack_trace");
        assertTrue(stack.startsWith("java.lang.IllegalStateException: card declined\n\tat "), stack);
        assertTrue(stack.contains("\nWrapped by: java.io.IOException: reset\n"), stack);
        assertTrue(stack.contains("\nWrapped by: java.io.UncheckedIOException: gateway call failed"), stack);
        assertTrue(stack.contains("\nWrapped by: java.lang.RuntimeException: payment failed\n"), stack);
        assertTrue(stack.contains("\n\tSuppressed: java.lang.IllegalArgumentException: rollback failed too\n"), stack);
        assertTrue(stack.contains("\tat dev.sluice.logback.SluiceAppenderTest.paymentFailure"), stack);
        assertEquals(1, agent.lines().size(), "the whole trace is one record");
    }

    @Test
    void logbackLevelsBecomeTheRecordsLevelWords() throws Exception {
        agent.start();
        Logger log = context().getLogger("levels");

        log.trace("t");
        log.debug("d");
        log.info("i");
        log.warn("w");
        log.error("e");

        List<Object> levels = agent.expect(5).stream().map(r -> r.get("level")).toList();
        assertEquals(List.of("trace", "debug", "info", "warn", "error"), levels);
        assertEquals(Severity.ERROR, SluiceAppender.severity(ch.qos.logback.classic.Level.ERROR));
    }

    @Test
    void stopDrainsAtMostTheFlushTimeoutWhenTheAgentStallsAndCountsTheRest() throws Exception {
        agent.start();
        LoggerContext context = context("FLUSH_TIMEOUT", "500 milliseconds", "MAX_QUEUE_RECORDS", "100000");
        SluiceAppender appender = Contexts.appender(context);
        Logger log = context.getLogger("stall");
        log.info("connect first");
        agent.expect(1);
        agent.stall();
        String payload = "p".repeat(1000);
        for (int i = 0; i < 5000; i++) {
            log.info(payload);
        }
        assertTrue(Waiting.until(() -> appender.stats().queuedRecords() > 0 && appender.stats().sent() > 1));

        long started = System.nanoTime();
        context.stop();
        long took = System.nanoTime() - started;

        // The close timeout, the sender's stop and room for a busy machine; below the default (2 s).
        assertTrue(took < Duration.ofMillis(1800).toNanos(), "stop took " + took / 1_000_000 + " ms");
        Stats stats = appender.stats();
        assertTrue(stats.dropped(DropReason.CLOSED) > 0, stats.toString());
        assertTrue(context.getStatusManager().getCopyOfStatusList().stream()
                .anyMatch(s -> s.getLevel() == Status.WARN && s.getMessage().startsWith("sluice client: closed;")),
                "the summary went to logback's status manager");
    }

    @Test
    void dropsAreReportedThroughLogbacksStatusManager() throws Exception {
        LoggerContext context = context("MAX_QUEUE_RECORDS", "2", "FLUSH_TIMEOUT", "200 milliseconds"); // no agent: the queue fills
        Logger log = context.getLogger("drops");

        for (int i = 0; i < 5; i++) {
            log.warn("record {}", i);
        }

        assertEquals(3, Contexts.appender(context).stats().dropped(DropReason.FULL, Severity.WARN));
        // The sender writes the notice when it next wakes: it may have counted only the first drops.
        assertTrue(Waiting.until(() -> context.getStatusManager().getCopyOfStatusList().stream()
                .anyMatch(s -> s.getLevel() == Status.WARN && s.getMessage().startsWith("sluice client: dropped ")
                        && s.getMessage().contains("(total by reason: full="))));
    }

    @Test
    void theCountersAreAnMBeanNamedAfterTheAppenderWhileItRuns() throws Exception {
        LoggerContext context = context();
        ObjectName name = new ObjectName("dev.sluice:type=SluiceClient,name=SLUICE");
        assertTrue(ManagementFactory.getPlatformMBeanServer().isRegistered(name));
        assertEquals(socket.toString(), ManagementFactory.getPlatformMBeanServer().getAttribute(name, "SocketPath"));

        context.stop();

        assertFalse(ManagementFactory.getPlatformMBeanServer().isRegistered(name));
    }

    @Test
    void anOptionOutOfRangeLeavesTheAppenderStoppedWithAnError() {
        Map<String, String> values = Map.of("SOCKET", socket.toString(), "MAX_RECORD_SIZE", "10");

        IllegalStateException error = org.junit.jupiter.api.Assertions.assertThrows(IllegalStateException.class,
                () -> contexts.configure(values));

        assertTrue(error.getMessage().contains("maxRecordSize must be between 256 B and 64 MiB"), error.getMessage());
    }

    @Test
    void theAppenderNeverConnectsFromTheLoggingThread() throws Exception {
        LoggerContext context = context("FLUSH_TIMEOUT", "200 milliseconds"); // no agent
        Logger log = context.getLogger("absent");
        SluiceAppender appender = Contexts.appender(context);

        for (int i = 0; i < 1000; i++) {
            log.info("nobody listens {}", i);
        }

        assertEquals(1000, appender.stats().queuedRecords(), "every call returned with its event queued");
        assertTrue(Waiting.until(() -> "ENOENT".equals(appender.stats().lastError())));
    }
}
