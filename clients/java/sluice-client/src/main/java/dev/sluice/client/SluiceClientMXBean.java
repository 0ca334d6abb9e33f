package dev.sluice.client;

import java.util.Map;

/**
 * A client's counters over JMX, registered as {@code dev.sluice:type=SluiceClient,name=<name>}
 * (the appender's name). Each getter is a plain number or flag, so Micrometer's JMX binder, a
 * Prometheus JMX exporter or a {@code FunctionCounter}/{@code Gauge} over the getters reads it
 * as is. See {@link Stats} for what each counts.
 */
public interface SluiceClientMXBean {
    String getSocketPath();

    boolean isAcknowledged();

    boolean isConnected();

    /** {@code spooled} or {@code delivered} (acknowledged mode), else empty. */
    String getAckPoint();

    /** The last connection error ({@code ENOENT}, …), empty once connected. */
    String getLastError();

    long getQueuedRecords();

    long getQueuedBytes();

    long getUnacknowledgedRecords();

    long getUnacknowledgedBytes();

    long getRecordsSent();

    long getRecordsResent();

    long getRecordsAcknowledged();

    /** Every drop, whatever the reason. */
    long getRecordsDropped();

    long getDroppedFull();

    long getDroppedHighWater();

    long getDroppedClosed();

    long getDroppedFormatError();

    /** Records the agent refused ({@code NAK}), whatever the reason. */
    long getRecordsNaked();

    /** Records the agent refused, by its reason. */
    Map<String, Long> getNakByReason();

    long getRecordsReplaced();

    long getRecordsTruncated();

    long getRecordsUnconfirmed();

    long getReconnects();

    long getReportsSent();
}
