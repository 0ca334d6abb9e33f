package dev.sluice.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.sluice.client.testing.Json;
import java.nio.charset.StandardCharsets;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.junit.jupiter.api.Test;

class RecordQueueTest {
    private final AtomicLong nanos = new AtomicLong(1_000);
    private final AtomicLong micros = new AtomicLong(1_796_007_845_000_000L);

    private RecordQueue queue(int records, long bytes, double dropBelowWarnAt) {
        return new RecordQueue(records, bytes, dropBelowWarnAt, nanos::get, micros::get);
    }

    private static byte[] line(String text) {
        return (text + "\n").getBytes(StandardCharsets.UTF_8);
    }

    private static boolean offer(RecordQueue queue, Severity level, String text) {
        return queue.offer(line(text), level, false, false, 1);
    }

    private static String text(RecordQueue.Batch batch, int k) {
        return new String(batch.data[k], StandardCharsets.UTF_8).strip();
    }

    /** The sender's linger, started with a minute to wait; returns the thread running it. */
    private static Thread lingering(RecordQueue queue, int records, long bytes) throws InterruptedException {
        Thread sender = new Thread(() -> queue.linger(TimeUnit.MINUTES.toNanos(1), records, bytes));
        sender.start();
        while (sender.getState() != Thread.State.TIMED_WAITING && sender.isAlive()) {
            Thread.sleep(1);
        }
        return sender;
    }

    private static void assertEnds(Thread sender) throws InterruptedException {
        sender.join(TimeUnit.SECONDS.toMillis(10));
        assertFalse(sender.isAlive(), "the linger went on");
    }

    @Test
    void theLingerEndsWhenTheRecordThatReachesHalfABatchIsOffered() throws InterruptedException {
        RecordQueue queue = queue(1000, 1 << 20, 1.0);
        offer(queue, Severity.INFO, "first");
        Thread sender = lingering(queue, 3, 1 << 20);
        offer(queue, Severity.INFO, "second");
        assertTrue(sender.isAlive(), "a record below the mark signals nobody");
        offer(queue, Severity.INFO, "third");
        assertEnds(sender);
    }

    @Test
    void theLingerEndsWhenTheBytesReachTheirMark() throws InterruptedException {
        RecordQueue queue = queue(1000, 1 << 20, 1.0);
        offer(queue, Severity.INFO, "first");
        Thread sender = lingering(queue, 1000, 100);
        offer(queue, Severity.INFO, "x".repeat(100));
        assertEnds(sender);
    }

    @Test
    void theLingerEndsWhenAFlushWaitsAndDoesNotStartWhileOneDoes() throws InterruptedException {
        RecordQueue queue = queue(1000, 1 << 20, 1.0);
        offer(queue, Severity.INFO, "waiting");
        Thread sender = lingering(queue, 1000, 1 << 20);
        Thread flush = new Thread(() -> queue.waitDrained(TimeUnit.SECONDS.toNanos(30)));
        flush.setDaemon(true);
        flush.start();
        assertEnds(sender);
        // While the flush still waits, a linger returns at once.
        Thread again = new Thread(() -> queue.linger(TimeUnit.MINUTES.toNanos(1), 1000, 1 << 20));
        again.start();
        assertEnds(again);
        queue.stop();
        flush.join(TimeUnit.SECONDS.toMillis(10));
    }

    @Test
    void theLingerEndsAtStop() throws InterruptedException {
        RecordQueue queue = queue(1000, 1 << 20, 1.0);
        offer(queue, Severity.INFO, "waiting");
        Thread sender = lingering(queue, 1000, 1 << 20);
        queue.stop();
        assertEnds(sender);
    }

    @Test
    void noDropReportIsQueuedOnceTheQueueIsClosed() {
        // After close() every record is dropped `closed`; a report per sender step would keep the
        // queue from draining and flood the store (the summary line at close tells the drops).
        RecordQueue queue = queue(2, 1 << 20, 1.0);
        offer(queue, Severity.INFO, "one");
        offer(queue, Severity.INFO, "two");
        offer(queue, Severity.INFO, "dropped");
        queue.connectionOpened(null, false);
        RecordQueue.Batch batch = new RecordQueue.Batch(10);
        queue.peek(batch, 1 << 20);
        queue.commit(batch, 2);
        queue.close();
        queue.peek(batch, 1 << 20);
        assertEquals(0, batch.size, "closed: no report");
    }

