/**
 * {@link dev.sluice.logback.SluiceAppender}: logback-classic's appender for the Sluice agent.
 *
 * <p>Owns the translation of a logback {@code ILoggingEvent} into the core's {@code LogRecord}
 * (level, logger, formatted message, thread, MDC, SLF4J 2 key-value pairs, the throwable while it
 * is at hand, trace and span ids from the MDC, static fields from the configuration) and the
 * appender's lifecycle in logback's terms ({@code start}/{@code stop}, options as Joran bean
 * properties, problems through the status API).
 *
 * <p>Must not: do I/O on the logging thread (that is the core's sender's), log through a logger
 * (its own notices go to logback's status manager and stderr), or hold logback's appender lock
 * ({@code UnsynchronizedAppenderBase}: the core's queue takes care of threads).
 */
package dev.sluice.logback;
