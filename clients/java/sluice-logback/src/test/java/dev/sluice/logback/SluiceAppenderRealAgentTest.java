package dev.sluice.logback;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import ch.qos.logback.classic.LoggerContext;
import dev.sluice.client.DropReason;
import dev.sluice.client.Stats;
import dev.sluice.client.testing.Json;
import dev.sluice.client.testing.RealPipeline;
import dev.sluice.client.testing.Waiting;
import java.nio.file.Path;
import java.time.Duration;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import org.slf4j.Logger;
import org.slf4j.MDC;

/**
 * The logback appender against the real pipeline: {@code sluice agent} ({@code SLUICE_BIN}) to
 * Kafka ({@code SLUICE_TEST_KAFKA}) to {@code sluice persist} to PostgreSQL ({@code
 * SLUICE_TEST_PG}), read back as rows. Skipped when {@code SLUICE_BIN} is not set.
 */
class SluiceAppenderRealAgentTest {
    private static final Duration ROWS_TIMEOUT = Duration.ofSeconds(60);

    @TempDir
    Path dir;

    private RealPipeline.Env env;
    private RealPipeline pipeline;
    private Contexts contexts;

    @BeforeEach
    void setUp() {
        env = RealPipeline.Env.fromEnvironment();
        assumeTrue(env != null, "SLUICE_BIN is not set: the path of a built `sluice` binary runs these tests");
        contexts = new Contexts();
    }

    @AfterEach
    void tearDown() {
        if (contexts != null) {
            contexts.close();
        }
        if (pipeline != null) {
            pipeline.close();
        }
    }

    private RealPipeline start(RealPipeline.Options options) throws Exception {
        pipeline = RealPipeline.create(env, dir, options);
        pipeline.startAgent();
        pipeline.startPersister();
        return pipeline;
    }

    private LoggerContext context(String... properties) throws Exception {
        Map<String, String> values = new HashMap<>();
        values.put("SOCKET", pipeline.socket().toString());
        for (int i = 0; i < properties.length; i += 2) {
            values.put(properties[i], properties[i + 1]);
        }
        return contexts.configure(values);
    }

    @Test
    void eventsArriveAsRowsWithTheirMdcFieldsAndWholeStackTraces() throws Exception {
        start(RealPipeline.Options.memory().maxRecordSize("64 KiB"));
        LoggerContext context = context("MAX_RECORD_SIZE", "64KB");
        Logger log = context.getLogger("shop.orders");
        int n = 200;
        for (int i = 0; i < n; i++) {
            MDC.put("request_id", "req-" + i);
            log.atInfo().addKeyValue("seq", i).log("order {} paid", i);
        }
        MDC.put("request_id", "req-failed");
        RuntimeException failure = new RuntimeException("payment failed", new IllegalStateException("card declined"));
        failure.addSuppressed(new IllegalArgumentException("rollback failed too"));
        log.error("payment for order 17 failed", failure);
        // Longer than max_record_size: cut by the client, so the agent does not refuse it.
        log.warn("x".repeat(200 * 1024));
        MDC.clear();
        SluiceAppender appender = Contexts.appender(context);
        context.stop();

        Stats stats = appender.stats();
        assertEquals(n + 2, stats.sent(), stats.toString());
        assertEquals(0, stats.droppedTotal());
        assertEquals(1, stats.truncated());
        pipeline.waitForRows(n + 2, ROWS_TIMEOUT);
        assertEquals(n, pipeline.scalar("SELECT count(DISTINCT record->>'request_id') FROM logs WHERE record->>'seq' IS NOT NULL"));
        assertEquals(n, pipeline.scalar("SELECT count(*) FROM logs WHERE message LIKE 'order % paid' AND level = 'info'"));
        assertEquals(0, pipeline.scalar("SELECT count(*) FROM logs WHERE event_time IS NULL"), "the persister reads the time");
        List<String> errors = pipeline.strings("SELECT record::text FROM logs WHERE level = 'error'");
        assertEquals(1, errors.size());
        Map<String, Object> error = Json.object(errors.get(0));
        assertEquals("payment for order 17 failed", error.get("message"));
        assertEquals("req-failed", error.get("request_id"));
        assertEquals("checkout", error.get("service"));
        String stack = (String) error.get("stack_trace");
        assertTrue(stack.startsWith("java.lang.IllegalStateException: card declined\n"), stack);
        assertTrue(stack.contains("\nWrapped by: java.lang.RuntimeException: payment failed\n"), stack);
        assertTrue(stack.contains("\tSuppressed: java.lang.IllegalArgumentException: rollback failed too"), stack);
        assertEquals(1, pipeline.scalar("SELECT count(*) FROM logs WHERE level = 'warn' AND (record->>'truncated')::boolean"));
    }