    @Test
    void theIncomingRecordIsDroppedWhenFullAndCountedByReasonAndLevel() {
        RecordQueue queue = queue(3, 1 << 20, 1.0);
        for (int i = 0; i < 3; i++) {
            assertTrue(offer(queue, Severity.INFO, "kept " + i));
        }

        assertFalse(offer(queue, Severity.ERROR, "dropped"));
        assertFalse(offer(queue, Severity.INFO, "dropped"));

        Stats stats = queue.stats();
        assertEquals(3, stats.queuedRecords());
        assertEquals(Map.of("full", Map.of("error", 1L, "info", 1L)), stats.dropped());
        RecordQueue.Batch batch = new RecordQueue.Batch(10);
        queue.peek(batch, 1 << 20);
        assertEquals("kept 0", text(batch, 0), "the oldest stay: only the incoming record is dropped");
    }

    @Test
    void theByteBoundAppliesAsTheRecordBoundDoes() {
        RecordQueue queue = queue(1000, 100, 1.0);
        assertTrue(offer(queue, Severity.WARN, "x".repeat(60)));

        assertFalse(offer(queue, Severity.WARN, "y".repeat(60)));

        assertEquals(1, queue.stats().dropped(DropReason.FULL, Severity.WARN));
        assertEquals(61, queue.stats().queuedBytes());
    }

    @Test
    void aboveTheHighWaterMarkRecordsBelowWarnAreDroppedFirst() {
        RecordQueue queue = queue(10, 1 << 20, 0.8);
        for (int i = 0; i < 8; i++) {
            assertTrue(offer(queue, Severity.DEBUG, "fills to the mark " + i));
        }

        assertFalse(offer(queue, Severity.INFO, "below warn"));
        assertTrue(offer(queue, Severity.WARN, "a warning"));
        assertTrue(offer(queue, Severity.ERROR, "an error"));
        assertFalse(offer(queue, Severity.FATAL, "no room at all"));

        Stats stats = queue.stats();
        assertEquals(1, stats.dropped(DropReason.HIGH_WATER, Severity.INFO));
        assertEquals(1, stats.dropped(DropReason.FULL, Severity.FATAL));
        assertEquals(10, stats.queuedRecords());
    }

    @Test
    void theDropReportIsQueuedOnceConnectedAndThereIsRoomAndCountsEveryDrop() {
        RecordQueue queue = queue(2, 1 << 20, 1.0);
        offer(queue, Severity.INFO, "one");
        offer(queue, Severity.INFO, "two");
        offer(queue, Severity.INFO, "dropped");
        offer(queue, Severity.ERROR, "dropped");
        RecordQueue.Batch batch = new RecordQueue.Batch(10);

        queue.peek(batch, 1 << 20);
        assertEquals(2, batch.size, "not connected: no report");
        queue.connectionOpened(null, false);
        queue.peek(batch, 1 << 20);
        assertEquals(2, batch.size, "connected, but no room yet");
        queue.commit(batch, 2);
        queue.peek(batch, 1 << 20);

        assertEquals(1, batch.size);
        Map<String, Object> report = Json.object(text(batch, 0));
        assertEquals("dropped", report.get("sluice.client"));
        assertEquals(2L, report.get("count"));
        assertEquals("warn", report.get("level"));
        assertEquals(Map.of("full", 2L), report.get("by_reason"));
        assertEquals(Map.of("info", 1L, "error", 1L), report.get("by_level"));
        assertEquals("2026-11-30T03:04:05.000000Z", report.get("since"));
        queue.commit(batch, 1);
        assertEquals(1, queue.stats().reportsSent());
        assertEquals(2, queue.stats().sent(), "the report is not one of the app's records");
        queue.peek(batch, 1 << 20);
        assertEquals(0, batch.size, "one report for those drops");
    }

