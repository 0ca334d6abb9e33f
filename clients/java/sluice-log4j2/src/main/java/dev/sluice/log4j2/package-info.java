/**
 * {@link dev.sluice.log4j2.SluiceAppender}: the {@code Sluice} plugin of log4j-core.
 *
 * <p>Owns the translation of a log4j {@code LogEvent} into the core's {@code LogRecord} (level,
 * logger, formatted message, thread, the {@code ThreadContext} map, the throwable while it is at
 * hand, trace and span ids from the context, static fields from {@code <Property>} elements) and
 * the appender's lifecycle in log4j's terms (a builder the configuration fills, a bounded {@code
 * stop(timeout, unit)}).
 *
 * <p>Must not: do I/O on the logging thread (that is the core's sender's), log through a logger
 * (its own notices go to log4j's {@code StatusLogger} and stderr), or use a {@code Layout}: the
 * record is always the core's JSON.
 */
package dev.sluice.log4j2;