    @Test
    void whileTheAgentIsStoppedLoggingReturnsAndDropsAreCountedThenRowsFlowAgain() throws Exception {
        start(RealPipeline.Options.memory());
        int bound = 500;
        LoggerContext context = context("MAX_QUEUE_RECORDS", String.valueOf(bound));
        SluiceAppender appender = Contexts.appender(context);
        Logger log = context.getLogger("outage");
        for (int i = 0; i < 10; i++) {
            log.info("before the stop {}", i);
        }
        assertTrue(appender.flush(Duration.ofSeconds(10)));
        pipeline.waitForRows(10, ROWS_TIMEOUT);

        assertEquals(0, pipeline.stopAgent(), pipeline.agentLog());
        long started = System.nanoTime();
        for (int i = 0; i < 2000; i++) {
            log.info("while the agent is stopped {}", i);
        }
        // Each call only encoded and enqueued (a call that waited for the agent would take a
        // connect or write timeout); the bound is for a busy machine, not for the client.
        assertTrue(System.nanoTime() - started < Duration.ofSeconds(5).toNanos(), "the calls waited");
        // The sender notices the agent gone when it next writes, which a busy machine may delay
        // past the last call (the logging thread holds the CPU and barges the queue's lock).
        assertTrue(Waiting.until(() -> !appender.stats().connected(), Duration.ofSeconds(10)), appender.stats().toString());
        Stats during = appender.stats();
        assertEquals(10, during.sent());
        assertTrue(during.droppedTotal() >= 2000 - bound, during.toString());
        assertTrue(Set.of("full", "high_water").containsAll(during.dropped().keySet()), during.toString());
        long dropped = during.droppedTotal();

        pipeline.startAgent();
        assertTrue(appender.flush(Duration.ofSeconds(15)), appender.stats().toString());
        for (int i = 0; i < 100; i++) {
            log.info("after the restart {}", i);
        }
        context.stop();

        Stats stats = appender.stats();
        assertEquals(dropped, stats.droppedTotal(), "nothing dropped once the agent was back");
        assertEquals(10 + 2000 + 100, stats.sent() + dropped, stats.toString());
        assertTrue(stats.reconnects() >= 1);
        // One report, or more when the sender had not yet seen the agent go as the drops began
        // (a report queued then, another for the drops after it): together they tell every drop.
        assertTrue(stats.reportsSent() >= 1, "the drops were reported in band once the agent was back");
        pipeline.waitForRows(stats.sent() + stats.reportsSent(), ROWS_TIMEOUT);
        assertEquals(stats.sent() + stats.reportsSent(), pipeline.rows());
        assertEquals(dropped, pipeline.scalar(
                "SELECT sum((record->>'count')::bigint) FROM logs WHERE record->>'sluice.client' = 'dropped'"));
        assertEquals(100, pipeline.scalar("SELECT count(*) FROM logs WHERE message LIKE 'after the restart %'"));
    }

