package dev.sluice.bench;

import dev.sluice.bench.Variant.Target;
import dev.sluice.client.Stats;
import dev.sluice.log4j2.SluiceAppender;
import java.nio.file.Path;
import java.time.Duration;
import org.apache.logging.log4j.LogManager;
import org.apache.logging.log4j.Logger;
import org.apache.logging.log4j.ThreadContext;
import org.apache.logging.log4j.core.Appender;
import org.apache.logging.log4j.core.LoggerContext;
import org.apache.logging.log4j.core.async.AsyncLoggerContext;
import org.apache.logging.log4j.core.async.AsyncLoggerContextSelector;
import org.apache.logging.log4j.core.config.xml.XmlConfiguration;

/**
 * log4j2 through its own API, configured from one of this module's {@code bench-log4j2-*.xml};
 * with {@code asyncLoggers}, every logger is an async logger ({@code AsyncLoggerContextSelector},
 * as {@code -Dlog4j2.contextSelector=…} would make it).
 */
final class Log4j2Target implements Target {
    private final LoggerContext context;
    private final Logger log;
    /** The {@code SLUICE} appender, or null (an anchor). */
    private final SluiceAppender sluice;

    Log4j2Target(String resource, boolean asyncLoggers, Path file) {
        // Before log4j's first use in this JVM (nothing here touches LogManager earlier).
        if (asyncLoggers) {
            System.setProperty("log4j2.contextSelector", AsyncLoggerContextSelector.class.getName());
        }
        if (file != null) {
            System.setProperty("sluice.bench.file", file.toString());
        }
        System.setProperty("log4j2.configurationFile", resource);
        context = (LoggerContext) LogManager.getContext(false);
        if (!(context.getConfiguration() instanceof XmlConfiguration)) {
            throw new IllegalStateException("log4j2 did not take " + resource + ": " + context.getConfiguration());
        }
        if (asyncLoggers != (context instanceof AsyncLoggerContext)) { // whose loggers are all AsyncLoggers
            throw new IllegalStateException("the logger context is a " + context.getClass().getName() + " (async loggers: " + asyncLoggers + ")");
        }
        log = LogManager.getLogger("bench");
        Appender appender = context.getConfiguration().getAppender("SLUICE");
        sluice = appender instanceof SluiceAppender ? (SluiceAppender) appender : null;
        if (resource.contains("sluice") && sluice == null) {
            throw new IllegalStateException(resource + " has no Sluice appender named SLUICE (is the plugin index in the jar?)");
        }
    }

    @Override
    public void call(int i) {
        log.info("handled request {}", i);
    }

    @Override
    public void bindRequest(String requestId) {
        ThreadContext.put("request_id", requestId);
    }

    @Override
    public Stats stats() {
        return sluice == null ? null : sluice.stats();
    }

    @Override
    public void flush(long millis) {
        if (sluice != null) {
            sluice.flush(Duration.ofMillis(millis));
        }
    }

    @Override
    public void stop() {
        LogManager.shutdown(context);
    }
}
