package dev.sluice.logback;

import ch.qos.logback.classic.LoggerContext;
import ch.qos.logback.classic.joran.JoranConfigurator;
import ch.qos.logback.core.joran.spi.JoranException;
import ch.qos.logback.core.status.Status;
import ch.qos.logback.core.status.StatusUtil;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicInteger;
import org.slf4j.Logger;
import org.slf4j.MDC;

/**
 * Logback contexts for the tests, each configured from {@code sluice-appender.xml} through Joran
 * as an application's would be, and stopped (appenders drained) at the test's end.
 */
final class Contexts implements AutoCloseable {
    private static final AtomicInteger COUNTER = new AtomicInteger();
    private final List<LoggerContext> made = new ArrayList<>();

    /** A context with {@code properties} (SOCKET, ACKNOWLEDGED, …); fails on any configuration error. */
    LoggerContext configure(Map<String, String> properties) throws JoranException {
        LoggerContext context = new LoggerContext();
        context.setName("sluice-test-" + COUNTER.incrementAndGet());
        context.setMDCAdapter(MDC.getMDCAdapter()); // org.slf4j.MDC writes where these events read
        properties.forEach(context::putProperty);
        JoranConfigurator configurator = new JoranConfigurator();
        configurator.setContext(context);
        configurator.doConfigure(Contexts.class.getResource("/sluice-appender.xml"));
        made.add(context);
        if (new StatusUtil(context).getHighestLevel(0) >= Status.ERROR) {
            throw new IllegalStateException("logback configuration failed: " + context.getStatusManager().getCopyOfStatusList());
        }
        return context;
    }

    static SluiceAppender appender(LoggerContext context) {
        return (SluiceAppender) context.getLogger(Logger.ROOT_LOGGER_NAME).getAppender("SLUICE");
    }

    @Override
    public void close() {
        for (LoggerContext context : made) {
            context.stop();
        }
        MDC.clear();
    }
}
