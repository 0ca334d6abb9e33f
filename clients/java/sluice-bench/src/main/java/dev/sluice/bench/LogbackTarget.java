package dev.sluice.bench;

import ch.qos.logback.classic.LoggerContext;
import ch.qos.logback.classic.joran.JoranConfigurator;
import ch.qos.logback.core.Appender;
import ch.qos.logback.core.status.Status;
import ch.qos.logback.core.status.StatusUtil;
import ch.qos.logback.core.util.StatusPrinter2;
import dev.sluice.bench.Variant.Target;
import dev.sluice.client.Stats;
import dev.sluice.logback.SluiceAppender;
import java.net.URL;
import java.nio.file.Path;
import java.time.Duration;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import org.slf4j.MDC;

/** logback through SLF4J, configured from one of this module's {@code bench-logback-*.xml}. */
final class LogbackTarget implements Target {
    private final LoggerContext context;
    private final Logger log;
    /** The {@code SLUICE} appender, or null (an anchor). */
    private final SluiceAppender sluice;

    LogbackTarget(String resource, Path file) throws Exception {
        if (file != null) {
            System.setProperty("sluice.bench.file", file.toString());
        }
        context = (LoggerContext) LoggerFactory.getILoggerFactory();
        context.reset();
        URL config = LogbackTarget.class.getClassLoader().getResource(resource);
        if (config == null) {
            throw new IllegalStateException(resource + " is not on the classpath");
        }
        JoranConfigurator joran = new JoranConfigurator();
        joran.setContext(context);
        joran.doConfigure(config);
        if (new StatusUtil(context).getHighestLevel(0) >= Status.ERROR) {
            new StatusPrinter2().print(context);
            throw new IllegalStateException("logback did not take " + resource + " cleanly (its status above)");
        }
        log = LoggerFactory.getLogger("bench");
        Appender<?> appender = context.getLogger(Logger.ROOT_LOGGER_NAME).getAppender("SLUICE");
        sluice = appender instanceof SluiceAppender ? (SluiceAppender) appender : null;
        if (resource.contains("sluice") && sluice == null) {
            throw new IllegalStateException(resource + " has no SluiceAppender named SLUICE on the root logger");
        }
    }

    @Override
    public void call(int i) {
        log.info("handled request {}", i);
    }

    @Override
    public void bindRequest(String requestId) {
        MDC.put("request_id", requestId);
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
        context.stop();
    }
}
