package dev.sluice.log4j2;

import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.logging.log4j.ThreadContext;
import org.apache.logging.log4j.core.LoggerContext;
import org.apache.logging.log4j.core.config.ConfigurationSource;
import org.apache.logging.log4j.core.config.xml.XmlConfiguration;

/**
 * Log4j contexts for the tests, each configured from {@code sluice-log4j2.xml} (the plugin found
 * by its element name, as in an application), and stopped (appenders drained) at the test's end.
 */
final class Contexts implements AutoCloseable {
    private static final AtomicInteger COUNTER = new AtomicInteger();
    private static final Map<String, String> DEFAULTS = Map.of(
            "ACKNOWLEDGED", "false",
            "MAX_QUEUE_RECORDS", "8192",
            "MAX_RECORD_SIZE", "1 MB",
            "FLUSH_TIMEOUT_MILLIS", "2000");

    private final List<LoggerContext> made = new ArrayList<>();

    /** A started context; {@code values} fill the template's {@code @NAME@}s (SOCKET is required). */
    LoggerContext configure(Map<String, String> values) throws IOException {
        Map<String, String> all = new LinkedHashMap<>(DEFAULTS);
        all.putAll(values);
        String xml;
        try (InputStream in = Contexts.class.getResourceAsStream("/sluice-log4j2.xml")) {
            xml = new String(in.readAllBytes(), StandardCharsets.UTF_8);
        }
        for (Map.Entry<String, String> value : all.entrySet()) {
            xml = xml.replace("@" + value.getKey() + "@", value.getValue());
        }
        LoggerContext context = new LoggerContext("sluice-test-" + COUNTER.incrementAndGet());
        XmlConfiguration configuration = new XmlConfiguration(context,
                new ConfigurationSource(new ByteArrayInputStream(xml.getBytes(StandardCharsets.UTF_8))));
        context.start(configuration);
        made.add(context);
        return context;
    }

    static SluiceAppender appender(LoggerContext context) {
        return context.getConfiguration().getAppender("SLUICE");
    }

    @Override
    public void close() {
        for (LoggerContext context : made) {
            context.stop(5, TimeUnit.SECONDS);
        }
        ThreadContext.clearAll();
    }
}
