package dev.sluice.client;

import java.util.Map;

/**
 * A snapshot of a client's counters, since it was made. {@link SluiceClient#stats()} takes one
 * under the queue's lock, so its numbers agree with each other.
 *
 * @param queuedRecords waiting to be sent
 * @param queuedBytes their bytes
 * @param unacknowledgedRecords sent on the current connection, awaiting {@code ACK}
 *     (acknowledged mode)
 * @param unacknowledgedBytes their bytes
 * @param sent records written to the socket (a record sent again after a reconnect counts again)
 * @param resent of those, the writes after a record's first (acknowledged mode, after a reconnect)
 * @param acknowledged records the agent acknowledged (a {@code NAK}ed one is not)
 * @param dropped {@code {reason: {level: n}}}; reasons {@code full}, {@code high_water}, {@code
 *     closed}, {@code format_error}
 * @param nak {@code {reason: n}}: records the agent refused, in the agent's words ({@code
 *     too_large}, {@code rate_limited}, …), each counted once
 * @param replaced records in which characters were replaced by U+FFFD
 * @param truncated records cut to {@code maxRecordSize}
 * @param reconnects connections made after the first
 * @param unconfirmed sent, never acknowledged, when {@code close()} gave up (the agent may have
 *     stored them)
 * @param reportsSent in-band {@code "sluice.client":"dropped"} records sent
 * @param connected whether the sender holds a connection now
 * @param ackPoint the agent's answer to the handshake ({@code spooled}, {@code delivered}); null
 *     in plain mode
 * @param lastError the last connection error ({@code ENOENT}, {@code ECONNREFUSED}, …), null
 *     once connected
 */
public record Stats(
        long queuedRecords,
        long queuedBytes,
        long unacknowledgedRecords,
        long unacknowledgedBytes,
        long sent,
        long resent,
        long acknowledged,
        Map<String, Map<String, Long>> dropped,
        Map<String, Long> nak,
        long replaced,
        long truncated,
        long reconnects,
        long unconfirmed,
        long reportsSent,
        boolean connected,
        String ackPoint,
        String lastError) {

    /** Every record dropped, whatever the reason. */
    public long droppedTotal() {
        return dropped.values().stream().flatMap(byLevel -> byLevel.values().stream()).mapToLong(Long::longValue).sum();
    }

    /** Records dropped for {@code reason} ({@link DropReason#label()}), any level. */
    public long dropped(DropReason reason) {
        Map<String, Long> byLevel = dropped.get(reason.label());
        return byLevel == null ? 0 : byLevel.values().stream().mapToLong(Long::longValue).sum();
    }

    /** Records dropped for {@code reason} at {@code level}. */
    public long dropped(DropReason reason, Severity level) {
        Map<String, Long> byLevel = dropped.get(reason.label());
        return byLevel == null ? 0 : byLevel.getOrDefault(level.label(), 0L);
    }

    /** Records the agent refused, whatever its reason. */
    public long nakTotal() {
        return nak.values().stream().mapToLong(Long::longValue).sum();
    }
}