    @Test
    void acknowledgedModeAcrossAnAgentSigkillStoresEveryAcknowledgedRecordExactlyOnce() throws Exception {
        start(RealPipeline.Options.spooled());
        LoggerContext context = context("ACKNOWLEDGED", "true", "FLUSH_TIMEOUT", "30 seconds");
        SluiceAppender appender = Contexts.appender(context);
        Logger log = context.getLogger("acked");
        AtomicInteger logged = new AtomicInteger();
        AtomicBoolean stop = new AtomicBoolean();
        Thread writer = new Thread(() -> {
            while (!stop.get()) {
                for (int k = 0; k < 20; k++) { // bursts: some records are always awaiting their ACK
                    int seq = logged.getAndIncrement();
                    log.atInfo().addKeyValue("seq", seq).log("record {}", seq);
                }
                try {
                    Thread.sleep(5);
                } catch (InterruptedException e) {
                    return;
                }
            }
        }, "steady-writer");
        writer.start();
        try {
            assertTrue(Waiting.until(() -> appender.stats().acknowledged() >= 500, Duration.ofSeconds(30)),
                    appender.stats().toString());
            assertEquals("spooled", appender.stats().ackPoint());

            // Frozen first, so records written meanwhile wait for their ACK (the agent may be quick
            // enough to leave none waiting at any one moment): at the kill they are in flight.
            pipeline.freezeAgent();
            assertTrue(Waiting.until(() -> appender.stats().unacknowledgedRecords() > 0, Duration.ofSeconds(10)),
                    appender.stats().toString());
            pipeline.killAgent(); // SIGKILL: no drain; what it spooled and acknowledged must survive
            assertTrue(Waiting.until(() -> !appender.stats().connected(), Duration.ofSeconds(10)), appender.stats().toString());
            Thread.sleep(500); // records keep coming, and queue
            pipeline.startAgent(); // same socket, same spool
            int restartedAt = logged.get();
            assertTrue(Waiting.until(() -> appender.stats().acknowledged() >= restartedAt + 300, Duration.ofSeconds(30)),
                    appender.stats().toString());
        } finally {
            stop.set(true);
            writer.join(5000);
        }
        assertFalse(writer.isAlive());

        assertTrue(appender.flush(Duration.ofSeconds(30)), "not everything was acknowledged: " + appender.stats());
        Stats stats = appender.stats();
        assertEquals(logged.get(), stats.acknowledged() + stats.droppedTotal() + stats.nakTotal(), stats.toString());
        assertEquals(0, stats.droppedTotal() + stats.nakTotal(), stats.toString());
        assertEquals(0, stats.queuedRecords() + stats.unacknowledgedRecords() + stats.unconfirmed(), stats.toString());
        assertTrue(stats.reconnects() >= 1, stats.toString());
        assertTrue(stats.resent() >= 1, "what was in flight at the kill was sent again: " + stats);

        String distinct = "SELECT count(DISTINCT record->>'seq') FROM logs WHERE record->>'seq' IS NOT NULL";
        long acknowledged = stats.acknowledged();
        if (!Waiting.until(() -> scalar(distinct) >= acknowledged, ROWS_TIMEOUT)) {
            throw new AssertionError(scalar(distinct) + " of " + acknowledged + " records stored; agent log:\n"
                    + pipeline.agentLog() + "\npersister log:\n" + pipeline.persisterLog());
        }
        assertEquals(acknowledged, scalar(distinct), "every acknowledged record is stored");
        assertEquals(acknowledged, scalar("SELECT count(*) FROM logs WHERE record->>'seq' IS NOT NULL"),
                "and stored once, however often it was sent");
        assertEquals(logged.get() - 1, scalar("SELECT max((record->>'seq')::bigint) FROM logs"));
        assertEquals(0, stats.dropped(DropReason.FULL));
    }

    private long scalar(String sql) {
        try {
            return pipeline.scalar(sql);
        } catch (java.sql.SQLException e) {
            return -1;
        }
    }
}
