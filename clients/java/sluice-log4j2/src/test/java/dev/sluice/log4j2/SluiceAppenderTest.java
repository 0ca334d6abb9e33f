package dev.sluice.log4j2;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.sluice.client.DropReason;
import dev.sluice.client.Severity;
import dev.sluice.client.Stats;
import dev.sluice.client.testing.FakeAgent;
import dev.sluice.client.testing.Waiting;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import org.apache.logging.log4j.Level;
import org.apache.logging.log4j.Logger;
import org.apache.logging.log4j.ThreadContext;
import org.apache.logging.log4j.core.LoggerContext;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** The {@code Sluice} plugin configured from log4j2 XML, against the fake agent. */
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

    private LoggerContext context(String... values) throws Exception {
        Map<String, String> all = new java.util.HashMap<>();
        all.put("SOCKET", socket.toString());
        for (int i = 0; i < values.length; i += 2) {
            all.put(values[i], values[i + 1]);
        }
        return contexts.configure(all);
    }

    @Test
    void theElementSluiceIsThisPlugin() throws Exception {
        LoggerContext context = context();

        assertTrue(Contexts.appender(context) instanceof SluiceAppender);
        assertTrue(Contexts.appender(context).isStarted());
    }

    @Test
    void anEventCarriesTheThreadContextPropertiesAndItsWholeStackTraceAsOneRecord() throws Exception {
        agent.start();
        Logger log = context().getLogger("shop.payments");
        RuntimeException failure = new RuntimeException("payment failed", new IllegalStateException("card declined"));
        failure.addSuppressed(new IllegalArgumentException("rollback failed too"));

        ThreadContext.put("request_id", "req-42");
        ThreadContext.put("traceId", "4bf92f3577b34da6a3ce929d0e0e4736");
        try {
            log.error("payment for order {} failed", 17, failure);
        } finally {
            ThreadContext.clearAll();
        }

        Map<String, Object> record = agent.expect(1).get(0);
        assertEquals("error", record.get("level"));
        assertEquals("shop.payments", record.get("logger"));
        assertEquals("payment for order 17 failed", record.get("message"));
        assertEquals(Thread.currentThread().getName(), record.get("thread"));
        assertEquals("req-42", record.get("request_id"));
        assertEquals("4bf92f3577b34da6a3ce929d0e0e4736", record.get("trace_id"));
        assertEquals("checkout", record.get("service"));
        assertEquals("test", record.get("env"));
        String stack = (String) record.get("stack_trace");
        assertTrue(stack.startsWith("java.lang.IllegalStateException: card declined\n\tat "), stack);
        assertTrue(stack.contains("\nWrapped by: java.lang.RuntimeException: payment failed\n"), stack);
        assertTrue(stack.contains("\n\tSuppressed: java.lang.IllegalArgumentException: rollback failed too\n"), stack);
        assertEquals(1, agent.lines().size(), "the whole trace is one record");
    }

    @Test
    void log4jLevelsBecomeTheRecordsLevelWords() throws Exception {
        agent.start();
        Logger log = context().getLogger("levels");

        log.trace("t");
        log.debug("d");
        log.info("i");
        log.warn("w");
        log.error("e");
        log.fatal("f");
        log.log(Level.forName("NOTICE", 350), "between warn and info");

        List<Object> levels = agent.expect(7).stream().map(r -> r.get("level")).toList();
        assertEquals(List.of("trace", "debug", "info", "warn", "error", "fatal", "info"), levels);
    }

    @Test
    void stopDrainsAtMostItsTimeoutWhenTheAgentStallsAndCountsTheRest() throws Exception {
        agent.start();
        LoggerContext context = context("FLUSH_TIMEOUT_MILLIS", "500", "MAX_QUEUE_RECORDS", "100000");
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
        context.stop(30, TimeUnit.SECONDS);
        long took = System.nanoTime() - started;

        // The close timeout, the sender's stop and room for a busy machine; below the default (2 s).
        assertTrue(took < Duration.ofMillis(1800).toNanos(), "stop took " + took / 1_000_000 + " ms");
        Stats stats = appender.stats();
        assertTrue(stats.dropped(DropReason.CLOSED, Severity.INFO) > 0, stats.toString());
    }

    @Test
    void anOptionOutOfRangeMakesNoAppender() throws Exception {
        LoggerContext context = context("MAX_RECORD_SIZE", "10");

        assertNull(Contexts.appender(context));
    }
}