    @Test
    void theDropNoticeIsWrittenAtMostOnceAMinute() {
        RecordQueue queue = queue(1, 1 << 20, 1.0);
        offer(queue, Severity.INFO, "kept");
        offer(queue, Severity.INFO, "dropped");

        String first = queue.takeNotice("/run/sluice/sluice.sock");
        assertNotNull(first);
        assertTrue(first.contains("dropped 1 log record(s)") && first.contains("full=1") && first.contains("not connected"), first);

        offer(queue, Severity.INFO, "dropped again");
        assertNull(queue.takeNotice("/run/sluice/sluice.sock"), "not within the minute");
        nanos.addAndGet(TimeUnit.SECONDS.toNanos(59));
        assertNull(queue.takeNotice("/run/sluice/sluice.sock"));
        nanos.addAndGet(TimeUnit.SECONDS.toNanos(1));
        String second = queue.takeNotice("/run/sluice/sluice.sock");
        assertTrue(second != null && second.contains("dropped 1 log record(s) since the last notice") && second.contains("full=2"), second);
    }

    @Test
    void recordsInFlightArePendingAgainAfterAReconnectInOrderAndUnderTheirNumbers() {
        RecordQueue queue = queue(100, 1 << 20, 1.0);
        for (int i = 0; i < 3; i++) {
            offer(queue, Severity.INFO, "r" + i);
        }
        long first = queue.connectionOpened("spooled", false);
        RecordQueue.Batch batch = new RecordQueue.Batch(10);
        queue.take(first, batch, 1 << 20);
        assertEquals(1, batch.firstSeq);
        queue.ack(first, 1);
        offer(queue, Severity.INFO, "r3");

        queue.connectionLost(first, "EPIPE");
        queue.ack(first, 3); // a stale answer of the lost connection settles nothing
        assertEquals(2, queue.firstUnsettled());
        long second = queue.connectionOpened("spooled", true);
        queue.take(second, batch, 1 << 20);

        assertEquals(2, batch.firstSeq);
        assertEquals(3, batch.size);
        assertEquals("r1", text(batch, 0));
        assertEquals("r3", text(batch, 2));
        Stats stats = queue.stats();
        assertEquals(2, stats.resent());
        assertEquals(6, stats.sent());
        assertEquals(1, stats.reconnects());
    }

    @Test
    void aNakedRecordIsCountedOnceAndKeepsItsPlaceUntilAnAckCoversIt() {
        RecordQueue queue = queue(100, 1 << 20, 1.0);
        for (int i = 0; i < 3; i++) {
            offer(queue, Severity.INFO, "r" + i);
        }
        long gen = queue.connectionOpened("spooled", false);
        RecordQueue.Batch batch = new RecordQueue.Batch(10);
        queue.take(gen, batch, 1 << 20);

        queue.nak(gen, 2, "rate_limited");
        queue.nak(gen, 2, "rate_limited");
        assertEquals(3, queue.stats().unacknowledgedRecords(), "refused, not yet settled");
        queue.ack(gen, 3);

        Stats stats = queue.stats();
        assertEquals(Map.of("rate_limited", 1L), stats.nak());
        assertEquals(2, stats.acknowledged());
        assertEquals(0, stats.unacknowledgedRecords());
        assertEquals(0, stats.queuedBytes() + stats.unacknowledgedBytes());
    }

    @Test
    void stopCountsWhatWasQueuedAsClosedAndWhatWasInFlightAsUnconfirmed() {
        RecordQueue queue = queue(100, 1 << 20, 1.0);
        offer(queue, Severity.INFO, "in flight");
        long gen = queue.connectionOpened("spooled", false);
        queue.take(gen, new RecordQueue.Batch(10), 1 << 20);
        offer(queue, Severity.WARN, "queued");

        queue.stop();
        offer(queue, Severity.ERROR, "after");

        Stats stats = queue.stats();
        assertEquals(1, stats.unconfirmed());
        assertEquals(Map.of("closed", Map.of("warn", 1L, "error", 1L)), stats.dropped());
        assertEquals(0, stats.queuedRecords() + stats.unacknowledgedRecords());
    }

    @Test
    void theRingGrowsToTheBoundAndKeepsTheOrder() {
        RecordQueue queue = queue(5000, 1 << 30, 1.0);
        RecordQueue.Batch batch = new RecordQueue.Batch(1);
        for (int i = 0; i < 5000; i++) {
            assertTrue(offer(queue, Severity.INFO, "r" + i));
            if (i % 3 == 0) {
                queue.peek(batch, 1 << 20);
                queue.commit(batch, 1);
            }
        }
        queue.peek(batch, 1 << 20);
        assertEquals("r1667", text(batch, 0), "one removed from the front for every third added");
        assertEquals(5000 - 1667, queue.stats().queuedRecords());
    }
}
