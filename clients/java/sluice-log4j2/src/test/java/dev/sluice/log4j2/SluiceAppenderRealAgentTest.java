package dev.sluice.log4j2;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import dev.sluice.client.Stats;
import dev.sluice.client.testing.Json;
import dev.sluice.client.testing.RealPipeline;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import org.apache.logging.log4j.Logger;
import org.apache.logging.log4j.ThreadContext;
import org.apache.logging.log4j.core.LoggerContext;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The log4j2 plugin against the real pipeline (agent, Kafka, persister, PostgreSQL), read back as
 * rows. Skipped when {@code SLUICE_BIN} is not set.
 */
class SluiceAppenderRealAgentTest {
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

    @Test
    void eventsArriveAsRowsWithTheirThreadContextFieldsAndWholeStackTraces() throws Exception {
        pipeline = RealPipeline.create(env, dir, RealPipeline.Options.spooled());
        pipeline.startAgent();
        pipeline.startPersister();
        LoggerContext context = contexts.configure(Map.of("SOCKET", pipeline.socket().toString(), "ACKNOWLEDGED", "true"));
        SluiceAppender appender = Contexts.appender(context);
        Logger log = context.getLogger("shop.orders");
        int n = 200;
        for (int i = 0; i < n; i++) {
            ThreadContext.put("request_id", "req-" + i);
            ThreadContext.put("seq", String.valueOf(i));
            log.info("order {} paid", i);
        }
        ThreadContext.clearAll();
        ThreadContext.put("request_id", "req-failed");
        RuntimeException failure = new RuntimeException("payment failed", new IllegalStateException("card declined"));
        failure.addSuppressed(new IllegalArgumentException("rollback failed too"));
        log.error("payment for order {} failed", 17, failure);
        ThreadContext.clearAll();

        assertTrue(appender.flush(Duration.ofSeconds(30)), appender.stats().toString());
        context.stop(5, TimeUnit.SECONDS);

        Stats stats = appender.stats();
        assertEquals(n + 1, stats.acknowledged(), stats.toString());
        assertEquals("spooled", stats.ackPoint());
        pipeline.waitForRows(n + 1, Duration.ofSeconds(60));
        assertEquals(n, pipeline.scalar("SELECT count(DISTINCT record->>'seq') FROM logs WHERE record->>'request_id' LIKE 'req-%'"));
        assertEquals(n + 1, pipeline.rows());
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
    }
}
