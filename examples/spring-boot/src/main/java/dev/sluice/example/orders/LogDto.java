package dev.sluice.example.orders;

import java.time.Instant;
import java.util.Map;

/** One request's log entry, as the seed's aspect queued it. */
public record LogDto(
        String requestId,
        long seq,
        String method,
        String path,
        long orderId,
        int status,
        double durationMs,
        Map<String, String> mdc,
        Instant loggedAt) {}
